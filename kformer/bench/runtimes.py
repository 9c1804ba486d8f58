"""`kformer bench runtimes`: latency, throughput, size, peak memory and BLEU of every exported
runtime and variant, each measured in its own process on the same sentences."""

import json
import os
import resource
import statistics
import tempfile
import time

from kformer import subprocesses
from kformer.config import search_label


def _runner(runtime, artifact_dir, beam, variant, threads):
    from kformer.export.formats import open_runner
    from kformer.export.manifest import load as load_manifest

    if runtime == "keras":  # the training folder the export came from, with the export's settings
        manifest = load_manifest(artifact_dir)
        return open_runner(
            manifest["trained_in"],
            "keras",
            beam_size=beam,
            alpha=manifest["alpha"],
            max_length=manifest["max_length"],
            no_repeat_ngram=manifest["no_repeat_ngram"],
        )
    return open_runner(artifact_dir, runtime, variant, beam, threads=threads)


def worker(artifact_dir, runtime, variant, beam, sentences_file, threads=None, repeats=3):
    """Measures one runtime/variant/search in this process; returns a dict (JSON-friendly).
    Batch 1: the job's first `batch1_sentences` sources one at a time, `repeats` times (the median
    pass); batch 32: the first 32 in one call; BLEU: every source, in batches."""
    with open(sentences_file, encoding="utf-8") as f:
        job = json.load(f)
    start = time.perf_counter()
    runner = _runner(runtime, artifact_dir, beam, variant, threads)
    load_seconds = time.perf_counter() - start
    sources = job["sources"]
    if variant == "text":  # text in, text out: SentencePiece runs inside the graph, so time that
        translate = runner.translate
    else:
        by_text = dict(zip(sources, runner.tokenizer.encode(sources)))
        translate = lambda texts: runner.translate_ids([by_text[t] for t in texts])[0]  # noqa: E731
    singles, batch = sources[: job["batch1_sentences"]], sources[:32]

    translate(singles[:1])  # warm-up (traces, allocates)
    passes = []
    for _ in range(repeats):
        t = time.perf_counter()
        outputs = [translate([source])[0] for source in singles]
        passes.append(time.perf_counter() - t)
    translate(batch)
    t = time.perf_counter()
    batch_outputs = translate(batch)
    batch_seconds = time.perf_counter() - t
    everything = translate(sources)
    hypotheses = everything if variant == "text" else [runner.tokenizer.decode(row) for row in everything]

    def lengths(outputs):  # output tokens: ids as they are, a text file's strings as their pieces
        return [len(runner.tokenizer.encode(o) if isinstance(o, str) else o) for o in outputs]

    return {
        "runtime": runtime,
        "variant": variant,
        "search": search_label(beam),
        "load_s": load_seconds,
        "latency_ms": 1000 * statistics.median(passes) / len(singles),
        "latency_output_tokens": statistics.mean(lengths(outputs)),
        "batch32_sentences_per_s": len(batch) / batch_seconds,
        "batch32_tokens_per_s": sum(n + 1 for n in lengths(batch_outputs)) / batch_seconds,
        "peak_rss_mb": peak_memory_mb(),
        "hypotheses": hypotheses,
    }


def peak_memory_mb():
    """This process's peak resident memory. VmHWM, not getrusage's ru_maxrss: Linux keeps
    ru_maxrss across execve, so a child would report its parent's (TensorFlow-sized) peak."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def bench_runtimes(artifact_dir, sentences=200, rounds=3, batch1_sentences=16, progress=print):
    """Runs every runtime/variant/search of an export in a subprocess, in `rounds` interleaved
    rounds (every job once per round, so a change in the machine's speed hits all alike); reports
    the median of each timing, the peak memory, and BLEU on the first `sentences` of the held-out
    test split of the corpus the model was trained on. Batch 1 is timed over the first
    `batch1_sentences`, one at a time: a single sentence of a few milliseconds gives ratios that
    move by up to 3x between rounds."""
    from kformer.evaluate import score, split_references
    from kformer.export.manifest import load as load_manifest

    artifact_dir = os.path.abspath(artifact_dir)  # the workers run in another folder
    manifest = load_manifest(artifact_dir)
    sources, references = split_references(manifest["trained_in"], "test")
    sources, references = sources[:sentences], references[:sentences]
    language = (manifest.get("corpus") or {}).get("direction", "x-en").split("-")[-1]
    light = ("tflite", "onnx", "ctranslate2")
    jobs = [("keras", "fp32"), ("savedmodel", "fp32")] + sorted(
        {(a["format"], a["variant"]) for a in manifest["artifacts"] if a["format"] in light}
    )
    sizes = {
        (a["format"], a["variant"]): a["bytes"] for a in manifest["artifacts"]
    }  # a file serves both searches
    runs = {}  # (runtime, variant, beam) -> one result per round
    with tempfile.TemporaryDirectory() as work:
        job_file = os.path.join(work, "job.json")
        with open(job_file, "w", encoding="utf-8") as f:
            json.dump({"sources": sources, "batch1_sentences": min(batch1_sentences, len(sources))}, f)
        for number, (runtime, variant, beam) in enumerate(
            [(r, v, b) for _ in range(rounds) for r, v in jobs for b in (1, manifest["beam_size"])]
        ):
            progress(
                f"round {number // (2 * len(jobs)) + 1}/{rounds}: {runtime} {variant} beam {beam} ...",
                end=" ",
                flush=True,
            )
            out = os.path.join(work, "out.json")
            code = (
                "import json, sys; from kformer.bench.runtimes import worker; "
                f"json.dump(worker(*sys.argv[1:4], int(sys.argv[4]), sys.argv[5]), open({out!r}, 'w'))"
            )
            try:  # in the work folder: a relative export folder would not be found there
                subprocesses.run_python(code, artifact_dir, runtime, variant, str(beam), job_file, cwd=work)
            except subprocesses.Failed as e:
                raise RuntimeError(f"bench of {runtime} {variant} failed:\n{e}") from None
            with open(out, encoding="utf-8") as f:
                row = json.load(f)
            row["bleu"] = score(row.pop("hypotheses"), references, language)["bleu"]
            row["bytes"] = sizes.get((runtime, variant))  # None for keras: no file of its own
            runs.setdefault((runtime, variant, beam), []).append(row)
            progress(f"{row['latency_ms']:.0f} ms, BLEU {row['bleu']:.2f}")
    rows = [_median_row(results) for results in runs.values()]
    _against_ctranslate2(rows)
    return {
        "artifact": artifact_dir,
        "sentences": len(sources),
        "rounds": rounds,
        "batch1_sentences": min(batch1_sentences, len(sources)),
        "rows": rows,
    }


def _median_row(results):
    """One row from a job's rounds: median timings, the highest peak memory, the rest as measured."""
    row = dict(results[0])
    for key in ("load_s", "latency_ms", "batch32_sentences_per_s", "batch32_tokens_per_s"):
        row[key] = statistics.median(r[key] for r in results)
    row["peak_rss_mb"] = max(r["peak_rss_mb"] for r in results)
    row["rounds"] = len(results)
    row["per_round"] = {key: [r[key] for r in results] for key in ("latency_ms", "batch32_sentences_per_s")}
    return row


def _against_ctranslate2(rows):
    """Adds each row's time divided by CTranslate2's for the same search and precision (int8 with
    int8, every other variant with fp32), at batch 1 and 32, when the export has CTranslate2:
    "time_vs_ct2" (b1, b32), the median of the ratios taken round by round, and "time_vs_ct2_range"
    ((min, max) at b1, at b32). Round by round, because CTranslate2's own fp32 timing moves by up to
    1.6x between processes: the range shows how far a ratio holds."""
    reference = {(r["search"], r["variant"]): r for r in rows if r["runtime"] == "ctranslate2"}

    def per_round(row, key):  # a row reduced by _median_row keeps its rounds; a plain row is one round
        return row.get("per_round", {}).get(key, [row[key]])

    for r in rows:
        ct2 = reference.get((r["search"], "int8" if r["variant"] == "int8" else "fp32"))
        if ct2 is None:
            r["time_vs_ct2"] = r["time_vs_ct2_range"] = None
            continue
        b1 = [ours / theirs for ours, theirs in zip(per_round(r, "latency_ms"), per_round(ct2, "latency_ms"))]
        b32 = [
            theirs / ours
            for ours, theirs in zip(
                per_round(r, "batch32_sentences_per_s"), per_round(ct2, "batch32_sentences_per_s")
            )
        ]
        r["time_vs_ct2"] = (statistics.median(b1), statistics.median(b32))
        r["time_vs_ct2_range"] = ((min(b1), max(b1)), (min(b32), max(b32)))


def print_table(results):
    print(
        f"BLEU on {results['sentences']} test sentences; latency: ms per sentence at batch 1 (the first "
        f"{results['batch1_sentences']}, one at a time, median of 3 passes; out tok: their mean output); "
        f"throughput: 32 sentences in one call; timings: median of {results['rounds']} interleaved rounds"
    )
    print(
        f"{'runtime':>10} {'variant':>7} {'search':>6} {'latency ms':>10} {'out tok':>7} {'sent/s@32':>9} "
        f"{'tok/s@32':>8} {'MB':>6} {'peak MB':>7} {'BLEU':>6} {'time/CT2 b1,b32':>15} {'range b1, b32':>19}"
    )
    for r in results["rows"]:
        size = "-" if r["bytes"] is None else f"{r['bytes'] / 1e6:.1f}"
        ratio = "-" if not r.get("time_vs_ct2") else "{:.2f}, {:.2f}".format(*r["time_vs_ct2"])
        spread = (
            "-"
            if not r.get("time_vs_ct2_range")
            else "{:.2f}-{:.2f}, {:.2f}-{:.2f}".format(*r["time_vs_ct2_range"][0], *r["time_vs_ct2_range"][1])
        )
        print(
            f"{r['runtime']:>10} {r['variant']:>7} {r['search']:>6} {r['latency_ms']:10.1f} "
            f"{r['latency_output_tokens']:7.1f} {r['batch32_sentences_per_s']:9.1f} {r['batch32_tokens_per_s']:8.0f} "
            f"{size:>6} {r['peak_rss_mb']:7.0f} {r['bleu']:6.2f} {ratio:>15} {spread:>19}"
        )

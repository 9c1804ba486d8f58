"""`kformer bench runtimes`: latency, throughput, size, peak memory and BLEU of every exported
runtime and variant, each measured in its own process on the same sentences; `kformer bench web`:
the web page against onnxruntime in Python. Not tests."""

import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from kformer.config import search_label


def _runner(runtime, artifact_dir, beam, variant, threads):
    from export.runtime import load_manifest, open_runner

    if runtime == "keras":  # the training folder the export came from, with the export's settings
        manifest = load_manifest(artifact_dir)
        return open_runner(
            manifest["trained_in"],
            "keras",
            beam_size=beam,
            alpha=manifest["alpha"],
            max_length=manifest["max_length"],
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
    `batch1_sentences`, one at a time: a single sentence of a few milliseconds gave ratios that
    moved by up to 3x between rounds (2026-11-25)."""
    from export.runtime import load_manifest
    from kformer.evaluate import score, split_references

    artifact_dir = os.path.abspath(artifact_dir)  # the workers run in the repository folder
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
                "import json, sys; from export.benchmark import worker; "
                f"json.dump(worker(*sys.argv[1:4], int(sys.argv[4]), sys.argv[5]), open({out!r}, 'w'))"
            )
            argv = [sys.executable, "-c", code, artifact_dir, runtime, variant, str(beam), job_file]
            result = subprocess.run(
                argv, capture_output=True, text=True, cwd=os.path.dirname(os.path.dirname(__file__))
            )
            if result.returncode:
                raise RuntimeError(f"bench of {runtime} {variant} failed:\n{result.stderr[-2000:]}")
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
    ((min, max) at b1, at b32). Round by round, because CTranslate2's own fp32 timing moved by up to
    1.6x between processes on this project's machine (2026-11-24): the range shows how far a ratio
    holds."""
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


# `kformer bench web`: the page of export/web/ against onnxruntime in Python, same export, same sentences.
TIME_EACH_SENTENCE_JS = """async ([lines, beam]) => {
  const ms = [];
  for (const line of lines) {
    const start = performance.now();
    await window.kformer.translate([line], {beam});
    ms.push(performance.now() - start);
  }
  return ms;
}"""
PAGE_BYTES_JS = """() => performance.getEntriesByType("navigation").concat(performance.getEntriesByType("resource"))
  .reduce((total, entry) => total + entry.encodedBodySize, 0)"""


def bench_web(artifact_dir, sentences=50, rounds=2, screenshot=None, browser=None, progress=print):
    """Per-sentence latency (batch 1, greedy and beam) of the page in headless Chromium (WASM, one
    thread and all cores; onnxruntime-web on each ONNX variant, LiteRT.js on the fixed-shape TFLite
    files) and of the same files in Python (onnxruntime, LiteRT) with as many threads, on the first
    `sentences` test sentences, interleaved over `rounds`; page load time and bytes per variant.
    `browser`: a Playwright browser to use (default: start web.chromium())."""
    from export import web
    from export.runtime import load_manifest, open_runner
    from kformer.evaluate import split_references

    manifest = load_manifest(artifact_dir)
    sources = split_references(manifest["trained_in"], "test")[0][:sentences]
    present = {(a["format"], a["variant"]) for a in manifest["artifacts"]}
    variants = [
        (runtime, variant)
        for runtime, (fmt, names) in web.PAGE_RUNTIMES.items()
        for variant in names
        if (fmt, variant) in present
    ]
    beams = (1, manifest["beam_size"])
    runs = {}  # (runtime, variant, threads, beam, "page"|"python") -> per-sentence ms of every round
    loads = {}  # (runtime, variant, threads) -> [(seconds, bytes)]
    jobs = [
        (number, runtime, variant, threads)
        for number in range(rounds)
        for runtime, variant in variants
        for threads in sorted({1, os.cpu_count() or 1})
    ]
    with contextlib.nullcontext(browser) if browser else web.chromium() as browser:
        for number, runtime, variant, threads in jobs:
            progress(
                f"round {number + 1}/{rounds}: {runtime} {variant}, {threads} thread(s) ...",
                end=" ",
                flush=True,
            )
            with web.serving(artifact_dir, runtime, variant) as url:
                context = browser.new_context()  # an empty cache: the load is a first visit
                page = context.new_page()
                page.goto(f"{url}&threads={threads}")
                seconds = page.evaluate("window.kformer.ready.then(() => performance.now() / 1000)")
                loads.setdefault((runtime, variant, threads), []).append(
                    (seconds, page.evaluate(PAGE_BYTES_JS))
                )
                for beam in beams:
                    runner = open_runner(
                        artifact_dir, web.PAGE_RUNTIMES[runtime][0], variant, beam, threads=threads
                    )
                    runner.translate(sources[:1])  # warm-up, as the page's first call below
                    page.evaluate(TIME_EACH_SENTENCE_JS, [sources[:1], beam])
                    runs.setdefault((runtime, variant, threads, beam, "page"), []).extend(
                        page.evaluate(TIME_EACH_SENTENCE_JS, [sources, beam])
                    )
                    python = runs.setdefault((runtime, variant, threads, beam, "python"), [])
                    for line in sources:
                        start = time.perf_counter()
                        runner.translate([line])
                        python.append(1000 * (time.perf_counter() - start))
                if screenshot and number == 0 and threads > 1 and (runtime, variant) == variants[0]:
                    page.click("#translate")
                    page.wait_for_function("document.getElementById('output').textContent.length > 0")
                    page.screenshot(path=screenshot)
                context.close()
            progress(f"loaded in {seconds:.1f} s")
    rows = []
    for (runtime, variant, threads), measured in loads.items():
        for beam in beams:
            page_ms = statistics.median(runs[(runtime, variant, threads, beam, "page")])
            python_ms = statistics.median(runs[(runtime, variant, threads, beam, "python")])
            rows.append(
                {
                    "runtime": runtime,
                    "variant": variant,
                    "threads": threads,
                    "search": search_label(beam),
                    "page_ms": page_ms,
                    "python_ms": python_ms,
                    "ratio": page_ms / python_ms,
                    "load_s": statistics.median(s for s, _ in measured),
                    "page_bytes": measured[0][1],
                }
            )
    return {"artifact": artifact_dir, "sentences": len(sources), "rounds": rounds, "rows": rows}


def print_web_table(results):
    print(
        f"median ms per sentence (batch 1) over {results['sentences']} test sentences x {results['rounds']} "
        "interleaved rounds; page: headless Chromium, WASM (onnx: onnxruntime-web, litert: LiteRT.js); "
        "python: onnxruntime or LiteRT on the same file"
    )
    print(
        f"{'runtime':>7} {'variant':>7} {'threads':>7} {'search':>6} {'page ms':>8} {'python ms':>9} "
        f"{'page/python':>11} {'load s':>6} {'MB loaded':>9}"
    )
    for r in results["rows"]:
        print(
            f"{r['runtime']:>7} {r['variant']:>7} {r['threads']:7d} {r['search']:>6} {r['page_ms']:8.1f} "
            f"{r['python_ms']:9.1f} "
            f"{r['ratio']:11.2f} {r['load_s']:6.1f} {r['page_bytes'] / 1e6:9.1f}"
        )

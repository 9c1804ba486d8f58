"""`kformer bench runtimes`: every exported runtime and variant on the work users give it, each
measured in its own process on the same sentences: a whole file through the runner's translate
path (length-sorted batches at the runner's default size, as `kformer translate FILE` and the
server run it) and one sentence at a time; speed, size, memory and BLEU, and time against
CTranslate2."""

import json
import os
import resource
import statistics
import tempfile
import time

from kformer import subprocesses
from kformer.arguments import add_rounds_option, positive
from kformer.bench.harness import report
from kformer.export.format import quantization
from kformer.model.config import search_label

TIMINGS = ("file_s", "batch1_ms")  # the two cells each ratio to CTranslate2 is taken in

# CTranslate2's matrix-product backends on x86-64, chosen by CT2_USE_MKL (its default: MKL on Intel
# CPUs, oneDNN on others), and its intra-op threads: the bench's, and one. Any of them can be the slow
# one by a wide margin (docs/benchmarks.md), so each is measured, and CTranslate2's time for a cell
# is its fastest setting's in that round: a ratio against a badly tuned reference says nothing.
CT2_BACKENDS = {"mkl": "1", "dnnl": "0"}
CT2_ONE_THREAD = "1 thread"


def export_runner(runtime, artifact_dir, beam, variant, threads=None, batch_size=32, parallel=1):
    """The runner of an export's file, or for "keras" of the training folder it came from, with
    the export's search settings."""
    from kformer.export.formats import open_listed, open_runner
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
            batch_size=batch_size,
        )
    return open_listed(
        artifact_dir,
        runtime,
        variant,
        beam_size=beam,
        batch_size=batch_size,
        threads=threads,
        parallel=parallel,
    )


def _import_runtime(runtime):
    """Imports what the runtime's runner needs, so that memory before the model is loaded can be told
    from the model's own."""
    import importlib

    modules = {
        "onnx": ["onnxruntime"],
        "tflite": ["ai_edge_litert.interpreter"],
        "ctranslate2": ["ctranslate2"],
    }.get(runtime, ["tensorflow", "keras"])
    for module in ["numpy", "sentencepiece", *modules]:
        importlib.import_module(module)


def worker(artifact_dir, runtime, variant, beam, sentences_file, threads=None):
    """Measures one runtime/variant/search in this process; returns a dict (JSON-friendly).
    File: every source of the job through `runner.translate` (sentence splitting, length-sorted
    batches of the job's `batch_size`, detokenizing: what a user's file goes through); batch 1: the first
    `batch1_sentences`, one `translate` call each. Memory: resident MB after the runtime is
    imported, after the model is loaded, and the process's peak."""
    with open(sentences_file, encoding="utf-8") as f:
        job = json.load(f)
    _import_runtime(runtime)
    imported_mb = resident_memory_mb()
    start = time.perf_counter()
    runner = export_runner(
        runtime, artifact_dir, beam, variant, threads, job["batch_size"], job.get("parallel", 1)
    )
    load_seconds = time.perf_counter() - start
    loaded_mb = resident_memory_mb()
    sources, singles = job["sources"], job["sources"][: job["batch1_sentences"]]

    runner.translate(sources[:32])  # warm-up (traces, allocates, prepacks)
    runner.translate(singles[:1])
    t = time.perf_counter()
    hypotheses = runner.translate(sources)
    file_seconds = time.perf_counter() - t
    t = time.perf_counter()
    singles_out = [runner.translate([source])[0] for source in singles]
    batch1_seconds = time.perf_counter() - t
    return {
        "runtime": runtime,
        "variant": variant,
        "search": search_label(beam),
        "batch_size": runner.batch_size,
        "load_s": load_seconds,
        "file_s": file_seconds,
        "file_sentences_per_s": len(sources) / file_seconds,
        "file_output_tokens": sum(len(ids) for ids in runner.tokenizer.encode(hypotheses)),
        "batch1_ms": 1000 * batch1_seconds / len(singles),
        "batch1_output_tokens": statistics.mean(len(ids) for ids in runner.tokenizer.encode(singles_out)),
        "imported_mb": imported_mb,
        "loaded_mb": loaded_mb,
        # At least what was resident when loaded: Linux folds each thread's RSS count into the
        # process's in batches, so a VmHWM read later can be a few pages below an earlier VmRSS.
        "peak_rss_mb": max(peak_memory_mb(), loaded_mb),
        "hypotheses": hypotheses,
    }


def _proc_status_mb(field):
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def resident_memory_mb():
    """This process's resident memory now (VmRSS)."""
    return _proc_status_mb("VmRSS") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def peak_memory_mb():
    """This process's peak resident memory. VmHWM, not getrusage's ru_maxrss: Linux keeps
    ru_maxrss across execve, so a child would report its parent's (TensorFlow-sized) peak."""
    return _proc_status_mb("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _jobs(manifest, runtimes, parallel=1):
    """(runtime, variant) pairs to measure: Keras (the training folder) and every SavedModel, TFLite,
    ONNX and CTranslate2 file of the export; those of `runtimes` only when given; with `parallel`
    > 1, those whose runners take it only."""
    formats = ("savedmodel", "tflite", "onnx", "ctranslate2")
    jobs = [("keras", "fp32")] + sorted(
        {(a["format"], a["variant"]) for a in manifest["artifacts"] if a["format"] in formats}
    )
    if runtimes:
        unknown = set(runtimes) - {runtime for runtime, _ in jobs}
        if unknown:
            raise ValueError(
                f"--runtimes {','.join(sorted(unknown))}: not in this export "
                f"(it has {','.join(sorted({r for r, _ in jobs}))})"
            )
        jobs = [(runtime, variant) for runtime, variant in jobs if runtime in runtimes]
    if parallel > 1:
        from kformer.decode.runner import Runner
        from kformer.export.formats import runs_batches_at_once

        jobs = [(runtime, variant) for runtime, variant in jobs if runs_batches_at_once(runtime, variant)]
        if not jobs:
            raise ValueError(
                f"--parallel {parallel}: none of these runtimes runs batches at once; "
                f"measure {Runner.PARALLEL_RUNTIMES}"
            )
    return jobs


def _settings(runtime, parallel):
    """The settings a runtime is measured with: {name: (its environment, its threads or None for the
    bench's)}, or {None: ({}, None)} for one. CTranslate2: each backend (x86-64), on the bench's
    threads and, with one batch at a time, on one."""
    import platform

    if runtime != "ctranslate2":
        return {None: ({}, None)}
    backends = {None: {}}
    if platform.machine().lower() in ("x86_64", "amd64"):
        backends = {name: {"CT2_USE_MKL": value} for name, value in CT2_BACKENDS.items()}
    settings = {name: (environment, None) for name, environment in backends.items()}
    if parallel == 1:  # with batches at once, each already runs on threads / parallel
        for name, environment in backends.items():
            settings[CT2_ONE_THREAD if name is None else f"{name}, {CT2_ONE_THREAD}"] = (environment, 1)
    return settings


def bench_runtimes(
    artifact_dir,
    sentences=500,
    rounds=3,
    batch1_sentences=100,
    runtimes=None,
    batch_size=32,
    parallel=1,
    progress=print,
):
    """Runs every runtime/variant/search of an export in a subprocess, in `rounds` interleaved
    rounds (every job once per round, so a change in the machine's speed hits all alike); reports
    the median of each timing, the peak memory, and BLEU of the file pass on the first `sentences`
    of the held-out test split of the corpus the model was trained on. Batch 1 is timed over the
    first `batch1_sentences`, one at a time (one alone gives noisy ratios). `batch_size`: the
    file's sentences a runner call takes (`kformer translate --batch-size`). `parallel`: batches a
    runner's translate runs at once (`--parallel`); runtimes that run one at a time are left out."""
    from kformer.evaluate import score, split_references
    from kformer.export.manifest import load as load_manifest

    artifact_dir = os.path.abspath(artifact_dir)  # the workers run in another folder
    manifest = load_manifest(artifact_dir)
    sources, references = split_references(manifest["trained_in"], "test")
    sources, references = sources[:sentences], references[:sentences]
    language = (manifest.get("corpus") or {}).get("direction", "x-en").split("-")[-1]
    jobs = _jobs(manifest, runtimes, parallel)
    # The bytes of a variant's file or folder, for both searches (TFLite, ONNX: a file of each)
    sizes = {(a["format"], a["variant"]): a["bytes"] for a in manifest["artifacts"]}
    with tempfile.TemporaryDirectory() as work:
        batch1_sentences = min(batch1_sentences, len(sources))
        job = {"sources": sources, "batch1_sentences": batch1_sentences, "batch_size": batch_size}
        job_file = _write_job(work, {**job, "parallel": parallel})
        measured = [
            (runtime, variant, backend, environment, threads, beam)
            for runtime, variant in jobs
            for backend, (environment, threads) in _settings(runtime, parallel).items()
            for beam in (1, manifest["beam_size"])
        ]
        runs = {}  # (runtime, variant, backend, beam) -> one result per round
        for number, measure in enumerate(measured * rounds):
            runtime, variant, backend, _, _, beam = measure
            label = variant if backend is None else f"{variant} ({backend})"
            round_ = f"round {number // len(measured) + 1}/{rounds}"
            progress(f"{round_}: {runtime} {label} beam {beam} ...", end=" ", flush=True)
            row = _measured(artifact_dir, measure, job_file, work)
            row["bleu"] = score(row.pop("hypotheses"), references, language)["bleu"]
            row["bytes"] = sizes.get((runtime, variant))  # None for keras: no file of its own
            runs.setdefault((runtime, variant, backend, beam), []).append(row)
            progress(f"file {row['file_sentences_per_s']:.0f} sent/s, {row['batch1_ms']:.1f} ms at b1")
    rows = [_median_row(results) for results in runs.values()]
    _against_ctranslate2(rows)
    return {
        "artifact": artifact_dir,
        "sentences": len(sources),
        "rounds": rounds,
        "batch_size": batch_size,
        "parallel": parallel,
        "batch1_sentences": batch1_sentences,
        "rows": rows,
    }


def _write_job(work, job):
    """The job every worker reads (its sentences and settings), as a file in `work`."""
    path = os.path.join(work, "job.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(job, f)
    return path


def _measured(artifact_dir, measure, job_file, work):
    """One job's row, measured by `worker` in a process of its own (in `work`: a relative export
    folder would not be found there). `measure`: (runtime, variant, backend, environment, threads, beam)."""
    runtime, variant, backend, environment, threads, beam = measure
    out = os.path.join(work, "out.json")
    code = (
        "import json, sys; from kformer.bench.runtimes import worker; "
        "threads = int(sys.argv[6]) if sys.argv[6] else None; "
        f"json.dump(worker(*sys.argv[1:4], int(sys.argv[4]), sys.argv[5], threads), open({out!r}, 'w'))"
    )
    arguments = (artifact_dir, runtime, variant, str(beam), job_file, str(threads or ""))
    try:
        subprocesses.run_python(code, *arguments, cwd=work, env={**os.environ, **environment})
    except subprocesses.Failed as e:
        label = variant if backend is None else f"{variant} ({backend})"
        raise RuntimeError(f"bench of {runtime} {label} failed:\n{e}") from None
    with open(out, encoding="utf-8") as f:
        return {**json.load(f), "backend": backend}


def _median_row(results):
    """One row from a job's rounds: median timings, the highest memory, the rest as measured."""
    row = dict(results[0])
    for key in ("load_s", "file_sentences_per_s", *TIMINGS):
        row[key] = statistics.median(r[key] for r in results)
    for key in ("imported_mb", "loaded_mb", "peak_rss_mb"):
        row[key] = max(r[key] for r in results)
    row["rounds"] = len(results)
    row["per_round"] = {key: [r[key] for r in results] for key in TIMINGS}
    return row


def _against_ctranslate2(rows):
    """Adds each row's time divided by CTranslate2's for the same search, in both cells (the file,
    batch 1), when the export has CTranslate2; each the median of the ratios taken round by round
    (CTranslate2's own timings move by up to 1.6x between processes), with their (min, max):
    "vs_ct2": against the same precision (int8 and int8-ort with int8, the others with fp32);
    "vs_ct2_fastest": against the fastest of CTranslate2's files in that round and cell (its int8
    can be slower than its fp32, by CPU). A file of CTranslate2 measured with several settings
    (`_settings`: backends, threads) takes, in each round and cell, its fastest setting's time."""

    def per_round(row, key):  # a row reduced by _median_row keeps its rounds; a plain row is one round
        return row.get("per_round", {}).get(key, [row[key]])

    def fastest(references):  # {cell: the fastest of `references` in each round}
        return {k: [min(times) for times in zip(*(per_round(c, k) for c in references))] for k in TIMINGS}

    ct2 = [r for r in rows if r["runtime"] == "ctranslate2"]
    for r in rows:
        ours = {key: per_round(r, key) for key in TIMINGS}
        precision = "int8" if quantization(r["variant"]) == "int8" else "fp32"
        same = [c for c in ct2 if c["search"] == r["search"] and c["variant"] == precision]
        references = [c for c in ct2 if c["search"] == r["search"]]
        r["vs_ct2"] = _ratios(ours, fastest(same)) if same else None
        r["vs_ct2_fastest"] = _ratios(ours, fastest(references)) if references else None


def _ratios(ours, theirs):
    """{cell: (median, min, max)} of ours / theirs, round by round."""
    result = {}
    for key in TIMINGS:
        ratios = [a / b for a, b in zip(ours[key], theirs[key])]
        result[key] = (statistics.median(ratios), min(ratios), max(ratios))
    return result


def _cells(ratios):
    return "-" if not ratios else "{:.2f}, {:.2f}".format(*(ratios[k][0] for k in TIMINGS))


def print_table(results):
    print(
        f"file: {results['sentences']} test sentences through translate (length-sorted batches of "
        f"{results['batch_size']} sentences, fewer long ones; TFLite's beam 2 x "
        f"{results['batch_size']} / K; {results.get('parallel', 1)} at once), "
        f"BLEU on them; batch 1: the first {results['batch1_sentences']}, one at a time (out tok: their "
        f"mean output); timings: median of {results['rounds']} interleaved rounds; time / CTranslate2: "
        f"file, batch 1, round by round, against the same precision and against its fastest file, "
        f"each with its fastest setting (backend, threads) in the round"
    )
    print(
        f"{'runtime':>11} {'variant':>11} {'search':>6} {'sent/s':>7} {'ms@b1':>6} {'out tok':>7} "
        f"{'MB':>5} {'import':>6} {'loaded':>6} {'peak':>5} {'BLEU':>6} {'/CT2 same':>10} {'/CT2 best':>10}"
    )
    for r in results["rows"]:
        size = "-" if r["bytes"] is None else f"{r['bytes'] / 1e6:.1f}"
        variant = r["variant"] if r.get("backend") is None else f"{r['variant']} {r['backend']}"
        print(
            f"{r['runtime']:>11} {variant:>11} {r['search']:>6} {r['file_sentences_per_s']:7.0f} "
            f"{r['batch1_ms']:6.1f} {r['batch1_output_tokens']:7.1f} {size:>5} {r['imported_mb']:6.0f} "
            f"{r['loaded_mb']:6.0f} {r['peak_rss_mb']:5.0f} {r['bleu']:6.2f} {_cells(r['vs_ct2']):>10} "
            f"{_cells(r['vs_ct2_fastest']):>10}"
        )


HELP = "every exported runtime against CTranslate2: a file of test sentences and batch 1"


def add_arguments(p):
    p.add_argument("--model", required=True, help="a `kformer export` folder")
    p.add_argument(
        "--sentences", type=positive(int), default=500, help="test sentences translated and scored (500)"
    )
    p.add_argument(
        "--runtimes", help="comma list of those to measure (default: keras, savedmodel and the export's)"
    )
    p.add_argument(
        "--batch-size",
        type=positive(int),
        default=32,
        help="sentences a call of the file's translate takes, as translate's --batch-size (32)",
    )
    p.add_argument(
        "--parallel",
        type=positive(int),
        default=1,
        metavar="N",
        help="batches translated at once, as translate's --parallel (only the runtimes that take it are measured)",
    )
    add_rounds_option(p)


def main(args):
    runtimes = args.runtimes.split(",") if args.runtimes else None
    results = bench_runtimes(
        args.model,
        sentences=args.sentences,
        rounds=args.rounds,
        runtimes=runtimes,
        batch_size=args.batch_size,
        parallel=args.parallel,
    )
    report(results, print_table, args.json)

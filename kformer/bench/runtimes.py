"""`kformer bench runtimes`: every exported runtime and variant on the work users give it, each
measured in its own process on the same sentences: a whole file through the runner's translate
path (length-sorted batches at the runner's default size, as `kformer translate FILE` and the
server run it) and one sentence at a time; speed, size, memory and BLEU, and time against
CTranslate2."""

import dataclasses
import json
import os
import statistics
import tempfile

from kformer import subprocesses
from kformer.arguments import add_rounds_option, positive
from kformer.bench.harness import (
    Stopwatch,
    interleave,
    memory_mb,
    print_table,
    reduced,
    report,
    spread,
)
from kformer.contracts.export import ExportManifest
from kformer.decode.options import SearchOptions, search_label
from kformer.decode.runner import Runner, RunnerSettings
from kformer.export.artifact_format import quantization

TIMINGS = ("file_s", "batch1_ms")  # the two cells each ratio to CTranslate2 is taken in

# CTranslate2's matrix-product backends on x86-64, chosen by CT2_USE_MKL (its default: MKL on Intel
# CPUs, oneDNN on others), and its intra-op threads: the bench's, and one. Any of them can be the slow
# one by a wide margin (docs/benchmarks.md), so each is measured, and CTranslate2's time for a cell
# is its fastest setting's in that round: a ratio against a badly tuned reference says nothing.
CT2_BACKENDS = {"mkl": "1", "dnnl": "0"}
CT2_ONE_THREAD = "1 thread"


@dataclasses.dataclass(frozen=True)
class RuntimesBench:
    """What `bench_runtimes` measures (see it for each option)."""

    sentences: int = 500
    rounds: int = 3
    batch1_sentences: int = 100
    runtimes: list[str] | None = None
    batch_size: int = 32
    parallel: int = 1
    source: str | None = None
    reference: str | None = None


@dataclasses.dataclass(frozen=True)
class WorkerRun:
    """One measurement by `worker` in a process of its own: a runtime's file (`variant`) at `beam`,
    in one of its `_settings`: `backend` (its name, None where a runtime has one setting), the
    `environment` it adds and its `threads` (None: the bench's)."""

    runtime: str
    variant: str
    backend: str
    environment: dict
    threads: int
    beam: int

    @property
    def label(self):
        variant = self.variant if self.backend is None else f"{self.variant} ({self.backend})"
        return f"{self.runtime} {variant} beam {self.beam}"


def export_runner(runtime, artifact_dir, beam, variant, settings=None):
    """The runner of an export's file, or for "keras" of the training folder it came from, with
    the export's search settings; `settings`: a RunnerSettings."""
    from kformer.export.formats import open_listed, open_runner

    if runtime == "keras":  # the training folder the export came from, with the export's settings
        m = ExportManifest.load(artifact_dir)
        return open_runner(
            m.trained_in,
            "keras",
            settings=settings,
            options=SearchOptions(beam, m.alpha, m.max_length, m.no_repeat_ngram),
        )
    return open_listed(artifact_dir, runtime, variant, settings, SearchOptions(beam_size=beam))


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
    imported_mb = memory_mb("VmRSS")
    with Stopwatch() as load:
        runner = export_runner(
            runtime,
            artifact_dir,
            beam,
            variant,
            RunnerSettings(job["batch_size"], threads, job.get("parallel", 1)),
        )
    loaded_mb = memory_mb("VmRSS")
    sources, singles = job["sources"], job["sources"][: job["batch1_sentences"]]

    runner.translate(sources[:32])  # warm-up (traces, allocates, prepacks)
    runner.translate(singles[:1])
    with Stopwatch() as file_pass:
        hypotheses = runner.translate(sources)
    with Stopwatch() as batch1:
        singles_out = [runner.translate([source])[0] for source in singles]
    return {
        "runtime": runtime,
        "variant": variant,
        "search": search_label(beam),
        "batch_size": runner.batch_size,
        "load_s": load.seconds,
        "file_s": file_pass.seconds,
        "file_sentences_per_s": len(sources) / file_pass.seconds,
        "file_output_tokens": sum(len(ids) for ids in runner.tokenizer.encode(hypotheses)),
        "batch1_ms": 1000 * batch1.seconds / len(singles),
        "batch1_output_tokens": statistics.mean(len(ids) for ids in runner.tokenizer.encode(singles_out)),
        "imported_mb": imported_mb,
        "loaded_mb": loaded_mb,
        # At least what was resident when loaded: Linux folds each thread's RSS count into the
        # process's in batches, so a VmHWM read later can be a few pages below an earlier VmRSS.
        "peak_rss_mb": max(memory_mb("VmHWM"), loaded_mb),
        "hypotheses": hypotheses,
    }


def _jobs(manifest, runtimes, parallel=1):
    """(runtime, variant) pairs to measure: Keras (the training folder) and every SavedModel, TFLite,
    ONNX and CTranslate2 file of the export; those of `runtimes` only when given; with `parallel`
    > 1, those whose runners take it only."""
    formats = ("savedmodel", "tflite", "onnx", "ctranslate2")
    jobs = [("keras", "fp32")] + sorted(
        {(a.format, a.variant) for a in manifest.artifacts if a.format in formats}
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


def bench_runtimes(artifact_dir, progress=print, **settings):
    """Runs every runtime/variant/search of an export in a subprocess, in `rounds` interleaved
    rounds (every job once per round, so a change in the machine's speed hits all alike); reports
    the median of each timing, the peak memory, and BLEU of the file pass on the first `sentences`
    of the held-out test split of the corpus the model was trained on, or of the `source` file
    (BLEU only with a `reference` file: an import has no test split). Batch 1 is timed over the
    first `batch1_sentences`, one at a time (one alone gives noisy ratios). `batch_size`: the
    file's sentences a runner call takes (`kformer translate --batch-size`). `parallel`: batches a
    runner's translate runs at once (`--parallel`); runtimes that run one at a time are left out.
    `runtimes`: those measured (default: all, `_jobs`). `settings`: RuntimesBench's fields."""

    from kformer.evaluate import score

    bench = RuntimesBench(**settings)
    artifact_dir = os.path.abspath(artifact_dir)  # the workers run in another folder
    manifest = ExportManifest.load(artifact_dir)
    sources, references = _sentences(manifest, bench)
    language = manifest.pair.target if manifest.pair else "en"
    # The bytes of a variant's file or folder, for both searches (TFLite, ONNX: a file of each)
    sizes = {(a.format, a.variant): a.bytes for a in manifest.artifacts}
    batch1 = min(bench.batch1_sentences, len(sources))
    runs = {run.label: run for run in _worker_runs(manifest, bench)}
    with tempfile.TemporaryDirectory() as work:
        job_file = os.path.join(work, "job.json")  # what every worker reads: its sentences and settings
        with open(job_file, "w", encoding="utf-8") as f:
            job = {"sources": sources, "batch1_sentences": batch1, "batch_size": bench.batch_size}
            json.dump({**job, "parallel": bench.parallel}, f)

        def measure(run, _):
            row = _measured(artifact_dir, run, job_file, work)
            hypotheses = row.pop("hypotheses")
            row["bleu"] = score(hypotheses, references, language)["bleu"] if references else None
            row["bytes"] = sizes.get((run.runtime, run.variant))  # None for keras: no file of its own
            return row

        found = interleave(
            runs,
            bench.rounds,
            measure,
            progress,
            lambda row: f"file {row['file_sentences_per_s']:.0f} sent/s, {row['batch1_ms']:.1f} ms at b1",
        )
    rows = [_median_row(results) for results in found.values()]
    _against_ctranslate2(rows)
    return {
        "artifact": artifact_dir,
        "source": bench.source and os.path.basename(bench.source),
        "sentences": len(sources),
        "rounds": bench.rounds,
        "batch_size": bench.batch_size,
        "parallel": bench.parallel,
        "batch1_sentences": batch1,
        "rows": rows,
    }


def _sentences(manifest, bench):
    """(sources, references or None): the first `sentences` lines of the bench's `source` file
    (and `reference`) where given, else of the held-out test split of the model's corpus."""
    from kformer.data import corpus as corpus_lib
    from kformer.evaluate import file_references, split_references

    if bench.reference is not None and bench.source is None:
        raise ValueError("--reference needs --source")
    if bench.source is None:
        found = split_references(manifest.trained_in, "test")
    elif bench.reference is None:
        found = corpus_lib.read_text_file(bench.source), None
    else:
        found = file_references(bench.source, bench.reference)
    sources, references = (None if f is None else f[: bench.sentences] for f in found)
    if not sources:
        raise ValueError(f"nothing to translate: {bench.source or 'the test split'} is empty")
    return sources, references


def _worker_runs(manifest, bench):
    """The measurements of a round: every file of `_jobs`, in each of its `_settings`, at both
    searches (greedy and the export's beam)."""
    return [
        WorkerRun(runtime, variant, backend, environment, threads, beam)
        for runtime, variant in _jobs(manifest, bench.runtimes, bench.parallel)
        for backend, (environment, threads) in _settings(runtime, bench.parallel).items()
        for beam in (1, manifest.beam_size)
    ]


def _measured(artifact_dir, run, job_file, work):
    """A WorkerRun's row, measured by `worker` in a process of its own (in `work`: a relative export
    folder would not be found there)."""
    out = os.path.join(work, "out.json")
    code = (
        "import json, sys; from kformer.bench.runtimes import worker; "
        "threads = int(sys.argv[6]) if sys.argv[6] else None; "
        f"json.dump(worker(*sys.argv[1:4], int(sys.argv[4]), sys.argv[5], threads), open({out!r}, 'w'))"
    )
    arguments = (artifact_dir, run.runtime, run.variant, str(run.beam), job_file, str(run.threads or ""))
    try:
        subprocesses.run_python(code, *arguments, cwd=work, env={**os.environ, **run.environment})
    except subprocesses.Failed as e:
        raise RuntimeError(f"bench of {run.label} failed:\n{e}") from None
    with open(out, encoding="utf-8") as f:
        return {**json.load(f), "backend": run.backend}


def _median_row(results):
    """One row from a job's rounds: median timings, the highest memory, the rest as measured."""
    medians, peaks = ("load_s", "file_sentences_per_s", *TIMINGS), ("imported_mb", "loaded_mb", "peak_rss_mb")
    row = reduced(results, medians, peaks)
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

    def against(row, references):  # {cell: spread of row over the fastest of `references` in each round}
        if not references:
            return None
        fastest = {k: [min(times) for times in zip(*(per_round(c, k) for c in references))] for k in TIMINGS}
        return {k: spread(per_round(row, k), fastest[k]) for k in TIMINGS}

    ct2 = [r for r in rows if r["runtime"] == "ctranslate2"]
    for r in rows:
        precision = "int8" if quantization(r["variant"]) == "int8" else "fp32"
        r["vs_ct2"] = against(r, [c for c in ct2 if c["search"] == r["search"] and c["variant"] == precision])
        r["vs_ct2_fastest"] = against(r, [c for c in ct2 if c["search"] == r["search"]])


def _cells(ratios):
    return "-" if not ratios else "{:.2f}, {:.2f}".format(*(ratios[k][0] for k in TIMINGS))


def print_runtimes_table(results):
    title = (
        f"file: {results['sentences']} {results.get('source') or 'test'} sentences through translate "
        "(length-sorted batches of "
        f"{results['batch_size']} sentences, fewer long ones; TFLite's beam 2 x "
        f"{results['batch_size']} / K; {results.get('parallel', 1)} at once), "
        f"BLEU on them (with references); batch 1: the first {results['batch1_sentences']}, one at a time "
        "(out tok: their "
        f"mean output); timings: median of {results['rounds']} interleaved rounds; time / CTranslate2: "
        f"file, batch 1, round by round, against the same precision and against its fastest file, "
        f"each with its fastest setting (backend, threads) in the round"
    )
    columns = [
        ("runtime", ">11", "runtime"),
        (
            "variant",
            ">11",
            lambda r: r["variant"] if r.get("backend") is None else f"{r['variant']} {r['backend']}",
        ),
        ("search", ">6", "search"),
        ("sent/s", "7.0f", "file_sentences_per_s"),
        ("ms@b1", "6.1f", "batch1_ms"),
        ("out tok", "7.1f", "batch1_output_tokens"),
        ("MB", ">5", lambda r: "-" if r["bytes"] is None else f"{r['bytes'] / 1e6:.1f}"),
        ("import", "6.0f", "imported_mb"),
        ("loaded", "6.0f", "loaded_mb"),
        ("peak", "5.0f", "peak_rss_mb"),
        ("BLEU", ">6", lambda r: "-" if r["bleu"] is None else f"{r['bleu']:.2f}"),
        ("/CT2 same", ">10", lambda r: _cells(r["vs_ct2"])),
        ("/CT2 best", ">10", lambda r: _cells(r["vs_ct2_fastest"])),
    ]
    print_table(columns, results["rows"], title=title)


HELP = "every exported runtime against CTranslate2: a file of test sentences and batch 1"


def add_arguments(p):
    p.add_argument("--model", required=True, help="a `kformer export` folder")
    p.add_argument(
        "--sentences",
        type=positive(int),
        default=RuntimesBench.sentences,
        help=f"test sentences translated and scored ({RuntimesBench.sentences})",
    )
    p.add_argument(
        "--runtimes", help="comma list of those to measure (default: keras, savedmodel and the export's)"
    )
    p.add_argument(
        "--batch-size",
        type=positive(int),
        default=RuntimesBench.batch_size,
        help="sentences a call of the file's translate takes, as translate's --batch-size "
        f"({RuntimesBench.batch_size})",
    )
    p.add_argument(
        "--parallel",
        type=positive(int),
        default=RuntimesBench.parallel,
        metavar="N",
        help="batches translated at once, as translate's --parallel (only the runtimes that take it are measured)",
    )
    p.add_argument(
        "--source", help="translate this file's lines (one sentence each) instead of the test split"
    )
    p.add_argument("--reference", help="their reference translations, one a line, for BLEU (with --source)")
    add_rounds_option(p)


def main(args):
    report(
        bench_runtimes(
            args.model,
            sentences=args.sentences,
            rounds=args.rounds,
            runtimes=args.runtimes.split(",") if args.runtimes else None,
            batch_size=args.batch_size,
            parallel=args.parallel,
            source=args.source,
            reference=args.reference,
        ),
        print_runtimes_table,
        args.json,
    )

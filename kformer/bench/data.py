"""`kformer bench data`: the large-corpus path (`kformer prepare`, then `kformer train` on the
prepared folder) on a synthetic corpus of N pairs, each step in a process of its own, measured
from outside: its wall time and its peak resident memory (the kernel's count, wait4's ru_maxrss).

The synthetic corpus: the default corpus's pairs once each, then pairs that each join 2 or 3
distinct random pairs of it (sources to sources, targets to targets, in the same order; English
joined by a space, Chinese by nothing). Joins of 2 or 3 of 56k pairs repeat rarely; `prepare`
removes the repeats and the table gives the distinct pairs it kept. Every file is deleted after
measuring."""

import gzip
import json
import logging
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from kformer.arguments import positive
from kformer.bench.harness import print_table, report, waited
from kformer.contracts.prepared import PreparedCorpus
from kformer.data import corpus as corpus_lib
from kformer.model.config import DEFAULT_PRESET, PRESETS
from kformer.train.distributed import local_cluster

log = logging.getLogger("kformer")

JOINED = (2, 3)  # how many default-corpus pairs a synthetic pair joins

# Trains `steps` steps (a resumed run: to `steps` in all) and reports, from this process's start:
# when fit began, when its first step ended, the steps/s after it; then reads the same batch
# stream alone (a fresh iterator, as a resumed run's) to time the input pipeline without training.
PROBE = r"""
import json, sys, time
started = time.monotonic()
import keras
from kformer.train.fit import start
from kformer.train.options import TrainOptions
out, data, config_name, steps, pipeline_batches = sys.argv[1:6]

class Clock(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.begin, self.ends = time.monotonic(), []
    def on_train_batch_end(self, batch, logs=None):
        self.ends.append(time.monotonic())

clock = Clock()
run = start(out, TrainOptions(config_name, data=data, steps=int(steps), callbacks=(clock,), verbose=0))
try:
    run.finish(run.model.fit(**run.fit_args))
finally:
    run.release()
ends = clock.ends
report = {"resumed_from": run.steps, "to_fit": clock.begin - started, "to_first_step": ends[0] - started,
          "steps_per_s": (len(ends) - 1) / (ends[-1] - ends[0]) if len(ends) > 1 else None}
if int(pipeline_batches):
    batches = iter(run.fit_args["x"])
    first = time.monotonic()
    next(batches)
    report["pipeline_first_batch_s"] = time.monotonic() - first
    for _ in range(20):  # past the shuffle buffer's first fill
        next(batches)
    begin = time.monotonic()
    for _ in range(int(pipeline_batches)):
        next(batches)
    report["pipeline_batches_per_s"] = int(pipeline_batches) / (time.monotonic() - begin)
print(json.dumps(report))
"""


def synthetic_corpus(path, pairs, base=None, seed=0, direction=corpus_lib.DEFAULT_DIRECTION):
    """Writes `pairs` synthetic pairs (see the module doc) made of the (source, target) pairs
    `base` (default: the default corpus's) to a gzipped TSV at `path`."""
    pair, base = corpus_lib.parse_pair(direction), base or corpus_lib.read_corpus(direction=direction)[0]
    rng = np.random.default_rng(seed)
    source_joiner, target_joiner = ("" if side == "zh" else " " for side in (pair.source, pair.target))
    started = time.monotonic()
    with gzip.open(path, "wt", encoding="utf-8", compresslevel=1) as f:
        for source, target in base[:pairs]:
            f.write(f"{source}\t{target}\n")
        written = min(pairs, len(base))
        while written < pairs:
            block = min(pairs - written, 100_000)
            sizes = rng.choice(JOINED, size=block)
            picks = rng.integers(0, len(base), size=(block, max(JOINED)))
            lines = []
            for size, row in zip(sizes, picks):
                chosen = [base[i] for i in dict.fromkeys(row[:size].tolist())]
                lines.append(
                    source_joiner.join(s for s, _ in chosen)
                    + "\t"
                    + target_joiner.join(t for _, t in chosen)
                    + "\n"
                )
            f.write("".join(lines))
            written += block
            rate = written / (time.monotonic() - started)
            log.info(
                "synthetic corpus: %d of %d pairs, %.0f pairs/s, ETA %.0f s",
                written,
                pairs,
                rate,
                (pairs - written) / rate,
            )
    return written


def measured(argv, environments=(None,)):
    """Runs argv once in each of `environments` (None: this process's), all at once; -> [(seconds
    until it ended, peak resident MB, stdout)], a process each. Raises with the end of a failed
    one's stderr."""
    started, files = (
        time.monotonic(),
        [(tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")) for _ in environments],
    )
    processes = [
        subprocess.Popen(argv, stdout=out, stderr=err, env=env)
        for env, (out, err) in zip(environments, files)
    ]
    found = []
    for process, (out, err) in zip(processes, files):
        code, peak = waited(process)
        seconds = time.monotonic() - started
        out.seek(0), err.seek(0)
        if code:
            raise RuntimeError(f"{' '.join(argv[:4])}... failed: {err.read()[-2000:]}")
        found.append((seconds, peak, out.read()))
    return found


def _cli(*args):
    return [sys.executable, "-m", "kformer.cli", *args]


def _probe(out, data, config, steps, pipeline_batches=0):
    # As `kformer train` runs: TensorFlow quiet (oneDNN's kernels: this process's setting,
    # kformer/__init__.py).
    env = {"TF_CPP_MIN_LOG_LEVEL": "3", **os.environ}
    [(seconds, peak, stdout)] = measured(
        [sys.executable, "-c", PROBE, out, data, config, str(steps), str(pipeline_batches)], [env]
    )
    return {**json.loads(stdout.strip().splitlines()[-1]), "seconds": seconds, "peak_mb": peak}


def _two_workers(prepared, out, config, steps):
    """Peak resident MB of each worker of a two-worker local cluster training `steps` steps."""
    argv = _cli(
        "train",
        "--config",
        config,
        "--data",
        prepared,
        "--out",
        out,
        "--steps",
        str(steps),
        "--strategy",
        "multi-worker",
    )
    return [peak for _, peak, _ in measured(argv, [{**os.environ, **env} for env in local_cluster(2)])]


def bench_size(pairs, work=None, config="small", many_steps=2000, pipeline_batches=1000, base=None):
    """The measurements at one corpus size (a synthetic corpus of `base`'s pairs), in a folder of
    `work` deleted afterwards."""
    with tempfile.TemporaryDirectory(
        prefix=f"kformer-bench-data-{pairs}-", dir=work, ignore_cleanup_errors=True
    ) as folder:
        corpus = os.path.join(folder, "pairs.tsv.gz")
        synthetic_corpus(corpus, pairs, base)
        corpus_mb = os.path.getsize(corpus) / 2**20
        prepared = os.path.join(folder, "prepared")
        log.info("bench data: kformer prepare, %d pairs", pairs)
        [(seconds, peak, _)] = measured(_cli("prepare", "--data", corpus, "--out", prepared))
        os.remove(corpus)
        manifest = PreparedCorpus.load(prepared)
        result = {
            "pairs": pairs,
            "corpus_gz_mb": corpus_mb,
            "distinct": manifest.read["pairs"],
            "train_pairs": manifest.pairs["train"],
            "prepare_s": seconds,
            "prepare_peak_mb": peak,
            "bytes_per_pair": manifest.bytes_per_pair,
        }
        log.info("bench data: kformer train (%s) on the prepared corpus", config)
        result["train"] = _probe(os.path.join(folder, "run"), prepared, config, 20, pipeline_batches)
        for name, steps in (("few", 20), ("many", many_steps)):  # tiny: many steps in little time
            log.info("bench data: %d steps of tiny, then a resume", steps)
            run = os.path.join(folder, f"tiny-{name}")
            result[f"trained_{name}"] = _probe(run, prepared, "tiny", steps)
            result[f"resume_{name}"] = _probe(run, prepared, "tiny", steps + 5)
        log.info("bench data: two workers")
        result["worker_peak_mb"] = _two_workers(prepared, os.path.join(folder, "two"), config, 20)
        return result


def bench_data(sizes=(1_000_000,), config="small", work=None):
    """The measurements for each corpus size (`bench_size`)."""
    return {"config": config, "sizes": [bench_size(n, work, config) for n in sizes]}


def print_data_table(results):
    columns = [
        ("pairs", ">11,", "pairs"),
        ("distinct", ">11,", "distinct"),
        ("prepare", ">9", lambda r: f"{r['prepare_s']:.0f}s"),
        ("peak", ">7", lambda r: f"{r['prepare_peak_mb'] / 1024:.2f}G"),
        ("B/pair", ">7.0f", "bytes_per_pair"),
        ("to step 1", ">10", lambda r: f"{r['train']['to_first_step']:.1f}s"),
        ("train peak", ">11", lambda r: f"{r['train']['peak_mb'] / 1024:.2f}G"),
        ("pipeline", ">9", lambda r: f"{r['train']['pipeline_batches_per_s']:.0f}/s"),
        ("step", ">7", lambda r: f"{r['train']['steps_per_s']:.1f}/s"),
        ("ratio", ">6", lambda r: f"{r['train']['pipeline_batches_per_s'] / r['train']['steps_per_s']:.0f}x"),
        ("resume@few", ">11", lambda r: f"{r['resume_few']['to_first_step']:.1f}s"),
        ("resume@many", ">12", lambda r: f"{r['resume_many']['to_first_step']:.1f}s"),
        ("2 workers", ">12", lambda r: "/".join(f"{m / 1024:.2f}" for m in r["worker_peak_mb"]) + "G"),
    ]
    print_table(
        columns,
        results["sizes"],
        title=f"data bench: synthetic corpora, training config {results['config']}; peak = resident memory",
    )


HELP = "prepare and training input on synthetic corpora of millions of pairs: time and memory"


def add_arguments(p):
    p.add_argument("--config", default=DEFAULT_PRESET, choices=sorted(PRESETS))
    p.add_argument(
        "--pairs",
        type=positive(int),
        nargs="+",
        default=[1_000_000],
        help="corpus sizes (pairs), one row each",
    )
    p.add_argument("--work", help="where the synthetic corpora are written, then deleted (default: temp)")


def main(args):
    report(bench_data(args.pairs, args.config, args.work), print_data_table, args.json)

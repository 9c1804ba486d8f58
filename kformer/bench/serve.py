"""`kformer bench serve`: `kformer serve` (a subprocess, on loopback) under N concurrent clients,
next to the runner's own batch-32 throughput measured in this process in the same rounds.

Each client (a thread with one keep-alive connection) sends one test sentence per LibreTranslate
request and waits for the answer, for `seconds` per level. Then two checks of the targets:
`mixed` sends good and bad bodies from 32 clients and compares every good answer with the
runner's own translation (resident memory after warm-up and at the end), and `overload` sends
bigger requests from many clients to a server whose queue holds less than they ask.
"""

import collections
import concurrent.futures
import dataclasses
import functools
import http.client
import json
import os
import random
import re
import statistics
import subprocess
import sys
import threading
import time

from kformer.arguments import add_rounds_option, positive
from kformer.bench.harness import Stopwatch, interleave, memory_mb, print_table, reduced, report, spread

CLIENT_LEVELS = (1, 8, 32, 128)
BAD_BODIES = [  # (body, content type): each must get a 4xx
    (b'{"q": "x", "source": "zh"', "application/json"),
    (b'{"source": "zh", "target": "en"}', "application/json"),
    (b'{"q": 3, "source": "zh", "target": "en"}', "application/json"),
    (b'{"q": "\xff", "source": "zh", "target": "en"}', "application/json"),
    (b"q=%FF&source=zh&target=en", "application/x-www-form-urlencoded"),
    (b'{"q": "x", "source": "zh", "target": "xx"}', "application/json"),
]


class Server:
    """`kformer serve` in a subprocess on a free port, until close()."""

    def __init__(self, artifact_dir, threads, *options):
        command = [sys.executable, "-m", "kformer.cli", "serve", "--model", artifact_dir, "--port", "0"]
        command += [*(["--threads", str(threads)] if threads else []), *options]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        for line in self.process.stdout:
            if found := re.search(r"http://127\.0\.0\.1:(\d+)/", line):
                self.port = int(found.group(1))
                return
        raise RuntimeError(f"kformer serve exited ({self.process.wait()}) before serving")

    def close(self):
        self.process.terminate()
        self.process.wait(timeout=60)


class _Client(http.client.HTTPConnection):
    """One keep-alive connection to the server: post() -> (status, body); status 0 when no answer
    came (the connection is then closed, and http.client opens it again for the next request)."""

    def __init__(self, port, timeout=120):
        super().__init__("127.0.0.1", port, timeout=timeout)

    def post(self, body, content_type):
        try:
            self.request("POST", "/translate", body, {"Content-Type": content_type})
            response = self.getresponse()
            return response.status, response.read()
        except (OSError, http.client.HTTPException):
            self.close()
            return 0, b""


def _lt_body(texts):
    return json.dumps({"q": texts, "source": "zh", "target": "en"}).encode()


def load_level(port, bodies, clients, seconds):
    """`clients` threads send bodies (cycled) for `seconds`: {sentences_per_s, p50_ms, p99_ms,
    refused, errors, requests}. bodies: (body, content type, sentences in it)."""
    stop = time.monotonic() + seconds

    def client(offset):  # (status, seconds, sentences) of each of its requests; status 0: no answer
        connection, answers, i = _Client(port), [], offset
        while time.monotonic() < stop:
            body, kind, sentences = bodies[i % len(bodies)]
            with Stopwatch() as watch:
                status, _ = connection.post(body, kind)
            answers.append((status, watch.seconds, sentences))
            i += clients
        connection.close()
        return answers

    with Stopwatch() as elapsed, concurrent.futures.ThreadPoolExecutor(clients) as pool:
        answers = [answer for found in pool.map(client, range(clients)) for answer in found]
    latencies = sorted(s for status, s, _ in answers if status == 200)
    errors = collections.Counter(status for status, _, _ in answers if status != 200)

    def percentile(p):
        return (
            1000 * latencies[min(len(latencies) - 1, int(p * len(latencies)))] if latencies else float("nan")
        )

    refused = errors.pop(503, 0)
    return {
        "sentences_per_s": sum(n for status, _, n in answers if status == 200) / elapsed.seconds,
        "p50_ms": percentile(0.5),
        "p99_ms": percentile(0.99),
        "refused": refused,
        "errors": sum(errors.values()),
        "requests": len(answers),
    }


def runner_throughput(runner, sources, seconds, batch=32):
    """Sentences/s of runner.translate on `batch` test sentences a call, for about `seconds`."""
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        runner.translate([sources[(done + i) % len(sources)] for i in range(batch)])
        done += batch
    return done / (time.perf_counter() - start)


def mixed(server, runner, sources, requests, bad_share=0.2, clients=32, seed=0):
    """`requests` single-sentence requests, a `bad_share` of them bad, from `clients` threads: every
    good answer compared with the runner's own translation (default options, as the server's)."""
    rng = random.Random(seed)
    plan = [
        ("bad", rng.choice(BAD_BODIES)) if rng.random() < bad_share else ("good", rng.choice(sources))
        for _ in range(requests)
    ]
    expected = dict(zip(sources, runner.translate(sources)))
    outcome = {"good_ok": 0, "good_wrong": 0, "bad_4xx": 0, "bad_other": 0}
    lock, warm = threading.Lock(), {}

    def client(offset):
        connection = _Client(server.port)
        for i in range(offset, requests, clients):
            kind, item = plan[i]
            body, content_type = (_lt_body(item), "application/json") if kind == "good" else item
            status, raw = connection.post(body, content_type)
            if kind == "good":
                right = status == 200 and json.loads(raw)["translatedText"] == expected[item]
                key = "good_ok" if right else "good_wrong"
            else:
                key = "bad_4xx" if 400 <= status < 500 else "bad_other"
            with lock:
                outcome[key] += 1
                if sum(outcome.values()) == requests // 2:
                    warm["rss_mb"] = memory_mb("VmRSS", server.process.pid)
        connection.close()

    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))
    return {
        **outcome,
        "requests": requests,
        "rss_half_mb": warm.get("rss_mb"),
        "rss_end_mb": memory_mb("VmRSS", server.process.pid),
    }


@dataclasses.dataclass(frozen=True)
class ServeBench:
    """What `bench_serve` measures (see it for each option)."""

    sentences: int = 200
    rounds: int = 2
    seconds: float = 10.0
    requests: int = 10_000
    threads: int | None = None
    parallel: int = 1


def overload(artifact_dir, bench, sources, clients=256, queue_chars=2_000):
    """Clients of requests of up to 10 sentences against a queue of `queue_chars`; then one request alone."""
    server = Server(
        artifact_dir, bench.threads, "--max-queue-chars", str(queue_chars), "--parallel", str(bench.parallel)
    )
    try:
        chunks = [sources[i : i + 10] for i in range(0, len(sources), 10)]  # the last may be shorter
        bodies = [(_lt_body(chunk), "application/json", len(chunk)) for chunk in chunks]
        level = load_level(server.port, bodies, clients, bench.seconds)
        with Stopwatch() as after:
            status, _ = _Client(server.port, timeout=60).post(_lt_body(sources[0]), "application/json")
        level.update(after_status=status, after_ms=1000 * after.seconds, clients=clients)
        return level
    finally:
        server.close()


def bench_serve(artifact_dir, progress=print, **settings):
    """`kformer serve` under load against its runner alone (onnxruntime fp32, batches of 32 and of
    1, one at a time), at several numbers of clients, in interleaved rounds; a mixed good/bad
    check; overload. `settings`: ServeBench's fields (`parallel`: the server's `--parallel`)."""
    from kformer.decode.runner import RunnerSettings
    from kformer.evaluate import split_references
    from kformer.export.formats import open_runner

    bench = ServeBench(**settings)
    artifact_dir = os.path.abspath(artifact_dir)
    sources = split_references(artifact_dir, "test")[0][: bench.sentences]  # the run's test split
    runner = open_runner(artifact_dir, "onnx", "fp32", RunnerSettings(threads=bench.threads))
    server = Server(artifact_dir, bench.threads, "--parallel", str(bench.parallel))
    try:
        found = _rounds(server, runner, sources, bench, progress)
        progress(f"mixed: {bench.requests} requests ...", flush=True)
        mixed_result = mixed(server, runner, sources, bench.requests)
        peak_mb = memory_mb("VmHWM", server.process.pid)
    finally:
        server.close()
    progress("overload ...", flush=True)
    return {
        **_levels(found),
        "server_peak_mb": peak_mb,
        "mixed": mixed_result,
        "overload": overload(artifact_dir, bench, sources),
        "rounds": bench.rounds,
        "seconds": bench.seconds,
        "sentences": len(sources),
        "threads": bench.threads or os.cpu_count(),
        "parallel": bench.parallel,
    }


def _rounds(server, runner, sources, bench, progress):
    """{variant: its measurement ({"sentences_per_s", ...}) in each round}: the runner alone on
    batches of 32 and of 1, and the server under each of CLIENT_LEVELS, interleaved."""
    bodies = [(_lt_body(s), "application/json", 1) for s in sources]

    def alone(batch):
        return {"sentences_per_s": runner_throughput(runner, sources, bench.seconds, batch)}

    variants = {
        "runner batch 32": functools.partial(alone, 32),
        "runner batch 1": functools.partial(alone, 1),
        **{
            f"{n} clients": functools.partial(load_level, server.port, bodies, n, bench.seconds)
            for n in CLIENT_LEVELS
        },
    }
    return interleave(variants, bench.rounds, lambda measure, _: measure(), progress)


def _levels(found):
    """The results of the rounds: each level's medians; the runner's speeds; each level's speed
    over the runner's (batch 32) and over one client's, the median of the ratios round by round."""
    baseline = [r["sentences_per_s"] for r in found["runner batch 32"]]
    levels = {n: found[f"{n} clients"] for n in CLIENT_LEVELS}
    speeds = {n: [r["sentences_per_s"] for r in runs] for n, runs in levels.items()}
    return {
        "levels": {n: reduced(runs, medians=runs[0]) for n, runs in levels.items()},
        "runner_batch32": statistics.median(baseline),
        "runner_batch1": statistics.median(r["sentences_per_s"] for r in found["runner batch 1"]),
        "x_runner": {n: spread(runs, baseline)[0] for n, runs in speeds.items()},
        "x_one_client": {n: spread(runs, speeds[1])[0] for n, runs in speeds.items()},
        "runner_per_round": baseline,
        "per_round": levels,
    }


def print_serve_table(results):
    columns = [
        ("clients", ">7", "clients"),
        ("sent/s", "8.1f", "sentences_per_s"),
        ("x runner b32", "12.2f", lambda r: results["x_runner"][r["clients"]]),
        ("x 1 client", "10.2f", lambda r: results["x_one_client"][r["clients"]]),
        ("p50 ms", "8.1f", "p50_ms"),
        ("p99 ms", "8.1f", "p99_ms"),
        ("errors", "6g", "errors"),
    ]
    print_table(
        columns,
        [{"clients": n, **row} for n, row in results["levels"].items()],
        title=f"kformer serve --parallel {results.get('parallel', 1)}, LibreTranslate API, one test sentence "
        f"a request; {results['seconds']:g} s a level, median of {results['rounds']} interleaved rounds "
        f"(ratios: of the per-round ratios); runner batch 32: {results['runner_batch32']:.1f}, batch 1: "
        f"{results['runner_batch1']:.1f} sentences/s",
    )
    m, o = results["mixed"], results["overload"]
    print(f"server peak memory {results['server_peak_mb']:.0f} MB")
    print(
        f"mixed: {m['requests']} requests: good answered right {m['good_ok']}, wrong/failed {m['good_wrong']}; "
        f"bad 4xx {m['bad_4xx']}, other {m['bad_other']}; RSS {m['rss_half_mb']:.0f} MB after half, "
        f"{m['rss_end_mb']:.0f} MB at the end"
    )
    print(
        f"overload: {o['clients']} clients of requests of up to 10 sentences, queue 2,000 characters: {o['requests']} "
        f"requests, {o['refused']} refused (503), {o['errors']} other errors, "
        f"admitted p50 {o['p50_ms']:.0f} ms p99 {o['p99_ms']:.0f} ms; "
        f"then one request: {o['after_status']} in {o['after_ms']:.0f} ms"
    )


HELP = "kformer serve under load, against the runner alone; bad requests and overload"


def add_arguments(p):
    p.add_argument("--model", required=True, help="a `kformer export` folder with ONNX files")
    p.add_argument(
        "--sentences",
        type=positive(int),
        default=ServeBench.sentences,
        help=f"test sentences the clients send ({ServeBench.sentences})",
    )
    p.add_argument(
        "--requests",
        type=positive(int),
        default=ServeBench.requests,
        help="requests of the mixed good/bad check",
    )
    p.add_argument(
        "--parallel",
        type=positive(int),
        default=ServeBench.parallel,
        metavar="N",
        help=f"the server's --parallel ({ServeBench.parallel})",
    )
    add_rounds_option(p)


def main(args):
    report(
        bench_serve(
            args.model,
            sentences=args.sentences,
            rounds=args.rounds,
            requests=args.requests,
            parallel=args.parallel,
        ),
        print_serve_table,
        args.json,
    )

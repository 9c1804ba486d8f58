"""`kformer bench web`: the web page (headless Chromium, WASM) against onnxruntime and LiteRT in
Python, on the same export and sentences."""

import contextlib
import os
import statistics
import time

from kformer.arguments import add_rounds_option, positive
from kformer.bench.harness import report
from kformer.model.config import search_label

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
    from kformer.evaluate import split_references
    from kformer.export import web
    from kformer.export.manifest import load as load_manifest

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
            shot = screenshot if number == 0 and threads > 1 and (runtime, variant) == variants[0] else None
            seconds = _time_page(
                browser, artifact_dir, (runtime, variant, threads), sources, beams, runs, loads, shot
            )
            progress(f"loaded in {seconds:.1f} s")
    return {
        "artifact": artifact_dir,
        "sentences": len(sources),
        "rounds": rounds,
        "rows": _rows(loads, runs, beams),
    }


def _time_page(browser, artifact_dir, job, sources, beams, runs, loads, screenshot=None):
    """One round of one (runtime, variant, threads): the page's first load, then each sentence in
    the page and in Python, alternately per search; adds to `runs` and `loads`. Returns the load
    time in seconds."""
    from kformer.export import web
    from kformer.export.formats import open_listed
    from kformer.serve.server import serving_page

    runtime, variant, threads = job
    with serving_page(artifact_dir, runtime, variant) as url:
        context = browser.new_context()  # an empty cache: the load is a first visit
        page = context.new_page()
        page.goto(f"{url}&threads={threads}")
        seconds = page.evaluate("window.kformer.ready.then(() => performance.now() / 1000)")
        loads.setdefault(job, []).append((seconds, page.evaluate(PAGE_BYTES_JS)))
        for beam in beams:
            runner = open_listed(
                artifact_dir, web.PAGE_RUNTIMES[runtime][0], variant, beam_size=beam, threads=threads
            )
            runner.translate(sources[:1])  # warm-up, as the page's first call below
            page.evaluate(TIME_EACH_SENTENCE_JS, [sources[:1], beam])
            runs.setdefault((*job, beam, "page"), []).extend(
                page.evaluate(TIME_EACH_SENTENCE_JS, [sources, beam])
            )
            python = runs.setdefault((*job, beam, "python"), [])
            for line in sources:
                start = time.perf_counter()
                runner.translate([line])
                python.append(1000 * (time.perf_counter() - start))
        if screenshot:
            page.click("#translate")
            page.wait_for_function("document.getElementById('output').textContent.length > 0")
            page.screenshot(path=screenshot)
        context.close()
    return seconds


def _rows(loads, runs, beams):
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
    return rows


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


HELP = "the page in headless Chromium against the same files in Python"


def add_arguments(p):
    p.add_argument("--model", required=True, help="a `kformer export` folder with ONNX files")
    p.add_argument(
        "--sentences", type=positive(int), default=200, help="test sentences timed one by one (200)"
    )
    p.add_argument("--screenshot", help="save a picture of the page here (PNG)")
    add_rounds_option(p)


def main(args):
    results = bench_web(args.model, sentences=args.sentences, rounds=args.rounds, screenshot=args.screenshot)
    report(results, print_web_table, args.json)

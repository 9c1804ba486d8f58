"""`kformer bench web`: the web page (headless Chromium, WASM) against onnxruntime and LiteRT in
Python, on the same export and sentences."""

import contextlib
import os
import statistics

from kformer.arguments import add_rounds_option, positive
from kformer.bench.harness import Stopwatch, interleave, print_table, report
from kformer.contracts.export import ExportManifest
from kformer.decode.options import SearchOptions, search_label
from kformer.decode.runner import RunnerSettings
from kformer.export.page import PAGE_RUNTIMES, chromium

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

    manifest = ExportManifest.load(artifact_dir)
    sources = split_references(manifest.trained_in, "test")[0][:sentences]
    present = {(a.format, a.variant) for a in manifest.artifacts}
    jobs = {
        f"{runtime} {variant}, {threads} thread(s)": (runtime, variant, threads)
        for runtime, (fmt, names) in PAGE_RUNTIMES.items()
        for variant in names
        if (fmt, variant) in present
        for threads in sorted({1, os.cpu_count() or 1})
    }
    beams = (1, manifest.beam_size)
    shot = next((job for job in jobs.values() if job[2] > 1), None)  # the first variant, all cores
    with contextlib.nullcontext(browser) if browser else chromium() as browser:

        def measure(job, number):
            picture = screenshot if number == 0 and job == shot else None
            return _time_page(browser, artifact_dir, job, sources, beams, picture)

        found = interleave(jobs, rounds, measure, progress, lambda m: f"loaded in {m['load_s']:.1f} s")
    return {
        "artifact": artifact_dir,
        "sentences": len(sources),
        "rounds": rounds,
        "rows": _rows(jobs, found, beams),
    }


def _time_page(browser, artifact_dir, job, sources, beams, screenshot=None):
    """One round of one (runtime, variant, threads): the page's first load, then each sentence in
    the page and in Python, alternately per search: {"load_s", "bytes", (beam, "page" or
    "python"): ms of each sentence}."""
    from kformer.export.formats import open_listed
    from kformer.serve.server import serving_page

    runtime, variant, threads = job
    with serving_page(artifact_dir, runtime, variant) as url:
        context = browser.new_context()  # an empty cache: the load is a first visit
        page = context.new_page()
        page.goto(f"{url}&threads={threads}")
        found = {
            "load_s": page.evaluate("window.kformer.ready.then(() => performance.now() / 1000)"),
            "bytes": page.evaluate(PAGE_BYTES_JS),
        }
        for beam in beams:
            runner = open_listed(
                artifact_dir,
                PAGE_RUNTIMES[runtime][0],
                variant,
                RunnerSettings(threads=threads),
                SearchOptions(beam_size=beam),
            )
            runner.translate(sources[:1])  # warm-up, as the page's first call below
            page.evaluate(TIME_EACH_SENTENCE_JS, [sources[:1], beam])
            found[beam, "page"] = page.evaluate(TIME_EACH_SENTENCE_JS, [sources, beam])
            python = found[beam, "python"] = []  # ms of each sentence
            for line in sources:
                with Stopwatch() as watch:
                    runner.translate([line])
                python.append(1000 * watch.seconds)
        if screenshot:
            page.click("#translate")
            page.wait_for_function("document.getElementById('output').textContent.length > 0")
            page.screenshot(path=screenshot)
        context.close()
    return found


def _rows(jobs, found, beams):
    """A row a job and search: the medians over every sentence of every round."""
    rows = []
    for label, (runtime, variant, threads) in jobs.items():
        measured = found[label]
        for beam in beams:
            page_ms, python_ms = (
                statistics.median(ms for m in measured for ms in m[beam, side]) for side in ("page", "python")
            )
            rows.append(
                {
                    "runtime": runtime,
                    "variant": variant,
                    "threads": threads,
                    "search": search_label(beam),
                    "page_ms": page_ms,
                    "python_ms": python_ms,
                    "ratio": page_ms / python_ms,
                    "load_s": statistics.median(m["load_s"] for m in measured),
                    "page_bytes": measured[0]["bytes"],
                }
            )
    return rows


def print_web_table(results):
    columns = [
        ("runtime", ">7", "runtime"),
        ("variant", ">7", "variant"),
        ("threads", "7d", "threads"),
        ("search", ">6", "search"),
        ("page ms", "8.1f", "page_ms"),
        ("python ms", "9.1f", "python_ms"),
        ("page/python", "11.2f", "ratio"),
        ("load s", "6.1f", "load_s"),
        ("MB loaded", "9.1f", lambda r: r["page_bytes"] / 1e6),
    ]
    print_table(
        columns,
        results["rows"],
        title=f"median ms per sentence (batch 1) over {results['sentences']} test sentences x "
        f"{results['rounds']} interleaved rounds; page: headless Chromium, WASM (onnx: onnxruntime-web, "
        "litert: LiteRT.js); python: onnxruntime or LiteRT on the same file",
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
    report(
        bench_web(args.model, sentences=args.sentences, rounds=args.rounds, screenshot=args.screenshot),
        print_web_table,
        args.json,
    )

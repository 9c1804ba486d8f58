"""The page of export/web/ that translates in the browser; `kformer serve` serves it.

The page runs the exported search graphs with onnxruntime-web (ONNX files) or LiteRT.js (the
fixed-shape TFLite file), both WASM; see export/web/kformer.js. Its routes: / (the page), /ort/ and
/litert/, /litert-utils/ (the runtimes' files from npm), /model/ (the export folder's manifest
and the files it lists, `served_files`); each
response carries the cross-origin isolation headers that WASM threads need (kformer.serve.app)."""

import contextlib
import os

from kformer.contracts.export import ExportManifest
from kformer.contracts.tokenizer import TOKENIZER_JSON
from kformer.data import vocabulary as vocabulary_lib

WEB_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "web")
NODE_MODULES = os.path.join(WEB_DIR, "node_modules")
ROUTES = {
    "/ort/": os.path.join(NODE_MODULES, "onnxruntime-web", "dist"),
    "/litert/": os.path.join(NODE_MODULES, "@litertjs", "core"),
    "/litert-utils/": os.path.join(NODE_MODULES, "@litertjs", "wasm-utils", "dist"),
}
PAGE_FILES = ("index.html", "kformer.js", "sentencepiece.js", "sentences.js", "vocabulary.js")
# runtime in the page -> (export format, variants it can run)
PAGE_RUNTIMES = {
    "onnx": ("onnx", ("fp32", "int8")),
    "litert": ("tflite", ("fixed-text", "fixed", "int8-fixed", "fp16-fixed")),
}
CHROMIUM = "/usr/bin/chromium"  # Debian's package: Playwright's own browser download is not reachable here
# Headless, as root, on a machine with a closed network: without the last four flags Chromium keeps
# trying to reach Google's hosts.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
]


def check(artifact_dir, runtime="onnx", variant="fp32"):
    """One-line errors for what would make the page fail: no JavaScript packages, no files for
    the runtime and variant."""
    if runtime not in PAGE_RUNTIMES:
        raise ValueError(f"--runtime {runtime}: the page runs {' or '.join(PAGE_RUNTIMES)}")
    fmt, variants = PAGE_RUNTIMES[runtime]
    if variant not in variants:
        raise ValueError(f"--variant {variant}: the page runs {runtime} with {' or '.join(variants)}")
    missing = [folder for folder in ROUTES.values() if not os.path.isdir(folder)]
    if missing:
        raise ValueError(
            f"{missing[0]} not found: install the page's packages with `npm ci --prefix {WEB_DIR}` "
            "(the README's commands do it)"
        )
    manifest = ExportManifest.load(artifact_dir)
    manifest.artifact(fmt, variant)  # the page loads its files itself, checking each
    return manifest


def default_variant(artifact_dir, runtime):
    """The variant the page runs for `runtime` when none is asked for: the first of
    PAGE_RUNTIMES' that the export has (LiteRT.js: the fixed-text file, else the fixed one)."""
    return _first_present(_listed(artifact_dir), runtime) or PAGE_RUNTIMES[runtime][1][0]


def queries(artifact_dir):
    """The page's URL query for each runtime the export has a file of ("?runtime=onnx&variant=fp32",
    "?runtime=litert&variant=fixed-text"), in the order of PAGE_RUNTIMES: [] for none."""
    listed = _listed(artifact_dir)
    found = {runtime: _first_present(listed, runtime) for runtime in PAGE_RUNTIMES}
    return [f"?runtime={runtime}&variant={variant}" for runtime, variant in found.items() if variant]


def _listed(artifact_dir):
    """{(format, variant)} of the files an export's manifest lists."""
    return {(a.format, a.variant) for a in ExportManifest.load(artifact_dir).artifacts}


def _first_present(listed, runtime):
    fmt, variants = PAGE_RUNTIMES[runtime]
    return next((v for v in variants if (fmt, v) in listed), None)


def served_files(artifact_dir, manifest):
    """{path in the folder: its path here} of the files an export's `manifest` (ExportManifest)
    lists, the files inside a listed folder included: what the server serves of the folder, and
    all it serves besides the manifest (never another file put there, nor a link)."""
    found, folder = {}, os.path.realpath(artifact_dir)
    for file in [entry.file for entry in manifest.entries()] + _tokenizer_parts(artifact_dir, manifest):
        path = os.path.join(artifact_dir, file)
        inside = (
            [path]
            if os.path.isfile(path)
            else [os.path.join(d, f) for d, _, files in os.walk(path) for f in files]
        )
        for inner in inside:
            real = os.path.realpath(inner)  # a listed folder may itself be a link out of the export
            if os.path.isfile(inner) and os.path.commonpath([real, folder]) == folder:
                found[os.path.relpath(inner, artifact_dir).replace(os.sep, "/")] = inner
    return found


def _tokenizer_parts(artifact_dir, manifest):
    """The files an imported model's tokenizer.json names (its source and target SentencePiece
    models and vocabulary; the page checks each against tokenizer.json's sha256), else none."""
    if manifest.tokenizer.file != TOKENIZER_JSON:
        return []
    return [file for file in vocabulary_lib.files(artifact_dir) if file != TOKENIZER_JSON]


@contextlib.contextmanager
def chromium():
    """A headless Chromium driven by Playwright (for the tests and `kformer bench web`)."""
    from playwright.sync_api import sync_playwright

    if not os.path.exists(CHROMIUM):
        raise ValueError(f"{CHROMIUM} not found: install Debian's chromium package (make test does)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()

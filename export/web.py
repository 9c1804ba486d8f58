"""`kformer web`: serves the page of export/web/ and one export folder on 127.0.0.1.

The page runs the exported search graphs with onnxruntime-web (ONNX files) or LiteRT.js (the
fixed-shape TFLite file), both WASM; see export/web/kformer.js. Routes: / (the page), /ort/ and
/litert/, /litert-utils/ (the runtimes' files from npm), /model/ (the export folder). Every
response carries the cross-origin isolation headers that WASM threads need."""

import contextlib
import functools
import http.server
import os
import posixpath
import urllib.parse

from kformer.export.manifest import find_artifact, load

WEB_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "web")
NODE_MODULES = os.path.join(WEB_DIR, "node_modules")
ROUTES = {
    "/ort/": os.path.join(NODE_MODULES, "onnxruntime-web", "dist"),
    "/litert/": os.path.join(NODE_MODULES, "@litertjs", "core"),
    "/litert-utils/": os.path.join(NODE_MODULES, "@litertjs", "wasm-utils", "dist"),
}
PAGE_FILES = ("index.html", "kformer.js", "sentencepiece.js", "sentences.js")
# runtime in the page -> (export format, variants it can run)
PAGE_RUNTIMES = {"onnx": ("onnx", ("fp32", "int8")), "litert": ("tflite", ("fixed",))}
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
    manifest = load(artifact_dir)
    find_artifact(manifest, fmt, variant)  # the page loads one file for both searches
    return manifest


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Maps the three routes to folders; nothing outside them is served."""

    extensions_map = {
        **http.server.SimpleHTTPRequestHandler.extensions_map,
        ".js": "text/javascript",
        ".mjs": "text/javascript",
        ".wasm": "application/wasm",
        ".json": "application/json",
    }

    def __init__(self, *args, model_dir, **kwargs):
        self.model_dir = model_dir
        super().__init__(*args, directory=WEB_DIR, **kwargs)

    def translate_path(self, path):
        path = posixpath.normpath(urllib.parse.unquote(urllib.parse.urlsplit(path).path))
        for prefix, root in (*ROUTES.items(), ("/model/", self.model_dir)):
            if path.startswith(prefix):
                return os.path.join(root, *path[len(prefix) :].split("/"))
        name = path.lstrip("/") or "index.html"
        return os.path.join(WEB_DIR, name) if name in PAGE_FILES else ""  # "": 404

    def list_directory(self, path):
        self.send_error(404)

    def end_headers(self):
        self.send_header("Cross-Origin-Opener-Policy", "same-origin")
        self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        self.send_header("Cross-Origin-Resource-Policy", "same-origin")
        self.send_header("Cache-Control", "no-cache")
        super().end_headers()

    def log_message(self, *args):
        pass  # one line per file would bury the URL


def serve(artifact_dir, port=8000, runtime="onnx", variant=None):
    """Starts the server (call `serve_forever()` on it); port 0 picks a free one. Returns
    (server, url of the page). variant: default fp32 for onnx, fixed for litert."""
    if variant is None and runtime in PAGE_RUNTIMES:
        variant = PAGE_RUNTIMES[runtime][1][0]
    check(artifact_dir, runtime, variant)
    handler = functools.partial(_Handler, model_dir=os.path.abspath(artifact_dir))
    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    except OSError as e:
        raise OSError(f"cannot serve on 127.0.0.1:{port} ({e.strerror}); choose another --port") from None
    return server, f"http://127.0.0.1:{server.server_address[1]}/?runtime={runtime}&variant={variant}"


@contextlib.contextmanager
def serving(artifact_dir, runtime="onnx", variant=None):
    """The server on a free port, in a thread, for as long as the block runs; yields the page's URL."""
    import threading

    server, url = serve(artifact_dir, 0, runtime, variant)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield url
    finally:
        server.shutdown()
        server.server_close()


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

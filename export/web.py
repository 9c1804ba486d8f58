"""`kformer web`: serves the page of export/web/ and one export folder on 127.0.0.1.

The page runs the exported ONNX search graph with onnxruntime-web (WASM); see export/web/kformer.js.
Routes: / (the page), /ort/ (onnxruntime-web's files from npm), /model/ (the export folder). Every
response carries the cross-origin isolation headers that WASM threads need."""

import contextlib
import functools
import http.server
import os
import posixpath
import urllib.parse

from export.runtime import find_artifact, load_manifest

WEB_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "web")
ORT_DIR = os.path.join(WEB_DIR, "node_modules", "onnxruntime-web", "dist")
PAGE_FILES = ("index.html", "kformer.js", "sentencepiece.js")
VARIANTS = ("fp32", "int8")
CHROMIUM = "/usr/bin/chromium"  # Debian's package: Playwright's own browser download is not reachable here
# Headless, as root, on a machine with a closed network: without the last four flags Chromium keeps
# trying to reach Google's hosts.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-quic"]


def check(artifact_dir, variant):
    """One-line errors for what would make the page fail: no onnxruntime-web, no ONNX files."""
    if variant not in VARIANTS:
        raise ValueError(f"--variant {variant}: the page runs {' or '.join(VARIANTS)}")
    if not os.path.isdir(ORT_DIR):
        raise ValueError(f"{ORT_DIR} not found: install the page's packages with `npm ci --prefix {WEB_DIR}` "
                         "(the README's commands do it)")
    manifest = load_manifest(artifact_dir)
    for search in ("greedy", "beam"):
        find_artifact(manifest, "onnx", search, variant)
    return manifest


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Maps the three routes to folders; nothing outside them is served."""

    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map,
                      ".js": "text/javascript", ".mjs": "text/javascript", ".wasm": "application/wasm",
                      ".json": "application/json"}

    def __init__(self, *args, model_dir, **kwargs):
        self.model_dir = model_dir
        super().__init__(*args, directory=WEB_DIR, **kwargs)

    def translate_path(self, path):
        path = posixpath.normpath(urllib.parse.unquote(urllib.parse.urlsplit(path).path))
        for prefix, root in (("/ort/", ORT_DIR), ("/model/", self.model_dir)):
            if path.startswith(prefix):
                return os.path.join(root, *path[len(prefix):].split("/"))
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


def serve(artifact_dir, port=8000, variant="fp32"):
    """Starts the server (call `serve_forever()` on it); port 0 picks a free one. Returns
    (server, url of the page)."""
    check(artifact_dir, variant)
    handler = functools.partial(_Handler, model_dir=os.path.abspath(artifact_dir))
    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    except OSError as e:
        raise OSError(f"cannot serve on 127.0.0.1:{port} ({e.strerror}); choose another --port") from None
    return server, f"http://127.0.0.1:{server.server_address[1]}/?variant={variant}"


@contextlib.contextmanager
def serving(artifact_dir, variant="fp32"):
    """The server on a free port, in a thread, for as long as the block runs; yields the page's URL."""
    import threading

    server, url = serve(artifact_dir, 0, variant)
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

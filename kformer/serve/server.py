"""`kformer serve`: the app of app.py on uvicorn, after the model is loaded and has translated a
probe sentence (so that /health answers only for a model that works).

uvicorn stops on SIGTERM or Ctrl-C as a service should: it stops accepting connections, lets
the requests in flight finish (within GRACEFUL_SECONDS), then the batcher stops."""

import contextlib
import ipaddress
import logging
import os
import socket
import threading

import uvicorn

from kformer.contracts.export import MANIFEST_FILE, ExportManifest
from kformer.export import page
from kformer.export.formats import open_runner
from kformer.serve import connections
from kformer.serve.app import create_app, page_app
from kformer.serve.settings import SERVED_RUNTIMES, Settings

log = logging.getLogger("kformer")
GRACEFUL_SECONDS = 30
PROBE = "你好。"


def load(model, runtime=None, variant="fp32", settings=None, options=None):
    """The runner of an export folder (a RunnerSettings and SearchOptions as open_runner's;
    `settings.parallel`: batches the server runs at once, kformer.serve.batcher), checked by
    translating a probe sentence. runtime None: `default_runtime`'s."""
    runtime = runtime or default_runtime(model, variant)
    if runtime not in SERVED_RUNTIMES:
        raise ValueError(f"--runtime {runtime}: the server runs an export with onnx, tflite or ctranslate2")
    runner = open_runner(model, runtime, variant, settings, options)
    runner.translations([PROBE])
    return runner


def export_folders(paths):
    """The export folders of --model paths: each path, or a folder of exports' folders in order
    of name. A duplicate language pair or a folder without one is a one-line error naming it."""
    folders = []
    for path in paths:
        inside = sorted(os.path.join(path, name) for name in os.listdir(path)) if os.path.isdir(path) else []
        exports = [f for f in inside if os.path.exists(os.path.join(f, MANIFEST_FILE))]
        has_own = os.path.exists(os.path.join(path, MANIFEST_FILE))
        folders += [path] if has_own or not exports else exports
    served = {}
    for folder in folders:
        pair = ExportManifest.load(folder).pair  # a one-line ArtifactError for what is not an export
        if pair is None:
            raise ValueError(f"--model {folder}: its manifest records no language pair")
        if pair in served:
            raise ValueError(
                f"--model {folder} translates {pair}, as --model {served[pair]} does: one model a pair"
            )
        served[pair] = folder
    return folders


def default_runtime(model, variant):
    """The first of SERVED_RUNTIMES whose format has `variant` in the export `model`; onnx where
    none has (its runner then says what the export lacks)."""
    listed = {(a.format, a.variant) for a in ExportManifest.load(model).artifacts}
    return next((runtime for runtime in SERVED_RUNTIMES if (runtime, variant) in listed), SERVED_RUNTIMES[0])


def load_models(paths, runtime=None, variant="fp32", settings=None, options=None):
    """(runners, the resident bytes each one's loading and probe added) of the exports of
    `paths` (`export_folders`), each loaded as `load` does. A model that fails to load names itself."""
    runners, sizes = [], []
    for folder in export_folders(paths):
        before = _resident_bytes()
        try:
            runners.append(load(folder, runtime, variant, settings, options))
        except (ValueError, OSError) as e:
            raise ValueError(f"--model {folder}: {e}") from None
        sizes.append(None if before is None else max(0, _resident_bytes() - before))
    return runners, sizes


def _resident_bytes():
    """This process's resident memory (Linux), or None."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None


def bind(host, port):
    """A listening socket, or a one-line error for a taken port or an unknown address."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto named: asyncio turns Nagle's algorithm off only on sockets that say they are TCP; with
    # it on, a response's headers and body (two writes) waited for the client's delayed ACK
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise OSError(
            f"cannot serve on {host}:{port} ({e.strerror}); choose another --host or --port"
        ) from None
    sock.listen(2048)
    return sock


def is_loopback(host):
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _server(app):
    """uvicorn serving `app` with its connection settings (app.state.settings, a Settings)."""
    settings = app.state.settings
    return uvicorn.Server(
        uvicorn.Config(
            app,
            http=connections.protocol(settings.timeout_headers, settings.timeout_body),
            log_level="warning",
            access_log=False,
            timeout_keep_alive=settings.timeout_keep_alive,
            timeout_graceful_shutdown=GRACEFUL_SECONDS,
            limit_concurrency=settings.limit_concurrency,
            lifespan="on",
        )
    )


def serve(runners, host="127.0.0.1", port=8000, settings=None, ready=print, resident_bytes=None):
    """Serves `runners` (`create_app`) until SIGTERM or Ctrl-C. ready(url) is called once the
    socket is listening."""
    settings = settings or Settings()
    if not is_loopback(host) and settings.api_key is None:
        log.warning("serving on %s without --api-key: anyone who can reach it can use it", host)
    sock = bind(host, port)
    server = _server(create_app(runners, settings, resident_bytes))
    shown = f"[{host}]" if ":" in host else host
    ready(f"http://{shown}:{sock.getsockname()[1]}/")
    # uvicorn raises Ctrl-C again once it has shut down gracefully
    with contextlib.suppress(KeyboardInterrupt):
        server.run(sockets=[sock])


@contextlib.contextmanager
def serving(app):
    """An app (`create_app`, `page_app`) on a free loopback port, in a thread, for as long as the
    block runs; yields its URL (tests, benchmarks, the page's browser checks)."""
    sock = bind("127.0.0.1", 0)
    server = _server(app)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started and thread.is_alive():
        threading.Event().wait(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/"
    finally:
        server.should_exit = True
        thread.join()
        sock.close()


@contextlib.contextmanager
def serving_page(artifact_dir, runtime="onnx", variant=None):
    """The page of kformer.export.page and the export folder as `kformer serve` serves them (no model loaded: the page
    checks the files itself), on a free loopback port, in a thread, for as long as the block runs;
    yields the page's URL for `runtime` and `variant` (default: page.default_variant's)."""
    if variant is None and runtime in page.PAGE_RUNTIMES:
        variant = page.default_variant(artifact_dir, runtime)
    page.check(artifact_dir, runtime, variant)
    with serving(page_app(os.path.abspath(artifact_dir))) as url:
        yield f"{url}?runtime={runtime}&variant={variant}"

"""The server's routes (Starlette), on one runner of an export folder:

  POST /v1/translate            kformer's JSON API (kformer_api.py)
  POST /translate, POST /detect, GET /languages
                                LibreTranslate's API (libretranslate.py)
  GET  /health                  200 once the model is loaded and has translated its probe
  GET  /metrics                 Prometheus text format (metrics.py)
  GET  /                        the page that translates in the browser (export/web), with /model/
                                (the export folder) and the runtimes' files

Bad requests get a 4xx with {"error": message} (LibreTranslate's shape; kformer's API adds
"field"); a full queue a 503 with Retry-After; the server goes on serving. With an API key set,
the translation routes need it (LibreTranslate's api_key field, or `Authorization: Bearer KEY`).
"""

import asyncio
import contextlib
import hmac
import logging
import os
import time

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from kformer.export import manifest as manifest_lib
from kformer.export import web
from kformer.serve import kformer_api, libretranslate
from kformer.serve.batcher import Batcher, QueueFull
from kformer.serve.metrics import Metrics
from kformer.serve.requests import BadRequest, fields, read_body
from kformer.serve.settings import Settings

log = logging.getLogger("kformer")


class ClientGone(Exception):
    """The client disconnected before its translation was ready."""


class Service:
    """The runner, its batcher and metrics, and the request handlers."""

    def __init__(self, runner, settings):
        self.runner, self.settings = runner, settings
        self.source = manifest_lib.source_language(runner.manifest) or "und"
        self.target = manifest_lib.target_language(runner.manifest)
        self.metrics = Metrics(lambda: (self.batcher.queued_requests, self.batcher.queued_chars))
        self.batcher = Batcher(
            runner, settings.batch_size, settings.window, settings.max_queue_chars, self.metrics.observe_batch
        )

    def check_key(self, request, values=None):
        key = self.settings.api_key
        if key is None:
            return
        given = (values or {}).get("api_key") or ""
        bearer = request.headers.get("authorization", "")
        if bearer.lower().startswith("bearer "):
            given = given or bearer[7:].strip()
        if not isinstance(given, str) or not hmac.compare_digest(given.encode(), key.encode()):
            raise BadRequest("Invalid API key", 403)

    async def translations(self, request, texts, changes):
        """Translations of texts (a list of str) with search option changes, through the batcher."""
        chars = sum(map(len, texts))
        if chars > self.settings.max_chars:
            raise BadRequest(
                f"Invalid request: the texts have {chars:,} characters, more than the limit "
                f"{self.settings.max_chars:,} of a request",
                413,
            )
        try:
            options = self.runner.checked(self.runner.options, **changes)
        except ValueError as e:  # names the option
            raise BadRequest(str(e)) from None
        return await _unless_disconnected(request, self.batcher.submit(texts, options))

    async def kformer_translate(self, request):
        body = await read_body(request, self.settings.max_body_bytes)
        self.check_key(request)
        texts, changes = kformer_api.parse(body)
        return kformer_api.respond(await self.translations(request, texts, changes))

    async def lt_translate(self, request):
        values = fields(request, await read_body(request, self.settings.max_body_bytes))
        self.check_key(request, values)
        parsed = libretranslate.parse(values, self.source, self.target, self.runner.manifest["beam_size"])
        results = await self.translations(request, parsed.texts, {"nbest": parsed.alternatives + 1})
        return libretranslate.respond(parsed, results, self.runner.tokenizer, self.source)

    async def lt_detect(self, request):
        values = fields(request, await read_body(request, self.settings.max_body_bytes))
        self.check_key(request, values)
        if not isinstance(values.get("q"), str) or not values["q"]:
            raise BadRequest("Invalid request: missing q parameter", field="q")
        return [libretranslate.detected(values["q"], self.runner.tokenizer, self.source)]

    async def languages(self, request):
        return libretranslate.languages(self.source, self.target)

    async def health(self, request):
        return {"status": "ready", "direction": f"{self.source}-{self.target}", "runtime": self.runner.fmt,
                "variant": self.runner.variant, "beam_size": self.runner.manifest["beam_size"]}  # fmt: skip

    async def metrics_text(self, request):
        body, media_type = self.metrics.text()
        return Response(body, media_type=media_type)


async def _disconnect(receive):
    while (await receive())["type"] != "http.disconnect":
        pass


async def _unless_disconnected(request, future):
    """The future's result; if the client leaves first, the future is cancelled (a request still
    queued is then never run) and ClientGone raised."""
    waiter = asyncio.wrap_future(future)
    watcher = asyncio.ensure_future(_disconnect(request.receive))
    await asyncio.wait({waiter, watcher}, return_when=asyncio.FIRST_COMPLETED)
    if waiter.done():
        watcher.cancel()
        return waiter.result()
    # Cancelled here, not through `waiter`: wrap_future passes a cancel on in a loop callback, which
    # may run after the 499 is recorded and the batcher has started the request.
    future.cancel()
    waiter.cancel()
    raise ClientGone


def _route(service, name, handler, methods):
    """A route whose handler returns JSON (or a Response); errors become their status codes."""

    async def endpoint(request):
        start = time.perf_counter()
        try:
            result = await handler(request)
            response = result if isinstance(result, Response) else JSONResponse(result)
        except BadRequest as e:
            body = {"error": str(e)} | ({"field": e.field} if e.field and name.startswith("/v1") else {})
            response = JSONResponse(body, e.status)
        except QueueFull as e:
            response = JSONResponse({"error": str(e)}, 503, headers={"Retry-After": str(e.retry_after)})
        except ClientGone:
            response = Response(status_code=499)  # nginx's code; nobody reads it
        except Exception as e:  # noqa: BLE001 -- one request fails, the server goes on
            log.exception("%s failed", name)
            response = JSONResponse({"error": f"Cannot translate text: {e}"}, 500)
        service.metrics.observe_request(name, response.status_code, time.perf_counter() - start)
        return response

    return Route(name, endpoint, methods=methods)


class _PageHeaders:
    """ASGI middleware: the cross-origin isolation headers that the page's WASM threads need, on
    the page's files only (an API answer with them could not be read by other sites' pages)."""

    PREFIXES = ("/model/", *web.ROUTES)
    HEADERS = [(b"cross-origin-opener-policy", b"same-origin"), (b"cross-origin-embedder-policy", b"require-corp"),
               (b"cross-origin-resource-policy", b"same-origin"), (b"cache-control", b"no-cache")]  # fmt: skip

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "")
        if scope["type"] != "http" or not (
            path.lstrip("/") in ("", *web.PAGE_FILES) or path.startswith(self.PREFIXES)
        ):
            return await self.app(scope, receive, send)

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *self.HEADERS]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _page_routes(artifact_dir):
    """The page's routes, when its JavaScript packages are installed (else none, with a note)."""
    missing = [folder for folder in web.ROUTES.values() if not os.path.isdir(folder)]
    if missing:
        log.warning(
            "%s not found: the page is not served (`npm ci --prefix %s` installs it)", missing[0], web.WEB_DIR
        )
        return []
    files = [
        Route("/" + ("" if name == "index.html" else name), _file(os.path.join(web.WEB_DIR, name)))
        for name in web.PAGE_FILES
    ]
    mounts = [
        Mount(prefix.rstrip("/"), StaticFiles(directory=folder)) for prefix, folder in web.ROUTES.items()
    ]
    return [*files, *mounts, Mount("/model", StaticFiles(directory=artifact_dir))]


def _file(path):
    async def endpoint(request):
        return FileResponse(path, media_type="text/javascript" if path.endswith(".js") else None)

    return endpoint


PAGE_MIDDLEWARE = [Middleware(_PageHeaders)]


def page_app(artifact_dir):
    """The page and an export folder alone, with no model loaded: the page checks the files itself
    (the browser tests, `kformer bench web`)."""
    return Starlette(routes=_page_routes(artifact_dir), middleware=PAGE_MIDDLEWARE)


def create_app(runner, settings=None):
    """The Starlette app serving `runner` (an ArtifactRunner); the batcher stops with the app."""
    service = Service(runner, settings or Settings())
    routes = [
        _route(service, "/v1/translate", service.kformer_translate, ["POST"]),
        _route(service, "/translate", service.lt_translate, ["POST"]),
        _route(service, "/detect", service.lt_detect, ["POST"]),
        _route(service, "/languages", service.languages, ["GET", "POST"]),
        _route(service, "/health", service.health, ["GET"]),
        _route(service, "/metrics", service.metrics_text, ["GET"]),
        *_page_routes(runner.artifact_dir),
    ]
    middleware = [Middleware(CORSMiddleware, allow_origins=["*"], allow_methods=["GET", "POST"], allow_headers=["*"]),
                  *PAGE_MIDDLEWARE]  # fmt: skip

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        await asyncio.to_thread(service.batcher.close)

    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan)
    app.state.service = service
    return app

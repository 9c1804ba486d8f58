"""The server's routes (Starlette), on the runners of one or more export folders, a language pair
each (requests are routed by their source and target):

  POST /v1/translate            kformer's JSON API (kformer_api.py)
  POST /translate, POST /detect, GET /languages
                                LibreTranslate's API (libretranslate.py)
  GET  /frontend/settings       LibreTranslate's server settings (its limits, the first pair)
  GET  /health                  200 once every model is loaded and has translated its probe
  GET  /metrics                 Prometheus text format (metrics.py)
  GET  /                        the page that translates in the browser (export/web), with the
                                runtimes' files, /models/<source>-<target>/ (each pair's export
                                folder) and /model/ (the first pair's)

Bad requests get a 4xx with {"error": message} (LibreTranslate's shape; kformer's API adds
"field"); a full queue a 503 with Retry-After, a client over its requests per minute a 429 with
Retry-After (kformer.serve.limits); the server goes on serving. With an API key set, the
translation routes need it (LibreTranslate's api_key field, or `Authorization: Bearer KEY`).
"""

import asyncio
import concurrent.futures
import contextlib
import hmac
import logging
import os
import time

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from kformer.contracts.export import MANIFEST_FILE, ExportManifest
from kformer.contracts.pair import language_name
from kformer.decode.options import SearchOptions
from kformer.decode.text_batches import Hypothesis, Translation
from kformer.export import page
from kformer.serve import connections, cost, detect, html, kformer_api, libretranslate
from kformer.serve.batcher import Batcher, QueueFull
from kformer.serve.limits import RateLimiter, TooManyRequests
from kformer.serve.metrics import Metrics
from kformer.serve.requests import BadRequest, ClientGone, fields, read_body
from kformer.serve.settings import Settings

log = logging.getLogger("kformer")


class Model:
    """One served export: its runner, its language pair, its own batcher (batching stays per
    model) and the memory its loading took (None: not measured)."""

    def __init__(self, runner, settings, observe_batch, resident_bytes=None):
        self.runner, self.resident_bytes = runner, resident_bytes
        pair = runner.manifest.pair
        self.source, self.target = ("und", None) if pair is None else (pair.source, pair.target)
        self.pair = f"{self.source}-{self.target}"
        self.batcher = Batcher(
            runner, settings.batch_size, settings.window, settings.max_queue_chars, observe_batch
        )

    def describe(self):
        return {"direction": self.pair, "runtime": self.runner.fmt, "variant": self.runner.variant,
                "beam_size": self.runner.manifest.beam_size}  # fmt: skip


class Service:
    """The served models by language pair, the metrics, and the request handlers."""

    def __init__(self, runners, settings, resident_bytes=None):
        self.settings = settings
        self.metrics = Metrics(self.queued)
        self.limiter = RateLimiter()
        # One thread reads and writes web pages: parsing holds the interpreter, and more threads
        # at it would only take more of it from the event loop.
        self.page_thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kformer-html")
        self.page_chars = 0  # characters of markup in or waiting for the page thread (the loop's)
        self.models = {}
        for runner, size in zip(runners, resident_bytes or [None] * len(runners)):
            model = Model(runner, settings, self.metrics.observe_batch, size)
            if model.pair in self.models:
                model.batcher.close()
                raise ValueError(
                    f"{runner.artifact_dir} translates {model.pair}, as "
                    f"{self.models[model.pair].runner.artifact_dir} does: serve one model a pair"
                )
            self.models[model.pair] = model
        self.metrics.watch_memory({pair: m.resident_bytes for pair, m in self.models.items()})

    def queued(self):
        """(requests, characters) waiting, over every model's queue."""
        batchers = [m.batcher for m in self.models.values()]
        return sum(b.queued_requests for b in batchers), sum(b.queued_chars for b in batchers)

    def close(self):
        for model in self.models.values():
            model.batcher.close()
        self.page_thread.shutdown()

    def sources(self, target=None):
        """The served source languages (into `target`, if given), in the order served."""
        return list(dict.fromkeys(m.source for m in self.models.values() if target in (None, m.target)))

    def model(self, source, target, texts=()):
        """The model of the pair; source "auto": of the served source into `target` that
        kformer.serve.detect finds in `texts`. A pair not served is a 400 naming the field."""
        if source == "auto":
            sources = self.sources(target)
            if not sources:
                raise BadRequest(f"{target} is not supported", field="target")
            source = detect.detect(" ".join(texts), sources)[0]["language"]
        if f"{source}-{target}" in self.models:
            return self.models[f"{source}-{target}"]
        if source not in self.sources():
            raise BadRequest(f"{source} is not supported", field="source")
        raise BadRequest(f"{target} is not supported", field="target")

    def admit(self, request, values=None):
        """Checks the API key where one is needed (403) and counts the request against its
        client's limit (429): the client is its key where the keys file lists it, else its address."""
        given = (values or {}).get("api_key") or ""
        bearer = _header_text(request.headers.get("authorization", ""))
        if bearer.lower().startswith("bearer "):
            given = given or bearer[7:].strip()
        if not isinstance(given, str):
            raise BadRequest("Invalid API key", 403)
        key, keys = self.settings.api_key, self.settings.api_keys
        if key is not None and not hmac.compare_digest(given.encode(), key.encode()):
            raise BadRequest("Invalid API key", 403)
        client, limit = f"address {request.client.host if request.client else ''}", self.settings.req_limit
        if keys is not None and given:
            if given not in keys:
                raise BadRequest("Invalid API key", 403)
            client, limit = f"key {given}", keys[given] or self.settings.req_limit
        self.limiter.admit(client, limit)

    async def frontend_settings(self, request):
        """GET /frontend/settings: what LibreTranslate's page and clients read of a server."""
        first = next(iter(self.models.values()))
        return {
            "charLimit": self.settings.max_chars,
            "frontendTimeout": 500,
            "apiKeys": self.settings.api_keys is not None or self.settings.api_key is not None,
            "keyRequired": self.settings.api_key is not None,
            "suggestions": False,
            "filesTranslation": False,
            "supportedFilesFormat": [],
            "language": {
                "source": {"code": first.source, "name": language_name(first.source)},
                "target": {"code": first.target, "name": language_name(first.target)},
            },
        }

    async def translations(self, request, model, texts, changes, charged=None):
        """Translations of texts (a list of str) by `model` with search option changes, through
        its batcher; `charged`: what the request counts against its limit and the queue's
        (default: kformer.serve.cost's charge of the texts)."""
        limit = self.settings.max_chars
        charged = cost.request_cost(texts, limit) if charged is None else charged
        if charged > limit:
            raise BadRequest(
                f"Invalid request: the texts count as {charged:,} characters, more than the limit "
                f"{limit:,} of a request (a sentence counts as at least {cost.SENTENCE_FLOOR})",
                413,
            )
        options = _checked_options(model.runner, changes)
        return await _unless_disconnected(request, model.batcher.submit(texts, options, charged))

    async def pages(self, request, model, pages, changes):
        """format html: the texts of all `pages` (kformer.serve.html: sentences with their marked
        words, lone text nodes) through `model`'s batcher as one request, each page rebuilt around
        its translations; a Translation a page, scored by the sum of its texts' scores. Pages are
        read and written in a thread of their own, never on the event loop, and one too long to
        be read at the request's limit is refused before it is."""
        if _checked_options(model.runner, changes).nbest > 1:
            raise BadRequest(
                "Invalid request: alternatives are not given for format html", field="alternatives"
            )
        limit = self.settings.max_chars
        longest, size = html.MARKUP_ALLOWANCE * limit, sum(map(len, pages))
        if size > longest or len(pages) * cost.SENTENCE_FLOOR > limit:  # a page is a text, at least
            raise BadRequest(
                f"Invalid request: {len(pages):,} pages of {size:,} characters with their markup, more "
                f"than {longest:,} ({html.MARKUP_ALLOWANCE} times the limit of a request) or than "
                f"{limit // cost.SENTENCE_FLOOR:,} pages; refused before they are read",
                413,
            )
        read = await self._in_page_thread(size, html.read, pages)
        translations = await self.translations(request, model, read.texts, changes, read.charged)
        written = await self._in_page_thread(size, html.written, read, [t.text for t in translations])
        done = iter(translations)
        scores = [sum(next(done).score for _ in range(count)) for count in read.counts]
        return [Translation(page, score, (Hypothesis(page, score),)) for page, score in zip(written, scores)]

    async def _in_page_thread(self, size, work, *args):
        """work(*args) in the page thread, for pages of `size` characters with their markup; its
        queue is bounded as the translation queue is (QueueFull: 503), so a flood of pages,
        each under the limit of a request, cannot pile up behind it."""
        bound = html.MARKUP_ALLOWANCE * self.settings.max_queue_chars
        if self.page_chars and self.page_chars + size > bound:
            raise QueueFull(1)
        self.page_chars += size
        try:
            return await asyncio.get_running_loop().run_in_executor(self.page_thread, work, *args)
        finally:
            self.page_chars -= size

    async def kformer_translate(self, request):
        body = await read_body(request, self.settings.max_body_bytes)
        self.admit(request)
        texts, pair, changes, is_html = kformer_api.parse(body)
        model = self._model_of(pair, texts)
        translate = self.pages if is_html else self.translations
        return kformer_api.respond(await translate(request, model, texts, changes))

    def _model_of(self, pair, texts):
        """kformer's API: the pair asked for, or the one model served when none is given."""
        if pair["source"] is None and pair["target"] is None:
            if len(self.models) > 1:
                raise BadRequest(
                    f"this server translates {', '.join(self.models)}: give source and target", field="source"
                )
            return next(iter(self.models.values()))
        for name, value in pair.items():
            if value is None:
                raise BadRequest(f"missing field {name!r} (a language code; the other is given)", field=name)
        return self.model(pair["source"], pair["target"], texts)

    async def lt_translate(self, request):
        values = fields(request, await read_body(request, self.settings.max_body_bytes))
        self.admit(request, values)
        parsed = libretranslate.parse(values)
        model = self.model(parsed.source, parsed.target, parsed.texts)
        libretranslate.check_alternatives(parsed, model.runner.manifest.beam_size)
        translate = self.pages if parsed.html else self.translations
        results = await translate(request, model, parsed.texts, {"nbest": parsed.alternatives + 1})
        sources = self.sources(parsed.target)
        detected = (lambda text: detect.detect(text, sources)[0]) if parsed.source == "auto" else None
        return libretranslate.respond(parsed, results, detected)

    async def lt_detect(self, request):
        values = fields(request, await read_body(request, self.settings.max_body_bytes))
        self.admit(request, values)
        if not isinstance(values.get("q"), str) or not values["q"]:
            raise BadRequest("Invalid request: missing q parameter", field="q")
        return detect.detect(values["q"], self.sources())

    async def languages(self, request):
        return libretranslate.languages([(m.source, m.target) for m in self.models.values()])

    async def health(self, request):
        """Ready: every model was loaded and translated its probe before the server started."""
        models = [m.describe() for m in self.models.values()]
        return {"status": "ready", **models[0], "models": models}


def _header_text(value):
    """A header's value as its client wrote it: Starlette reads a header's bytes as latin-1, and
    clients send text that is not ASCII (an API key) as UTF-8, or as latin-1 where they must."""
    try:
        return value.encode("latin-1").decode("utf-8")
    except UnicodeDecodeError:
        return value


def _checked_options(runner, changes):
    """The runner's options with a request's changes, checked; a 400 naming the first option
    refused on its own (else nbest, which can only be refused against the beam size)."""
    try:
        return runner.checked(SearchOptions(**changes))
    except ValueError as e:  # the message names the option
        field = "nbest"
        for name, value in changes.items():
            try:
                runner.checked(SearchOptions(**{name: value}))
            except ValueError:
                field = name
                break
        raise BadRequest(str(e), field=field) from None


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
        except TooManyRequests as e:
            response = JSONResponse({"error": str(e)}, 429, headers={"Retry-After": str(e.retry_after)})
        except QueueFull as e:
            response = JSONResponse({"error": str(e)}, 503, headers={"Retry-After": str(e.retry_after)})
        except ClientGone:  # nginx's code (nobody reads it), or 408 where its body came too late
            response = Response(status_code=408 if request.scope.get(connections.TIMED_OUT) else 499)
        except Exception as e:  # noqa: BLE001 -- one request fails, the server goes on
            log.exception("%s failed", name)
            response = JSONResponse({"error": f"Cannot translate text: {e}"}, 500)
        service.metrics.observe_request(name, response.status_code, time.perf_counter() - start)
        return response

    return Route(name, endpoint, methods=methods)


class _PageHeaders:
    """ASGI middleware: the cross-origin isolation headers that the page's WASM threads need, on
    the page's files only (an API answer with them could not be read by other sites' pages)."""

    PREFIXES = ("/model/", "/models/", *page.ROUTES)
    HEADERS = [(b"cross-origin-opener-policy", b"same-origin"), (b"cross-origin-embedder-policy", b"require-corp"),
               (b"cross-origin-resource-policy", b"same-origin"), (b"cache-control", b"no-cache")]  # fmt: skip

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "")
        if scope["type"] != "http" or not (
            path.lstrip("/") in ("", *page.PAGE_FILES) or path.startswith(self.PREFIXES)
        ):
            return await self.app(scope, receive, send)

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *self.HEADERS]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _page_routes(artifact_dir, pairs=None):
    """The page's routes, when its JavaScript packages are installed (else none, with a note):
    /model/ serves `artifact_dir`, /models/<pair>/ each folder of `pairs` ({"zh-en": folder})."""
    missing = [folder for folder in page.ROUTES.values() if not os.path.isdir(folder)]
    if missing:
        log.warning(
            "%s not found: the page is not served (`npm ci --prefix %s` installs it)",
            missing[0],
            page.WEB_DIR,
        )
        return []
    files = [
        Route("/" + ("" if name == "index.html" else name), _file(os.path.join(page.WEB_DIR, name)))
        for name in page.PAGE_FILES
    ]
    mounts = [
        Mount(prefix.rstrip("/"), StaticFiles(directory=folder)) for prefix, folder in page.ROUTES.items()
    ]
    exports = [_export_route(f"/models/{pair}", folder) for pair, folder in (pairs or {}).items()]
    return [*files, *mounts, *exports, _export_route("/model", artifact_dir)]


def _export_route(prefix, artifact_dir):
    """prefix/manifest.json (without this machine's paths) and the files the manifest lists
    (kformer.export.page.served_files); nothing else of the folder."""
    manifest = ExportManifest.load(artifact_dir)
    shown, files = manifest.without_paths().to_dict(), page.served_files(artifact_dir, manifest)

    async def endpoint(request):
        name = request.path_params["name"]
        if name == MANIFEST_FILE:
            return JSONResponse(shown)
        if name in files:
            return FileResponse(files[name])
        return PlainTextResponse("Not Found", 404)

    return Route(prefix + "/{name:path}", endpoint, methods=["GET"])


def _file(path):
    async def endpoint(request):
        return FileResponse(path, media_type="text/javascript" if path.endswith(".js") else None)

    return endpoint


PAGE_MIDDLEWARE = [Middleware(_PageHeaders)]


def page_app(artifact_dir):
    """The page and an export folder alone, with no model loaded: the page checks the files itself
    (the browser tests, `kformer bench web`)."""
    app = Starlette(routes=_page_routes(artifact_dir), middleware=PAGE_MIDDLEWARE)
    app.state.settings = Settings()
    return app


def create_app(runners, settings=None, resident_bytes=None):
    """The Starlette app serving `runners` (ArtifactRunners, one per language pair; or one
    runner); the batchers stop with the app. resident_bytes: the memory each took to load, for
    /metrics. The page, if installed, runs the first model's export and offers the others."""
    runners = runners if isinstance(runners, (list, tuple)) else [runners]
    service = Service(runners, settings or Settings(), resident_bytes)
    routes = [
        _route(service, "/v1/translate", service.kformer_translate, ["POST"]),
        _route(service, "/translate", service.lt_translate, ["POST"]),
        _route(service, "/detect", service.lt_detect, ["POST"]),
        _route(service, "/languages", service.languages, ["GET", "POST"]),
        _route(service, "/health", service.health, ["GET"]),
        _route(service, "/frontend/settings", service.frontend_settings, ["GET"]),
        _route(service, "/metrics", service.metrics.response, ["GET"]),
        *_page_routes(
            runners[0].artifact_dir, {m.pair: m.runner.artifact_dir for m in service.models.values()}
        ),
    ]
    cors = Middleware(CORSMiddleware, allow_origins=list(service.settings.cors_origins),
                      allow_methods=["GET", "POST"], allow_headers=["*"])  # fmt: skip

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        await asyncio.to_thread(service.close)

    app = Starlette(routes=routes, middleware=[cors, *PAGE_MIDDLEWARE], lifespan=lifespan)
    app.state.service, app.state.settings = service, service.settings
    return app

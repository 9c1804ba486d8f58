"""`kformer serve`: the HTTP translation server on exports (kformer's and LibreTranslate's APIs, the page)."""

import argparse
import re

from kformer import extras
from kformer.arguments import (
    add_runner_options,
    add_search_options,
    positive,
    search_options,
)
from kformer.decode.runner import RunnerSettings
from kformer.export.formats import VARIANTS
from kformer.serve.settings import SERVED_RUNTIMES, Settings

HELP = "HTTP translation server on an export (kformer's and LibreTranslate's APIs, the page)"


def add_arguments(p):
    p.add_argument(
        "--model",
        required=True,
        action="append",
        help="export folder, or a folder of them; repeat for more language pairs (one model a pair)",
    )
    p.add_argument(
        "--runtime",
        choices=SERVED_RUNTIMES,
        help="default: onnx where the export has the variant, else tflite, else ctranslate2",
    )
    p.add_argument(
        "--variant", default="fp32", choices=sorted({v for names in VARIANTS.values() for v in names})
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    p.add_argument(
        "--port", type=positive(int, zero_allowed=True, largest=65535), default=8000, help="0: any free port"
    )
    _access_options(p, Settings())
    _connection_options(p, Settings())
    add_runner_options(p, "more sentences a second under load, a lone request slower")
    _batching_options(p, Settings())
    add_search_options(p, defaults=False, where="the export's; a request may choose its own")


def _access_options(p, defaults):
    p.add_argument(
        "--cors-origins",
        type=origins,
        default=",".join(defaults.cors_origins),
        metavar="ORIGINS",
        help="the sites (scheme://host[:port], comma-separated) whose pages may call the API from a "
        "browser; '' for none (default: *, any site, as LibreTranslate allows)",
    )
    p.add_argument(
        "--api-key",
        help="require this key (LibreTranslate's api_key field or Authorization: "
        "Bearer); default $KFORMER_API_KEY, else none",
    )
    p.add_argument(
        "--api-keys",
        metavar="FILE",
        help="API keys, one a line, each optionally with its own requests per minute ('KEY 120'); "
        "requests without a key get --req-limit",
    )
    p.add_argument(
        "--req-limit",
        type=positive(int),
        help="requests per minute per client (its key, else its address); 429 above (default: none)",
    )


def _connection_options(p, defaults):
    for name, what in (
        ("timeout_headers", "seconds a request's line and headers may take to arrive; 408 after"),
        ("timeout_body", "seconds a request's body may take to arrive after its headers; 408 after"),
        ("timeout_keep_alive", "seconds a connection may stay idle between requests (uvicorn's)"),
    ):
        default = getattr(defaults, name)
        p.add_argument(
            "--" + name.replace("_", "-"),
            type=positive(float),
            default=default,
            metavar="SECONDS",
            help=f"{what} (default {default:g})",
        )
    p.add_argument(
        "--limit-concurrency",
        type=positive(int),
        metavar="N",
        default=defaults.limit_concurrency,
        help=f"connections and requests at once; more get 503 at once (uvicorn's; default "
        f"{defaults.limit_concurrency:,})",
    )


def _batching_options(p, defaults):
    p.add_argument(
        "--batch-size",
        type=positive(int),
        default=defaults.batch_size,
        help=f"texts gathered into one runner call, a request whole (default {defaults.batch_size})",
    )
    p.add_argument(
        "--batch-window-ms",
        type=positive(float, zero_allowed=True),
        default=defaults.window * 1000,
        help=f"how long a batch waits for more requests (default {defaults.window * 1000:g})",
    )
    p.add_argument(
        "--max-queue-chars",
        type=positive(int),
        default=defaults.max_queue_chars,
        help=f"characters waiting beyond which requests get 503 (default {defaults.max_queue_chars:,})",
    )
    p.add_argument(
        "--max-chars",
        "--char-limit",
        type=positive(int),
        default=defaults.max_chars,
        help=f"most characters in one request (413 above; default {defaults.max_chars:,})",
    )
    p.add_argument(
        "--max-body-bytes",
        type=positive(int),
        default=defaults.max_body_bytes,
        help=f"largest request body (413 above; default {defaults.max_body_bytes:,})",
    )


def origins(text):
    """The origins of --cors-origins ("https://a.example,http://b:8080"; "*"; "" for none): a
    browser sends scheme://host[:port], so anything else would silently match nothing."""
    found = tuple(origin.strip() for origin in text.split(",") if origin.strip())
    for origin in found:
        if origin != "*" and not re.fullmatch(r"https?://[^/\s]+", origin):
            raise argparse.ArgumentTypeError(f"{origin!r} is not an origin (scheme://host[:port], or *)")
    return found


def page_line(url, artifact_dir):
    """Where the page runs the export `artifact_dir`: its URL for each runtime of the page the
    export has a file of."""
    from kformer.export import page

    found = [url + query for query in page.queries(artifact_dir)]
    return " or ".join(found) if found else "none (the export has no ONNX file nor fixed TFLite file)"


def main(args):
    from kformer.serve.limits import api_keys
    from kformer.serve.server import load_models, serve

    api_key, keys = api_keys(args.api_key, args.api_keys)
    settings = Settings(
        batch_size=args.batch_size,
        window=args.batch_window_ms / 1000,
        max_queue_chars=args.max_queue_chars,
        max_body_bytes=args.max_body_bytes,
        max_chars=args.max_chars,
        api_key=api_key,
        req_limit=args.req_limit,
        api_keys=keys,
        timeout_headers=args.timeout_headers,
        timeout_body=args.timeout_body,
        timeout_keep_alive=args.timeout_keep_alive,
        limit_concurrency=args.limit_concurrency,
        cors_origins=args.cors_origins,
    )
    extras.require("lxml", "kformer serve's format=html")  # bs4 would find it missing per request
    print(
        f"loading {', '.join(args.model)} ({args.runtime or 'runtime by export'}, {args.variant})", flush=True
    )
    # --batch-size is the batcher's
    runner = RunnerSettings(
        threads=args.threads, parallel=args.parallel, target_language=args.target_language
    )
    runners, sizes = load_models(args.model, args.runtime, args.variant, runner, search_options(args))

    def ready(url):
        pairs = ", ".join(f"{r.manifest.pair} ({r.fmt} {r.variant})" for r in runners)
        print(f"serving {pairs} at {url} (POST /translate, /v1/translate; GET /health, /metrics)", flush=True)
        print(f"page: {page_line(url, runners[0].artifact_dir)}; Ctrl-C stops", flush=True)

    serve(runners, args.host, args.port, settings, ready, sizes)

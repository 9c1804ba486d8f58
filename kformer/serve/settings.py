"""The server's settings, with their defaults (`kformer serve` options)."""

import dataclasses

SERVED_RUNTIMES = ("onnx", "tflite", "ctranslate2")  # the order in which --runtime's default tries them


@dataclasses.dataclass(frozen=True)
class Settings:
    """batch_size: texts gathered into one runner call (the request that reaches it runs whole);
    window: seconds a batch waits for more after its first request; max_queue_chars: characters
    waiting beyond which requests are refused (503); max_body_bytes (413); max_chars: characters of
    one request's texts (413); api_key: one key every translation needs, None for none;
    req_limit: requests per minute per client (429 above; None: no limit); api_keys: {key: its
    requests per minute or None for req_limit} (kformer.serve.limits.read_api_keys), None for none;
    timeout_headers, timeout_body: seconds a request's headers, then its body, may take to arrive
    (408 after; kformer.serve.connections); timeout_keep_alive: seconds a connection may idle
    between requests (uvicorn's); limit_concurrency: connections and requests at once, beyond
    which uvicorn answers 503; cors_origins: the origins whose pages may call the API ("*": any)."""

    batch_size: int = 32
    # 0: what has queued while the runner was busy is the batch. Waiting for more delays a lone
    # request by the wait and gained nothing beyond noise with many clients (`kformer bench serve`).
    window: float = 0.0
    max_queue_chars: int = 8_000  # a few seconds of a small model's work on a few cores
    max_body_bytes: int = 1 << 20
    max_chars: int = 10_000
    api_key: str | None = None
    req_limit: int | None = None
    api_keys: dict | None = None
    timeout_headers: float = 10.0  # a request's line and headers are a few hundred bytes
    timeout_body: float = 30.0  # max_body_bytes at about 300 kbit/s
    timeout_keep_alive: float = 5.0  # uvicorn's default
    limit_concurrency: int = 1024  # each idle connection is cheap; the queue bounds the work
    # Any site's page may call the API, as LibreTranslate's servers allow (and what it answers is
    # no more than what a request from anywhere gets); an operator may name the sites.
    cors_origins: tuple[str, ...] = ("*",)

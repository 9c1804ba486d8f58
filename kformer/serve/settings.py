"""The server's settings, with their defaults (`kformer serve` options)."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Settings:
    """batch_size: texts gathered into one runner call (the request that reaches it runs whole);
    window: seconds a batch waits for more after its first request; max_queue_chars: characters
    waiting beyond which requests are refused (503); max_body_bytes (413); max_chars: characters of
    one request's texts (413); api_key: None for none."""

    batch_size: int = 32
    # 0: what has queued while the runner was busy is the batch. Waiting for more delays a lone
    # request by the wait (one client: 89 -> 56 sentences/s with 5 ms, 31 with 20 ms) and gained
    # nothing beyond noise at 8 or 32 clients (demo model, 2 cores).
    window: float = 0.0
    max_queue_chars: int = 8_000  # ~5 s of the demo model's work on 2 cores (~1,600 characters/s)
    max_body_bytes: int = 1 << 20
    max_chars: int = 10_000
    api_key: str | None = None

"""The server's settings, with their defaults (`kformer serve` options)."""

import dataclasses

from kformer.config import GATHER_WINDOW_SECONDS


@dataclasses.dataclass(frozen=True)
class Settings:
    """batch_size: most requests gathered into one runner call; window: seconds a batch waits for
    more after its first request; max_queue_chars: characters waiting beyond which requests are
    refused (503); max_body_bytes (413); max_chars: characters of one request's texts (413);
    api_key: None for none."""

    batch_size: int = 32
    window: float = GATHER_WINDOW_SECONDS
    max_queue_chars: int = 20_000
    max_body_bytes: int = 1 << 20
    max_chars: int = 10_000
    api_key: str | None = None

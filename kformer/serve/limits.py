"""Per-client limits, as LibreTranslate has them: requests per minute for each client (its API
key, or its address without one), with API keys read from a file, each with its own limit.

A client over its limit gets 429 with Retry-After: the seconds until its oldest request in the
last minute leaves the window."""

import collections
import math
import os
import threading
import time

WINDOW_SECONDS = 60.0
SWEEP_CLIENTS = 10_000  # beyond this many clients seen, those idle for a minute are forgotten


class TooManyRequests(Exception):
    def __init__(self, limit, retry_after):
        super().__init__(f"Too many requests: the limit is {limit} per minute; retry in {retry_after} s")
        self.retry_after = retry_after


def read_api_keys(path):
    """{key: its requests per minute, or None for the server's --req-limit} of a keys file: one
    key a line, optionally followed by its limit; blank lines and lines from "#" on are skipped.
    A malformed line is a one-line ValueError naming the file and line."""
    keys = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            if len(words) > 2 or (len(words) == 2 and not (words[1].isdigit() and int(words[1]) > 0)):
                raise ValueError(
                    f"{path}:{number}: expected 'KEY' or 'KEY REQUESTS_PER_MINUTE' (> 0), got {line.strip()!r}"
                )
            if words[0] in keys:
                raise ValueError(f"{path}:{number}: the key is listed twice")
            keys[words[0]] = int(words[1]) if len(words) == 2 else None
    if not keys:
        raise ValueError(f"{path}: no API keys in it")
    return keys


def api_keys(api_key, keys_file):
    """(the one key every request needs, {key: requests per minute}) of --api-key (or
    $KFORMER_API_KEY) and --api-keys FILE: at most one of them, None for the other."""
    api_key = api_key or os.environ.get("KFORMER_API_KEY") or None
    keys = read_api_keys(keys_file) if keys_file else None
    if api_key and keys:
        raise ValueError("--api-key and --api-keys: give one key every request needs, or a file of keys")
    return api_key, keys


class RateLimiter:
    """Requests per minute per client: each client's request times over the last minute."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self._times = collections.defaultdict(collections.deque)
        self._lock = threading.Lock()

    def admit(self, client, limit):
        """Counts a request of `client`; TooManyRequests if it had `limit` in the last minute
        (limit None: no limit)."""
        if limit is None:
            return
        now = self.clock()
        with self._lock:
            times = self._times[client]
            while times and times[0] <= now - WINDOW_SECONDS:
                times.popleft()
            if len(times) >= limit:
                raise TooManyRequests(limit, max(1, math.ceil(times[0] + WINDOW_SECONDS - now)))
            times.append(now)
            if len(self._times) > SWEEP_CLIENTS:
                idle = [c for c, t in self._times.items() if t[-1] <= now - WINDOW_SECONDS]
                for c in idle:
                    del self._times[c]

"""Batching across requests: texts of concurrent requests run on the runner together.

Requests wait in a queue bounded by the characters it holds, as kformer.serve.cost charges them
(what a translation costs); a full queue refuses work at once (`QueueFull`, which the server answers with 503 and
Retry-After) instead of letting a backlog grow. A thread takes what has queued (kformer.decode.gather:
requests up to batch_size texts, the last one whole), runs each group of texts that share search
options in one `runner.translations` call, and hands each request its results; a runner opened
with `parallel` N (kformer.decode.runner) has N such threads, each batch on threads / N threads. A
request whose client left before its turn is skipped. A request whose texts fail the runner
fails alone (`Batcher._run`): its batch-mates are answered.
"""

import concurrent.futures
import dataclasses
import math
import queue as queue_lib
import threading
import time

from kformer.decode import gather
from kformer.decode.options import SearchOptions
from kformer.serve import cost
from kformer.serve.requests import BadRequest


class QueueFull(Exception):
    def __init__(self, retry_after):
        super().__init__(f"the translation queue is full; retry in {retry_after} s")
        self.retry_after = retry_after


@dataclasses.dataclass
class _Request:
    texts: list
    options: SearchOptions  # checked: equal ones run together
    future: concurrent.futures.Future
    chars: int


_STOP = object()


def _texts(request):
    return 0 if request is _STOP else len(request.texts)


class Batcher:
    """`submit(texts, options) -> Future` of list[Translation]; `close()` after the last request.

    observe(batch_texts, seconds) is called after each runner call (for metrics)."""

    def __init__(self, runner, batch_size, window, max_queue_chars, observe=None):
        self.runner, self.batch_size, self.window = runner, batch_size, window
        self.max_queue_chars, self.observe = max_queue_chars, observe or (lambda texts, seconds: None)
        self.queued_chars = self.queued_requests = 0
        self.chars_per_second = None  # measured per thread, for Retry-After
        self._lock = threading.Lock()
        self._queue = queue_lib.Queue()
        self._threads = [
            threading.Thread(target=self._work, daemon=True, name=f"kformer-batcher-{i}")
            for i in range(getattr(runner, "parallel", 1))
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, texts, options, charged=None):
        """Queues the texts, `charged` characters (default: kformer.serve.cost's charge); raises
        QueueFull when they would take the queue over its bound (a request alone over it is
        still taken into an empty queue, so every size can be served)."""
        chars = cost.request_cost(texts, math.inf) if charged is None else charged
        with self._lock:
            if self.queued_requests and self.queued_chars + chars > self.max_queue_chars:
                raise QueueFull(self._retry_after())
            self.queued_chars += chars
            self.queued_requests += 1
        request = _Request(list(texts), options, concurrent.futures.Future(), chars)
        self._queue.put(request)
        return request.future

    def _retry_after(self):
        """Whole seconds until the queue has drained, at the measured rate (1 before a measure)."""
        if not self.chars_per_second:
            return 1
        return max(1, round(self.queued_chars / (self.chars_per_second * len(self._threads))))

    def close(self):
        """Translates what is queued, then stops the threads."""
        self._queue.put(_STOP)
        for thread in self._threads:
            thread.join()

    def _work(self):
        while True:
            requests = gather.take_batch(self._queue, self.batch_size, self.window, _texts)
            stop = _STOP in requests
            requests = [r for r in requests if r is not _STOP]
            with self._lock:
                self.queued_chars -= sum(r.chars for r in requests)
                self.queued_requests -= len(requests)
            live = [r for r in requests if r.future.set_running_or_notify_cancel()]
            for options in dict.fromkeys(r.options for r in live):  # in order of arrival
                self._run([r for r in live if r.options == options], options)
            if stop:
                self._queue.put(_STOP)  # what queued behind it runs first, and each thread sees it
                if self._queue.qsize() == 1:  # nothing but the stop
                    return

    def _run(self, requests, options):
        """Runs the requests' texts in one runner call. Where the call fails, each half of the
        requests runs again on its own, down to single requests: a text that fails (one the
        tokenizer cannot encode, say) fails its own request, and the others get their
        translations at the cost of a few more calls."""
        texts = [text for r in requests for text in r.texts]
        start = time.perf_counter()
        try:
            results = self.runner.translations(texts, options)
        except Exception as e:  # noqa: BLE001 -- the failure goes to the request that caused it
            if len(requests) == 1:
                requests[0].future.set_exception(_own_failure(e))
                return
            middle = len(requests) // 2
            self._run(requests[:middle], options)
            self._run(requests[middle:], options)
            return
        seconds = time.perf_counter() - start
        chars = sum(r.chars for r in requests)
        rate = chars / max(seconds, 1e-6)
        self.chars_per_second = (
            rate if self.chars_per_second is None else 0.8 * self.chars_per_second + 0.2 * rate
        )
        self.observe(len(texts), seconds)
        for r in requests:
            r.future.set_result(results[: len(r.texts)])
            results = results[len(r.texts) :]


def _own_failure(error):
    """What a request alone failed with: a 400 where the runner refused its input (the errors
    Python raises for a wrong value: the texts cannot be encoded or decoded), else the error."""
    if isinstance(error, (ValueError, TypeError)):
        return BadRequest(f"Cannot translate text: {error}")
    return error

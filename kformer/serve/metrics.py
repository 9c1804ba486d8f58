"""The server's metrics, in Prometheus' text format at GET /metrics (prometheus_client): requests
and their status codes per route, latency and batch-size histograms (percentiles come from the
buckets, as Prometheus computes them), the queues' depth, and each model's memory."""

import prometheus_client as prom
from starlette.responses import Response

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class Metrics:
    def __init__(self, batcher_state):
        """batcher_state() -> (queued requests, queued characters), read at each scrape."""
        self.registry = prom.CollectorRegistry()
        self.requests = prom.Counter(
            "kformer_requests", "HTTP requests answered", ["route", "code"], registry=self.registry
        )
        self.latency = prom.Histogram(
            "kformer_request_seconds",
            "time from a request's arrival to its answer",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.batch_texts = prom.Histogram(
            "kformer_batch_texts", "texts per runner call", buckets=BATCH_BUCKETS, registry=self.registry
        )
        self.batch_seconds = prom.Histogram(
            "kformer_batch_seconds", "time of a runner call", buckets=LATENCY_BUCKETS, registry=self.registry
        )
        for index, what in enumerate(("requests", "characters")):
            gauge = prom.Gauge(
                f"kformer_queue_{what}", f"{what} waiting for the runner", registry=self.registry
            )
            gauge.set_function(lambda index=index: batcher_state()[index])

    def watch_memory(self, resident_bytes):
        """{language pair: bytes its loading added to the process (None: not measured)}."""
        gauge = prom.Gauge(
            "kformer_model_resident_bytes",
            "resident memory the model's loading and probe added to the server",
            ["model"],
            registry=self.registry,
        )
        for pair, size in resident_bytes.items():
            if size is not None:
                gauge.labels(pair).set(size)

    def observe_request(self, route, code, seconds):
        self.requests.labels(route, str(code)).inc()
        self.latency.labels(route).observe(seconds)

    def observe_batch(self, texts, seconds):
        self.batch_texts.observe(texts)
        self.batch_seconds.observe(seconds)

    async def response(self, request):
        """GET /metrics."""
        return Response(prom.generate_latest(self.registry), media_type=prom.CONTENT_TYPE_LATEST)

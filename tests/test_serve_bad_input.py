"""`kformer serve` against hostile input: a request's failure stays its own, the work of a request
is bounded by what it is charged, and every malformed field is a 4xx; then a real `kformer serve`
on loopback under a bounded hostile client (docs/guide.md, "What bad input gets")."""

import concurrent.futures

import pytest

from kformer.decode.text_batches import Hypothesis, Translation
from kformer.serve.batcher import Batcher
from kformer.serve.requests import BadRequest


class Echo:
    """A runner without a model: each text's translation is the text reversed; a text with a lone surrogate
    (U+D800, which no tokenizer encodes) fails the call it is in, as SentencePiece's
    encoder does. Records the texts of each call."""

    parallel = 1

    def __init__(self):
        self.calls = []

    def translations(self, texts, options=None):
        self.calls.append(list(texts))
        if any("\ud800" in text for text in texts):
            raise TypeError("Sequence elements must be str or bytes")
        return [Translation(t[::-1], -1.0, (Hypothesis(t[::-1], -1.0),)) for t in texts]


def test_a_request_that_fails_in_a_batch_fails_alone():
    """One request whose text the runner cannot encode gets its own 400; the requests batched with
    it get their translations."""
    runner = Echo()
    batcher = Batcher(runner, batch_size=64, window=0.2, max_queue_chars=10**6)
    try:
        texts = [[f"text {i}"] for i in range(30)]
        texts.insert(7, ["bad \ud800"])
        futures = [batcher.submit(t, None) for t in texts]
        concurrent.futures.wait(futures, timeout=30)
    finally:
        batcher.close()
    assert len(runner.calls[0]) == 31  # they did run together
    for submitted, future in zip(texts, futures):
        if submitted == ["bad \ud800"]:
            assert isinstance(future.exception(), BadRequest) and future.exception().status == 400
        else:
            assert [t.text for t in future.result()] == [submitted[0][::-1]]


if __name__ == "__main__":
    pytest.main([__file__])

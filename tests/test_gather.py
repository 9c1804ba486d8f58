import queue
import threading
import time

import pytest

from kformer.decode import gather


def test_take_batch_takes_what_is_queued_up_to_size_and_waits_at_most_the_window():
    q = queue.Queue()
    for i in range(5):
        q.put(i)
    assert gather.take_batch(q, 3, 10.0) == [0, 1, 2]  # full: no wait
    start = time.monotonic()
    assert gather.take_batch(q, 3, 0.05) == [3, 4]
    assert 0.04 <= time.monotonic() - start < 1.0  # waited the window for a third, not longer
    threading.Timer(0.02, q.put, args=(5,)).start()
    threading.Timer(0.03, q.put, args=(6,)).start()
    assert gather.take_batch(q, 3, 0.5) == [5, 6]  # one that arrives within the window joins
    for texts in (["a"], ["b", "c", "d"], ["e"], ["f"]):
        q.put(texts)
    assert gather.take_batch(q, 3, 0.0, cost=len) == [["a"], ["b", "c", "d"]]  # the last one whole
    assert gather.take_batch(q, 3, 0.0, cost=len) == [["e"], ["f"]]


def test_gathered_yields_what_has_arrived_when_the_input_pauses():
    arrivals = queue.Queue()

    def lines():  # a pipe: a burst of three lines, a pause, then one line, then the end
        while (line := arrivals.get()) is not None:
            yield line

    batches = gather.gathered(lines(), size=32, window=0.01)
    for line in ("a", "b", "c"):
        arrivals.put(line)
    assert next(batches) == ["a", "b", "c"]  # before the fourth line exists
    arrivals.put("d")
    assert next(batches) == ["d"]
    arrivals.put(None)
    assert list(batches) == []


def test_gathered_keeps_order_and_raises_the_input_error_after_the_items_before_it():
    def lines():
        yield from ["1", "2"]
        raise ValueError("<stdin>:3: invalid UTF-8 at byte 0")

    batches = gather.gathered(lines(), size=1, window=0.0)
    assert next(batches) == ["1"] and next(batches) == ["2"]
    with pytest.raises(ValueError, match="<stdin>:3"):
        next(batches)
    assert [b for batch in gather.gathered(iter(range(100)), 7, 0.0) for b in batch] == list(range(100))

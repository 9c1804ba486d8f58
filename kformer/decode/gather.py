"""Gathering work that arrives a piece at a time into batches: what `kformer translate` does with
the lines of a pipe and `kformer serve` with concurrent requests.

A batch is what has arrived, up to `size` items, waiting at most `window` seconds after its first
item for more: items that arrive together run together, and a lone item (a line written into a
pipe by a program that waits for its answer) is not held back for a full batch.
"""

import queue as queue_lib
import threading
import time

_END = object()  # after the last item of `gathered`'s input
MAX_INPUT_CHARS = 100_000  # `kformer translate` refuses a longer input line (--max-chars)
# How long `kformer translate` waits for more lines of a pipe after the first: a file's lines
# then fill the first batch too, where a search call takes tens of ms at batch 1.
WINDOW_SECONDS = 0.005


def take_batch(queue, size, window, cost=None):
    """Blocks for one item of a queue.Queue, then returns it with those that follow within `window`
    seconds (those already queued at once), until the batch's cost reaches `size`: cost(item), 1
    an item by default; the item that reaches it is taken whole."""
    cost = cost or (lambda item: 1)
    batch = [queue.get()]
    total, deadline = cost(batch[0]), time.monotonic() + window
    while total < size:
        try:
            batch.append(queue.get(timeout=max(0.0, deadline - time.monotonic())))
        except queue_lib.Empty:
            break
        total += cost(batch[-1])
    return batch


class _Failed:
    def __init__(self, error):
        self.error = error


def gathered(items, size, window):
    """Yields lists of the items of an iterable (a stream of lines) as they arrive, gathered as
    `take_batch` does, in order. The iterable is read in a thread, at most 4 batches ahead; an
    error it raises is raised here after the items before it."""
    queue = queue_lib.Queue(maxsize=4 * size)

    def read():
        try:
            for item in items:
                queue.put(item)
        except Exception as e:  # noqa: BLE001 -- raised again in the caller's thread, in order
            queue.put(_Failed(e))
            return
        queue.put(_END)

    threading.Thread(target=read, daemon=True, name="kformer-reader").start()
    while True:
        batch = take_batch(queue, size, window)
        stop = next((i for i, item in enumerate(batch) if item is _END or isinstance(item, _Failed)), None)
        if stop is None:
            yield batch
            continue
        if batch[:stop]:
            yield batch[:stop]
        if isinstance(batch[stop], _Failed):
            raise batch[stop].error
        return


def checked_lines(batches, max_chars, where):
    """The batches of lines (an iterable of lists) as they come, each line checked to have at most
    `max_chars` characters (a one-line ValueError naming `where` and its number otherwise)."""
    done = 0
    for lines in batches:
        for number, line in enumerate(lines, start=done + 1):
            if len(line) > max_chars:
                raise ValueError(
                    f"{where} {number} has {len(line):,} characters, more than --max-chars {max_chars:,}; "
                    "split it into lines or raise --max-chars"
                )
        done += len(lines)
        yield lines

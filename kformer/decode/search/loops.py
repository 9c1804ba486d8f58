"""How a search loop stops spending steps on rows that are done: one value of the three loop
strategies, which both searches take.

A batch steps until its last row is done, so rows that are done should stop costing steps:
- `OnePass`: every row in one loop with buffers of the full length (XLA's static shapes, and the
  fixed file of the page, one row a call); `trace` keeps beam search's hypotheses of every step.
- `DropDone`: the loop's batch shrinks, each step keeping the rows not yet done (their cache
  too) and writing its tokens into buffers of the whole batch; for runtimes whose loops take
  shapes that change from step to step (TensorFlow, onnxruntime).
- `TwoPasses`: for fixed shapes (LiteRT, whose loop bodies are planned once): short buffers for
  all rows until only a quarter of them run on, then full-length buffers for those
  (`in_two_passes`).

A search's state is a NamedTuple whose KINDS say what each field is (the constants below), so
that moving rows between passes never depends on a field's name.
"""

from typing import NamedTuple

import tensorflow as tf

from kformer.decode.search.common import beams_of, where
from kformer.model import portable


class OnePass(NamedTuple):
    """All rows, one loop, full-length buffers. trace: beam search also returns the alive
    hypotheses after every step, for pictures."""

    trace: bool = False


class TwoPasses(NamedTuple):
    """A first pass of every row in buffers of `first_length` T1 (int32 scalar), then the rows left
    in full-length buffers; `grow(cache_state, length)` grows the cache's buffers to a length."""

    first_length: object
    grow: object


class DropDone(NamedTuple):
    """One loop whose batch shrinks: a row leaves it the step it is done."""


ONE_PASS, DROP_DONE = OnePass(), DropDone()

# The kinds of a search state's fields (each state's KINDS): what the second pass takes of them.
STEP = "step"  # a scalar of the whole loop (the step index): kept
ROW = "row"  # (B, ...) one entry per source row: the rows left taken, the passes merged
BUFFER = "buffer"  # (B, [K,] T) output buffers: as ROW, padded to the full length
GUARD = "guard"  # (B * K, T) the repeat guard's runs, or () without a guard: as BUFFER, by beam
CACHE = "cache"  # {"static", "state"} of (B * K, ...): the rows' beams taken, the state grown
TRACE = "trace"  # beam search's trace (one pass only): kept

# The first pass stops once at most 1/4 of its rows are running: the fastest of the shares
# measured (1/2, 1/4, 1/8), in TFLite and ONNX, greedy and beam.
FIRST_PASS_ENDS_AT = 4


def checked(loop):
    """`loop`, if it is one of the three strategies."""
    if not isinstance(loop, (OnePass, TwoPasses, DropDone)):
        raise TypeError(f"a search's loop is a OnePass, TwoPasses or DropDone, not {loop!r}")
    return loop


def first_length(loop, buffer_length):
    """The output buffers' length a search's state starts with."""
    return loop.first_length if isinstance(loop, TwoPasses) else buffer_length


def _take_rows(state, rows, buffer_length, grow, beam_size, pad_id):
    """The search state of the source rows `rows` (R,) only (all rows if None), with its output
    buffers padded and its cache grown (`grow(cache_state, length)`) to `buffer_length`.
    Batch-first fields are (B, ...); the cache is (B * beam_size, ...), beams of a row adjacent."""

    def take(t, k=1):
        return t if rows is None else tf.gather(t, beams_of(rows, k), axis=0)

    def taken(kind, value):
        if kind in (STEP, TRACE) or value is None:
            return value
        if kind == CACHE:
            value = tf.nest.map_structure(lambda t: take(t, beam_size), value)
            return {"static": value["static"], "state": grow(value["state"], buffer_length)}
        if kind == BUFFER:  # (B, [K,] T1) -> (B, [K,] T)
            return portable.extend(take(value), buffer_length, axis=-1, value=pad_id)
        if kind == GUARD:  # (B * beam_size, T1) -> (B * beam_size, T); () without a guard
            return (
                value
                if isinstance(value, tuple)
                else portable.extend(take(value, beam_size), buffer_length, axis=-1)
            )
        return take(value)

    kinds = type(state).KINDS
    return type(state)(**{name: taken(kinds[name], value) for name, value in state._asdict().items()})


def in_two_passes(run, state, limits, loop, buffer_length, pad_id, beam_size=1):
    """Runs a search loop `run(state, limits, length, rows_left) -> state` (steps while more than
    `rows_left` rows run) in two passes (`loop`, a TwoPasses): all rows, with output and key/value
    buffers of T1 (the state's), until at most a quarter of them are running
    (FIRST_PASS_ENDS_AT); then only the rows not yet `done`, in buffers of the full
    `buffer_length` T, to the end. Returns the final state of all rows with buffers of T, without
    its cache.

    Why: each step reads and rewrites the whole fixed-shape buffers, and a batch steps until its
    last row is done. Most outputs end within a few tokens of their source's length; the few that
    run on (often repeating themselves to the limit) now continue alone, in the longer buffers,
    instead of holding the whole batch. A batch of one row runs the first pass to its end. The
    tokens are those of one pass: a row's result does not depend on its batch or buffer length.
    (Dropping each row the step it is done needs a loop whose state changes shape at run time:
    a `tf.cond` in the body made every step at batch 1 slower in onnxruntime, and tf2onnx does not
    convert nested loops.)
    """
    first = run(state, limits, loop.first_length, tf.shape(limits)[0] // FIRST_PASS_ENDS_AT)
    left = tf.logical_not(first.done)  # (B,)
    rows = where(left)  # (R,) the rows left
    second = run(
        _take_rows(first, rows, buffer_length, loop.grow, beam_size, pad_id),
        tf.gather(limits, rows),
        buffer_length,
    )
    first = _take_rows(first._replace(cache=None), None, buffer_length, None, beam_size, pad_id)

    # Row b of the result, from the second pass's R rows followed by the first pass's B rows: its
    # row in the second pass if it was left, else its own row of the first pass (R + b). One
    # index for every field, and each field one concat and one gather.
    position = tf.where(
        left, tf.cumsum(tf.cast(left, tf.int32)) - 1, tf.shape(rows)[0] + tf.range(tf.shape(left)[0])
    )

    def merge(ours, theirs):
        return tf.gather(tf.concat([theirs, ours], 0), position)

    kinds = type(first).KINDS
    merged = (ROW, BUFFER, GUARD)
    return first._replace(
        **{
            name: merge(value, getattr(second, name))
            for name, value in first._asdict().items()
            if kinds[name] in merged and not isinstance(value, tuple)  # (): no guard
        }
    )


def shrinking(state):
    """Shape invariants of a DropDone loop's state: the first dim of its batch-first tensors
    unknown, but for the fields its class names in WHOLE (the buffers of the whole batch) and
    scalars."""

    def free_batch(t):
        return tf.TensorShape([None, *t.shape[1:]]) if t.shape.rank else t.shape

    whole = type(state).WHOLE
    return type(state)(
        **{
            name: tf.nest.map_structure(lambda t: t.shape, value)
            if name in whole
            else tf.nest.map_structure(free_batch, value)
            for name, value in state._asdict().items()
        }
    )


def while_rows_run(length):
    """The condition of a DropDone loop on its state `s` (fields index, rows): the step index is
    within the buffers of `length` and a row still runs."""
    last_index = length - 1

    def cond(s):
        return tf.logical_and(s.index <= last_index, tf.size(s.rows) >= 1)

    return cond

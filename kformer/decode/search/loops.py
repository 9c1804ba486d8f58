"""The three loop strategies: each runs a search in its own `tf.while_loop`, one typed value that
both searches take.

A batch steps until its last row is done, so rows that are done should stop costing steps:
- `OnePass`: every row in one loop with buffers of the full length (XLA's static shapes, and the
  fixed file of the page, one row a call); `trace` keeps beam search's hypotheses of every step.
- `TwoPasses`: for fixed shapes (LiteRT, whose loop bodies are planned once): short buffers for
  all rows until only a quarter of them run on, then full-length buffers for those; the passes'
  outputs merged.
- `DropDone`: the loop's batch shrinks, each step keeping the rows not yet done (their fields and
  cache gathered) and writing its rows' outputs into buffers of the whole batch; for runtimes
  whose loops take shapes that change from step to step (TensorFlow, onnxruntime).

A search supplies a `Search`: the state of its rows before the first step and a step over the
rows of a loop. Its state is a NamedTuple whose KINDS say what each field is (the constants
below), so that taking rows, growing buffers and merging passes never depend on a field's name,
and whose OUTPUTS name the fields its results are read from. A strategy's
`run(search, cache, lengths)` returns the state of all B rows after the last step: its OUTPUTS
final (and, after OnePass, every field). A fourth strategy is a class here with that method.

Shape letters: B batch, R rows of the batch in a loop, K hypotheses per row (1 in greedy
search), T buffer length.
"""

from collections.abc import Callable
from typing import NamedTuple, Protocol

import tensorflow as tf

from kformer.decode.search.common import Lengths, Nest, TokenIds, beams_of, where
from kformer.model import portable

# The kinds of a search state's fields (each state's KINDS): how a strategy takes rows of them.
STEP = "step"  # a scalar of the whole loop (the step index): kept
ROW = "row"  # (B, ...) one entry per source row: the rows taken
BUFFER = "buffer"  # (B, [K,] T) output buffers: as ROW, padded to the full length
GUARD = "guard"  # (B * K, T) the repeat guard's runs, or () without a guard: as BUFFER, by hypothesis
CACHE = "cache"  # {"static", "state"} of (B * K, ...): the rows' hypotheses taken, the state grown
TRACE = "trace"  # beam search's trace (one pass only): kept

# The first pass stops once at most 1/4 of its rows are running: the fastest of the shares
# measured (1/2, 1/4, 1/8), in TFLite and ONNX, greedy and beam.
FIRST_PASS_ENDS_AT = 4

# step(state, limits (B,) of the loop's rows) -> (the next state, None or (B * K,) the hypothesis
# of all rows each hypothesis continues: the order the loop gives the cache's state).
Step = Callable[[tuple, tf.Tensor], tuple[tuple, tf.Tensor | None]]


class Search(Protocol):
    """What a search gives the loop that runs it. Its state is a NamedTuple with KINDS, OUTPUTS
    (batch-first fields) and the fields index (the step, ()) and done ((B,) bool: the row has
    stopped)."""

    ids: TokenIds
    k: int  # hypotheses per source row K: the cache's and the guard's rows, a row's adjacent

    def start(self, cache: Nest, limits: tf.Tensor, length: int | tf.Tensor, trace: bool) -> tuple:
        """The state of the rows of limits (B,) before the first step: buffers of `length`, `cache`
        of B rows; with `trace`, room for a trace of every step."""

    def stepper(self, length: int | tf.Tensor, batch: tf.Tensor | None) -> Step:
        """The step of a loop over buffers of `length` and `batch` rows B (an int32 scalar), or,
        with None, rows that change from step to step, every one of them running. What every step
        reads is computed here, before the loop: a step runs node by node in TFLite and
        onnxruntime."""


class OnePass(NamedTuple):
    """All rows, one loop, full-length buffers. trace: beam search also returns the alive
    hypotheses after every step, for pictures."""

    trace: bool = False

    def run(self, search: Search, cache: Nest, lengths: Lengths) -> tuple:
        limits, length = lengths
        return _loop(search, search.start(cache, limits, length, self.trace), limits, length)


class TwoPasses(NamedTuple):
    """A first pass of every row in buffers of `first_length` T1 (int32 scalar), then the rows left
    in full-length buffers; `grow(cache_state, length)` grows the cache's buffers to a length."""

    first_length: int | tf.Tensor
    grow: Callable[[Nest, int | tf.Tensor], Nest]

    def run(self, search: Search, cache: Nest, lengths: Lengths) -> tuple:
        """All rows, with output and key/value buffers of T1, until at most a quarter of them are
        running (FIRST_PASS_ENDS_AT); then only the rows not yet `done`, in buffers of the full
        length T, to the end. Returns the first pass's state with the OUTPUTS of both.

        Why: each step reads and rewrites the whole fixed-shape buffers, and a batch steps until
        its last row is done. Most outputs end within a few tokens of their source's length; the
        few that run on (often repeating themselves to the limit) now continue alone, in the
        longer buffers, instead of holding the whole batch. A batch of one row runs the first pass
        to its end. The tokens are those of one pass: a row's result does not depend on its batch
        or buffer length. (DropDone needs a loop whose state changes shape at run time: a
        `tf.cond` in the body made every step at batch 1 slower in onnxruntime, and tf2onnx does
        not convert nested loops.)"""
        limits, length = lengths
        start = search.start(cache, limits, self.first_length, False)
        first = _loop(search, start, limits, self.first_length, tf.shape(limits)[0] // FIRST_PASS_ENDS_AT)
        left = tf.logical_not(first.done)  # (B,)
        rows = where(left)  # (R,) the rows left
        taken = _taken(first, rows, search.k)
        second = _loop(
            search, _grown(taken, length, self.grow, search.ids.pad), tf.gather(limits, rows), length
        )
        outputs = _grown(first._replace(cache=None), length, None, search.ids.pad)

        # Row b of the result, from the second pass's R rows followed by the first pass's B rows:
        # its row in the second pass if it was left, else its own row of the first pass (R + b).
        # One index for every output, and each one concat and one gather.
        position = tf.where(
            left, tf.cumsum(tf.cast(left, tf.int32)) - 1, tf.shape(rows)[0] + tf.range(tf.shape(left)[0])
        )
        return first._replace(
            **{
                name: tf.gather(tf.concat([getattr(second, name), getattr(outputs, name)], 0), position)
                for name in type(first).OUTPUTS
            }
        )


class DropDone(NamedTuple):
    """One loop whose batch shrinks: a row leaves it the step it is done."""

    def run(self, search: Search, cache: Nest, lengths: Lengths) -> tuple:
        """The R rows still running take each step; their outputs are written into buffers of all
        B rows, and the rows that are done then leave the loop: one gather of each field, the
        cache's state reordered (`Step`) in the same gather.

        Faster than two passes on batches, slightly slower on one sentence a call (the scatters
        and gathers of a step that drops nothing); the same tokens. Each node of a step costs a
        few microseconds in onnxruntime, so what a step reads is computed before the loop (the
        guard's bound), and the rows are int64, as ONNX's indices are (no casts a step)."""
        limits, length = lengths
        start = search.start(cache, limits, length, False)
        outputs = {name: getattr(start, name) for name in type(start).OUTPUTS}  # (B, ...)
        step, last_index = search.stepper(length, None), length - 1

        def body(s):
            state, order = step(s.state, tf.gather(limits, s.rows))
            keep = where(tf.logical_not(state.done), tf.int64)  # (R',) into R
            written = _written(s.outputs, s.rows, state)
            return [_Shrinking(tf.gather(s.rows, keep), _taken(state, keep, search.k, order), written)]

        def cond(s):
            return tf.logical_and(s.state.index <= last_index, tf.size(s.rows) >= 1)

        rows = where(limits > 0, tf.int64)  # (R,) all but empty sources
        state = _Shrinking(rows, _taken(start, rows, search.k), outputs)
        final = tf.while_loop(cond, body, [state], shape_invariants=[_shrinking(state)])[0]
        return start._replace(index=final.state.index, **final.outputs)


STRATEGIES = (OnePass, TwoPasses, DropDone)
ONE_PASS, DROP_DONE = OnePass(), DropDone()


def checked(loop):
    """`loop`, if it is one of the STRATEGIES."""
    if not isinstance(loop, STRATEGIES):
        raise TypeError(f"a search's loop is one of {[s.__name__ for s in STRATEGIES]}, not {loop!r}")
    return loop


def _loop(search, state, limits, length, rows_left=0):
    """The loop of OnePass and of each of TwoPasses' passes: `state`'s B rows (limits (B,)) step
    while the step index is within the buffers of `length` and more than `rows_left` of them
    are not done."""
    step = search.stepper(length, tf.shape(limits)[0])

    def body(s):
        s, order = step(s, limits)
        return [s if order is None else s._replace(cache=_reordered(s.cache, order))]

    return tf.while_loop(portable.loop_condition(length, rows_left), body, [state])[0]


def _reordered(cache, order):
    """The cache {"static", "state"} of (B * K, ...) with its state in `order` (B * K,). The static
    part is the same for every hypothesis of a row, so it is left as it is."""
    return {
        "static": cache["static"],
        "state": tf.nest.map_structure(lambda t: tf.gather(t, order), cache["state"]),
    }


def _by_kind(state, change):
    """`state` with each field `change(kind, value)`."""
    kinds = type(state).KINDS
    return type(state)(**{name: change(kinds[name], value) for name, value in state._asdict().items()})


def _taken(state, rows, k, order=None):
    """The state of the rows `rows` (R,) of `state` only: its rows' fields (B, ...) gathered, and
    its hypotheses' (B * k, ...); `order` (B * k,), the hypothesis each continues, whose cache
    state it takes (None: its own), in the same gather."""
    hypotheses = beams_of(rows, k)  # (R * k,)

    def taken(kind, value):
        if kind in (ROW, BUFFER):
            return tf.gather(value, rows)
        if kind == GUARD:
            return tf.nest.map_structure(lambda t: tf.gather(t, hypotheses), value)  # (): no guard
        if kind != CACHE:
            return value
        if order is None:
            return tf.nest.map_structure(lambda t: tf.gather(t, hypotheses), value)
        reordered = _reordered(value, tf.gather(order, hypotheses))["state"]
        return {
            "static": tf.nest.map_structure(lambda t: tf.gather(t, hypotheses), value["static"]),
            "state": reordered,
        }

    return _by_kind(state, taken)


def _grown(state, length, grow, pad_id):
    """`state` with its buffers (B, [K,] T1) padded to (B, [K,] T), T = `length`, and its cache's
    state grown (`grow(cache_state, length)`)."""

    def grown(kind, value):
        if kind == BUFFER:
            return portable.extend(value, length, axis=-1, value=pad_id)
        if kind == GUARD:  # (B * K, T1) -> (B * K, T); () without a guard
            return tf.nest.map_structure(lambda t: portable.extend(t, length, axis=-1), value)
        if kind == CACHE and value is not None:
            return {"static": value["static"], "state": grow(value["state"], length)}
        return value

    return _by_kind(state, grown)


class _Shrinking(NamedTuple):
    """DropDone's loop state."""

    rows: tf.Tensor  # (R,) the rows of the batch still running
    state: tuple  # the search's state of those rows
    outputs: dict[str, tf.Tensor]  # {name: (B, ...)} the search's OUTPUTS, of every row


def _written(outputs, rows, state):
    """The OUTPUTS of all B rows, those of the rows (R,) that `state` holds written in: one scatter
    into each buffer (a ScatterND in ONNX), the rows being distinct. TFLite has no builtin for it
    (its SCATTER_ND writes into zeros): LiteRT's files run the other strategies."""
    rows = tf.expand_dims(rows, 1)  # (R, 1)
    return {
        name: tf.tensor_scatter_nd_update(buffer, rows, getattr(state, name))
        for name, buffer in outputs.items()
    }


def _shrinking(state):
    """Shape invariants of a DropDone loop's state: the first dim of the rows' tensors unknown,
    the outputs' shapes kept."""

    def free_batch(t):
        return tf.TensorShape([None, *t.shape[1:]]) if t.shape.rank else t.shape

    return _Shrinking(
        *tf.nest.map_structure(free_batch, (state.rows, state.state)),
        tf.nest.map_structure(lambda t: t.shape, state.outputs),
    )

"""Greedy search: the most probable token at every step.

Shape letters: B batch, R rows still running, T buffer length (longest output), V vocabulary.
"""

from typing import NamedTuple

import tensorflow as tf

from kformer.decode.search import loops
from kformer.decode.search.common import NEG_INF, running, to_batch, where
from kformer.decode.search.repeat_guard import RepeatGuard
from kformer.model import portable


class GreedyState(NamedTuple):
    index: tf.Tensor  # () step
    last: tf.Tensor  # (B,) token fed at this step
    tokens: tf.Tensor  # (B, T) output buffer, pad after the end
    runs: object  # (B, T) int32 RepeatGuard runs of the output; () without a guard
    scores: tf.Tensor  # (B,) sum of log-probabilities of the output tokens
    done: tf.Tensor  # (B,) bool: the row has stopped (EOS or its limit)
    cache: object  # the step function's cache, batch-first tensors

    KINDS = {
        "index": loops.STEP,
        "last": loops.ROW,
        "tokens": loops.BUFFER,
        "runs": loops.GUARD,
        "scores": loops.ROW,
        "done": loops.ROW,
        "cache": loops.CACHE,
    }


def greedy_search(step, cache, lengths, ids, loop=loops.ONE_PASS, no_repeat_ngram=None, whole_top_1=False):
    """Picks the most probable token at every step; each row stops at EOS or at its limit.

    Args:
        step: `(tokens (B,), cache, index) -> (logits (B, V), cache)`.
        cache: initial cache (nested batch-first tensors).
        lengths: a common.Lengths: limits (B,) int32 maximum output length per row (0 = empty
            output), buffer T >= max(limits), the length of the output buffers.
        ids: a common.TokenIds.
        loop: how rows that are done stop stepping (kformer.decode.search.loops).
        no_repeat_ngram: int or int32 scalar: no n-gram of this size is output twice (<= 0: off;
            `RepeatGuard`); None: the loop has no guard at all (fewer nodes a step).
        whole_top_1: rank each row's logits in one top_k, not in chunks (`portable.top_tokens`).
    Returns (tokens (B, T) int32 with EOS kept and pad after, scores (B,) float32 log-probability).
    """
    limits, buffer_length = lengths
    if isinstance(loops.checked(loop), loops.DropDone):
        return _greedy_dropping_done(step, cache, lengths, ids, no_repeat_ngram, whole_top_1)

    def run(state, limits, length, rows_left=0):
        positions = tf.range(length)  # (T,) of the output buffer, read by every step
        guard = (
            None if no_repeat_ngram is None else RepeatGuard(no_repeat_ngram, tf.shape(limits)[0], positions)
        )

        def body(s):
            logits, cache = step(s.last, s.cache, s.index)  # (B, V)
            runs = s.runs
            if guard is not None:
                written = guard.written(s.index)
                logits = guard.ban(logits, s.tokens, s.runs, written)
            token_log_prob, token = (
                tf.squeeze(t, 1) for t in portable.top_log_probs(logits, 1, NEG_INF, whole_top_1)
            )  # (B,)
            token = tf.where(s.done, ids.pad, token)
            scores = s.scores + tf.where(s.done, 0.0, token_log_prob)
            done = s.done | tf.equal(token, ids.eos) | (s.index + 1 >= limits)
            if guard is not None:
                runs = guard.grown(s.runs, s.tokens, token, written)
            tokens = portable.write_slot(s.tokens, tf.equal(positions, s.index), token)
            return [GreedyState(s.index + 1, token, tokens, runs, scores, done, cache)]

        return tf.while_loop(portable.loop_condition(length, rows_left), body, [state])[0]

    batch = tf.shape(limits)[0]
    first_length = loops.first_length(loop, buffer_length)
    state = GreedyState(
        index=tf.constant(0),
        last=tf.fill([batch], ids.bos),
        tokens=tf.fill([batch, first_length], ids.pad),
        runs=() if no_repeat_ngram is None else tf.zeros([batch, first_length], tf.int32),
        scores=tf.zeros([batch]),
        done=tf.less_equal(limits, 0),
        cache=cache,
    )
    if isinstance(loop, loops.TwoPasses):
        final = loops.in_two_passes(run, state, limits, loop, buffer_length, ids.pad)
    else:
        final = run(state, limits, buffer_length)
    return final.tokens, final.scores


class DroppingGreedyState(NamedTuple):
    index: tf.Tensor  # () step
    rows: tf.Tensor  # (R,) the rows of the batch still running
    last: tf.Tensor  # (R,) token fed at this step
    runs: object  # (R, T) RepeatGuard runs of the running rows' outputs; () without a guard
    tokens: tf.Tensor  # (B, T) output buffer of every row, pad after the end
    scores: tf.Tensor  # (B,) sum of log-probabilities of the output tokens
    cache: object  # the running rows' cache, (R, ...) batch-first tensors

    WHOLE = ("tokens", "scores")  # the buffers of the whole batch (loops.shrinking)


def _greedy_dropping_done(step, cache, lengths, ids, no_repeat_ngram, whole_top_1):
    """`greedy_search` in one loop whose batch shrinks: the R rows still running take each step,
    its token is written into the buffers of all B rows, and the rows that end (EOS or their
    limit) are then dropped from the rows, their tokens and their cache (one gather of each).

    Faster than two passes on batches, slightly slower on one sentence a call (the scatters and
    gathers of a step that drops nothing); the same tokens. Each node of a step costs a few
    microseconds in onnxruntime, so what a step reads is computed before the loop (the
    scatters' shapes, the guard's bound).
    """
    limits, length = lengths
    batch = tf.shape(limits)[0]
    positions = tf.range(length)  # (T,)
    guard = None if no_repeat_ngram is None else RepeatGuard(no_repeat_ngram, None, positions)

    def body(s):
        logits, cache = step(s.last, s.cache, s.index)  # (R, V)
        runs = s.runs
        if guard is not None:
            written, outputs = guard.written(s.index), tf.gather(s.tokens, s.rows)  # (T,), (R, T)
            logits = guard.ban(logits, outputs, s.runs, written)
        token_log_prob, token = (
            tf.squeeze(t, 1) for t in portable.top_log_probs(logits, 1, NEG_INF, whole_top_1)
        )  # (R,)
        ends = tf.equal(token, ids.eos) | (s.index + 1 >= tf.gather(limits, s.rows))  # (R,)
        token_after = to_batch(s.rows, token + 1, [batch])  # (B,): 0 for the rows not running
        slot = tf.expand_dims(token_after > 0, 1) & tf.equal(positions, s.index)  # (B, T)
        tokens = tf.where(slot, tf.expand_dims(token_after - 1, 1), s.tokens)
        scores = s.scores + to_batch(s.rows, token_log_prob, [batch])
        if guard is not None:
            runs = guard.grown(s.runs, outputs, token, written)
        keep = where(tf.logical_not(ends), tf.int64)  # (R',) into R
        kept = lambda t: tf.gather(t, keep)  # noqa: E731
        state = (s.index + 1, kept(s.rows), kept(token), tf.nest.map_structure(kept, runs), tokens, scores)
        return [DroppingGreedyState(*state, tf.nest.map_structure(kept, cache))]

    rows = running(limits)
    state = DroppingGreedyState(
        index=tf.constant(0),
        rows=rows,
        last=tf.fill(tf.shape(rows), ids.bos),
        runs=() if no_repeat_ngram is None else tf.zeros(tf.stack([tf.size(rows), length]), tf.int32),
        tokens=tf.fill([batch, length], ids.pad),
        scores=tf.zeros([batch]),
        cache=tf.nest.map_structure(lambda t: tf.gather(t, rows), cache),
    )
    cond = loops.while_rows_run(length)
    final = tf.while_loop(cond, body, [state], shape_invariants=[loops.shrinking(state)])[0]
    return final.tokens, final.scores

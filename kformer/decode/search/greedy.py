"""Greedy search: the most probable token at every step.

Shape letters: B batch (the rows in the loop), T buffer length (longest output), V vocabulary.
"""

from typing import NamedTuple

import tensorflow as tf

from kformer.decode.search import loops
from kformer.decode.search.common import NEG_INF, Nest, StepFunction, TokenIds
from kformer.decode.search.repeat_guard import RepeatGuard
from kformer.model import portable


class GreedyState(NamedTuple):
    index: tf.Tensor  # () step
    last: tf.Tensor  # (B,) token fed at this step
    tokens: tf.Tensor  # (B, T) output buffer, pad after the end
    runs: tf.Tensor | tuple  # (B, T) int32 RepeatGuard runs of the output; () without a guard
    scores: tf.Tensor  # (B,) sum of log-probabilities of the output tokens
    done: tf.Tensor  # (B,) bool: the row has stopped (EOS or its limit)
    cache: Nest  # the step function's cache, batch-first tensors

    KINDS = {
        "index": loops.STEP,
        "last": loops.ROW,
        "tokens": loops.BUFFER,
        "runs": loops.GUARD,
        "scores": loops.ROW,
        "done": loops.ROW,
        "cache": loops.CACHE,
    }
    OUTPUTS = ("tokens", "scores")


def greedy_search(step, cache, lengths, ids, loop=loops.ONE_PASS, no_repeat_ngram=None, whole_top_1=False):
    """Picks the most probable token at every step; each row stops at EOS or at its limit.

    Args:
        step: `(tokens (B,), cache, index) -> (logits (B, V), cache)`.
        cache: initial cache (nested batch-first tensors).
        lengths: a common.Lengths: limits (B,) int32 maximum output length per row (0 = empty
            output), buffer T >= max(limits), the length of the output buffers.
        ids: a common.TokenIds.
        loop: the strategy that runs the loop (kformer.decode.search.loops).
        no_repeat_ngram: int or int32 scalar: no n-gram of this size is output twice (<= 0: off;
            `RepeatGuard`); None: the loop has no guard at all (fewer nodes a step).
        whole_top_1: rank each row's logits in one top_k, not in chunks (`portable.top_tokens`).
    Returns (tokens (B, T) int32 with EOS kept and pad after, scores (B,) float32 log-probability).
    """
    final = loops.checked(loop).run(_Greedy(step, ids, no_repeat_ngram, whole_top_1), cache, lengths)
    return final.tokens, final.scores


class _Greedy(NamedTuple):
    """What greedy search gives the loop that runs it (a loops.Search)."""

    step: StepFunction
    ids: TokenIds
    no_repeat_ngram: int | tf.Tensor | None
    whole_top_1: bool

    k = 1  # one hypothesis a row

    def start(self, cache, limits, length, trace):
        batch = tf.shape(limits)[0]
        return GreedyState(
            index=tf.constant(0),
            last=tf.fill([batch], self.ids.bos),
            tokens=tf.fill([batch, length], self.ids.pad),
            runs=() if self.no_repeat_ngram is None else tf.zeros([batch, length], tf.int32),
            scores=tf.zeros([batch]),
            done=tf.less_equal(limits, 0),
            cache=cache,
        )

    def stepper(self, length, batch):
        ids, positions = self.ids, tf.range(length)  # (T,) of the output buffer, read by every step
        guard = None if self.no_repeat_ngram is None else RepeatGuard(self.no_repeat_ngram, batch, positions)

        def step(s, limits):
            logits, cache = self.step(s.last, s.cache, s.index)  # (B, V)
            runs = s.runs
            if guard is not None:
                written = guard.written(s.index)
                logits = guard.ban(logits, s.tokens, s.runs, written)
            token_log_prob, token = (
                tf.squeeze(t, 1) for t in portable.top_log_probs(logits, 1, NEG_INF, self.whole_top_1)
            )  # (B,)
            done = tf.equal(token, ids.eos) | (s.index + 1 >= limits)
            if batch is not None:  # rows that are done step on: they write pad and keep their score
                token, token_log_prob = (
                    tf.where(s.done, ids.pad, token),
                    tf.where(s.done, 0.0, token_log_prob),
                )
                done |= s.done
            if guard is not None:
                runs = guard.grown(s.runs, s.tokens, token, written)
            tokens = portable.write_slot(s.tokens, tf.equal(positions, s.index), token)
            return GreedyState(s.index + 1, token, tokens, runs, s.scores + token_log_prob, done, cache), None

        return step

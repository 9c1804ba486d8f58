"""Beam search with the GNMT length penalty; alive and finished hypotheses are kept apart.

The step's cache is `{"static": ..., "state": ...}` (nested batch-first tensors; either part may
be `()`): static entries are fixed for a source row (encoder keys/values, masks), state entries
belong to one hypothesis (self-attention keys/values). Beam search tiles both to K beams once,
and reorders only the state as beams are re-ranked.

Shape letters: B batch (the rows in the loop), K beam size, T buffer length, V vocabulary.
"""

from typing import NamedTuple

import tensorflow as tf

from kformer.decode.options import LENGTH_PENALTY
from kformer.decode.search import loops
from kformer.decode.search.common import NEG_INF, Nest, StepFunction, TokenIds, length_penalty
from kformer.decode.search.repeat_guard import RepeatGuard
from kformer.model import portable


class BeamOptions(NamedTuple):
    """Beam search's run-time options, each a Python value or a scalar tensor (an input of the
    exported graphs).

    alpha: the length penalty's exponent (float32).
    nbest: how many finished hypotheses a row waits for (int32, at most K: a larger one waits until
        the limit; <= 1 is 1).
    no_repeat_ngram: as in `greedy_search`, for each hypothesis.
    """

    alpha: float | tf.Tensor = LENGTH_PENALTY
    nbest: int | tf.Tensor = 1
    no_repeat_ngram: int | tf.Tensor | None = None


DEFAULT_OPTIONS = BeamOptions()


class BeamState(NamedTuple):
    index: tf.Tensor  # () step
    alive_tokens: tf.Tensor  # (B, K, T)
    alive_runs: tf.Tensor | tuple  # (B * K, T) int32 RepeatGuard runs of the alive beams, or ()
    alive_log_probs: tf.Tensor  # (B, K) sum of log-probabilities, NEG_INF for dead slots
    finished_tokens: tf.Tensor  # (B, K, T)
    finished_scores: tf.Tensor  # (B, K) length-penalized scores, NEG_INF for empty slots
    done: tf.Tensor  # (B,) bool: the row has stopped (computed once a step, in the body)
    cache: Nest  # {"static", "state"} of (B * K, ...) batch-first tensors
    trace: tuple  # () or, with a trace, alive tokens (B, T, K, T) and log-probs (B, T, K) per step

    KINDS = {
        "index": loops.STEP,
        "alive_tokens": loops.BUFFER,
        "alive_runs": loops.GUARD,
        "alive_log_probs": loops.ROW,
        "finished_tokens": loops.BUFFER,
        "finished_scores": loops.ROW,
        "done": loops.ROW,
        "cache": loops.CACHE,
        "trace": loops.TRACE,
    }
    OUTPUTS = ("finished_tokens", "finished_scores")


def beam_search(step, cache, lengths, ids, beam_size, options=DEFAULT_OPTIONS, loop=loops.ONE_PASS):
    """Beam search with GNMT length penalty; alive and finished hypotheses are kept apart.

    Each step extends every alive beam, takes the top 2K candidates (so that K of them finishing
    at once still leaves K alive), keeps the best K non-finishing ones alive, and merges the
    finishing ones (EOS, or the row's length limit) into the K best finished by
    log-probability / ((5 + length) / 6)^alpha. A row is done once the most probable candidate
    of a step finishes and `nbest` hypotheses have finished, or at its length limit
    (CTranslate2's rule with num_hypotheses; the exact rule, until no alive beam could beat the
    best finished, took many more steps for a fraction of a BLEU point). With nbest 1 the search
    stops at the first such step; a larger nbest may run on and find a better-scoring best.

    Args:
        step, lengths, ids, loop: as in `greedy_search`; `cache` ({"static", "state"}) has batch
            B (tiled here). `loops.OnePass(trace=True)` also returns the alive hypotheses after
            every step, for pictures: {"tokens": (B, T, K, T), "log_probs": (B, T, K), "steps": ()}.
        beam_size: K.
        options: a BeamOptions (alpha, nbest, no_repeat_ngram).
    Returns (tokens (B, K, T) int32 best first, scores (B, K) float32 penalized log-probability)
    [, trace].
    """
    final = loops.checked(loop).run(_Beam(step, ids, beam_size, options), cache, lengths)
    outputs = _beam_outputs(final.finished_tokens, final.finished_scores, lengths.limits, ids.pad)
    if final.trace:
        return (*outputs, {"tokens": final.trace[0], "log_probs": final.trace[1], "steps": final.index})
    return outputs


class _Beam(NamedTuple):
    """What beam search gives the loop that runs it (a loops.Search)."""

    step: StepFunction
    ids: TokenIds
    k: int  # the beam size K
    options: BeamOptions

    def start(self, cache, limits, length, trace):
        """Buffers of `length`, the cache tiled to K beams, and a trace of `length` steps."""
        k, batch = self.k, tf.shape(limits)[0]
        # Only beam 0 is alive at first, so the first step does not pick K copies of one token.
        first = tf.concat([tf.zeros([batch, 1]), tf.fill([batch, k - 1], NEG_INF)], axis=1)
        empty = tf.fill([batch, k, length], self.ids.pad)
        guarded = self.options.no_repeat_ngram is not None
        history = ()
        if trace:
            history = (
                tf.fill([batch, length, k, length], self.ids.pad),
                tf.fill([batch, length, k], NEG_INF),
            )
        return BeamState(
            index=tf.constant(0),
            alive_tokens=empty,
            alive_runs=tf.zeros([batch * k, length], tf.int32) if guarded else (),
            alive_log_probs=first,
            finished_tokens=empty,
            finished_scores=tf.fill([batch, k], NEG_INF),
            done=tf.less_equal(limits, 0),
            cache=portable.repeat_rows(cache, k),
            trace=history,
        )

    def stepper(self, length, batch):
        k, ngram = self.k, self.options.no_repeat_ngram
        positions = tf.range(length)  # (T,) in the output buffers
        guard = None if ngram is None else RepeatGuard(ngram, None if batch is None else batch * k, positions)
        # (B, 1) where each row's beams start in the cache; a step counts the rows that change
        row_starts = None if batch is None else tf.expand_dims(tf.range(batch) * k, 1)

        def step(s, limits):
            starts = tf.expand_dims(tf.range(tf.size(limits)) * k, 1) if row_starts is None else row_starts
            return _beam_step(s, self, limits, _Stepper(positions, guard, starts))

        return step


class _Stepper(NamedTuple):
    """What a step of one beam search loop reads beyond its state, computed before it."""

    positions: tf.Tensor  # (T,) in the output buffers
    guard: RepeatGuard | None  # of B * K rows
    row_starts: tf.Tensor  # (B, 1) where each row's beams start in the cache


def _gather_beams(tensor, indices):
    """tensor (B, N, ...), indices (B, K) into N -> (B, K, ...)."""
    return tf.gather(tensor, indices, axis=1, batch_dims=1)


def _top_candidates(s, step, k, bos_id, ban):
    """Every alive beam extended by one token (none that `ban(logits)` bans): the 2K best
    candidates of each row, as (log-probabilities (B, 2K), the beam each extends (B, 2K), its
    token (B, 2K), the step's cache)."""
    last = tf.reshape(tf.gather(s.alive_tokens, tf.maximum(s.index - 1, 0), axis=2), [-1])
    last = tf.where(s.index >= 1, last, bos_id)  # >=: see portable.loop_condition
    logits, cache = step(last, s.cache, s.index)  # (B * K, V)
    logits = ban(logits)
    # The 2K best of all K * V extensions are among the N = min(2K, V) best of each beam.
    vocab = logits.shape[-1]  # static for a Keras model; 2K when unknown (then V >= 2K is assumed)
    per_beam = 2 * k if vocab is None else min(2 * k, vocab)
    log_probs, tokens = portable.top_log_probs(logits, per_beam, NEG_INF)  # (B * K, N)
    candidates = tf.reshape(
        tf.expand_dims(s.alive_log_probs, 2) + tf.reshape(log_probs, [-1, k, per_beam]),
        [-1, k * per_beam],
    )  # (B, K * N)
    top_log_probs, top_indices = tf.math.top_k(candidates, k=2 * k)  # (B, 2K)
    top_tokens = tf.gather(tf.reshape(tokens, [-1, k * per_beam]), top_indices, batch_dims=1)
    return top_log_probs, top_indices // per_beam, top_tokens, cache


def _merge_finished(s, top_seqs, new_scores, k):
    """The K best finished hypotheses (B, K, T) and scores (B, K): the old K and the candidates
    that finish at this step (`new_scores`, NEG_INF for the others); a done row takes no more."""
    new_scores = tf.where(tf.expand_dims(s.done, 1), NEG_INF, new_scores)
    scores = tf.concat([s.finished_scores, new_scores], axis=1)  # (B, 3K)
    finished_scores, pick = tf.math.top_k(scores, k=k)
    return _gather_beams(tf.concat([s.finished_tokens, top_seqs], axis=1), pick), finished_scores


def _traced(history, slot, alive_tokens, alive_log_probs):
    """Row `index` of the history = the alive beams after this step (one pass: T buffers)."""
    return (
        tf.where(slot[None, :, None, None], alive_tokens[:, None], history[0]),
        tf.where(slot[None, :, None], alive_log_probs[:, None], history[1]),
    )


def _beam_step(s, beam, limits, stepper):
    """One step of `beam_search` (`beam`, a _Beam) from state `s` of B rows (limits (B,);
    `stepper`, a _Stepper of the loop). Returns (the next state, its cache the step's before beams
    are reordered; (B * K,) the beam of all rows that each alive beam continues, the reorder).
    Reshapes keep a -1 for the batch: a shape built from tf.shape at every step is four exported
    nodes."""
    k, ids, (positions, guard, row_starts) = beam.k, beam.ids, stepper
    if guard is None:
        ban = lambda logits: logits  # noqa: E731
    else:
        written = guard.written(s.index)
        flat_shape = portable.shape_in_loop(s.alive_runs)  # (B * K, T), as the alive tokens flat
        alive_before = tf.reshape(s.alive_tokens, flat_shape)
        ban = lambda logits: guard.ban(logits, alive_before, s.alive_runs, written)  # noqa: E731
    top_log_probs, top_beams, top_tokens, cache = _top_candidates(s, beam.step, k, ids.bos, ban)  # (B, 2K)
    slot = tf.equal(positions, s.index)  # (T,)
    top_seqs = portable.write_slot(_gather_beams(s.alive_tokens, top_beams), slot, top_tokens)  # (B, 2K, T)
    length = s.index + 1
    at_limit = length >= limits  # (B,)
    finishing = tf.equal(top_tokens, ids.eos) | tf.expand_dims(at_limit, 1)  # (B, 2K)
    valid = top_log_probs > NEG_INF / 2  # candidates of dead beams stay dead

    # Alive: the K best candidates that do not finish.
    alive_candidates = tf.where(finishing | ~valid, NEG_INF, top_log_probs)
    alive_log_probs, alive_pick = tf.math.top_k(alive_candidates, k=k)  # (B, K) into 2K
    alive_tokens = _gather_beams(top_seqs, alive_pick)
    # (B * K,): the beam of all rows that each alive beam continues
    continued = tf.reshape(_gather_beams(top_beams, alive_pick) + row_starts, [-1])
    alive_runs = s.alive_runs
    if guard is not None:
        alive_flat = tf.reshape(alive_tokens, flat_shape)  # before this step's slot: its beam's
        alive_runs = guard.grown(
            tf.gather(s.alive_runs, continued),
            alive_flat,
            tf.gather(alive_flat, s.index, axis=1),
            written,
        )

    new_scores = tf.where(
        finishing & valid, top_log_probs / length_penalty(length, beam.options.alpha), NEG_INF
    )
    finished_tokens, finished_scores = _merge_finished(s, top_seqs, new_scores, k)
    # The most probable candidate (top_k sorts them) finishes: a gather, where [:, 0] is two nodes.
    # It is valid in a row not done. At the limit every candidate finishes, so the row is done
    # however few have; before it, it waits for nbest finished hypotheses.
    filled = tf.reduce_sum(tf.cast(finished_scores > NEG_INF / 2, tf.int32), axis=1)  # (B,)
    enough = (filled >= beam.options.nbest) | at_limit
    done = s.done | (tf.gather(finishing, 0, axis=1) & enough)
    history = _traced(s.trace, slot, alive_tokens, alive_log_probs) if s.trace else ()
    state = (length, alive_tokens, alive_runs, alive_log_probs, finished_tokens, finished_scores, done)
    return BeamState(*state, cache, history), continued


def _beam_outputs(finished_tokens, finished_scores, limits, pad_id):
    """(tokens, scores) of the finished hypotheses (B, K, T), (B, K). Every row with limit >= 1
    has some (all finish at the limit); an empty source (limit 0) gives empty outputs with score
    0, like greedy search."""
    has_output = limits > 0
    tokens = tf.where(has_output[:, None, None], finished_tokens, pad_id)
    scores = tf.where(has_output[:, None], finished_scores, 0.0)
    return tokens, scores

"""Beam search with the GNMT length penalty; alive and finished hypotheses are kept apart.

The step's cache is `{"static": ..., "state": ...}` (nested batch-first tensors; either part may
be `()`): static entries are fixed for a source row (encoder keys/values, masks), state entries
belong to one hypothesis (self-attention keys/values). Beam search tiles both to K beams once,
and reorders only the state as beams are re-ranked.

Shape letters: B batch, R rows still running, K beam size, T buffer length, V vocabulary.
"""

from typing import NamedTuple

import tensorflow as tf

from kformer.decode.search import loops
from kformer.decode.search.common import NEG_INF, beams_of, length_penalty, running, to_batch, where
from kformer.decode.search.repeat_guard import RepeatGuard
from kformer.model import portable
from kformer.model.config import LENGTH_PENALTY


class BeamState(NamedTuple):
    index: tf.Tensor  # () step
    alive_tokens: tf.Tensor  # (B, K, T)
    alive_runs: (
        object  # (B * K, T) int32 RepeatGuard runs of the alive beams (beams of a row adjacent), or ()
    )
    alive_log_probs: tf.Tensor  # (B, K) sum of log-probabilities, NEG_INF for dead slots
    finished_tokens: tf.Tensor  # (B, K, T)
    finished_scores: tf.Tensor  # (B, K) length-penalized scores, NEG_INF for empty slots
    done: tf.Tensor  # (B,) bool: the row has stopped (computed once a step, in the body)
    cache: object  # {"static", "state"} of (B * K, ...) batch-first tensors, beams of one row adjacent
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


class _Stepper(NamedTuple):
    """What every step of one beam search loop reads, computed once before it."""

    step: object  # (tokens (B * K,), cache, index) -> (logits (B * K, V), cache)
    k: int  # the beam size K
    ids: object  # common.TokenIds
    alpha: object  # the length penalty's exponent
    nbest: object  # finished hypotheses a row needs before it may stop (int or int32 scalar tensor)
    positions: tf.Tensor  # (T,) in the output buffers
    guard: object  # a RepeatGuard of B * K rows, or None
    trace: bool  # the state keeps the alive hypotheses of every step


def beam_search(
    step,
    cache,
    lengths,
    ids,
    beam_size,
    alpha=LENGTH_PENALTY,
    loop=loops.ONE_PASS,
    no_repeat_ngram=None,
    nbest=1,
):
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
        alpha: the length penalty's exponent, a float or a float32 scalar tensor.
        no_repeat_ngram: as in `greedy_search`, for each hypothesis.
        nbest: how many finished hypotheses a row waits for (int or int32 scalar tensor, at most
            K: a larger one waits until the limit; <= 1 is 1).
    Returns (tokens (B, K, T) int32 best first, scores (B, K) float32 penalized log-probability)
    [, trace].
    """
    k, (limits, buffer_length) = beam_size, lengths
    trace = isinstance(loops.checked(loop), loops.OnePass) and loop.trace

    def run(state, limits, length, rows_left=0):
        # Computed once, read by every step: positions (T,) in the output buffers, and where each
        # row's beams start (B, 1) in the cache.
        positions = tf.range(length)
        row_starts = tf.expand_dims(tf.range(tf.shape(limits)[0]) * k, 1)
        rows = tf.shape(limits)[0] * k
        guard = None if no_repeat_ngram is None else RepeatGuard(no_repeat_ngram, rows, positions)
        stepper = _Stepper(step, k, ids, alpha, nbest, positions, guard, trace)

        def body(s):
            state, continued = _beam_step(s, stepper, limits, row_starts)
            return [state._replace(cache=_reorder_state(state.cache, continued))]

        return tf.while_loop(portable.loop_condition(length, rows_left), body, [state])[0]

    if isinstance(loop, loops.DropDone):
        return _beam_outputs(
            *_beam_dropping_done(step, cache, lengths, ids, k, alpha, nbest, no_repeat_ngram),
            limits,
            ids.pad,
        )
    first_length = loops.first_length(loop, buffer_length)
    state = _first_beam_state(
        cache, limits, k, first_length, buffer_length if trace else None, ids.pad, no_repeat_ngram
    )
    if isinstance(loop, loops.TwoPasses):
        final = loops.in_two_passes(run, state, limits, loop, buffer_length, ids.pad, beam_size=k)
    else:
        final = run(state, limits, buffer_length)
    outputs = _beam_outputs(final.finished_tokens, final.finished_scores, limits, ids.pad)
    if trace:
        return (*outputs, {"tokens": final.trace[0], "log_probs": final.trace[1], "steps": final.index})
    return outputs


class DroppingBeamState(NamedTuple):
    rows: tf.Tensor  # (R,) the rows of the batch still running
    beams: BeamState  # theirs: (R, ...) and (R * K, ...)
    out_tokens: tf.Tensor  # (B, K, T) every row's finished hypotheses
    out_scores: tf.Tensor  # (B, K) their scores, NEG_INF for empty slots

    WHOLE = ("out_tokens", "out_scores")  # the buffers of the whole batch (loops.shrinking)

    @property
    def index(self):  # () step, as loops.while_rows_run reads it
        return self.beams.index


def _beam_dropping_done(step, cache, lengths, ids, k, alpha, nbest, no_repeat_ngram):
    """`beam_search` in one loop whose batch shrinks, as greedy's DropDone loop: the R rows still
    running take each step; their finished hypotheses are written into the buffers of all B rows,
    and the rows done are then dropped, with their beams' cache. The reorder of the cache's state
    and the drop are one gather. Returns the finished (tokens (B, K, T), scores (B, K))."""
    limits, length = lengths
    batch = tf.shape(limits)[0]
    positions = tf.range(length)  # (T,)
    tokens_shape, scores_shape = tf.stack([batch, k, length]), tf.stack([batch, k])  # (B, K, T), (B, K)

    guard = None if no_repeat_ngram is None else RepeatGuard(no_repeat_ngram, None, positions)
    stepper = _Stepper(step, k, ids, alpha, nbest, positions, guard, False)

    def body(s):
        row_starts = tf.expand_dims(tf.range(tf.size(s.rows)) * k, 1)  # (R, 1)
        beams, continued = _beam_step(s.beams, stepper, tf.gather(limits, s.rows), row_starts)
        finished_after = to_batch(
            s.rows, beams.finished_tokens + 1, tokens_shape
        )  # (B, K, T): 0 if not running
        stepped = finished_after[:, :1, :1] > 0  # (B, 1, 1)
        out_tokens = tf.where(stepped, finished_after - 1, s.out_tokens)
        out_scores = tf.where(
            stepped[:, :, 0], to_batch(s.rows, beams.finished_scores, scores_shape), s.out_scores
        )
        keep = where(tf.logical_not(beams.done))  # (R',) into R
        return [
            DroppingBeamState(
                tf.gather(s.rows, keep), _kept(beams, continued, keep, k), out_tokens, out_scores
            )
        ]

    rows = running(limits)
    state = DroppingBeamState(
        rows=rows,
        beams=_first_beam_state(
            tf.nest.map_structure(lambda t: tf.gather(t, rows), cache),
            tf.gather(limits, rows),
            k,
            length,
            None,
            ids.pad,
            no_repeat_ngram,
        ),
        out_tokens=tf.fill([batch, k, length], ids.pad),
        out_scores=tf.fill([batch, k], NEG_INF),
    )
    cond = loops.while_rows_run(length)
    final = tf.while_loop(cond, body, [state], shape_invariants=[loops.shrinking(state)])[0]
    return final.out_tokens, final.out_scores


def _kept(beams, continued, keep, k):
    """The beams of the rows `keep` (R',) into R after a step; `continued` (R * K,): the beam each
    alive beam continues. The reorder of the beams and the drop of the rows are one gather."""
    kept_beams = beams_of(keep, k)  # (R' * K,) into R * K
    cache = {
        "static": tf.nest.map_structure(lambda t: tf.gather(t, kept_beams), beams.cache["static"]),
        "state": _reorder_state(beams.cache, tf.gather(continued, kept_beams))["state"],
    }
    by_row = lambda t: tf.gather(t, keep)  # noqa: E731
    return BeamState(
        index=beams.index,
        alive_tokens=by_row(beams.alive_tokens),
        alive_runs=tf.nest.map_structure(lambda t: tf.gather(t, kept_beams), beams.alive_runs),
        alive_log_probs=by_row(beams.alive_log_probs),
        finished_tokens=by_row(beams.finished_tokens),
        finished_scores=by_row(beams.finished_scores),
        done=by_row(beams.done),
        cache=cache,
        trace=(),
    )


def _gather_beams(tensor, indices):
    """tensor (B, N, ...), indices (B, K) into N -> (B, K, ...)."""
    return tf.gather(tensor, indices, axis=1, batch_dims=1)


def _reorder_state(cache, flat):
    """Beam k of row b continues from the beam (B * K,) flat[b * K + k] of all rows: reorders
    the (B * K, ...) state of the cache. The static part is the same for every beam of a row, so
    it is left as it is."""
    return {
        "static": cache["static"],
        "state": tf.nest.map_structure(lambda t: tf.gather(t, flat, axis=0), cache["state"]),
    }


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


def _first_beam_state(cache, limits, k, length, trace_length, pad_id, no_repeat_ngram):
    """The state before the first step: buffers of `length`, the cache tiled to K beams, and a
    trace of `trace_length` steps (None: no trace)."""
    batch = tf.shape(limits)[0]
    # Only beam 0 is alive at first, so the first step does not pick K copies of one token.
    first = tf.concat([tf.zeros([batch, 1]), tf.fill([batch, k - 1], NEG_INF)], axis=1)
    empty = tf.fill([batch, k, length], pad_id)
    trace = ()
    if trace_length is not None:
        trace = (
            tf.fill([batch, trace_length, k, trace_length], pad_id),
            tf.fill([batch, trace_length, k], NEG_INF),
        )
    return BeamState(
        index=tf.constant(0),
        alive_tokens=empty,
        alive_runs=() if no_repeat_ngram is None else tf.zeros([batch * k, length], tf.int32),
        alive_log_probs=first,
        finished_tokens=empty,
        finished_scores=tf.fill([batch, k], NEG_INF),
        done=tf.less_equal(limits, 0),
        cache=portable.repeat_rows(cache, k),
        trace=trace,
    )


def _beam_step(s, stepper, limits, row_starts):
    """One step of `beam_search` from state `s` of B rows (limits (B,), row_starts (B, 1): where
    each row's beams start in the cache; `stepper`, a _Stepper of the loop). Returns
    (the next state, its cache the step's before beams are reordered; (B * K,) the beam of all
    rows that each alive beam continues, the reorder). Reshapes keep a -1 for the batch: a shape
    built from tf.shape at every step is four exported nodes."""
    step, k, ids, alpha, nbest, positions, guard, trace = stepper
    if guard is None:
        ban = lambda logits: logits  # noqa: E731
    else:
        written = guard.written(s.index)
        flat_shape = portable.shape_in_loop(s.alive_runs)  # (B * K, T), as the alive tokens flat
        alive_before = tf.reshape(s.alive_tokens, flat_shape)
        ban = lambda logits: guard.ban(logits, alive_before, s.alive_runs, written)  # noqa: E731
    top_log_probs, top_beams, top_tokens, cache = _top_candidates(s, step, k, ids.bos, ban)  # (B, 2K)
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

    new_scores = tf.where(finishing & valid, top_log_probs / length_penalty(length, alpha), NEG_INF)
    finished_tokens, finished_scores = _merge_finished(s, top_seqs, new_scores, k)
    # The most probable candidate (top_k sorts them) finishes: a gather, where [:, 0] is two nodes.
    # It is valid in a row not done. At the limit every candidate finishes, so the row is done
    # however few have; before it, it waits for nbest finished hypotheses.
    filled = tf.reduce_sum(tf.cast(finished_scores > NEG_INF / 2, tf.int32), axis=1)  # (B,)
    enough = (filled >= nbest) | at_limit
    done = s.done | (tf.gather(finishing, 0, axis=1) & enough)
    history = _traced(s.trace, slot, alive_tokens, alive_log_probs) if trace else s.trace
    state = (
        length,
        alive_tokens,
        alive_runs,
        alive_log_probs,
        finished_tokens,
        finished_scores,
        done,
        cache,
        history,
    )
    return BeamState(*state), continued


def _beam_outputs(finished_tokens, finished_scores, limits, pad_id):
    """(tokens, scores) of the finished hypotheses (B, K, T), (B, K). Every row with limit >= 1
    has some (all finish at the limit); an empty source (limit 0) gives empty outputs with score
    0, like greedy search."""
    has_output = limits > 0
    tokens = tf.where(has_output[:, None, None], finished_tokens, pad_id)
    scores = tf.where(has_output[:, None], finished_scores, 0.0)
    return tokens, scores

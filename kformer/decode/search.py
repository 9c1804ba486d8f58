"""Greedy and beam search over `step(tokens, cache, index) -> (logits, cache)`.

Search knows nothing about the model. The step's cache is `{"static": ..., "state": ...}` (nested
batch-first tensors; either part may be `()`): static entries are fixed for a source row (encoder
keys/values, masks), state entries belong to one hypothesis (self-attention keys/values). Beam
search tiles both to K beams once, and reorders only the state as beams are re-ranked.

Every loop is a `tf.while_loop`: preallocated token buffers written with one-hot blends, tokens
chosen with `top_k` (never argmax), no TensorArray, no Python loop over steps, so the same graph
exports to SavedModel, TFLite and ONNX; the spellings that keep it so are kformer.model.portable's. The
cache's state may grow along its step axis from step to step (`Transformer.init_cache`).

A batch steps until its last row is done, so rows that are done should stop costing steps. With
`drop_done`, the loop's batch shrinks: each step keeps only the rows not yet done (their cache
too), and writes its tokens into buffers of the whole batch (`_greedy_dropping_done`,
`_beam_dropping_done`); for runtimes whose loops take shapes that change from step to step
(TensorFlow, onnxruntime). With `first_pass`, for fixed shapes (LiteRT, whose loop bodies are
planned once): two loops, short buffers for all rows until only a quarter of them run on, then
full-length buffers for those (`_in_two_passes`).

Shape letters: B batch, K beam size, T buffer length (longest output), V vocabulary.
"""

from typing import NamedTuple

import tensorflow as tf

from kformer.model import portable
from kformer.model.config import EXTRA_OUTPUT_TOKENS, LENGTH_PENALTY

# The first pass stops once at most 1/4 of its rows are running (`_in_two_passes`): the fastest of
# the shares measured (1/2, 1/4, 1/8), in TFLite and ONNX, greedy and beam.
FIRST_PASS_ENDS_AT = 4

NEG_INF = -1.0e9  # finite: -inf would turn 0 * inf into NaN in the blends below


def output_limits(source_ids, pad_id, cap, extra=EXTRA_OUTPUT_TOKENS, buffer_cap=None):
    """Per-row maximum output length: source length + `extra` (the paper's rule), at most `cap`
    (an int or an int32 scalar tensor, a run-time option); 0 for an empty source, which yields an
    empty output.

    Returns ((B,) limits, T), the buffer length T = min(S + extra, buffer_cap) (default: cap).
    A Python int `buffer_cap` >= cap makes T depend on the padded input shape alone, not on
    values (XLA compiles one program per input shape; LiteRT.js needs static shapes).
    """
    source_lengths = tf.reduce_sum(tf.cast(tf.not_equal(source_ids, pad_id), tf.int32), axis=1)
    limits = tf.where(source_lengths > 0, tf.minimum(source_lengths + extra, cap), 0)
    return limits, tf.minimum(tf.shape(source_ids)[1] + extra, cap if buffer_cap is None else buffer_cap)


def length_penalty(length, alpha):
    """GNMT length penalty ((5 + length) / 6)^alpha."""
    return tf.pow((5.0 + tf.cast(length, tf.float32)) / 6.0, alpha)


class RepeatGuard:
    """The n-gram repeat guard of one search loop (`no_repeat_ngram_size` of CTranslate2 and
    fairseq: no n-gram of `ngram` tokens occurs twice in an output; ngram <= 0: off), over R
    hypothesis rows with output buffers of T (`positions` (T,)). What its steps read is computed
    here, once, before the loop: a search step runs node by node in TFLite and onnxruntime.

    The state it keeps per hypothesis is `runs` (R, T) int32: runs[r, j] (j <= the step index)
    is the length of the longest common suffix of the output's first j tokens and of all its
    tokens. Token j is banned when the ngram - 1 tokens before it are the last ngram - 1 tokens,
    i.e. runs[r, j] >= ngram - 1. NEG_INF is added to the banned tokens' logits, so the search's
    log-probabilities are those of the tokens left (logits minus their log-sum-exp).

    The loop runs its nodes whatever the option: off, no run reaches `least_run`. A second loop
    without them, for the option off, would double the loop bodies that each runtime compiles and
    packs the weights for, raising every peak for a small saving at batch 1 in LiteRT alone."""

    def __init__(self, ngram, rows, positions):
        """rows: R, or None when R changes from step to step (`drop_done`): then the steps count
        their rows."""
        self.positions = positions  # (T,)
        # A run no output reaches when the guard is off: the same graph either way.
        self.least_run = tf.where(ngram > 0, ngram - 1, tf.int32.max)
        self.rows = None if rows is None else tf.expand_dims(tf.range(rows), 1)  # (R, 1)
        self.zeros = None if rows is None else tf.zeros([rows, 1], tf.int32)

    def written(self, index):
        """(T,) bool: the positions of the output so far, before step `index`."""
        return self.positions < index

    def ban(self, logits, tokens, runs, written):
        """logits (R, V) with NEG_INF (or a multiple) added to the tokens that would repeat an
        n-gram; tokens, runs (R, T). A scatter of NEG_INF at the banned tokens, and of 0 at a row's
        token 0 for the positions not banned, into (R * V,) penalties (duplicates are summed, in
        TensorFlow and TFLite alike), then one add of equal shapes: fixed shapes (the number banned
        varies by row and step), a pass over (R, V) rather than a one-hot of (R, T, V), and no
        update in place. ONNX: onnx_rewrite's _scatter_adds scatters into the logits themselves."""
        vocab = logits.shape[-1]
        vocab = tf.shape(logits)[1] if vocab is None else vocab
        banned = (runs >= self.least_run) & written  # (R, T)
        rows = tf.expand_dims(tf.range(tf.shape(runs)[0]), 1) if self.rows is None else self.rows
        flat = rows * vocab + tf.where(banned, tokens, 0)  # (R, T) into (R * V,)
        penalties = tf.scatter_nd(
            tf.reshape(flat, [-1, 1]),
            tf.reshape(tf.where(banned, NEG_INF, 0.0), [-1]),
            portable.shape_in_loop(tf.reshape(logits, [-1])),  # (R * V,)
        )  # (R * V,)
        return logits + tf.cast(tf.reshape(penalties, [-1, vocab]), logits.dtype)

    def grown(self, runs, tokens, token, written):
        """The runs after `token` (R,) is written at the step's position of `tokens` (R, T)
        (whose `written` positions are read): the run at j + 1 grows by one where tokens[j] ==
        token, else it is 0. One shift a step, whatever the n-gram size (a run-time input)."""
        grown = tf.where(tf.equal(tokens, tf.expand_dims(token, 1)) & written, runs + 1, 0)  # runs at j + 1
        zeros = tf.zeros_like(runs[:, :1]) if self.zeros is None else self.zeros
        return tf.concat([zeros, grown[:, :-1]], axis=1)


class GreedyState(NamedTuple):
    index: tf.Tensor  # () step
    last: tf.Tensor  # (B,) token fed at this step
    tokens: tf.Tensor  # (B, T) output buffer, pad after the end
    runs: object  # (B, T) int32 RepeatGuard runs of the output; () without a guard
    scores: tf.Tensor  # (B,) sum of log-probabilities of the output tokens
    done: tf.Tensor  # (B,) bool: the row has stopped (EOS or its limit)
    cache: object  # the step function's cache, batch-first tensors


def greedy_search(
    step,
    cache,
    limits,
    buffer_length,
    bos_id,
    eos_id,
    pad_id=0,
    first_pass=None,
    no_repeat_ngram=None,
    drop_done=False,
):
    """Picks the most probable token at every step; each row stops at EOS or at its limit.

    Args:
        step: `(tokens (B,), cache, index) -> (logits (B, V), cache)`.
        cache: initial cache (nested batch-first tensors).
        limits: (B,) int32 maximum output length per row (0 = empty output).
        buffer_length: scalar int32 T >= max(limits), the length of the output buffers.
        first_pass: None (one pass), or `(T1, grow)` to search in two passes (see `_in_two_passes`).
        no_repeat_ngram: int or int32 scalar: no n-gram of this size is output twice (<= 0: off;
            `RepeatGuard`); None: the loop has no guard at all (fewer nodes a step).
        drop_done: rows leave the loop the step they are done (`_greedy_dropping_done`); then
            first_pass must be None.
    Returns (tokens (B, T) int32 with EOS kept and pad after, scores (B,) float32 log-probability).
    """
    if drop_done:
        _check_one_way(first_pass)
        return _greedy_dropping_done(
            step, cache, limits, buffer_length, bos_id, eos_id, pad_id, no_repeat_ngram
        )

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
                tf.squeeze(t, 1) for t in portable.top_log_probs(logits, 1, NEG_INF)
            )  # (B,)
            token = tf.where(s.done, pad_id, token)
            scores = s.scores + tf.where(s.done, 0.0, token_log_prob)
            done = s.done | tf.equal(token, eos_id) | (s.index + 1 >= limits)
            if guard is not None:
                runs = guard.grown(s.runs, s.tokens, token, written)
            tokens = portable.write_slot(s.tokens, tf.equal(positions, s.index), token)
            return [GreedyState(s.index + 1, token, tokens, runs, scores, done, cache)]

        return tf.while_loop(portable.loop_condition(length, rows_left), body, [state])[0]

    batch = tf.shape(limits)[0]
    first_length = buffer_length if first_pass is None else first_pass[0]
    state = GreedyState(
        index=tf.constant(0),
        last=tf.fill([batch], bos_id),
        tokens=tf.fill([batch, first_length], pad_id),
        runs=() if no_repeat_ngram is None else tf.zeros([batch, first_length], tf.int32),
        scores=tf.zeros([batch]),
        done=tf.less_equal(limits, 0),
        cache=cache,
    )
    if first_pass is None:
        final = run(state, limits, buffer_length)
    else:
        final = _in_two_passes(run, state, limits, first_length, buffer_length, first_pass[1], pad_id)
    return final.tokens, final.scores


def _check_one_way(first_pass):
    if first_pass is not None:
        raise ValueError("a search drops its done rows (drop_done) or runs two passes (first_pass), not both")


def _where(mask, dtype=tf.int32):
    """(N,) the positions where (B,) bool `mask` is True, in order; int64 as tf.where (and ONNX's
    NonZero) gives them saves a cast, for indices only gathered by."""
    positions = tf.reshape(tf.where(mask), [-1])
    return positions if dtype == tf.int64 else tf.cast(positions, dtype)


def _running(limits):
    """(R,) int32 the rows of limits (B,) that take a first step: all but empty sources."""
    return _where(limits > 0)


def _to_batch(rows, values, shape):
    """values (R, ...) of the running `rows` (R,) scattered into zeros of `shape` (B, ...), a
    shape computed before the loop (no shape read a step); rows are distinct, so a plain scatter
    (no duplicates to add). The result keeps the static dims of `values` past the first (a beam
    of 1 would otherwise broadcast to an unknown dim and change a loop variable's shape)."""
    scattered = tf.scatter_nd(tf.expand_dims(rows, 1), values, shape)
    scattered.set_shape([None, *values.shape[1:]])
    return scattered


def _shrinking(state, whole):
    """Shape invariants of a loop state whose batch-first tensors shrink: their first dim unknown,
    but for the fields named in `whole` (the buffers of the whole batch) and scalars."""

    def free_batch(t):
        return tf.TensorShape([None, *t.shape[1:]]) if t.shape.rank else t.shape

    return type(state)(
        **{
            name: (
                tf.nest.map_structure(lambda t: t.shape, value)
                if name in whole
                else tf.nest.map_structure(free_batch, value)
            )
            for name, value in state._asdict().items()
        }
    )


class DroppingGreedyState(NamedTuple):
    index: tf.Tensor  # () step
    rows: tf.Tensor  # (R,) the rows of the batch still running
    last: tf.Tensor  # (R,) token fed at this step
    runs: object  # (R, T) RepeatGuard runs of the running rows' outputs; () without a guard
    tokens: tf.Tensor  # (B, T) output buffer of every row, pad after the end
    scores: tf.Tensor  # (B,) sum of log-probabilities of the output tokens
    cache: object  # the running rows' cache, (R, ...) batch-first tensors


def _greedy_dropping_done(step, cache, limits, length, bos_id, eos_id, pad_id, no_repeat_ngram):
    """`greedy_search` in one loop whose batch shrinks: the R rows still running take each step,
    its token is written into the buffers of all B rows, and the rows that end (EOS or their
    limit) are then dropped from the rows, their tokens and their cache (one gather of each).

    Faster than two passes on batches, slightly slower on one sentence a call (the scatters and
    gathers of a step that drops nothing); the same tokens. Each node of a step costs a few microseconds
    in onnxruntime, so what a step reads is computed before the loop (the scatters' shapes, the
    guard's bound).
    """
    batch = tf.shape(limits)[0]
    positions = tf.range(length)  # (T,)
    guard = None if no_repeat_ngram is None else RepeatGuard(no_repeat_ngram, None, positions)

    def body(s):
        logits, cache = step(s.last, s.cache, s.index)  # (R, V)
        runs = s.runs
        if guard is not None:
            written, outputs = guard.written(s.index), tf.gather(s.tokens, s.rows)  # (T,), (R, T)
            logits = guard.ban(logits, outputs, s.runs, written)
        token_log_prob, token = (tf.squeeze(t, 1) for t in portable.top_log_probs(logits, 1, NEG_INF))  # (R,)
        ends = tf.equal(token, eos_id) | (s.index + 1 >= tf.gather(limits, s.rows))  # (R,)
        token_after = _to_batch(s.rows, token + 1, [batch])  # (B,): 0 for the rows not running
        slot = tf.expand_dims(token_after > 0, 1) & tf.equal(positions, s.index)  # (B, T)
        tokens = tf.where(slot, tf.expand_dims(token_after - 1, 1), s.tokens)
        scores = s.scores + _to_batch(s.rows, token_log_prob, [batch])
        if guard is not None:
            runs = guard.grown(s.runs, outputs, token, written)
        keep = _where(tf.logical_not(ends), tf.int64)  # (R',) into R
        kept = lambda t: tf.gather(t, keep)  # noqa: E731
        state = (s.index + 1, kept(s.rows), kept(token), tf.nest.map_structure(kept, runs), tokens, scores)
        return [DroppingGreedyState(*state, tf.nest.map_structure(kept, cache))]

    last_index = length - 1

    def cond(s):
        return tf.logical_and(s.index <= last_index, tf.size(s.rows) >= 1)

    rows = _running(limits)
    state = DroppingGreedyState(
        index=tf.constant(0),
        rows=rows,
        last=tf.fill(tf.shape(rows), bos_id),
        runs=() if no_repeat_ngram is None else tf.zeros(tf.stack([tf.size(rows), length]), tf.int32),
        tokens=tf.fill([batch, length], pad_id),
        scores=tf.zeros([batch]),
        cache=tf.nest.map_structure(lambda t: tf.gather(t, rows), cache),
    )
    final = tf.while_loop(cond, body, [state], shape_invariants=[_shrinking(state, ("tokens", "scores"))])[0]
    return final.tokens, final.scores


def _beams_of(rows, k):
    """(R * k,) the cache rows of source rows `rows` (R,) whose k beams are adjacent."""
    return tf.reshape(tf.expand_dims(rows * k, 1) + tf.range(k), [-1])


def _take_rows(state, rows, buffer_length, grow, beam_size, pad_id):
    """The search state of the source rows `rows` (R,) only (all rows if None), with its output
    buffers padded and its cache grown (`grow(cache_state, length)`) to `buffer_length`.
    Batch-first fields are (B, ...); the cache is (B * beam_size, ...), beams of a row adjacent."""

    def take(t, k=1):
        if rows is None:
            return t
        return tf.gather(t, _beams_of(rows, k), axis=0)

    fields = {}
    for name, value in state._asdict().items():
        if name == "index" or name == "trace":
            fields[name] = value
        elif name == "cache" and value is None:
            fields[name] = None
        elif name == "cache":
            taken = tf.nest.map_structure(lambda t: take(t, beam_size), value)
            fields[name] = {"static": taken["static"], "state": grow(taken["state"], buffer_length)}
        elif name.endswith("tokens"):  # the output buffers, (B, [K,] T1) -> (B, [K,] T)
            fields[name] = portable.extend(take(value), buffer_length, axis=-1, value=pad_id)
        elif name.endswith("runs"):  # the repeat guard's, (B * beam_size, T1) -> (B * beam_size, T)
            no_guard = isinstance(value, tuple)
            fields[name] = (
                value if no_guard else portable.extend(take(value, beam_size), buffer_length, axis=-1)
            )
        else:
            fields[name] = take(value)
    return type(state)(**fields)


def _in_two_passes(run, state, limits, first_length, buffer_length, grow, pad_id, beam_size=1):
    """Runs a search loop `run(state, limits, length, rows_left) -> state` (steps while more than
    `rows_left` rows run) in two passes: all rows, with output and key/value buffers of
    `first_length` T1 (the state's), until at most a quarter of them are running
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
    first = run(state, limits, first_length, tf.shape(limits)[0] // FIRST_PASS_ENDS_AT)
    left = tf.logical_not(first.done)  # (B,)
    rows = _where(left)  # (R,) the rows left
    second = run(
        _take_rows(first, rows, buffer_length, grow, beam_size, pad_id),
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

    return first._replace(
        **{
            name: merge(value, getattr(second, name))
            for name, value in first._asdict().items()
            if name not in ("index", "cache", "trace") and not isinstance(value, tuple)  # (): no guard
        }
    )


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
    trace: tuple  # () or, with trace=True, alive tokens (B, T, K, T) and log-probs (B, T, K) per step


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


def beam_search(
    step,
    cache,
    limits,
    buffer_length,
    beam_size,
    bos_id,
    eos_id,
    alpha=LENGTH_PENALTY,
    pad_id=0,
    trace=False,
    first_pass=None,
    no_repeat_ngram=None,
    drop_done=False,
):
    """Beam search with GNMT length penalty; alive and finished hypotheses are kept apart.

    Each step extends every alive beam, takes the top 2K candidates (so that K of them finishing
    at once still leaves K alive), keeps the best K non-finishing ones alive, and merges the
    finishing ones (EOS, or the row's length limit) into the K best finished by
    log-probability / ((5 + length) / 6)^alpha. A row is done once the most probable candidate
    of a step finishes (CTranslate2's and OpenNMT's rule; the exact rule, until no alive beam
    could beat the best finished, took many more steps for a fraction of a BLEU point).

    Args:
        step, limits, buffer_length, first_pass: as in `greedy_search`; `cache` ({"static", "state"})
            has batch B (tiled here).
        beam_size: K.
        alpha: the length penalty's exponent, a float or a float32 scalar tensor.
        no_repeat_ngram: as in `greedy_search`, for each hypothesis.
        drop_done: as in `greedy_search` (`_beam_dropping_done`).
        trace: also return the alive hypotheses after every step, for pictures (one pass only):
            {"tokens": (B, T, K, T), "log_probs": (B, T, K), "steps": ()}.
    Returns (tokens (B, K, T) int32 best first, scores (B, K) float32 penalized log-probability)
    [, trace].
    """
    k = beam_size

    def run(state, limits, length, rows_left=0):
        # Computed once, read by every step: positions (T,) in the output buffers, and where each
        # row's beams start (B, 1) in the cache.
        positions = tf.range(length)
        row_starts = tf.expand_dims(tf.range(tf.shape(limits)[0]) * k, 1)
        rows = tf.shape(limits)[0] * k
        guard = None if no_repeat_ngram is None else RepeatGuard(no_repeat_ngram, rows, positions)

        def body(s):
            state, continued = _beam_step(
                s, step, k, bos_id, eos_id, alpha, limits, positions, row_starts, guard, trace
            )
            return [state._replace(cache=_reorder_state(state.cache, continued))]

        return tf.while_loop(portable.loop_condition(length, rows_left), body, [state])[0]

    if trace and (first_pass is not None or drop_done):
        raise ValueError("a traced beam search runs in one pass (first_pass=None, drop_done=False)")
    if drop_done:
        _check_one_way(first_pass)
        args = (step, cache, limits, buffer_length, k, bos_id, eos_id, alpha, pad_id, no_repeat_ngram)
        return _beam_outputs(*_beam_dropping_done(*args), limits, pad_id)
    first_length = buffer_length if first_pass is None else first_pass[0]
    state = _first_beam_state(
        cache, limits, k, first_length, buffer_length if trace else None, pad_id, no_repeat_ngram
    )
    if first_pass is None:
        final = run(state, limits, buffer_length)
    else:
        final = _in_two_passes(
            run, state, limits, first_length, buffer_length, first_pass[1], pad_id, beam_size=k
        )
    outputs = _beam_outputs(final.finished_tokens, final.finished_scores, limits, pad_id)
    if trace:
        return (*outputs, {"tokens": final.trace[0], "log_probs": final.trace[1], "steps": final.index})
    return outputs


class DroppingBeamState(NamedTuple):
    rows: tf.Tensor  # (R,) the rows of the batch still running
    beams: BeamState  # theirs: (R, ...) and (R * K, ...)
    out_tokens: tf.Tensor  # (B, K, T) every row's finished hypotheses
    out_scores: tf.Tensor  # (B, K) their scores, NEG_INF for empty slots


def _beam_dropping_done(step, cache, limits, length, k, bos_id, eos_id, alpha, pad_id, no_repeat_ngram):
    """`beam_search` in one loop whose batch shrinks, as `_greedy_dropping_done`: the R rows still
    running take each step; their finished hypotheses are written into the buffers of all B rows,
    and the rows done are then dropped, with their beams' cache. The reorder of the cache's state
    and the drop are one gather. Returns the finished (tokens (B, K, T), scores (B, K))."""
    batch = tf.shape(limits)[0]
    positions = tf.range(length)  # (T,)
    tokens_shape, scores_shape = tf.stack([batch, k, length]), tf.stack([batch, k])  # (B, K, T), (B, K)

    guard = None if no_repeat_ngram is None else RepeatGuard(no_repeat_ngram, None, positions)

    def body(s):
        row_starts = tf.expand_dims(tf.range(tf.size(s.rows)) * k, 1)  # (R, 1)
        limits_now = tf.gather(limits, s.rows)
        beams, continued = _beam_step(
            s.beams, step, k, bos_id, eos_id, alpha, limits_now, positions, row_starts, guard
        )
        finished_after = _to_batch(
            s.rows, beams.finished_tokens + 1, tokens_shape
        )  # (B, K, T): 0 if not running
        stepped = finished_after[:, :1, :1] > 0  # (B, 1, 1)
        out_tokens = tf.where(stepped, finished_after - 1, s.out_tokens)
        out_scores = tf.where(
            stepped[:, :, 0], _to_batch(s.rows, beams.finished_scores, scores_shape), s.out_scores
        )
        keep = _where(tf.logical_not(beams.done))  # (R',) into R
        kept_beams = _beams_of(keep, k)  # (R' * K,) into R * K
        cache = {
            "static": tf.nest.map_structure(lambda t: tf.gather(t, kept_beams), beams.cache["static"]),
            # The reorder of the beams and the drop of the rows in one gather.
            "state": _reorder_state(beams.cache, tf.gather(continued, kept_beams))["state"],
        }
        by_row = lambda t: tf.gather(t, keep)  # noqa: E731
        beams = BeamState(
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
        return [DroppingBeamState(by_row(s.rows), beams, out_tokens, out_scores)]

    last_index = length - 1

    def cond(s):
        return tf.logical_and(s.beams.index <= last_index, tf.size(s.rows) >= 1)

    rows = _running(limits)
    state = DroppingBeamState(
        rows=rows,
        beams=_first_beam_state(
            tf.nest.map_structure(lambda t: tf.gather(t, rows), cache),
            tf.gather(limits, rows),
            k,
            length,
            None,
            pad_id,
            no_repeat_ngram,
        ),
        out_tokens=tf.fill([batch, k, length], pad_id),
        out_scores=tf.fill([batch, k], NEG_INF),
    )
    whole = ("out_tokens", "out_scores")
    final = tf.while_loop(cond, body, [state], shape_invariants=[_shrinking(state, whole)])[0]
    return final.out_tokens, final.out_scores


def _beam_step(s, step, k, bos_id, eos_id, alpha, limits, positions, row_starts, guard, trace=False):
    """One step of `beam_search` from state `s` of B rows (limits (B,), row_starts (B, 1): where
    each row's beams start in the cache; guard: a RepeatGuard of B * K rows, or None). Returns
    (the next state, its cache the step's before beams are reordered; (B * K,) the beam of all
    rows that each alive beam continues, the reorder). Reshapes keep a -1 for the batch: a shape
    built from tf.shape at every step is four exported nodes."""
    if guard is None:
        ban = lambda logits: logits  # noqa: E731
    else:
        written = guard.written(s.index)
        flat_shape = portable.shape_in_loop(s.alive_runs)  # (B * K, T), as the alive tokens flat
        alive_before = tf.reshape(s.alive_tokens, flat_shape)
        ban = lambda logits: guard.ban(logits, alive_before, s.alive_runs, written)  # noqa: E731
    top_log_probs, top_beams, top_tokens, cache = _top_candidates(s, step, k, bos_id, ban)  # (B, 2K)
    slot = tf.equal(positions, s.index)  # (T,)
    top_seqs = portable.write_slot(_gather_beams(s.alive_tokens, top_beams), slot, top_tokens)  # (B, 2K, T)
    length = s.index + 1
    finishing = tf.equal(top_tokens, eos_id) | tf.expand_dims(length >= limits, 1)  # (B, 2K)
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
    # It covers a row at its limit (every candidate finishes) and is valid in a row not done.
    done = s.done | tf.gather(finishing, 0, axis=1)
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


def naive_step(forward):
    """A step function with no cache: it re-runs `forward(source_ids, target_ids) -> logits`
    over the whole prefix at every step. The reference the cached loop is tested and
    benchmarked against; it works with both searches (its "cache" is the source and prefix).
    Use with `naive_cache`."""

    def step(last, cache, index):
        prefix = cache["state"]  # (B, T): BOS + tokens so far
        prefix = portable.write_slot(prefix, tf.equal(tf.range(tf.shape(prefix)[1]), index), last)
        logits = forward(cache["static"], prefix[:, : index + 1])
        return logits[:, -1], {"static": cache["static"], "state": prefix}

    return step


def naive_cache(source_ids, buffer_length, pad_id=0):
    return {"static": source_ids, "state": tf.fill([tf.shape(source_ids)[0], buffer_length], pad_id)}

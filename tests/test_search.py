"""Search against hand-written logit tables: a toy step function, no model.

Vocabulary of the toy: 0 pad, 1 unk, 2 bos, 3 eos, 4 "a", 5 "b". Each row r of a batch follows
its own Markov chain table[r, last_token] -> next-token probabilities; the row id travels in
the cache, so wrong beam tiling or reordering would mix rows up."""

import functools
import itertools
import math

import numpy as np
import pytest
import tensorflow as tf

from kformer.decode.search import (
    DROP_DONE,
    NEG_INF,
    BeamOptions,
    Lengths,
    OnePass,
    TokenIds,
    TwoPasses,
    beam_search,
    greedy_search,
    length_penalty,
)

BOS, EOS, A, B = 2, 3, 4, 5
IDS = TokenIds(BOS, EOS)
TRACED = OnePass(trace=True)
V = 6


def table_from(rows):
    """rows: per batch row, {last_token: {next_token: probability}} -> (R, V, V) logits."""
    table = np.full((len(rows), V, V), -1e4, np.float32)
    for r, chain in enumerate(rows):
        for last, nexts in chain.items():
            for token, p in nexts.items():
                table[r, last, token] = math.log(p)
    return tf.constant(table)


def markov_step(table):
    """The row id is static (fixed per source row); the toy has no per-hypothesis state."""

    def step(tokens, cache, index):
        return tf.gather_nd(table, tf.stack([cache["static"], tokens], axis=1)), cache

    return step


def row_cache(rows):
    return {"static": tf.range(len(rows)), "state": ()}


def run_beam(rows, limits, k, alpha):
    table = table_from(rows)
    limits = tf.constant(limits, tf.int32)
    lengths = Lengths(limits, tf.reduce_max(limits))
    tokens, scores = beam_search(markov_step(table), row_cache(rows), lengths, IDS, k, BeamOptions(alpha))
    return tokens.numpy(), scores.numpy()


def run_greedy(rows, limits):
    limits = tf.constant(limits, tf.int32)
    lengths = Lengths(limits, tf.reduce_max(limits))
    tokens, scores = greedy_search(markov_step(table_from(rows)), row_cache(rows), lengths, IDS)
    return tokens.numpy(), scores.numpy()


def penalized(log_prob, length, alpha):
    return log_prob / ((5 + length) / 6) ** alpha


def test_greedy_follows_the_most_probable_token_per_row():
    rows = [{BOS: {A: 0.6, EOS: 0.4}, A: {B: 0.7, EOS: 0.3}, B: {EOS: 1.0}}, {BOS: {EOS: 0.9, A: 0.1}}]
    tokens, scores = run_greedy(rows, [5, 5])
    np.testing.assert_array_equal(tokens, [[A, B, EOS, 0, 0], [EOS, 0, 0, 0, 0]])
    np.testing.assert_allclose(scores, [math.log(0.6 * 0.7), math.log(0.9)], rtol=1e-5)


def test_greedy_stops_at_each_rows_limit_and_empty_rows_stay_empty():
    loop = {BOS: {A: 1.0}, A: {A: 1.0}}
    tokens, scores = run_greedy([loop, loop, loop], [2, 4, 0])
    np.testing.assert_array_equal(tokens, [[A, A, 0, 0], [A, A, A, A], [0, 0, 0, 0]])
    np.testing.assert_allclose(scores, 0, atol=1e-5)


# "EOS" now, or "a EOS": "a" is the most probable first step (so the row goes on) and almost
# surely ends next, a little less probable in all than "EOS".
SHORT_OR_LONG = {BOS: {EOS: 0.44, A: 0.46, B: 0.1}, A: {EOS: 0.95, B: 0.05}, B: {EOS: 1.0}}


def test_length_penalty_changes_the_winner():
    short, long_ = math.log(0.44), math.log(0.46 * 0.95)
    tokens, scores = run_beam([SHORT_OR_LONG], [6], k=2, alpha=0.0)
    assert list(tokens[0, 0, :1]) == [EOS] and scores[0, 0] == pytest.approx(short, rel=1e-5)
    tokens, scores = run_beam([SHORT_OR_LONG], [6], k=2, alpha=1.0)
    assert list(tokens[0, 0, :2]) == [A, EOS] and scores[0, 0] == pytest.approx(long_ / (7 / 6), rel=1e-5)
    assert scores[0, 1] == pytest.approx(short, rel=1e-5)  # the n-best keeps the other one


def test_finishing_candidates_still_leave_k_alive():
    # Step 1, K = 2, candidates by probability: "a c" (0.2), "b EOS" (0.19), "a EOS" (0.175),
    # "b a" (0.16). Two of the first three finish; a search that filled its K alive slots from
    # the first K candidates would keep only "a c". Keeping the K best that do not finish keeps
    # "a c" and "b a" (C is the toy's spare id 1).
    C = 1
    rows = [
        {
            BOS: {A: 0.5, B: 0.5},
            A: {C: 0.4, EOS: 0.35, B: 0.25},
            B: {EOS: 0.38, A: 0.32, C: 0.3},
            C: {EOS: 1.0},
        }
    ]
    table = table_from(rows)
    lengths = Lengths(tf.constant([5]), 5)
    _, _, trace = beam_search(markov_step(table), row_cache(rows), lengths, IDS, 2, BeamOptions(0.6), TRACED)
    alive = trace["tokens"].numpy()[0, 1]  # (K, T) after step 1
    assert [list(seq[:2]) for seq in alive] == [[A, C], [B, A]]
    np.testing.assert_allclose(trace["log_probs"].numpy()[0, 1], np.log([0.2, 0.16]), rtol=1e-5)


def test_eos_at_different_steps_per_beam_gives_sorted_n_best():
    rows = [{BOS: {EOS: 0.3, A: 0.4, B: 0.3}, A: {EOS: 0.8, B: 0.2}, B: {B: 0.5, EOS: 0.5}}]
    tokens, scores = run_beam(rows, [6], k=3, alpha=0.6)
    lengths = [list(seq).index(EOS) + 1 for seq in tokens[0]]
    assert len(set(lengths)) > 1  # hypotheses finished at different steps
    assert list(scores[0]) == sorted(scores[0], reverse=True)
    for seq, score, length in zip(tokens[0], scores[0], lengths):  # every score recomputed by hand
        log_prob, last = 0.0, BOS
        for token in seq[:length]:
            log_prob += math.log(rows[0][last][token])
            last = token
        assert score == pytest.approx(penalized(log_prob, length, 0.6), rel=1e-5)


def brute_force_best(chain, limit, alpha):
    """Best complete hypothesis by enumeration: ends with EOS, or is cut at `limit` tokens."""
    best = (-math.inf, None)
    for length in range(1, limit + 1):
        for body in itertools.product([A, B], repeat=length - 1):
            for last in [EOS, A, B] if length == limit else [EOS]:
                seq, log_prob, previous = (*body, last), 0.0, BOS
                for token in seq:
                    log_prob += math.log(chain[previous].get(token, 1e-30))
                    previous = token
                best = max(best, (penalized(log_prob, length, alpha), seq))
    return best


@pytest.mark.parametrize("seed", range(4))
def test_wide_beam_equals_brute_force_without_length_penalty(seed):
    # With alpha = 0 a row that stops when its most probable candidate ends loses nothing: every
    # alive hypothesis is less probable, and can only fall further. (With alpha > 0 a longer one
    # could still win on the penalty; the rule stops anyway, as CTranslate2's does.)
    alpha = 0.0
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(2):
        chain = {}
        for last in (BOS, A, B):
            p = rng.dirichlet([1.0, 1.0, 1.0])
            chain[last] = {EOS: p[0], A: p[1], B: p[2]}
        rows.append(chain)
    tokens, scores = run_beam(rows, [3, 3], k=8, alpha=alpha)  # 8 >= every live prefix: exhaustive
    for r, chain in enumerate(rows):
        score, seq = brute_force_best(chain, 3, alpha)
        assert tuple(tokens[r, 0, : len(seq)]) == seq
        assert scores[r, 0] == pytest.approx(score, rel=1e-5)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beam_of_one_equals_greedy_without_length_penalty(seed):
    # With alpha = 0 a width-1 beam can never prefer a continuation over the EOS it passed up.
    rng = np.random.default_rng(seed)
    rows = [
        {last: dict(zip([EOS, A, B], rng.dirichlet([0.5, 1, 1]))) for last in (BOS, A, B)} for _ in range(3)
    ]
    greedy_tokens, greedy_scores = run_greedy(rows, [7, 3, 5])
    beam_tokens, beam_scores = run_beam(rows, [7, 3, 5], k=1, alpha=0.0)
    np.testing.assert_array_equal(beam_tokens[:, 0], greedy_tokens)
    np.testing.assert_allclose(beam_scores[:, 0], greedy_scores, rtol=1e-5)


def test_beam_respects_limits_and_empty_rows():
    loop = {BOS: {A: 0.9, B: 0.1}, A: {A: 0.9, B: 0.1}, B: {A: 0.9, B: 0.1}}
    tokens, scores = run_beam([loop, loop], [3, 0], k=2, alpha=0.6)
    assert tokens.shape == (2, 2, 3)
    np.testing.assert_array_equal(tokens[0, 0], [A, A, A])  # cut at the limit, no EOS
    assert scores[0, 0] == pytest.approx(penalized(3 * math.log(0.9), 3, 0.6), rel=1e-5)
    assert not tokens[1].any() and not scores[1].any()


def test_length_penalty_formula():
    assert float(length_penalty(tf.constant(7), 0.6)) == pytest.approx((12 / 6) ** 0.6)


def test_beam_trace_records_alive_hypotheses_per_step():
    rows = [{BOS: {EOS: 0.3, A: 0.4, B: 0.3}, A: {EOS: 0.8, B: 0.2}, B: {B: 0.5, EOS: 0.5}}]
    table = table_from(rows)
    limits = tf.constant([4])
    lengths = Lengths(limits, 4)
    tokens, scores, trace = beam_search(
        markov_step(table), row_cache(rows), lengths, IDS, 2, BeamOptions(0.6), TRACED
    )
    plain_tokens, plain_scores = beam_search(
        markov_step(table), row_cache(rows), lengths, IDS, 2, BeamOptions(0.6)
    )
    np.testing.assert_array_equal(tokens.numpy(), plain_tokens.numpy())  # tracing changes nothing
    history, log_probs = trace["tokens"].numpy()[0], trace["log_probs"].numpy()[0]
    # After step 0 the alive beams are "a" (0.4) and "b" (0.3); EOS (0.3) went to finished.
    assert list(history[0, :, 0]) == [A, B]
    np.testing.assert_allclose(log_probs[0], [math.log(0.4), math.log(0.3)], rtol=1e-5)
    # After step 1: "b b" (0.15) and "a b" (0.08) stay alive; "a EOS" finished.
    assert [list(h[:2]) for h in history[1]] == [[B, B], [A, B]]
    np.testing.assert_allclose(log_probs[1], [math.log(0.15), math.log(0.08)], rtol=1e-5)
    assert int(trace["steps"]) >= 2


def test_a_beam_row_stops_when_its_most_probable_candidate_ends():
    # "EOS" at once (0.5) is the most probable candidate of the first step: the search stops after
    # one step, with the second n-best slot left empty. The alive "a" (0.45) could still beat it
    # at the row's largest length penalty, so a search waiting for that bound would go on.
    rows = [{BOS: {EOS: 0.5, A: 0.45, B: 0.05}, A: {A: 0.5, B: 0.5}, B: {A: 0.5, B: 0.5}}]
    lengths = Lengths(tf.constant([6]), 6)
    tokens, scores, trace = beam_search(
        markov_step(table_from(rows)), row_cache(rows), lengths, IDS, 2, BeamOptions(0.6), TRACED
    )
    tokens, scores = tokens.numpy(), scores.numpy()
    assert int(trace["steps"]) == 1
    assert tokens[0, 0, 0] == EOS and scores[0, 0] == pytest.approx(math.log(0.5), rel=1e-5)
    assert scores[0, 1] < NEG_INF / 2 and not tokens[0, 1].any()


# EOS at once is the best; "a EOS" finishes at the second step; "b" goes on until the limit.
WAITS = [{BOS: {EOS: 0.5, A: 0.3, B: 0.2}, A: {EOS: 0.9, A: 0.1}, B: {B: 1.0}}]


@pytest.mark.parametrize(
    "nbest, steps, finished",
    [
        (1, 1, [[EOS]]),  # the first step's best finishes: done, one slot filled
        (2, 2, [[EOS], [A, EOS]]),  # the second step's best ("a EOS") finishes, two are in
        # Three are in after the third step ("a a EOS"), but its best ("b b b") goes on; at the
        # limit "b" x 6 finishes, the best step of all, and outranks "a a EOS".
        (3, 6, [[EOS], [A, EOS], [B] * 6]),
    ],
)
def test_a_beam_row_waits_for_nbest_finished_hypotheses(nbest, steps, finished):
    table, lengths = table_from(WAITS), Lengths(tf.constant([6]), 6)
    probabilities = {1: [0.5], 2: [0.5, 0.27], 3: [0.5, 0.27, 0.2]}[nbest]
    graph = tf.function(  # nbest as the exported graphs take it: an int32 scalar input
        lambda nbest: beam_search(
            markov_step(table), row_cache(WAITS), lengths, IDS, 3, BeamOptions(0.0, nbest)
        ),
        input_signature=[tf.TensorSpec([], tf.int32)],
    )
    options = BeamOptions(0.0, nbest)
    _, _, trace = beam_search(markov_step(table), row_cache(WAITS), lengths, IDS, 3, options, TRACED)
    assert int(trace["steps"]) == steps
    runs = [
        graph(tf.constant(nbest)),
        beam_search(markov_step(table), row_cache(WAITS), lengths, IDS, 3, options, DROP_DONE),
    ]
    for tokens, scores in runs:
        tokens, scores = tokens.numpy()[0], scores.numpy()[0]
        assert [list(t[: len(f)]) for t, f in zip(tokens, finished)] == finished
        np.testing.assert_allclose(scores[:nbest], np.log(probabilities), rtol=1e-5)
        assert np.all(scores[nbest:] < NEG_INF / 2)


def counting_step(table):
    """A toy with per-hypothesis state: the state is the (B, T) buffer of tokens fed so far, and
    every "a" fed so far makes "b" likelier. A wrong row, beam or position after the second pass's
    gather or growth changes the outputs."""

    def step(tokens, cache, index):
        fed = tf.where(
            tf.equal(tf.range(tf.shape(cache["state"])[1]), index), tokens[:, None], cache["state"]
        )
        count_a = tf.reduce_sum(tf.cast(tf.equal(fed, A), tf.float32), axis=1)  # (B,)
        logits = tf.gather_nd(table, tf.stack([cache["static"], tokens], axis=1))
        logits += tf.one_hot(tf.fill(tf.shape(tokens), B), V) * count_a[:, None]
        return logits, {"static": cache["static"], "state": fed}

    return step


def grow_fed(state, length):  # (B, T1) -> (B, T), as Transformer.grow_cache does for its keys/values
    return tf.pad(state, [[0, 0], [0, length - tf.shape(state)[1]]])


@pytest.mark.parametrize("seed", range(4))
def test_two_passes_give_the_results_of_one(seed):
    rng = np.random.default_rng(seed)
    rows = 6
    table = tf.constant(rng.normal(size=(rows, V, V)).astype(np.float32) * 2)
    limits = tf.constant(rng.integers(0, 10, rows), tf.int32)  # some rows end in the first pass, some do not
    length = int(tf.reduce_max(limits))
    for first_length in (1, 3, length):  # with `length`, no row is left for the second pass

        def cache(length):
            return {"static": tf.range(rows), "state": tf.zeros([rows, length], tf.int32)}

        two_passes, lengths = TwoPasses(tf.constant(first_length), grow_fed), Lengths(limits, length)
        one = greedy_search(counting_step(table), cache(length), lengths, IDS)
        two = greedy_search(counting_step(table), cache(first_length), lengths, IDS, two_passes)
        np.testing.assert_array_equal(one[0], two[0])
        np.testing.assert_allclose(one[1], two[1], rtol=1e-6)
        guard = BeamOptions(no_repeat_ngram=2)  # its buffers are grown with the others
        one = beam_search(counting_step(table), cache(length), lengths, IDS, 3, guard)
        two = beam_search(counting_step(table), cache(first_length), lengths, IDS, 3, guard, two_passes)
        np.testing.assert_array_equal(one[0], two[0])
        np.testing.assert_allclose(one[1], two[1], rtol=1e-6)


@pytest.mark.parametrize("seed", range(4))
def test_dropping_done_rows_gives_the_results_of_one_pass(seed):
    """Rows with limits 0-9 (some empty, some ending at EOS, some at their limit), a per-hypothesis
    state and the n-gram guard, eager and in a graph of unknown batch (as exported)."""
    rng = np.random.default_rng(seed)
    rows = 6
    table = tf.constant(rng.normal(size=(rows, V, V)).astype(np.float32) * 2)
    limits = tf.constant(rng.integers(0, 10, rows), tf.int32)
    length = int(tf.reduce_max(limits))
    cache = {"static": tf.range(rows), "state": tf.zeros([rows, length], tf.int32)}
    searches = [
        functools.partial(greedy_search, counting_step(table), ids=IDS, no_repeat_ngram=2),
        functools.partial(
            beam_search, counting_step(table), ids=IDS, beam_size=3, options=BeamOptions(no_repeat_ngram=2)
        ),
    ]
    for search in searches:
        one = search(cache=cache, lengths=Lengths(limits, length))
        graph = tf.function(
            lambda static, state, limits, search=search: search(
                cache={"static": static, "state": state}, lengths=Lengths(limits, length), loop=DROP_DONE
            ),
            input_signature=[
                tf.TensorSpec([None], tf.int32),  # static: the row ids
                tf.TensorSpec([None, None], tf.int32),  # state: the tokens fed
                tf.TensorSpec([None], tf.int32),  # limits
            ],
        )
        for dropping in (
            search(cache=cache, lengths=Lengths(limits, length), loop=DROP_DONE),
            graph(cache["static"], cache["state"], limits),
        ):
            np.testing.assert_array_equal(one[0], dropping[0])
            np.testing.assert_allclose(one[1], dropping[1], rtol=1e-6)


@pytest.mark.parametrize("beam_size", [1, 3])
def test_done_rows_are_dropped_from_the_next_step(beam_size):
    """Rows that never say EOS, limits 1-4: the step sees only the rows still running. Eager, so
    the step sees each step's rows; the row ids in the static cache follow the drops (a row's
    outputs are its own chain's: row 3 says "b", the others "a")."""
    loop, other = {BOS: {A: 1.0}, A: {A: 1.0}}, {BOS: {B: 1.0}, B: {B: 1.0}}
    rows = [loop, loop, loop, other, loop]
    limits = tf.constant([2, 1, 4, 3, 0], tf.int32)
    stepped = []

    def step(tokens, cache, index):
        stepped.append(int(tf.shape(tokens)[0]) // beam_size)
        return markov_step(table_from(rows))(tokens, cache, index)

    search = greedy_search if beam_size == 1 else functools.partial(beam_search, beam_size=beam_size)
    tokens, _ = search(step, row_cache(rows), Lengths(limits, 4), IDS, loop=DROP_DONE)
    assert stepped == [4, 3, 2, 1], stepped
    best = (tokens if beam_size == 1 else tokens[:, 0]).numpy()
    np.testing.assert_array_equal(
        best, [[A, A, 0, 0], [A, 0, 0, 0], [A, A, A, A], [B, B, B, 0], [0, 0, 0, 0]]
    )


def test_a_search_refuses_a_loop_it_does_not_know():
    rows = [{BOS: {EOS: 1.0}}]
    for search in (greedy_search, functools.partial(beam_search, beam_size=2)):
        with pytest.raises(TypeError, match="loop"):
            search(
                markov_step(table_from(rows)), row_cache(rows), Lengths(tf.constant([2]), 2), IDS, loop="drop"
            )


@pytest.mark.parametrize("beam_size", [1, 3])
def test_the_long_rows_of_a_batch_continue_without_the_others(beam_size):
    """The first pass ends once at most a quarter of its rows run on; they alone take the
    remaining steps. Rows with limits 1 x6 and 8 x2 that never say EOS: 6 rows x 1 step + 2 x 8,
    not 8 rows x 8 steps. Eager, so the step sees each step's rows."""
    loop = {BOS: {A: 1.0}, A: {A: 1.0}}
    rows = [loop] * 8
    limits = tf.constant([1, 1, 8, 1, 1, 1, 8, 1], tf.int32)
    stepped = []

    def step(tokens, cache, index):
        stepped.append(int(tf.shape(tokens)[0]) // beam_size)
        return markov_step(table_from(rows))(tokens, cache, index)

    search = greedy_search if beam_size == 1 else functools.partial(beam_search, beam_size=beam_size)
    unchanged = TwoPasses(tf.constant(8), lambda state, length: state)  # the toy's cache has no buffers
    tokens, _ = search(step, row_cache(rows), Lengths(limits, 8), IDS, loop=unchanged)
    assert stepped == [8] + [2] * 7, stepped
    best = tokens if beam_size == 1 else tokens[:, 0]
    np.testing.assert_array_equal(tf.reduce_sum(tf.cast(best == A, tf.int32), axis=1), limits)


def has_repeated_ngram(tokens, n):
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return len(grams) != len(set(grams))


def guarded_log_probs(logits, output, n):
    """Log-probabilities of the next token after `output`, the tokens that would repeat an n-gram
    removed and the rest renormalized: the rule, spelled out on Python lists."""
    banned = (
        {
            output[j + n - 1]
            for j in range(len(output) - n + 1)
            if tuple(output[j : j + n - 1]) == tuple(output[len(output) - n + 1 :])
        }
        if n > 0
        else set()
    )
    allowed = [t for t in range(V) if t not in banned]
    total = np.logaddexp.reduce([logits[t] for t in allowed])
    return {t: logits[t] - total for t in allowed}


def random_loopy_rows(rng, rows):
    """Chains whose most probable continuation often returns to a token seen before."""
    return tf.constant((rng.normal(size=(rows, V, V)) * 3).astype(np.float32))


@pytest.mark.parametrize("n", [1, 2, 3])
def test_greedy_never_repeats_an_ngram_and_follows_the_renormalized_best(n):
    rng = np.random.default_rng(n)
    table = random_loopy_rows(rng, 4)
    limits = tf.constant([9, 9, 5, 0], tf.int32)
    cache = {"static": tf.range(4), "state": ()}
    tokens, scores = greedy_search(markov_step(table), cache, Lengths(limits, 9), IDS, no_repeat_ngram=n)
    for r in range(4):
        output, log_prob, last = [], 0.0, BOS
        while len(output) < int(limits[r]) and (not output or output[-1] != EOS):
            log_probs = guarded_log_probs(table[r, last].numpy(), output, n)
            token = max(log_probs, key=log_probs.get)
            output.append(token)
            log_prob += log_probs[token]
            last = token
        assert list(tokens[r, : len(output)].numpy()) == output, (r, output)
        assert not has_repeated_ngram(output, n)
        assert scores[r].numpy() == pytest.approx(log_prob, rel=1e-4, abs=1e-4)
    unguarded, _ = greedy_search(markov_step(table), cache, Lengths(limits, 9), IDS)
    assert any(has_repeated_ngram(list(row), n) for row in unguarded.numpy())  # the guard did something


@pytest.mark.parametrize("n", [2, 3])
def test_wide_guarded_beam_equals_brute_force(n):
    """alpha 0 and a beam as wide as every live prefix: the best sequence with no repeated n-gram,
    by enumeration with the renormalized probabilities."""
    rng = np.random.default_rng(10 + n)
    table = random_loopy_rows(rng, 1)
    limit, k = 5, 64
    tokens, scores = beam_search(
        markov_step(table),
        {"static": tf.range(1), "state": ()},
        Lengths(tf.constant([limit]), limit),
        IDS,
        k,
        BeamOptions(alpha=0.0, no_repeat_ngram=n),
    )
    best = (-math.inf, None)
    for length in range(1, limit + 1):
        for seq in itertools.product(range(V), repeat=length):
            if EOS in seq[:-1] or (length < limit and seq[-1] != EOS) or has_repeated_ngram(seq, n):
                continue
            log_prob, last = 0.0, BOS
            for i, token in enumerate(seq):
                log_prob += guarded_log_probs(table[0, last].numpy(), list(seq[:i]), n).get(token, -math.inf)
                last = token
            best = max(best, (log_prob, seq))
    assert tuple(tokens[0, 0, : len(best[1])].numpy()) == best[1]
    assert scores[0, 0].numpy() == pytest.approx(best[0], rel=1e-4)
    for hypothesis in tokens[0].numpy():
        assert not has_repeated_ngram([t for t in hypothesis if t != 0], n)

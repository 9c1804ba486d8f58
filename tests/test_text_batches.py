"""kformer.decode.text_batches's length-sorted batches: every row once, in order of length, and a call of long
sentences holding fewer of them."""

import concurrent.futures
import time

import numpy as np

from kformer.decode import text_batches


def _ids(lengths):
    return [[7] * n for n in lengths]


def test_batches_are_length_sorted_and_hold_every_row_once():
    lengths = [5, 1, 9, 3, 3, 0, 12]
    ids = _ids(lengths)
    batches = list(text_batches.length_sorted_batches(ids, 3))
    assert [len(chunk) for chunk, _ in batches] == [3, 3, 1]
    order = [i for chunk, _ in batches for i in chunk]
    assert sorted(order) == list(range(len(ids)))
    assert [lengths[i] for i in order] == sorted(lengths)
    for chunk, batch in batches:  # padded with 0 to the longest row (at least one column)
        assert batch.dtype == np.int32 and batch.shape == (len(chunk), max(1, *(lengths[i] for i in chunk)))
        for row, i in enumerate(chunk):
            assert list(batch[row, : lengths[i]]) == ids[i] and not batch[row, lengths[i] :].any()


def test_a_token_budget_makes_batches_of_long_rows_smaller():
    lengths = [2] * 10 + [10] * 7 + [40]  # the row of 40 alone is over the budget
    batches = list(text_batches.length_sorted_batches(_ids(lengths), 8, max_tokens=30))
    assert [batch.shape for _, batch in batches] == [(8, 2), (3, 10), (3, 10), (3, 10), (1, 40)]
    assert sorted(i for chunk, _ in batches for i in chunk) == list(range(len(lengths)))


def test_calls_take_fewer_long_sentences():
    """`search_units` with `tokens_per_call`'s budget: greedy calls of at most batch_size sentences
    and batch_size * TOKENS_PER_SENTENCE padded source tokens; beam calls of batch_size sentences,
    capped at batch_size * BEAM_TOKENS_PER_SENTENCE tokens where asked."""
    long = text_batches.TOKENS_PER_SENTENCE * 3
    lengths = [4] * 40 + [long] * 10

    def shapes_of(search_name, beam_capped=False):
        shapes = []

        def search(batch):
            shapes.append(batch.shape)
            return np.full((len(batch), 2), 3, np.int32), np.zeros(len(batch), np.float32)

        budget = text_batches.tokens_per_call(8, search_name, beam_capped)
        results = text_batches.search_units(search, _ids(lengths), 8, eos_id=3, max_tokens=budget)
        assert len(results) == len(lengths) and all(r == [([], 0.0)] for r in results)
        return shapes

    assert shapes_of("greedy") == [(8, 4)] * 5 + [(2, long)] * 5
    assert shapes_of("beam") == [(8, 4)] * 5 + [(8, long), (2, long)]
    capped = 8 * text_batches.BEAM_TOKENS_PER_SENTENCE // long  # 2 sentences of 48 tokens in 96
    assert shapes_of("beam", beam_capped=True) == [(8, 4)] * 5 + [(capped, long)] * (10 // capped)


def test_searches_run_through_the_given_map_and_come_back_in_input_order():
    """`map_batches` an executor's map: batches finish out of order (the first sleeps longest),
    and every row still gets its own batch's output."""
    lengths = [3, 1, 2, 5, 4, 6, 1]
    ran = []

    def search(batch):  # each row's output: its length as a token, EOS 3 after
        ran.append(batch.shape)
        time.sleep(0.05 if len(ran) == 1 else 0)
        tokens = np.stack([[100 + int((row != 0).sum()), 3] for row in batch]).astype(np.int32)
        return tokens, -np.ones(len(batch), np.float32)

    ids = _ids(lengths)
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        results = text_batches.search_units(search, ids, 2, eos_id=3, map_batches=pool.map)
    assert results == [[([100 + n], -1.0)] for n in lengths] and len(ran) == 4


def test_a_lone_surrogate_is_a_question_mark(tokenizer):
    """No tokenizer takes a lone surrogate (sentencepiece raised TypeError): every runner reads it
    as "?", as the TFLite text files are sent it."""
    assert text_batches.segment_texts(
        tokenizer, ["半個\ud800字", "\udc00"], 64
    ) == text_batches.segment_texts(tokenizer, ["半個?字", "?"], 64)

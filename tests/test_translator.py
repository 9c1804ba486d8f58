import functools
import logging

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import random_ids

from kformer.decode.options import SearchOptions
from kformer.decode.recipe import RECIPES
from kformer.decode.runner import RunnerSettings
from kformer.decode.search import (
    DROP_DONE,
    ONE_PASS,
    BeamOptions,
    TokenIds,
    TwoPasses,
    beam_search,
    greedy_search,
    naive_cache,
    naive_step,
    output_limits,
)
from kformer.decode.text_batches import strip_special
from kformer.decode.translator import KerasRunner, Translator
from kformer.model.cache import FixedBuffers, Growing
from kformer.model.config import preset
from kformer.model.transformer import Transformer


@pytest.fixture(scope="module")
def random_model():
    """An untrained model: its near-uniform outputs run to varied lengths (EOS is 1 of 40 tokens)."""
    keras.utils.set_random_seed(0)
    return Transformer(preset("tiny", vocab_size=40, max_target_length=24))


def python_naive_greedy(model, source_row, limit):
    """Independent reference: re-run the full model on the whole prefix, pick np.argmax, stop at EOS."""
    config, prefix, output = model.config, [model.config.bos_id], []
    for _ in range(limit):
        logits = model({"source_ids": source_row[None], "target_ids": np.array([prefix], np.int32)})
        token = int(np.argmax(np.asarray(logits)[0, -1]))
        output.append(token)
        if token == config.eos_id:
            break
        prefix.append(token)
    return output


def run(translator, source, search, options=None):
    """The translator's graph of `search` on a batch, with `options` (a SearchOptions) over DEFAULTS."""
    beam_size = 1 if search == "greedy" else translator.beam_size
    options = SearchOptions(beam_size=beam_size).over(options or SearchOptions())
    return translator.run(source, options.checked(translator.config.max_target_length))


@pytest.mark.parametrize("batch, length", [(1, 1), (3, 5), (4, 9)])
def test_greedy_equals_naive_prefix_rerun(random_model, batch, length):
    source = random_ids(np.random.default_rng(batch), batch, length, 40, pad_tail=min(2, length - 1))
    options = SearchOptions(max_length=12, no_repeat_ngram=0)
    tokens = run(Translator(random_model), source, "greedy", options)["tokens"].numpy()
    limits, _ = output_limits(source, 0, 12)
    for row in range(batch):
        expected = python_naive_greedy(random_model, source[row][source[row] != 0], int(limits[row]))
        assert list(tokens[row][: len(expected)]) == expected
        assert not tokens[row][len(expected) :].any()


def test_graph_naive_search_equals_cached_search(random_model):
    source = tf.constant(random_ids(np.random.default_rng(5), 3, 6, 40, pad_tail=2))
    lengths = output_limits(source, 0, 16, buffer_cap=random_model.config.max_target_length)
    length, ids = lengths.buffer, TokenIds(2, 3)
    step = naive_step(lambda s, t: random_model({"source_ids": s, "target_ids": t}))
    translator = Translator(random_model, beam_size=3)
    options = SearchOptions(max_length=16, no_repeat_ngram=0)
    naive_tokens, naive_scores = greedy_search(step, naive_cache(source, length), lengths, ids)
    cached = run(translator, source, "greedy", options)
    np.testing.assert_array_equal(naive_tokens.numpy(), cached["tokens"].numpy())
    np.testing.assert_allclose(naive_scores.numpy(), cached["scores"].numpy(), rtol=1e-4)
    naive_tokens, naive_scores = beam_search(step, naive_cache(source, length), lengths, ids, 3)
    cached = run(translator, source, "beam", options)
    np.testing.assert_array_equal(naive_tokens.numpy(), cached["tokens"].numpy())
    np.testing.assert_allclose(naive_scores.numpy(), cached["scores"].numpy(), rtol=1e-4)


@pytest.mark.parametrize("beam_size", [1, 3])
def test_appended_caches_search_as_fixed_buffers(random_model, beam_size):
    """The exported searches' caches (appended a step at a time) against XLA's fixed buffers,
    in two passes (first buffers of 6: the second pass grows the fixed ones)."""
    model, source = random_model, tf.constant(random_ids(np.random.default_rng(8), 5, 7, 40, pad_tail=3))
    lengths = output_limits(source, 0, 20, buffer_cap=model.config.max_target_length)
    results = []
    for cache in (model.init_cache(source, FixedBuffers, 6), model.init_cache(source)):
        args = (model.decode_step, cache, lengths, TokenIds(2, 3))
        loop = TwoPasses(6, model.grow_cache)
        if beam_size == 1:
            results.append(greedy_search(*args, loop=loop, no_repeat_ngram=0))
        else:
            results.append(beam_search(*args, beam_size, BeamOptions(no_repeat_ngram=0), loop=loop))
    (fixed_tokens, fixed_scores), (tokens, scores) = results
    np.testing.assert_array_equal(tokens.numpy(), fixed_tokens.numpy())
    np.testing.assert_allclose(scores.numpy(), fixed_scores.numpy(), rtol=1e-5)


def test_caches_append_unless_fixed_buffers_or_xla_are_asked_for(random_model):
    source = tf.constant(random_ids(np.random.default_rng(9), 2, 5, 40))
    kind = lambda translator: type(translator.search_inputs(source, 10)[1]["state"])  # noqa: E731
    assert kind(Translator(random_model)) is Growing
    assert kind(Translator(random_model, recipe=RECIPES["tflite"])) is FixedBuffers
    assert kind(Translator(random_model, recipe=RECIPES["xla"])) is FixedBuffers


def test_done_rows_are_dropped_with_growing_caches_and_left_by_a_second_pass_with_fixed_buffers(random_model):
    source = tf.constant(random_ids(np.random.default_rng(9), 2, 5, 40))
    loop = lambda translator: translator.search_inputs(source, 10)[2]  # noqa: E731
    assert loop(Translator(random_model)) == DROP_DONE
    assert isinstance(loop(Translator(random_model, recipe=RECIPES["tflite"])), TwoPasses)
    assert loop(Translator(random_model, recipe=RECIPES["tflite-fixed"])) == ONE_PASS
    assert loop(Translator(random_model, recipe=RECIPES["xla"])) == ONE_PASS  # static shapes: one pass


def test_beam_of_one_equals_greedy_on_a_model(random_model):
    source = random_ids(np.random.default_rng(6), 4, 7, 40, pad_tail=3)
    translator = Translator(random_model, beam_size=1)
    np.testing.assert_array_equal(
        translator.beam(source, 0.0, random_model.config.max_target_length, 0, 1)["tokens"].numpy()[:, 0],
        run(translator, source, "greedy", SearchOptions(alpha=0.0, no_repeat_ngram=0))["tokens"].numpy(),
    )


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_rows_are_independent_of_batch_and_padding(random_model, search):
    rng = np.random.default_rng(7)
    rows = [random_ids(rng, 1, n, 40)[0] for n in (1, 9, 3, 14)]  # very short and long mixed
    translator = Translator(random_model, beam_size=3)
    fn = functools.partial(run, translator, search=search)
    batch = np.zeros((4, 20), np.int32)  # extra padding beyond the longest row, too
    for i, row in enumerate(rows):
        batch[i, : len(row)] = row
    together = fn(batch)
    for i, row in enumerate(rows):
        alone = fn(row[None])
        expected = alone["tokens"].numpy()[0]
        got = together["tokens"].numpy()[i][..., : expected.shape[-1]]
        np.testing.assert_array_equal(got, expected)
        assert not together["tokens"].numpy()[i][..., expected.shape[-1] :].any()
        np.testing.assert_allclose(
            together["scores"].numpy()[i], alone["scores"].numpy()[0], rtol=1e-4, atol=1e-5
        )


def test_greedy_calls_take_fewer_long_sentences(random_model):
    """The Keras runner batches as the runners do (batching.tokens_per_call): a greedy call of long
    sentences takes fewer of them, a beam call its batch_size."""
    options = SearchOptions(beam_size=2, max_length=3, no_repeat_ngram=0)
    runner = KerasRunner(random_model, None, options, RunnerSettings(batch_size=4))
    translator = runner.translator
    run, shapes = translator.run, []
    translator.run = lambda batch, options: (
        shapes.append((options.search, batch.shape)) or run(batch, options)
    )
    long = [[5] * 40] * 4  # 4 x 40 tokens against greedy's 4 x TOKENS_PER_SENTENCE = 64: one a call
    runner.translate_ids(long, SearchOptions(beam_size=1))
    runner.translate_ids(long)
    assert shapes == [("greedy", (1, 40))] * 4 + [("beam", (4, 40))]


def test_one_trace_per_signature(random_model):
    translator = Translator(random_model, beam_size=2)
    for shape, alpha, max_length, ngram in [((1, 3), 0.6, 5, 0), ((2, 7), 1.0, 9, 2), ((5, 2), 0.0, 24, 3)]:
        source = random_ids(np.random.default_rng(0), *shape, 40)
        options = SearchOptions(alpha=alpha, max_length=max_length, no_repeat_ngram=ngram)
        run(translator, source, "greedy", options)  # greedy search takes no alpha
        run(translator, source, "beam", options)
    assert translator.greedy.experimental_get_tracing_count() == 1
    assert translator.beam.experimental_get_tracing_count() == 1


def test_output_limit_is_source_length_plus_50_capped(random_model):
    source = np.zeros((3, 5), np.int32)
    source[0, :2] = 7
    source[1, :5] = 7
    limits, length = output_limits(source, 0, 54)
    assert list(limits.numpy()) == [52, 54, 0] and int(length) == 54  # min(5 + 50, 54)


def test_over_long_ids_are_truncated_in_the_graph(random_model):
    translator = Translator(random_model, beam_size=2)
    long_source = random_ids(np.random.default_rng(8), 2, random_model.config.max_source_length + 9, 40)
    cut = long_source[:, : random_model.config.max_source_length]
    for search in ("greedy", "beam"):
        np.testing.assert_array_equal(
            run(translator, long_source, search)["tokens"].numpy(),
            run(translator, cut, search)["tokens"].numpy(),
        )


def test_translator_rejects_bad_settings(random_model):
    with pytest.raises(ValueError, match="beam size"):
        KerasRunner(random_model, None, SearchOptions(beam_size=0))
    with pytest.raises(ValueError, match="max length"):
        KerasRunner(random_model, None, SearchOptions(max_length=1000))


def test_strip_special():
    assert strip_special([5, 6, 3, 7, 0], eos_id=3) == [5, 6]
    assert strip_special([5, 0, 0], eos_id=3) == [5]


TEXT_OPTIONS = SearchOptions(beam_size=2, max_length=10)


@pytest.fixture(scope="module")
def text_translator(tokenizer):
    keras.utils.set_random_seed(1)
    model = Transformer(preset("tiny", vocab_size=tokenizer.get_piece_size(), max_source_length=12))
    return KerasRunner(model, tokenizer, TEXT_OPTIONS)


def in_language(runner, language):
    """The runner's model and options, joining sentences as `language` does."""
    return KerasRunner(runner.translator.model, runner.tokenizer, TEXT_OPTIONS, language=language)


def test_empty_and_blank_text_translate_to_empty(text_translator):
    assert text_translator.translate(["", "   ", "\t"]) == ["", "", ""]
    assert text_translator.translate(["", "我們試試看！", ""])[0::2] == ["", ""]


def test_a_paragraph_translates_as_its_sentences_joined(text_translator):
    sentences = ["我們試試看！", "他很高興。", "「你呢？」", "好"]
    alone = text_translator.translate(sentences)
    assert in_language(text_translator, "en").translate(["".join(sentences)]) == [" ".join(alone)]
    assert in_language(text_translator, "zh").translate(["".join(sentences)]) == ["".join(alone)]
    lines = sentences[0] + sentences[1] + "\n\n  " + sentences[2] + "\n"
    assert text_translator.translate([lines]) == [f"{alone[0]} {alone[1]}\n\n{alone[2]}"]


def test_a_sentence_over_the_source_length_is_split_at_its_clauses(text_translator, caplog):
    tokenizer, limit = text_translator.tokenizer, text_translator.config.max_source_length
    clauses = ["他很高興，", "因為他的朋友們都來了，", "我們試試看。"]
    sizes = [len(tokenizer.encode(c)) for c in clauses]
    assert len(tokenizer.encode("".join(clauses))) > limit and all(
        a + b > limit for a, b in zip(sizes, sizes[1:])
    )
    with caplog.at_level(logging.WARNING, logger="kformer"):
        (output,) = text_translator.translate(["".join(clauses)])
    assert output == " ".join(text_translator.translate(clauses))  # each clause alone: no two fit together
    assert not caplog.records


def test_a_clause_over_the_source_length_is_cut_with_a_warning(text_translator, caplog):
    tokenizer, limit = text_translator.tokenizer, text_translator.config.max_source_length
    text = "我們試試看" * 6  # no sentence or clause mark
    ids = tokenizer.encode(text)
    assert len(ids) > limit
    with caplog.at_level(logging.WARNING, logger="kformer"):
        (output,) = text_translator.translate([text])
    assert "no clause break within the model's maximum source length 12; cut into pieces" in caplog.text
    pieces, rest = [], text
    while rest:  # the longest prefixes that fit, by brute force
        pieces.append(
            [rest[:i] for i in range(1, len(rest) + 1) if len(tokenizer.encode(rest[:i])) <= limit][-1]
        )
        rest = rest[len(pieces[-1]) :]
    assert len(pieces) > 1 and "".join(pieces) == text  # nothing dropped
    assert output == " ".join(text_translator.translate(pieces))


def test_translations_have_scores_and_alternatives_of_the_search(text_translator):
    texts = ["我們試試看！", "他很高興。"]
    results = text_translator.translations(texts, SearchOptions(nbest=2))
    for text, result in zip(texts, results):
        tokens, scores = text_translator.search(np.array([text_translator.tokenizer.encode(text)], np.int32))
        assert [a.text for a in result.alternatives] == [
            text_translator.tokenizer.decode(strip_special(t, 3)) for t in tokens[0]
        ]
        np.testing.assert_allclose([a.score for a in result.alternatives], scores[0], rtol=1e-6)
        assert (result.text, result.score) == (result.alternatives[0].text, result.alternatives[0].score)
    (joined,) = text_translator.translations(["".join(texts)], SearchOptions(nbest=2))
    assert joined.score == pytest.approx(results[0].score + results[1].score)
    assert joined.alternatives[1].text == " ".join(r.alternatives[1].text for r in results)
    greedy = text_translator.translations(texts, SearchOptions(beam_size=1))
    assert [len(r.alternatives) for r in greedy] == [1, 1]


def test_options_change_the_search(text_translator):
    source = np.array([text_translator.tokenizer.encode("他很高興，因為他的朋友們都來參加了")[:12]], np.int32)
    tokens, scores = text_translator.search(source, SearchOptions(beam_size=1))
    short, _ = text_translator.search(source, SearchOptions(beam_size=1, max_length=3))
    assert (short[0] != 0).sum() <= 3 and list(short[0, :3]) == list(tokens[0, :3])
    _, flat = text_translator.search(source, SearchOptions(alpha=0.0))
    _, penalized = text_translator.search(source, SearchOptions(alpha=1.0))
    assert not np.allclose(flat, penalized)
    guarded, _ = text_translator.search(source, SearchOptions(beam_size=1, no_repeat_ngram=1))
    output = strip_special(guarded[0], 3)
    assert len(output) == len(set(output))  # no token twice


def test_bad_options_are_one_line_errors(text_translator):
    for options, message in [
        ({"nbest": 3}, "nbest 3 is more than the beam size 2"),
        ({"alpha": float("nan")}, "alpha"),
        ({"alpha": -1.0}, "alpha"),
        ({"max_length": 0}, "max length"),
        ({"max_length": 1000}, "max length must be in"),
        ({"no_repeat_ngram": -1}, "no_repeat_ngram"),
    ]:
        with pytest.raises(ValueError, match=message):
            text_translator.translate(["好"], SearchOptions(**options))
    other_width = SearchOptions(beam_size=3).checked(text_translator.config.max_target_length)
    with pytest.raises(ValueError, match="beam size 2, not 3"):  # the graph's width is fixed
        text_translator.translator.run(np.array([[5, 6]], np.int32), other_width)


def test_text_outside_the_vocabulary_is_output_as_it_is(text_translator, caplog):
    tokenizer = text_translator.tokenizer
    assert all(
        tokenizer.encode(t) == [tokenizer.piece_to_id("▁"), tokenizer.unk_id()] for t in ("🙂🙃", "ᚠᛇᚻ")
    )
    texts = ["🙂🙃 ᚠᛇᚻ", "  🙂  ", "Привет 🙂 我們", "我們試試看！"]
    with caplog.at_level(logging.WARNING, logger="kformer"):
        outputs = text_translator.translate(texts)
    assert outputs[:2] == ["🙂🙃 ᚠᛇᚻ", "🙂"]  # untranslated, not an invented sentence
    assert outputs[2:] == [
        text_translator.tokenizer.decode(row)
        for row in text_translator.translate_ids([tokenizer.encode(t) for t in texts[2:]])[0]
    ]  # mostly unknown: still translated
    warnings = [r.getMessage() for r in caplog.records]
    assert sum("none of its characters is in the model's vocabulary" in w for w in warnings) == 2
    assert any(w.startswith("input 'Привет 🙂 我們': 7 of its 9 characters") for w in warnings)
    assert not any("我們試試看" in w for w in warnings)


def test_mixed_batch_equals_one_by_one(text_translator):
    texts = ["我們試試看！", "他很高興，因為他的朋友們都來參加了他的生日聚會。", "好", ""]
    together = text_translator.translate(texts)
    assert together == [text_translator.translate([t])[0] for t in texts]

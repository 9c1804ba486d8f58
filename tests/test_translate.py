import logging

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import random_ids

from kformer.batching import strip_special
from kformer.config import preset
from kformer.model import Transformer
from kformer.search import beam_search, greedy_search, naive_cache, naive_step, output_limits
from kformer.translate import Translator


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


@pytest.mark.parametrize("batch, length", [(1, 1), (3, 5), (4, 9)])
def test_greedy_equals_naive_prefix_rerun(random_model, batch, length):
    source = random_ids(np.random.default_rng(batch), batch, length, 40, pad_tail=min(2, length - 1))
    translator = Translator(random_model, max_length=12)
    tokens = translator.greedy(source)["tokens"].numpy()
    limits, _ = output_limits(source, 0, 12)
    for row in range(batch):
        expected = python_naive_greedy(random_model, source[row][source[row] != 0], int(limits[row]))
        assert list(tokens[row][: len(expected)]) == expected
        assert not tokens[row][len(expected) :].any()


def test_graph_naive_search_equals_cached_search(random_model):
    source = tf.constant(random_ids(np.random.default_rng(5), 3, 6, 40, pad_tail=2))
    limits, length = output_limits(source, 0, 16)
    step = naive_step(lambda s, t: random_model({"source_ids": s, "target_ids": t}))
    translator = Translator(random_model, beam_size=3, max_length=16)
    naive_tokens, naive_scores = greedy_search(step, naive_cache(source, length), limits, length, 2, 3)
    cached = translator.greedy(source)
    np.testing.assert_array_equal(naive_tokens.numpy(), cached["tokens"].numpy())
    np.testing.assert_allclose(naive_scores.numpy(), cached["scores"].numpy(), rtol=1e-4)
    naive_tokens, naive_scores = beam_search(step, naive_cache(source, length), limits, length, 3, 2, 3)
    cached = translator.beam(source)
    np.testing.assert_array_equal(naive_tokens.numpy(), cached["tokens"].numpy())
    np.testing.assert_allclose(naive_scores.numpy(), cached["scores"].numpy(), rtol=1e-4)


def test_beam_of_one_equals_greedy_on_a_model(random_model):
    source = random_ids(np.random.default_rng(6), 4, 7, 40, pad_tail=3)
    translator = Translator(random_model, beam_size=1, alpha=0.0)
    np.testing.assert_array_equal(
        translator.beam(source)["tokens"].numpy()[:, 0], translator.greedy(source)["tokens"].numpy()
    )


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_rows_are_independent_of_batch_and_padding(random_model, search):
    rng = np.random.default_rng(7)
    rows = [random_ids(rng, 1, n, 40)[0] for n in (1, 9, 3, 14)]  # very short and long mixed
    translator = Translator(random_model, beam_size=3)
    fn = getattr(translator, search)
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


def test_one_trace_per_signature(random_model):
    translator = Translator(random_model, beam_size=2)
    for shape in [(1, 3), (2, 7), (5, 2), (3, 11)]:
        source = random_ids(np.random.default_rng(0), *shape, 40)
        translator.greedy(source)
        translator.beam(source)
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
    for fn in (translator.greedy, translator.beam):
        np.testing.assert_array_equal(fn(long_source)["tokens"].numpy(), fn(cut)["tokens"].numpy())


def test_translator_rejects_bad_settings(random_model):
    with pytest.raises(ValueError, match="beam size"):
        Translator(random_model, beam_size=0)
    with pytest.raises(ValueError, match="max length"):
        Translator(random_model, max_length=1000)


def test_strip_special():
    assert strip_special([5, 6, 3, 7, 0], eos_id=3) == [5, 6]
    assert strip_special([5, 0, 0], eos_id=3) == [5]


@pytest.fixture(scope="module")
def text_translator(tokenizer):
    keras.utils.set_random_seed(1)
    model = Transformer(preset("tiny", vocab_size=tokenizer.get_piece_size(), max_source_length=12))
    return Translator(model, tokenizer, beam_size=2, max_length=10)


def test_empty_and_blank_text_translate_to_empty(text_translator):
    assert text_translator.translate(["", "   ", "\t"]) == ["", "", ""]
    assert text_translator.translate(["", "我們試試看！", ""])[0::2] == ["", ""]


def test_long_text_is_truncated_with_a_warning(text_translator, caplog):
    long_text = "我們試試看！" * 30
    with caplog.at_level(logging.WARNING, logger="kformer"):
        (output,) = text_translator.translate([long_text])
    assert "truncated to the model's maximum source length 12" in caplog.text
    first_12 = text_translator.tokenizer.encode(long_text)[:12]  # the ids path, not the text path again
    (expected,), _ = text_translator.translate_ids([first_12])
    assert output == text_translator.tokenizer.decode(expected)


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

import math

import numpy as np
import pytest
from layer_test import run_layer_test

from kformer.model.layers import (
    DecoderBlock,
    EncoderBlock,
    FeedForward,
    PositionalEncoding,
    TokenEmbedding,
    sinusoidal_table,
)


def test_sinusoidal_table_matches_the_paper_formula():
    table = sinusoidal_table(50, 16)
    for pos in (0, 1, 7, 49):
        for i in range(8):
            angle = pos / 10000 ** (2 * i / 16)
            assert table[pos, 2 * i] == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1] == pytest.approx(math.cos(angle), abs=1e-6)


def test_positional_encoding_adds_table_from_start_index():
    x = np.zeros((2, 3, 8), "float32")
    out = np.asarray(PositionalEncoding(max_length=10)(x, start_index=4))
    np.testing.assert_allclose(out[1], sinusoidal_table(10, 8)[4:7], atol=1e-6)


def test_token_embedding_scales_and_ties(tmp_path):
    layer = TokenEmbedding(vocab_size=20, d_model=8)
    ids = np.array([[1, 2, 3]], "int32")
    emb = np.asarray(layer(ids))
    table = np.asarray(layer.embeddings)
    np.testing.assert_allclose(emb[0], table[[1, 2, 3]] * math.sqrt(8), rtol=1e-6)
    states = np.random.default_rng(0).normal(size=(1, 2, 8)).astype("float32")
    np.testing.assert_allclose(
        np.asarray(layer(states, reverse=True)), states @ table.T, rtol=1e-5, atol=1e-5
    )
    run_layer_test(TokenEmbedding, dict(vocab_size=20, d_model=8), [ids], tmp_path=tmp_path)


def test_feed_forward(tmp_path):
    x = np.random.default_rng(0).normal(size=(2, 3, 8)).astype("float32")
    layer = FeedForward(d_model=8, d_ff=16)
    out = np.asarray(layer(x))
    w1, b1, w2, b2 = [np.asarray(w) for w in layer.get_weights()]
    np.testing.assert_allclose(out, np.maximum(x @ w1 + b1, 0) @ w2 + b2, rtol=1e-5, atol=1e-5)
    run_layer_test(FeedForward, dict(d_model=8, d_ff=16, activation="gelu"), [x], tmp_path=tmp_path)


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_encoder_block(tmp_path, norm_position):
    x = np.random.default_rng(0).normal(size=(2, 5, 8)).astype("float32")
    kwargs = dict(d_model=8, num_heads=2, d_ff=16, dropout=0.0, norm_position=norm_position)
    out = run_layer_test(EncoderBlock, kwargs, [x], tmp_path=tmp_path)
    assert out.shape == (2, 5, 8)


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_decoder_block(tmp_path, norm_position):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 4, 8)).astype("float32")
    memory = rng.normal(size=(2, 6, 8)).astype("float32")
    kwargs = dict(d_model=8, num_heads=2, d_ff=16, dropout=0.0, norm_position=norm_position)
    out = run_layer_test(DecoderBlock, kwargs, [x, memory], tmp_path=tmp_path)
    assert out.shape == (2, 4, 8)


def test_post_ln_output_is_normalized():
    x = np.random.default_rng(0).normal(size=(2, 5, 8)).astype("float32") * 10
    out = np.asarray(EncoderBlock(d_model=8, num_heads=2, d_ff=16, dropout=0.0)(x)[0])
    np.testing.assert_allclose(out.mean(-1), 0, atol=1e-4)
    np.testing.assert_allclose(out.std(-1), 1, atol=1e-2)


def test_the_halves_table_is_marians():
    """Marian's (and fairseq's) layout: the sine of every angle, then every cosine, written here
    as transformers' MarianSinusoidalPositionalEmbedding computes it."""
    length, dim = 30, 12
    angles = np.array(
        [[pos / np.power(10000, 2 * (j // 2) / dim) for j in range(dim)] for pos in range(length)]
    )
    marian = np.concatenate([np.sin(angles[:, 0::2]), np.cos(angles[:, 1::2])], axis=1)
    np.testing.assert_allclose(sinusoidal_table(length, dim, "halves"), marian, atol=1e-6)
    x = np.zeros((1, 4, dim), "float32")
    layer = PositionalEncoding(max_length=length, layout="halves")
    np.testing.assert_allclose(np.asarray(layer(x, start_index=2))[0], marian[2:6], atol=1e-6)


def test_unscaled_embeddings_and_a_logits_bias():
    layer = TokenEmbedding(5, 4, scale=False, output_bias=True)
    ids = np.array([[1, 3]])
    out = np.asarray(layer(ids))
    np.testing.assert_allclose(out[0], np.asarray(layer.embeddings)[[1, 3]], atol=1e-6)
    layer.logits_bias.assign(np.arange(5, dtype="float32"))
    states = np.ones((1, 1, 4), "float32")
    expected = states[0, 0] @ np.asarray(layer.embeddings).T + np.arange(5)
    np.testing.assert_allclose(np.asarray(layer(states, reverse=True))[0, 0], expected, rtol=1e-5)


def test_swish_is_x_times_its_sigmoid():
    from kformer.model import portable

    x = np.linspace(-6, 6, 25).astype("float32")
    np.testing.assert_allclose(np.asarray(portable.activation("swish", x)), x / (1 + np.exp(-x)), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(portable.activation("relu", x)), np.maximum(x, 0), rtol=1e-6)

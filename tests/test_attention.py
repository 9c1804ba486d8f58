import keras
import numpy as np
import pytest
from layer_test import run_layer_test

from kformer.model import masks
from kformer.model.attention import MultiHeadAttention
from kformer.model.cache import FixedBuffers, Growing
from kformer.model.portable import contract

HEADS, HEAD_SIZE, WIDTH = 2, 4, 8


def copy_to_keras_mha(ours, query, value):
    """A keras.layers.MultiHeadAttention holding the same weights as `ours`."""
    reference = keras.layers.MultiHeadAttention(num_heads=HEADS, key_dim=HEAD_SIZE)
    reference(query, value)
    for ours_dense, theirs in (
        (ours.query, reference._query_dense),
        (ours.key, reference._key_dense),
        (ours.value, reference._value_dense),
        (ours.output_projection, reference._output_dense),
    ):
        theirs.set_weights(ours_dense.get_weights())  # same layout: kernels (M, H, D) / (H, D, M)
    return reference


@pytest.mark.parametrize("cross", [False, True])
def test_matches_keras_multi_head_attention(cross):
    rng = np.random.default_rng(0)
    query = rng.normal(size=(3, 5, WIDTH)).astype("float32")
    value = rng.normal(size=(3, 7, WIDTH)).astype("float32") if cross else query
    ids = np.ones((3, value.shape[1]), "int32")
    ids[1, -3:] = 0  # padded keys in row 1
    mask = np.broadcast_to(np.asarray(masks.padding_mask(ids)), (3, 5, value.shape[1]))
    ours = MultiHeadAttention(HEADS, HEAD_SIZE)
    out, extras = ours(query, value if cross else None, attention_mask=mask)  # None: self-attention
    weights = extras["weights"]
    reference = copy_to_keras_mha(ours, query, value)
    expected, expected_weights = reference(query, value, attention_mask=mask, return_attention_scores=True)
    np.testing.assert_allclose(np.asarray(out), np.asarray(expected), atol=1e-5)
    np.testing.assert_allclose(np.asarray(weights), np.asarray(expected_weights), atol=1e-5)
    assert np.all(np.asarray(weights)[1, :, :, -3:] == 0)


def test_fully_masked_row_stays_finite():
    x = np.random.default_rng(0).normal(size=(1, 3, WIDTH)).astype("float32")
    out, _ = MultiHeadAttention(HEADS, HEAD_SIZE)(x, attention_mask=np.zeros((1, 3, 3), bool))
    assert np.all(np.isfinite(np.asarray(out)))


def test_cached_steps_equal_full_causal_pass():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, 6, WIDTH)).astype("float32")
    layer = MultiHeadAttention(HEADS, HEAD_SIZE)
    full = np.asarray(layer(x, attention_mask=masks.causal_mask(6))[0])
    buffer = np.zeros((2, HEADS, 8, HEAD_SIZE), "float32")  # longer than needed: unused slots masked
    cache = (buffer, buffer)
    for i in range(6):
        step, extras = layer(
            x[:, i : i + 1],
            attention_mask=masks.causal_mask(1, 8, offset=i),
            cache=cache,
            write=FixedBuffers([cache]).step(i)[1],  # into slot i
        )
        cache = extras["cache"]
        np.testing.assert_allclose(np.asarray(step)[:, 0], full[:, i], atol=1e-5)


def test_appended_steps_equal_full_causal_pass():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, 6, WIDTH)).astype("float32")
    layer = MultiHeadAttention(HEADS, HEAD_SIZE)
    full = np.asarray(layer(x, attention_mask=masks.causal_mask(6))[0])
    empty = np.zeros((2, HEADS, 0, HEAD_SIZE), "float32")  # the keys/values of no token yet
    cache = (empty, empty)
    for i in range(6):
        step, extras = layer(x[:, i], cache=cache, write=Growing([cache]).step(i)[1])  # a step's (B, M) query
        cache = extras["cache"]
        assert cache[0].shape == (2, HEADS, i + 1, HEAD_SIZE)
        np.testing.assert_allclose(np.asarray(step), full[:, i], atol=1e-5)


def test_static_cache_equals_recomputed_keys():
    rng = np.random.default_rng(2)
    q, memory = (
        rng.normal(size=(2, 3, WIDTH)).astype("float32"),
        rng.normal(size=(2, 5, WIDTH)).astype("float32"),
    )
    layer = MultiHeadAttention(HEADS, HEAD_SIZE)
    expected = np.asarray(layer(q, memory)[0])
    out, _ = layer(q, cache=layer.key_value(memory))
    np.testing.assert_allclose(np.asarray(out), expected, atol=1e-6)


def test_layer_contract(tmp_path):
    x = np.random.default_rng(0).normal(size=(2, 3, WIDTH)).astype("float32")
    run_layer_test(MultiHeadAttention, dict(num_heads=HEADS, head_size=HEAD_SIZE), [x, x], tmp_path=tmp_path)


@pytest.mark.parametrize("axes", [1, 2])
def test_contract_is_tensordot_and_reads_no_shape_when_it_need_not(axes):
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 2, 4, 5)).astype("float32")
    kernel = rng.normal(size=(*x.shape[4 - axes :], 6, 7)).astype("float32")
    bias = rng.normal(size=(6, 7)).astype("float32")
    for shape, reads_shape in (
        ([None, 2, 4, 5], False),
        ([None, None, 4, 5], True),
    ):  # decoding step, training
        fn = tf.function(
            lambda x: contract(x, kernel, axes, bias), input_signature=[tf.TensorSpec(shape, tf.float32)]
        )
        np.testing.assert_allclose(
            np.asarray(fn(x)), np.tensordot(x, kernel, axes) + bias, rtol=1e-5, atol=1e-5
        )
        ops = {op.type for op in fn.get_concrete_function().graph.get_operations()}
        assert ("Shape" in ops) == reads_shape, ops

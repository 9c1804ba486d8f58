"""kformer.model.portable's spellings against the plain TensorFlow operations they stand for."""

import numpy as np
import pytest
import tensorflow as tf

from kformer.model import portable


@pytest.mark.parametrize("vocab", [8000, 1200, 200, 50])  # chunks of 32, 16, 8; none divides 50
@pytest.mark.parametrize("k", [1, 2, 8])
def test_top_tokens_rank_as_top_k_ties_to_the_lower_id(vocab, k):
    """Logits rounded to halves tie often; a row of equal logits, and a row whose best value sits
    in one chunk while the ties after it sit in a chunk before it and in its own."""
    rng = np.random.default_rng(vocab + k)
    logits = np.round(rng.normal(scale=2, size=(12, vocab)) * 2) / 2
    logits[3] = 0.0
    logits[4] = -1.0
    logits[4, 0] = logits[4, vocab - 1] = 1.0  # the first and last chunks tie at 1
    logits[4, vocab - 2] = 5.0  # ... and the last chunk ranks first
    logits = tf.constant(logits, tf.float32)

    tokens = portable.top_tokens(logits, k)

    np.testing.assert_array_equal(tokens.numpy(), tf.math.top_k(logits, k=k).indices.numpy())


def test_top_log_probs_are_the_ranked_log_softmax():
    logits = tf.constant(np.random.default_rng(0).normal(scale=4, size=(5, 1200)), tf.float32)

    log_probs, tokens = portable.top_log_probs(logits, 8, floor=-1e9)

    want = tf.math.top_k(tf.nn.log_softmax(logits), k=8)
    np.testing.assert_array_equal(tokens.numpy(), want.indices.numpy())
    np.testing.assert_allclose(log_probs.numpy(), want.values.numpy(), rtol=1e-6, atol=1e-5)


def test_a_token_of_no_probability_reads_the_floor():
    """A row whose second token is banned (a logit of -1e9: probability 0 in float32) or ~200
    nats below the best: its log-probability is the floor, finite, not -inf; the top 1 is exact."""
    logits = tf.constant([[0.0, -1e9, -5.0], [0.0, -200.0, -5.0]], tf.float32)

    log_probs, tokens = portable.top_log_probs(logits, 3, floor=-1e9)
    best, _ = portable.top_log_probs(logits, 1, floor=-1e9)

    np.testing.assert_array_equal(tokens.numpy(), [[0, 2, 1], [0, 2, 1]])
    np.testing.assert_array_equal(log_probs.numpy()[:, 2], [-1e9, -1e9])
    want = tf.nn.log_softmax(logits).numpy()
    np.testing.assert_allclose(log_probs.numpy()[:, :2], want[:, [0, 2]], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(best.numpy()[:, 0], want[:, 0], rtol=1e-6, atol=1e-6)


def _top_k_ops(k, whole=False):
    function = tf.function(lambda logits: portable.top_tokens(logits, k, whole)).get_concrete_function(
        tf.TensorSpec([None, 1200], tf.float32)
    )
    return sum(op.type == "TopKV2" for op in function.graph.get_operations())


def test_the_top_1_is_ranked_whole_only_while_asked():
    """In chunks: the chunks ranked, then the best chunk's logits; `whole`, one top_k, and the
    top k of beam search still in chunks (also the chunk ids sorted)."""
    assert _top_k_ops(1) == 2
    assert _top_k_ops(1, whole=True) == 1 and _top_k_ops(8, whole=True) == 3
    assert _top_k_ops(1) == 2


def test_an_empty_cache_to_append_to_has_no_static_length():
    @tf.function(input_signature=[tf.TensorSpec([2, 3], tf.int32)])  # every input shape known
    def empty(ids):
        t = portable.empty_to_append(ids, 4, 5)
        assert t.shape.as_list() == [2, 4, None, 5]  # a loop may grow it along the third dim
        return t

    assert empty(tf.constant([[0, 3, 7], [5, 1, 0]])).shape == (2, 4, 0, 5)

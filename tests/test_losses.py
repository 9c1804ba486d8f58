"""The loss and metric against numpy."""

import numpy as np
import pytest

from kformer.train.losses import LabelSmoothedCrossEntropy, MaskedAccuracy


def _numpy_loss_and_gradient(logits, labels, smoothing=0.1):
    """The label-smoothed loss over non-pad (non-0) labels and its gradient, in float64 numpy:
    the smoothing spread over every token but pad."""
    wide = logits.astype("float64")
    log_probs = wide - wide.max(-1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
    target = np.full(logits.shape, smoothing / (logits.shape[-1] - 1))
    target[..., 0] = 0.0
    rows, positions = np.indices(labels.shape)
    target[rows, positions, labels] += 1 - smoothing
    mask = (labels != 0)[..., None]
    loss = -np.where(target > 0, target * log_probs, 0.0).sum(-1)[mask[..., 0]].mean()
    return loss, (np.exp(log_probs) - target) * mask / mask.sum()


def test_label_smoothed_loss_against_numpy():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 3, 5)).astype("float32")
    labels = np.array([[1, 4, 0], [2, 0, 0]], "int32")
    expected, _ = _numpy_loss_and_gradient(logits, labels)
    assert float(LabelSmoothedCrossEntropy(0.1)(labels, logits)) == pytest.approx(expected, rel=1e-5)


def test_masked_accuracy_ignores_padding():
    logits = np.eye(5, dtype="float32")[[[1, 2, 3], [4, 4, 4]]]
    metric = MaskedAccuracy()
    metric.update_state(np.array([[1, 2, 0], [4, 1, 0]]), logits)
    assert float(metric.result()) == pytest.approx(3 / 4)


def test_label_smoothed_loss_gradient_against_numpy():
    """d loss / d logits = (softmax - smoothed target) / non-pad count on real tokens, 0 on pads."""
    import tensorflow as tf

    rng = np.random.default_rng(1)
    logits = rng.normal(size=(2, 3, 5)).astype("float32")
    labels = np.array([[1, 4, 0], [2, 3, 0]], "int32")
    _, expected = _numpy_loss_and_gradient(logits, labels)
    variable = tf.Variable(logits)
    with tf.GradientTape() as tape:
        loss = LabelSmoothedCrossEntropy(0.1)(labels, variable)
    np.testing.assert_allclose(tape.gradient(loss, variable).numpy(), expected, atol=1e-6)


def test_label_smoothed_loss_with_extreme_logits_against_float64():
    """Logits far apart (a diverging or over-confident model): the loss and its gradient stay finite
    and right, where the label's probability underflows float32."""
    import tensorflow as tf

    rng = np.random.default_rng(2)
    logits = (rng.normal(size=(2, 3, 50)) * 100).astype("float32")
    labels = np.array([[1, 4, 7], [2, 3, 0]], "int32")
    expected_loss, expected_gradient = _numpy_loss_and_gradient(logits, labels)
    variable = tf.Variable(logits)
    with tf.GradientTape() as tape:
        loss = LabelSmoothedCrossEntropy(0.1)(labels, variable)
    assert float(loss) == pytest.approx(expected_loss, rel=1e-5)
    np.testing.assert_allclose(tape.gradient(loss, variable).numpy(), expected_gradient, atol=1e-6)


def test_a_pad_banned_by_its_logit_bias_leaves_the_loss_its_real_size():
    """An imported model's pad logit is -1e9: pad takes no smoothing, so the loss is the
    float64 one's (a uniform e / V share made it ~e / V * 1e9)."""
    import tensorflow as tf

    rng = np.random.default_rng(3)
    logits = rng.normal(size=(2, 3, 40)).astype("float32")
    logits[..., 0] = -1e9
    labels = np.array([[1, 4, 7], [2, 3, 0]], "int32")
    expected_loss, expected_gradient = _numpy_loss_and_gradient(logits, labels)
    variable = tf.Variable(logits)
    with tf.GradientTape() as tape:
        loss = LabelSmoothedCrossEntropy(0.1)(labels, variable)
    assert float(loss) == pytest.approx(expected_loss, rel=1e-5) and float(loss) < 10
    np.testing.assert_allclose(tape.gradient(loss, variable).numpy(), expected_gradient, atol=1e-6)

"""FusedAdam against Adam written out in numpy."""

import keras
import numpy as np


def test_fused_adam_is_adam_with_a_moving_average_in_one_kernel_each():
    """FusedAdam's weights, moments and moving average equal Adam's arithmetic written in numpy,
    step for step on a decaying rate, and its graph runs the fused kernels (not Keras' ops)."""
    import tensorflow as tf

    from kformer.train.optimizer import FusedAdam

    rng = np.random.default_rng(0)
    start = rng.normal(size=(7, 5)).astype("float32")
    grads = rng.normal(size=(4, 7, 5)).astype("float32")
    rate = keras.optimizers.schedules.ExponentialDecay(1e-2, 2, 0.5)
    variable = keras.Variable(start)
    optimizer = FusedAdam(rate, beta_1=0.9, beta_2=0.98, epsilon=1e-9, use_ema=True, ema_momentum=0.8)
    apply = tf.function(lambda g: optimizer.apply_gradients([(g, variable)]))
    w, m, v, average = start.astype("float64"), 0.0, 0.0, None
    for t, g in enumerate(grads, start=1):
        apply(g)
        m, v = 0.9 * m + 0.1 * g, 0.98 * v + 0.02 * g**2
        w = w - 1e-2 * 0.5 ** ((t - 1) / 2) * np.sqrt(1 - 0.98**t) / (1 - 0.9**t) * m / (np.sqrt(v) + 1e-9)
        average = w if average is None else 0.8 * average + 0.2 * w
        np.testing.assert_allclose(variable.numpy(), w, atol=1e-6)
        np.testing.assert_allclose(optimizer._model_variables_moving_average[0].numpy(), average, atol=1e-6)
    ops = {op.type for op in apply.get_concrete_function(grads[0]).graph.get_operations()}
    assert {"ResourceApplyAdam", "ResourceApplyGradientDescent"} <= ops


def test_the_pull_to_start_moves_each_weight_toward_where_it_began():
    """With pull_to_start, every update is Adam's step plus lr * pull * (start - w), the start being
    the weights when the optimizer was built (numpy reference); without it, Adam's alone."""
    import tensorflow as tf

    from kformer.train.optimizer import FusedAdam

    rng = np.random.default_rng(1)
    start = rng.normal(size=(6, 3)).astype("float32")
    grads = rng.normal(size=(3, 6, 3)).astype("float32")
    variable = keras.Variable(start)
    optimizer = FusedAdam(1e-2, beta_1=0.9, beta_2=0.98, epsilon=1e-9, pull_to_start=20.0)
    apply = tf.function(lambda g: optimizer.apply_gradients([(g, variable)]))
    w, m, v = start.astype("float64"), 0.0, 0.0
    for t, g in enumerate(grads, start=1):
        apply(g)
        w = w - 1e-2 * 20.0 * (w - start)  # the pull comes first (as Keras' weight decay), then Adam
        m, v = 0.9 * m + 0.1 * g, 0.98 * v + 0.02 * g**2
        w = w - 1e-2 * np.sqrt(1 - 0.98**t) / (1 - 0.9**t) * m / (np.sqrt(v) + 1e-9)
        np.testing.assert_allclose(variable.numpy(), w, atol=1e-6)
    assert np.abs(w - start).max() > 1e-3  # the steps moved it: the pull had something to pull
    assert FusedAdam.from_config(optimizer.get_config()).pull_to_start == 20.0

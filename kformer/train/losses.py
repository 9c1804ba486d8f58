"""The training loss and metric: label-smoothed cross-entropy and token accuracy over non-pad targets."""

import keras
import tensorflow as tf
from keras import ops


def smoothed_cross_entropy(labels, logits, smoothing, pad_id=0):
    """Cross-entropy of logits (B, T, V) against (1 - e) * one_hot(labels) + e / (V - 1) on every
    token but pad -> (B, T), with its gradient softmax(logits) - that target.

    Pad is never a label, so it gets no share of the smoothing (as OpenNMT's loss): a model that
    bans it from its output by a -1e9 logit bias (an import's) then has a loss of its real size,
    where e / V * -1e9 would swamp it (and float32 would lose the rest).

    Not TensorFlow's fused softmax_cross_entropy_with_logits: its CPU kernel takes two exponentials
    a logit and is slower than these ops, and it needs the (B, T, V) target in the forward pass
    (here only the gradient builds it). Not log_softmax and a gather either: the gather's gradient
    is a scatter into a (B, T, V) tensor. The log-sum-exp comes from the softmax as
    max(z) - log(max(p)): max(p) >= 1/V, so it never underflows (the label's p can).
    """
    vocab_size = logits.shape[-1]  # static: the output projection fixes it
    off_value = smoothing / (vocab_size - 1)
    on_value = 1.0 - smoothing + off_value
    not_pad = tf.one_hot(pad_id, vocab_size, on_value=0.0, off_value=1.0)  # (V,) 1.0 but at pad

    @tf.custom_gradient
    def cross_entropy(z):
        probs = tf.nn.softmax(z)  # (B, T, V)
        log_sum_exp = tf.reduce_max(z, -1) - tf.math.log(tf.reduce_max(probs, -1))  # (B, T)
        label_logit = tf.gather(z, labels[..., None], batch_dims=len(labels.shape))[..., 0]  # (B, T)
        # sum_v target_v * z_v = (1 - e) * z_label + e / (V - 1) * sum_{v != pad} z_v
        others = tf.tensordot(z, not_pad, axes=1)  # (B, T); a product, not a sum of slices (copies)
        loss = log_sum_exp - (1.0 - smoothing) * label_logit - off_value * others

        def gradient(upstream):  # (B, T) -> (B, T, V)
            target = tf.one_hot(labels, vocab_size, on_value=on_value, off_value=off_value)
            target = target * not_pad
            return upstream[..., None] * (probs - target)

        return loss, gradient

    return cross_entropy(logits)


@keras.saving.register_keras_serializable(package="kformer")
class LabelSmoothedCrossEntropy(keras.losses.Loss):
    """Cross-entropy against (1 - e) * one_hot + e / (V - 1) off pad, averaged over non-pad target tokens.

    y_true: (B, T) int labels, pad 0. y_pred: (B, T, V) logits.
    """

    def __init__(self, smoothing=0.1, pad_id=0, name="label_smoothed_cross_entropy", **kwargs):
        super().__init__(name=name, reduction="sum", **kwargs)
        self.smoothing = smoothing
        self.pad_id = pad_id

    def call(self, y_true, y_pred):
        y_true = ops.cast(y_true, "int32")
        per_token = smoothed_cross_entropy(y_true, ops.cast(y_pred, "float32"), self.smoothing, self.pad_id)
        weights = ops.cast(ops.not_equal(y_true, self.pad_id), "float32")
        loss = ops.sum(per_token * weights) / ops.maximum(ops.sum(weights), 1.0)
        # Keras sums gradients over replicas and scales only its own mean reductions by
        # 1/replicas; this loss reduces itself, so it scales itself (Keras unscales it for logs).
        # With several replicas the step follows the mean of their token means: the global token
        # mean when replicas get equal token counts. (Dividing by the all-reduced token count
        # instead makes it exact, but Keras then logs row-weighted replica values: a wrong loss.)
        return loss / tf.distribute.get_strategy().num_replicas_in_sync

    def get_config(self):
        config = super().get_config()
        config.update(smoothing=self.smoothing, pad_id=self.pad_id)
        config.pop("reduction", None)
        return config


@keras.saving.register_keras_serializable(package="kformer")
class MaskedAccuracy(keras.metrics.Metric):
    """Fraction of non-pad target tokens whose highest logit is the label."""

    def __init__(self, pad_id=0, name="token_accuracy", **kwargs):
        super().__init__(name=name, **kwargs)
        self.pad_id = pad_id
        self.correct = self.add_variable(shape=(), initializer="zeros", name="correct")
        self.total = self.add_variable(shape=(), initializer="zeros", name="total")

    def update_state(self, y_true, y_pred, sample_weight=None):
        y_true = ops.cast(y_true, "int32")
        weights = ops.cast(ops.not_equal(y_true, self.pad_id), "float32")
        # tf.argmax is fine here: a training metric, never part of the exported decode graph (which
        # uses top_k); not keras.ops.argmax, whose guard against negative zeros costs ~5% of a CPU step.
        hits = ops.cast(ops.equal(tf.argmax(y_pred, axis=-1, output_type="int32"), y_true), "float32")
        self.correct.assign_add(ops.sum(hits * weights))
        self.total.assign_add(ops.sum(weights))

    def result(self):
        return self.correct / ops.maximum(self.total, 1.0)

    def get_config(self):
        return {**super().get_config(), "pad_id": self.pad_id}

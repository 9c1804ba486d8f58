"""The training loss and metric: label-smoothed cross-entropy and token accuracy over non-pad targets."""

import keras
import tensorflow as tf
from keras import ops


@keras.saving.register_keras_serializable(package="kformer")
class LabelSmoothedCrossEntropy(keras.losses.Loss):
    """Cross-entropy against (1 - e) * one_hot + e / V, averaged over non-pad target tokens.

    y_true: (B, T) int labels, pad 0. y_pred: (B, T, V) logits.
    """

    def __init__(self, smoothing=0.1, pad_id=0, name="label_smoothed_cross_entropy", **kwargs):
        super().__init__(name=name, reduction="sum", **kwargs)
        self.smoothing = smoothing
        self.pad_id = pad_id

    def call(self, y_true, y_pred):
        vocab_size = y_pred.shape[-1]  # static: the output projection fixes it
        y_true = ops.cast(y_true, "int32")
        # The smoothed target distribution, then TensorFlow's fused softmax cross-entropy: one
        # kernel computes the loss and its gradient. (log_softmax + take_along_axis cost ~20% of a
        # CPU training step: the gradient of the gather is a scatter into a (B, T, V) tensor.)
        target = tf.one_hot(
            y_true,
            vocab_size,
            on_value=1.0 - self.smoothing + self.smoothing / vocab_size,
            off_value=self.smoothing / vocab_size,
        )  # (B, T, V)
        per_token = tf.nn.softmax_cross_entropy_with_logits(target, ops.cast(y_pred, "float32"))  # (B, T)
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

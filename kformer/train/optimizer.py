"""Adam whose update is one TensorFlow kernel per variable instead of ~10 element-wise ops.

Keras' Adam writes its update as separate ops (m, v, the step), each a full pass over the
weights; on a CPU those passes cost several times TensorFlow's fused `ResourceApplyAdam`
(`kformer bench train --profile` shows them). The arithmetic is the same:
m += (g - m)(1 - beta1), v += (g^2 - v)(1 - beta2),
w -= lr sqrt(1 - beta2^t) / (1 - beta1^t) * m / (sqrt(v) + epsilon). The moving average of the
weights (use_ema) is fused the same way. Under a tf.distribute strategy, with sparse gradients or
amsgrad, Keras' own update runs: under a strategy Keras updates every device's copy of a variable
and its slots through `strategy.extended.update`, and the raw kernel on those copies' handles is
not verified (the multi-worker tests compare runs with Keras' update; with several replicas the
step's time is in the gradients' all-reduce as much as in the update).

With gradient accumulation (Keras' `gradient_accumulation_steps`), `iterations` counts updates but
Keras calls the learning-rate schedule with the count of batches and averages the weights after
every batch; here the schedule sees updates and the average moves only when the weights do.

`pull_to_start` (fine-tuning's lever against forgetting where no original corpus is mixed in):
every update also moves each weight toward the value it had when the optimizer was built (the
weights fine-tuning starts from), w -= lr * pull_to_start * (w - start): decoupled from Adam's
step as AdamW's decay is, but toward the start rather than zero (L2-SP's anchor, Li et al. 2018).
The starts are optimizer variables, so a resumed run restores them with the checkpoint.
"""

import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="kformer")
class FusedAdam(keras.optimizers.Adam):
    """keras.optimizers.Adam (same arguments, same slots, same checkpoints), fused updates; with
    `pull_to_start` > 0, a slot more per weight (its start) and the pull toward it."""

    def __init__(self, *args, pull_to_start=0.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.pull_to_start = pull_to_start

    def get_config(self):
        return {**super().get_config(), "pull_to_start": self.pull_to_start}

    def build(self, var_list):
        if self.built:
            return
        super().build(var_list)
        if self.pull_to_start:
            with tf.init_scope():  # the values now, also where the first apply is being traced
                values = [keras.ops.convert_to_numpy(variable) for variable in var_list]
            self._starts = [
                self.add_variable_from_reference(variable, "start", keras.initializers.Constant(value))
                for variable, value in zip(var_list, values)
            ]

    def _apply_weight_decay(self, variables):
        if self.pull_to_start:
            if tf.distribute.has_strategy():  # each replica's copy would need its own update
                raise ValueError("--pull-to-start does not run under --strategy yet")
            for variable in variables:
                start = self._starts[self._get_variable_index(variable)]
                rate = tf.cast(self.learning_rate * self.pull_to_start, variable.dtype)
                variable.assign_sub((tf.convert_to_tensor(variable) - tf.convert_to_tensor(start)) * rate)
        super()._apply_weight_decay(variables)

    def _fused(self, *tensors):
        return not (
            self.amsgrad
            or tf.distribute.has_strategy()
            or any(isinstance(t, tf.IndexedSlices) for t in tensors)
        )

    def update_step(self, gradient, variable, learning_rate):
        if not self._fused(gradient):
            return super().update_step(gradient, variable, learning_rate)
        dtype = variable.dtype
        step = tf.cast(self.iterations + 1, dtype)
        index = self._get_variable_index(variable)
        tf.raw_ops.ResourceApplyAdam(
            var=_handle(variable),
            m=_handle(self._momentums[index]),
            v=_handle(self._velocities[index]),
            beta1_power=tf.pow(tf.cast(self.beta_1, dtype), step),
            beta2_power=tf.pow(tf.cast(self.beta_2, dtype), step),
            lr=tf.cast(learning_rate, dtype),
            beta1=tf.cast(self.beta_1, dtype),
            beta2=tf.cast(self.beta_2, dtype),
            epsilon=tf.cast(self.epsilon, dtype),
            grad=tf.cast(gradient, dtype),
        )

    def _get_current_learning_rate(self):
        schedule = isinstance(self._learning_rate, keras.optimizers.schedules.LearningRateSchedule)
        if self.gradient_accumulation_steps and schedule:
            return self._learning_rate(self.iterations)  # updates, not batches
        return super()._get_current_learning_rate()

    def _update_model_variables_moving_average(self, trainable_variables):
        if not self.gradient_accumulation_steps:
            return self._update_average(trainable_variables)
        updated = (
            self._iterations + 1
        ) % self.gradient_accumulation_steps == 0  # see _backend_apply_gradients
        tf.cond(updated, lambda: self._update_average(trainable_variables), lambda: None)

    def _update_average(self, trainable_variables):
        if not self._fused():
            return super()._update_model_variables_moving_average(trainable_variables)
        for variable, average in zip(trainable_variables, self._model_variables_moving_average):
            if average is None:
                continue
            # average -= (1 - momentum) * (average - variable); the first step copies (momentum 0).
            momentum = tf.cast(self.iterations != 0, average.dtype) * self.ema_momentum
            delta = tf.convert_to_tensor(average) - tf.cast(variable, average.dtype)
            tf.raw_ops.ResourceApplyGradientDescent(var=_handle(average), alpha=1 - momentum, delta=delta)


def _handle(variable):
    """The resource handle of a Keras or TensorFlow variable."""
    return (variable.value if isinstance(variable, keras.Variable) else variable).handle

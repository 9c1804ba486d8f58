"""Learning-rate schedules: the paper's (noam) and one sized to a time budget."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="kformer")
class TransformerSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """lr = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5) (section 5.3), step counted from 1."""

    def __init__(self, d_model, warmup_steps=4000):
        self.d_model = d_model
        self.warmup_steps = warmup_steps

    def __call__(self, step):
        step = ops.cast(step, "float32") + 1.0
        return self.d_model**-0.5 * ops.minimum(ops.rsqrt(step), step * self.warmup_steps**-1.5)

    def get_config(self):
        return {"d_model": self.d_model, "warmup_steps": self.warmup_steps}


@keras.saving.register_keras_serializable(package="kformer")
class BudgetSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up to `peak` over `warmup_steps`, hold, then linear decay to 0 at `total_steps`
    over its last `decay_fraction` (1.0: decay right after the warm-up).

    Both step counts are variables: with a time budget, `Budget` sizes them from the measured
    speed while training runs, so the decay ends when the budget does, on a fast or a slow day.
    """

    def __init__(self, peak, warmup_steps, total_steps, decay_fraction=1.0):
        self.peak, self.decay_fraction = peak, decay_fraction
        self.warmup_steps = keras.Variable(float(warmup_steps), trainable=False, name="warmup_steps")
        self.total_steps = keras.Variable(float(total_steps), trainable=False, name="total_steps")

    def set(self, warmup_steps, total_steps):
        self.warmup_steps.assign(float(warmup_steps))
        self.total_steps.assign(float(total_steps))

    def __call__(self, step):
        step = ops.cast(step, "float32") + 1.0
        warmup, total = ops.convert_to_tensor(self.warmup_steps), ops.convert_to_tensor(self.total_steps)
        decay = ops.maximum(ops.minimum(self.decay_fraction * total, total - warmup), 1.0)
        rising = step / warmup
        falling = (total - step + 1.0) / decay
        return self.peak * ops.clip(ops.minimum(rising, falling), 0.0, 1.0)

    def steps(self):
        """(warm-up steps, total steps) as numbers (`float(variable)` fails on a distributed one)."""
        return tuple(float(ops.convert_to_numpy(v)) for v in (self.warmup_steps, self.total_steps))

    def describe(self):
        warmup, total = self.steps()
        decay_start = max(warmup, total - self.decay_fraction * total)
        return (
            f"linear warm-up over {warmup:.0f} steps to {self.peak:.2g}, held until step "
            f"{decay_start:.0f}, then linear decay to 0 at step {total:.0f}"
        )

    def get_config(self):
        warmup, total = self.steps()
        return {
            "peak": self.peak,
            "warmup_steps": warmup,
            "total_steps": total,
            "decay_fraction": self.decay_fraction,
        }


def make_schedule(recipe, d_model, total_steps):
    """The learning-rate schedule of a TrainingRecipe, for a model of `d_model` trained
    `total_steps` (an estimate under a time budget)."""
    if recipe.schedule == "noam":
        return TransformerSchedule(d_model, recipe.warmup_steps)
    return BudgetSchedule(
        recipe.learning_rate, budget_warmup(recipe, total_steps), total_steps, recipe.decay_fraction
    )


def budget_warmup(recipe, total_steps):
    """The recipe's warm-up for a budget of `total_steps`: its fraction of them, at most warmup_steps."""
    return max(1, min(recipe.warmup_steps, round(recipe.warmup_fraction * total_steps)))

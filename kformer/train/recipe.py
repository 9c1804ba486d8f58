"""TrainingRecipe: how a model is trained (the loss's smoothing, the learning-rate schedule, the
batch, weight averaging), apart from what the model is (kformer.model.config.ModelConfig). Each
preset has one; a fine-tuning run starts from `FINE_TUNE`; an imported model has none of its own.
Saved as recipe.json in the run folder, so that a resumed run trains the same way."""

import dataclasses
import os

from kformer.contracts.json_records import Record, read_json
from kformer.contracts.run import CONFIG_FILE, RECIPE_FILE
from kformer.model.config import LEGACY_RECIPE_KEYS

SCHEDULES = ("budget", "noam")


@dataclasses.dataclass(frozen=True)
class TrainingRecipe(Record):
    """schedule "noam": the paper's d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), right for
    long runs. "budget": linear warm-up to `learning_rate`, hold it, then decay linearly to 0 over
    the last `decay_fraction` of the steps the budget (--minutes, --steps or --epochs) allows;
    warm-up is `warmup_fraction` of those steps, at most `warmup_steps`.
    ema_momentum > 0: translate with an exponential moving average of the weights.
    batch_tokens: tokens per optimizer update and side, padding included; accumulate_steps > 1:
    each update averages the gradients of this many batches of batch_tokens / accumulate_steps
    tokens (Keras' gradient_accumulation_steps): the paper's 25,000-token updates in less memory.
    pull_to_start > 0 (fine-tuning): every update also moves each weight toward the one it started
    from by learning rate x pull_to_start x the difference (kformer.train.optimizer)."""

    label_smoothing: float = 0.1
    schedule: str = "noam"
    learning_rate: float = 5e-4  # peak of the budget schedule
    warmup_steps: int = 4000
    warmup_fraction: float = 0.06
    decay_fraction: float = 1.0
    ema_momentum: float = 0.0
    batch_tokens: int = 4096
    accumulate_steps: int = 1
    pull_to_start: float = 0.0

    def __post_init__(self):
        self.check_types()
        errors = [
            f"{n} must be >= 1, got {getattr(self, n)}"
            for n in ("warmup_steps", "batch_tokens", "accumulate_steps")
            if getattr(self, n) < 1
        ]
        if not 0.0 <= self.ema_momentum < 1.0:
            errors.append(f"ema_momentum must be in [0, 1), got {self.ema_momentum}")
        if not (
            0.0 < self.warmup_fraction < 1.0
            and 0.0 < self.decay_fraction <= 1.0
            and 0.0 < self.learning_rate < 1.0
        ):
            errors.append(
                f"warmup_fraction, decay_fraction and learning_rate must be in (0, 1), got "
                f"{self.warmup_fraction}, {self.decay_fraction} and {self.learning_rate}"
            )
        if self.schedule not in SCHEDULES:
            errors.append(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if not 0.0 <= self.pull_to_start < 1.0 / self.learning_rate:
            errors.append(f"pull_to_start must be in [0, 1 / learning_rate), got {self.pull_to_start}")
        if not 0.0 <= self.label_smoothing < 1.0:
            errors.append(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if errors:
            raise ValueError("Invalid TrainingRecipe: " + "; ".join(errors))

    @property
    def micro_batch_tokens(self):
        """Tokens of one accumulated batch (the whole update's without accumulation): what the
        input pipeline batches by."""
        return max(1, self.batch_tokens // self.accumulate_steps)

    @classmethod
    def of_run(cls, run_dir):
        """A run's recipe: its recipe.json, or the recipe's fields of the config.json of a run
        written before recipe.json existed."""
        path = os.path.join(run_dir, RECIPE_FILE)
        if os.path.exists(path):
            return cls.load(path)
        legacy = os.path.join(run_dir, CONFIG_FILE)
        values = {k: v for k, v in read_json(legacy).items() if k in LEGACY_RECIPE_KEYS}
        if not values:
            raise ValueError(f"{path} not found, and {legacy} holds no recipe (as older runs' did)")
        return cls.from_dict(values, where=legacy)


RECIPES = {
    "tiny": TrainingRecipe(warmup_steps=100, batch_tokens=512),
    # ~90 pairs a batch, a schedule sized to the time budget (kformer.train.schedules.BudgetSchedule),
    # translation with the moving average of the weights.
    "small": TrainingRecipe(
        schedule="budget",
        learning_rate=1e-3,
        decay_fraction=0.3,
        warmup_steps=1000,
        ema_momentum=0.995,
        batch_tokens=1024,
    ),
    # The paper's.
    "base": TrainingRecipe(warmup_steps=4000, batch_tokens=25000),
    "big": TrainingRecipe(warmup_steps=4000, batch_tokens=25000),
}

# A fine-tuning run's recipe, over the new run's --minutes/--steps: the pretraining schedule ended at
# a learning rate near 0, and restarting the paper's schedule would warm up again to a rate meant
# for random weights: a short warm-up to a lower peak, then linear decay.
FINE_TUNE = dict(
    schedule="budget", learning_rate=2e-4, warmup_steps=100, warmup_fraction=0.05, decay_fraction=1.0
)


def recipe(name, **changes):
    if name not in RECIPES:
        raise ValueError(f"unknown config preset {name!r}; choose one of {sorted(RECIPES)}")
    return RECIPES[name].replace(**changes)

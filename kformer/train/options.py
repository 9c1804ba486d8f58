"""What a training run is asked for: the options of `kformer train` and of `kformer.train.train`,
in one frozen value, and when it evaluates its dev sample."""

import dataclasses
import typing

from kformer.data.corpus import DEFAULT_CORPUS
from kformer.data.tokenizer import VOCAB_SIZE

if typing.TYPE_CHECKING:
    import keras
    import tensorflow as tf

# A dev sample of this many sources, translated greedily every this many minutes of training.
EVAL_SENTENCES = 500
EVAL_MINUTES = 5.0
BUDGET_EVALUATIONS = 4  # a time budget shorter than this many EVAL_MINUTES is evaluated this often


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """When a run evaluates its dev sample (kformer.train.keep_best): every `minutes` of training
    (0: never) or, if given, every `steps` optimizer steps; on its first `sentences` dev sources;
    `early_stop`: stop after that many evaluations without a gain (None: never); `judge`: what
    the best is kept by (kformer.train.judge; None: its default for the run)."""

    minutes: float = EVAL_MINUTES
    steps: int | None = None
    sentences: int = EVAL_SENTENCES
    early_stop: int | None = None
    judge: str | None = None

    @property
    def on(self):
        return bool(self.steps or self.minutes)

    def within(self, budget_minutes):
        """This schedule in a run of `budget_minutes` (None: no time budget): every 1/BUDGET_EVALUATIONS
        of the budget at most, so that a short run (a fine-tune of minutes) evaluates while it
        trains, not only at its start and end. A schedule in steps is the user's own."""
        if self.steps or not self.minutes or budget_minutes is None:
            return self
        return dataclasses.replace(self, minutes=min(self.minutes, budget_minutes / BUDGET_EVALUATIONS))


@dataclasses.dataclass(frozen=True)
class TrainOptions:
    """Every option of a run but its folder.

    config_name: a preset (default DEFAULT_PRESET; a resumed run must ask for its own).
    data: a corpus (a TSV, a pair of aligned files, a prepared folder); direction: "zh-en" or
    "en-zh" (default DEFAULT_DIRECTION; a prepared folder's is its own).
    minutes (in all, across resumes), steps (total) or epochs (total): when training stops; with
    none given, after one epoch.
    xla: None for `fit.default_xla`. precision: "auto", "float32", "bfloat16" or "float16"
    (`kformer.train.precision.choose_precision`; weights stay float32).
    batch_tokens, accumulate (optimizer steps of batch_tokens tokens, each the average of the
    gradients of `accumulate` batches), average (the weights' moving average's momentum) and
    recipe_changes: changes to the preset's TrainingRecipe (kformer.train.recipe).
    strategy: None, a tf.distribute strategy or its name (`distributed.make_strategy`).
    evaluation: when the run translates a dev sample and keeps the best weights.
    init_from: a trained run to start from, with its tokenizer, direction and model sizes and the
    fine-tuning recipe (kformer.train.init_from); mix_original: the share of each batch's pairs
    drawn from that run's own corpus (None: init_from.MIX_ORIGINAL; 0: the new corpus alone).
    callbacks: extra Keras callbacks, run before kformer's own; verbose: model.fit's.
    """

    config_name: str | None = None
    data: str | tuple[str, ...] = DEFAULT_CORPUS
    direction: str | None = None
    minutes: float | None = None
    steps: int | None = None
    epochs: float | None = None
    xla: bool | None = None
    precision: str = "auto"
    batch_tokens: int | None = None
    accumulate: int | None = None
    average: float | None = None
    recipe_changes: dict[str, float | int | str] | None = None
    seed: int = 0
    strategy: "tf.distribute.Strategy | str | None" = None
    vocab_size: int = VOCAB_SIZE
    checkpoint_seconds: float = 300
    evaluation: Evaluation = Evaluation()
    init_from: str | None = None
    mix_original: float | None = None
    callbacks: "tuple[keras.callbacks.Callback, ...]" = ()
    verbose: str | int = "auto"

    def recipe_overrides(self):
        """The changes to the preset's recipe: `recipe_changes`, batch_tokens, accumulate, average."""
        given = {
            "batch_tokens": self.batch_tokens,
            "accumulate_steps": self.accumulate,
            "ema_momentum": self.average,
        }
        return {**(self.recipe_changes or {}), **{k: v for k, v in given.items() if v is not None}}

"""What a training run is asked for: the options of `kformer train`, of `kformer.train.train` and
of `kformer.train.fit.start`, in one frozen value."""

import dataclasses

from kformer.model.config import DEFAULT_CORPUS, TransformerConfig


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
    gradients of `accumulate` batches), overrides: changes to the preset's config.
    strategy: None, a tf.distribute strategy or its name (`distributed.make_strategy`).
    evaluation: when the run translates a dev sample and keeps the best weights
    (`kformer.train.keep_best.Evaluation`; None: its defaults).
    init_from: a trained run to start from, with its tokenizer, direction and model sizes and the
    fine-tuning recipe (kformer.train.init_from); mix_original: the share of each batch's pairs
    drawn from that run's own corpus (None: init_from.MIX_ORIGINAL; 0: the new corpus alone).
    callbacks: extra Keras callbacks, run before kformer's own; verbose: model.fit's.
    """

    config_name: str = None
    data: object = DEFAULT_CORPUS
    direction: str = None
    minutes: float = None
    steps: int = None
    epochs: float = None
    xla: bool = None
    precision: str = "auto"
    batch_tokens: int = None
    accumulate: int = None
    seed: int = 0
    strategy: object = None
    vocab_size: int = TransformerConfig.vocab_size
    overrides: dict = None
    checkpoint_seconds: float = 300
    evaluation: object = None
    init_from: str = None
    mix_original: float = None
    callbacks: tuple = ()
    verbose: object = "auto"

    def config_overrides(self):
        """The changes to the preset's config: `overrides`, batch_tokens and accumulate."""
        given = {"batch_tokens": self.batch_tokens, "accumulate_steps": self.accumulate}
        return {**(self.overrides or {}), **{k: v for k, v in given.items() if v is not None}}

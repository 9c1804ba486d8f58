"""Loss, learning-rate schedules, callbacks, and `train`: compile + fit, resumable, within a budget.

The run directory's files are kformer.checkpoint's business.
"""

import dataclasses
import logging
import math
import os
import time

import keras
from keras import ops

from kformer import checkpoint, distributed
from kformer import data as data_lib
from kformer.config import (
    DEFAULT_CORPUS,
    DEFAULT_DIRECTION,
    DEFAULT_PRESET,
    PRECISIONS,
    TransformerConfig,
    preset,
    tokenizer_digest,
)
from kformer.model import Transformer
from kformer.optimizer import FusedAdam

log = logging.getLogger("kformer")


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
        import tensorflow as tf

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
        import tensorflow as tf

        hits = ops.cast(ops.equal(tf.argmax(y_pred, axis=-1, output_type="int32"), y_true), "float32")
        self.correct.assign_add(ops.sum(hits * weights))
        self.total.assign_add(ops.sum(weights))

    def result(self):
        return self.correct / ops.maximum(self.total, 1.0)

    def get_config(self):
        return {**super().get_config(), "pad_id": self.pad_id}


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

    def describe(self):
        total = float(self.total_steps)
        decay_start = max(float(self.warmup_steps), total - self.decay_fraction * total)
        return (
            f"linear warm-up over {float(self.warmup_steps):.0f} steps to {self.peak:.2g}, held until step "
            f"{decay_start:.0f}, then linear decay to 0 at step {total:.0f}"
        )

    def get_config(self):
        return {
            "peak": self.peak,
            "warmup_steps": float(self.warmup_steps),
            "total_steps": float(self.total_steps),
            "decay_fraction": self.decay_fraction,
        }


def make_schedule(config, total_steps):
    if config.schedule == "noam":
        return TransformerSchedule(config.d_model, config.warmup_steps)
    return BudgetSchedule(
        config.learning_rate, budget_warmup(config, total_steps), total_steps, config.decay_fraction
    )


def budget_warmup(config, total_steps):
    return max(1, min(config.warmup_steps, round(config.warmup_fraction * total_steps)))


def compile_model(model, config, xla=True, schedule=None, fused=True):
    """Adam(0.9, 0.98, 1e-9) on `schedule` (default: the config's, sized for 10 x warmup_steps),
    label-smoothed loss, token accuracy; with `ema_momentum`, the optimizer keeps a moving average
    of the weights (see kformer.checkpoint). `fused=False`: Keras' own Adam (same arithmetic)."""
    schedule = schedule or make_schedule(config, config.warmup_steps * 10)
    averaging = dict(use_ema=True, ema_momentum=config.ema_momentum) if config.ema_momentum else {}
    adam = FusedAdam if fused else keras.optimizers.Adam
    optimizer = adam(schedule, beta_1=0.9, beta_2=0.98, epsilon=1e-9, **averaging)
    model.compile(
        optimizer=optimizer,
        loss=LabelSmoothedCrossEntropy(config.label_smoothing, config.pad_id),
        metrics=[MaskedAccuracy(config.pad_id)],
        jit_compile=xla,
    )
    return model


# --- callbacks ---


def onednn_state():
    """ "on" or "off": whether TensorFlow runs its oneDNN CPU kernels (TF_ENABLE_ONEDNN_OPTS, read
    when it starts; `kformer train` turns them on); "unknown" if this TensorFlow cannot tell."""
    try:
        from tensorflow.python.util import _pywrap_util_port  # no public API says it

        return "on" if _pywrap_util_port.IsMklEnabled() else "off"
    except (ImportError, AttributeError):
        return "unknown"


NATIVE_BFLOAT16_FLAGS = ("avx512_bf16", "amx_bf16")  # x86 CPUs that multiply bfloat16 in hardware


def cpu_flags(path="/proc/cpuinfo"):
    """The CPU feature flags Linux reports (empty elsewhere)."""
    try:
        with open(path) as f:
            return set(next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), []))
    except OSError:
        return set()


def choose_precision(precision="auto"):
    """-> (precision, why). "auto": bfloat16 compute with float32 weights on a CPU that multiplies
    bfloat16 in hardware through oneDNN (the small preset's training step 1.35-1.47x faster on this
    project's AVX-512 machine; without oneDNN, or without those instructions, bfloat16 is slower
    than float32), else float32. With a GPU, float32 as before (float16 is --precision float16)."""
    if precision not in ("auto", *PRECISIONS):
        raise ValueError(f"--precision {precision!r}: choose auto or one of {', '.join(PRECISIONS)}")
    if precision != "auto":
        return precision, "as asked"
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU"):
        return "float32", "auto: a GPU is visible"
    native = sorted(cpu_flags() & set(NATIVE_BFLOAT16_FLAGS))
    if not native:
        return "float32", "auto: this CPU has no bfloat16 instructions"
    if onednn_state() != "on":
        return "float32", f"auto: the CPU has {native[0]}, but TensorFlow's oneDNN kernels are off"
    return (
        "bfloat16",
        f"auto: the CPU multiplies bfloat16 ({native[0]}) and oneDNN is on; weights stay float32",
    )


def steps_done(model):
    """The optimizer's step count (`int(variable)` fails on a multi-worker MirroredVariable)."""
    return int(ops.convert_to_numpy(model.optimizer.iterations))


class Budget(keras.callbacks.Callback):
    """Stops cleanly after `max_steps` optimizer steps in total or when the time budget is spent
    (`minutes` in all, of which `spent_seconds` were used by earlier runs of this directory).

    With a time budget and a `BudgetSchedule`, the steps the rest of the budget allows are
    re-estimated every `every` steps from the speed measured in this run (the first step, which
    compiles, is not counted), so warm-up and decay fit the budget whatever the machine's speed.

    With several workers (`strategy`), every time decision is agreed on (the first clock to run
    out stops all, the schedule is sized from the mean estimate), so the workers stop at the same
    step and train on the same learning rate.
    """

    def __init__(self, schedule, max_steps=None, minutes=None, spent_seconds=0.0, every=25, strategy=None):
        super().__init__()
        self.schedule, self.max_steps, self.every, self.strategy = schedule, max_steps, every, strategy
        self.seconds = None if minutes is None else minutes * 60.0
        self.spent_seconds = spent_seconds
        self.reason = None

    def on_train_begin(self, logs=None):
        self.start = time.monotonic()
        self.first = None  # (step, time) after the first step of this run

    def elapsed(self):
        return self.spent_seconds + time.monotonic() - self.start

    def steps_per_second(self):
        """Speed of this run after its first step (which traces/compiles)."""
        if self.first is None:
            return float("nan")
        return (steps_done(self.model) - self.first[0]) / max(time.monotonic() - self.first[1], 1e-9)

    def on_train_batch_end(self, batch, logs=None):
        step = steps_done(self.model)
        if self.first is None:
            self.first = (step, time.monotonic())
        elif self.seconds is not None and (step - self.first[0]) % self.every == 0:
            self._estimate(step)
        if self.max_steps is not None and step >= self.max_steps:
            self.reason, self.model.stop_training = f"reached {self.max_steps} steps", True
        elif (
            self.seconds is not None and distributed.agree(self.strategy, self.elapsed() >= self.seconds) > 0
        ):
            self.reason, self.model.stop_training = f"time budget of {self.seconds / 60:g} min used", True

    def _estimate(self, step):
        schedule = self.schedule
        if not isinstance(schedule, BudgetSchedule):
            return
        rate = self.steps_per_second()
        total = distributed.agree(
            self.strategy, step + max(self.seconds - self.elapsed(), 0.0) * rate, "MEAN"
        )
        warmup = float(schedule.warmup_steps)
        first_estimate = step - self.first[0] == self.every
        if first_estimate and step < warmup:  # size the warm-up too
            warmup = budget_warmup(self.model.config, total)
        schedule.set(warmup, total)
        if first_estimate:
            log.info(
                "%.2f steps/s: learning rate %s (re-estimated as training goes)", rate, schedule.describe()
            )


class StopOnNaN(keras.callbacks.Callback):
    """Stops at the first non-finite loss; the last good checkpoint is kept, not overwritten."""

    def __init__(self):
        super().__init__()
        self.failed_at = None

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            self.failed_at = steps_done(self.model)
            self.model.stop_training = True


class Checkpoint(keras.callbacks.Callback):
    """Saves model.keras (weights + optimizer state) and training.json every `every_seconds` and
    at the end of each epoch (also the last, cut-short one), atomically, so a kill loses at most
    that much progress. Runs before Keras' end-of-fit averaging, so the raw weights are kept."""

    def __init__(self, path, budget, every_seconds=300, nan_guard=None):
        super().__init__()
        self.path, self.budget, self.every_seconds, self.nan_guard = path, budget, every_seconds, nan_guard
        self.last = time.monotonic()

    def save(self):
        if self.nan_guard is not None and self.nan_guard.failed_at is not None:
            return
        state = {
            "steps": steps_done(self.model),
            "seconds": self.budget.elapsed(),
            "schedule": self.budget.schedule.get_config(),
            "replicas": self.model.distribute_strategy.num_replicas_in_sync,
        }
        checkpoint.save(self.model, self.path, state)
        self.last = time.monotonic()

    def on_train_batch_end(self, batch, logs=None):
        if time.monotonic() - self.last >= self.every_seconds:
            self.save()

    def on_epoch_end(self, epoch, logs=None):
        self.save()


# --- the training run ---


def _requested_config(out_dir, config_name, overrides):
    """The config of a new run, or the saved one when resuming (which must agree)."""
    saved_path = checkpoint.path(out_dir, checkpoint.CONFIG_FILE)
    if not os.path.exists(saved_path):
        return None
    saved = TransformerConfig.load(saved_path)
    requested = preset(
        config_name, vocab_size=saved.vocab_size, tokenizer_sha256=saved.tokenizer_sha256, **overrides
    )
    if requested != saved:
        diff = {
            k: (v, requested.to_dict()[k]) for k, v in saved.to_dict().items() if requested.to_dict()[k] != v
        }
        raise ValueError(
            f"{out_dir} holds a run with another config (saved vs requested: {diff}); "
            "use a new --out directory. Nothing was overwritten."
        )
    return saved


def prepare(
    out_dir,
    config_name=DEFAULT_PRESET,
    data=DEFAULT_CORPUS,
    direction=DEFAULT_DIRECTION,
    vocab_size=TransformerConfig.vocab_size,
    overrides=None,
):
    """Reads and splits the corpus; trains the tokenizer of a new run (in memory) or loads a resumed
    run's, checking the run was trained on this corpus. Writes nothing: `checkpoint.create` writes a
    new run's files once training is known to start, so a failed start leaves no folder behind.
    Returns (config, tokenizer, splits, corpus record)."""
    overrides = dict(overrides or {})
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ValueError(f"--out {out_dir} is a file, not a folder; choose a folder name")
    config = _requested_config(out_dir, config_name, overrides)
    corpus = data_lib.corpus_record(data, direction)
    if config is not None and os.path.exists(checkpoint.path(out_dir, checkpoint.CORPUS_FILE)):
        saved = checkpoint.read_corpus(out_dir)
        same = (
            (saved["sha256"], saved["direction"]) == (corpus["sha256"], corpus["direction"])
            if "sha256" in saved
            else (saved["data"], saved["direction"]) == (data, direction)
        )  # a run from before digests
        if not same:
            raise ValueError(
                f"{out_dir} was trained on {saved['data']} ({saved['direction']}), not on {data} "
                f"({direction}) as it is now; use a new --out directory."
            )

    pairs, report = data_lib.read_corpus(data, direction)
    log.info("corpus: %s", report.summary())
    splits = data_lib.split_pairs(pairs)
    log.info("split by source sentence: %s", {k: len(v) for k, v in splits.items()})

    tokenizer_path = checkpoint.path(out_dir, checkpoint.TOKENIZER_FILE)
    if config is None:
        log.info("training a joint SentencePiece tokenizer (%d pieces) on the train split", vocab_size)
        tokenizer = data_lib.train_tokenizer([text for pair in splits["train"] for text in pair], vocab_size)
        config = preset(
            config_name,
            vocab_size=tokenizer.get_piece_size(),
            tokenizer_sha256=tokenizer_digest(tokenizer),
            **overrides,
        )
    else:
        tokenizer = data_lib.load_tokenizer(tokenizer_path)
        config.check_tokenizer(tokenizer, tokenizer_path)
    return config, tokenizer, splits, corpus


@dataclasses.dataclass
class Training:
    """A run ready to train: `model.fit(**fit_args)`, then `finish(history)`. `model` is None when
    there is nothing left to do (`done` says why)."""

    model: object
    config: TransformerConfig
    tokenizer: object
    fit_args: dict
    done: str = None  # why there is nothing left to train, if so
    steps: int = 0  # steps trained before this run
    budget: object = None
    nan_guard: object = None
    real_tokens_per_step: float = 0.0  # non-pad source + target tokens of an average batch
    writes: bool = True  # False on a worker other than the chief
    precision: str = "float32"  # compute precision (`choose_precision`); weights are float32

    def finish(self, history):
        """Raises if the loss went NaN; returns the summary (steps, minutes, last metrics, why it stopped)."""
        if self.nan_guard.failed_at is not None:
            raise FloatingPointError(
                f"loss became NaN/inf at step {self.nan_guard.failed_at}; training stopped and "
                "model.keras keeps the last good checkpoint. Try a lower learning rate "
                "or train in float32 (--precision float32)."
            )
        # The last epoch's end saved model.keras; fit then put the averaged weights in `model`.
        speed = self.budget.steps_per_second()
        summary = {
            "steps": steps_done(self.model),
            "stopped": self.budget.reason or "finished",
            "minutes": self.budget.elapsed() / 60,
            "steps_per_s": speed,
            "real_tokens_per_s": speed * self.real_tokens_per_step,
            "onednn": onednn_state(),
            "precision": self.precision,
            **{k: float(v[-1]) for k, v in history.history.items()},
        }
        log.info(
            "%s after %d steps (%s)",
            "saved model.keras" if self.writes else "trained (the chief saves)",
            summary["steps"],
            summary["stopped"],
        )
        return summary


def train(out_dir, config_name=DEFAULT_PRESET, **options):
    """Trains (or resumes) a model in `out_dir` (see `start` for the options). Returns a summary
    dict (steps, minutes, loss, token accuracy, why it stopped)."""
    run = start(out_dir, config_name, **options)
    if run.done:
        return {"steps": run.steps, "stopped": run.done}
    with distributed.worker_failures():
        history = run.model.fit(**run.fit_args)
    return run.finish(history)


def start(
    out_dir,
    config_name=DEFAULT_PRESET,
    data=DEFAULT_CORPUS,
    direction=DEFAULT_DIRECTION,
    minutes=None,
    steps=None,
    epochs=None,
    xla=None,
    precision="auto",
    batch_tokens=None,
    seed=0,
    strategy=None,
    vocab_size=TransformerConfig.vocab_size,
    overrides=None,
    checkpoint_seconds=300,
    callbacks=(),
    verbose="auto",
):
    """Prepares (or resumes) a run in `out_dir`: data, tokenizer, compiled model, callbacks.
    Training stops after `minutes` (in all, across resumes), `steps` (total) or `epochs` (total);
    with none given, after one epoch. `callbacks` are extra Keras callbacks, run before kformer's own.
    xla=None: XLA when a GPU is visible (on CPUs it compiles every batch shape for no gain: README).
    precision: "auto", "float32", "bfloat16" or "float16" (`choose_precision`; weights stay float32,
    so a run may resume in another precision, and it translates and exports in float32)."""
    import tensorflow as tf

    if xla is None:
        xla = bool(tf.config.list_physical_devices("GPU"))
    precision, why = choose_precision(precision)

    if isinstance(strategy, str):
        strategy = distributed.make_strategy(strategy)
    with distributed.chief_first(strategy) as chief:  # only the chief writes the run directory
        if not chief and not os.path.exists(checkpoint.path(out_dir, checkpoint.CONFIG_FILE)):
            raise ValueError(
                f"{checkpoint.path(out_dir, checkpoint.CONFIG_FILE)} not found after the chief started: "
                "the chief failed (see its log), or --out is not on storage every worker reads"
            )
        overrides = dict(overrides or {})
        if batch_tokens is not None:
            overrides["batch_tokens"] = batch_tokens
        keras.utils.set_random_seed(seed)
        config, tokenizer, splits, corpus = prepare(
            out_dir, config_name, data, direction, vocab_size, overrides
        )

        encoded = {name: data_lib.encode_pairs(tokenizer, pairs, config) for name, pairs in splits.items()}
        for name, split in encoded.items():
            if split.dropped_too_long:
                log.warning(
                    "%s: dropped %d pairs longer than max lengths (%d source, %d target tokens)",
                    name,
                    split.dropped_too_long,
                    config.max_source_length,
                    config.max_target_length,
                )
        per_epoch = data_lib.steps_per_epoch(encoded["train"], config, pad_to_bucket=xla)
        if per_epoch < 1:
            raise ValueError(
                f"the train split ({len(encoded['train'])} pairs) fills no batch of "
                f"batch_tokens={config.batch_tokens}; lower --batch-tokens"
            )
        max_steps = (
            steps
            if steps is not None
            else (epochs * per_epoch if epochs is not None else None if minutes is not None else per_epoch)
        )
        state = checkpoint.read_state(out_dir)
        spent = float(state.get("seconds", 0.0))
        if minutes is not None and spent >= minutes * 60:
            log.info(
                "%s has already used its budget (%.1f of %g min, %d steps); give a larger --minutes to "
                "train on",
                out_dir,
                spent / 60,
                minutes,
                state.get("steps", 0),
            )
            return Training(None, config, tokenizer, {}, "budget already spent", state.get("steps", 0))

        if chief:
            checkpoint.create(
                out_dir, config, tokenizer, corpus
            )  # training starts: the run's files appear now
    strategy = strategy or tf.distribute.get_strategy()
    model_path = checkpoint.path(out_dir, checkpoint.MODEL_FILE)
    log.info("compute precision: %s (%s)", precision, why)
    with strategy.scope():
        schedule = make_schedule(config, max_steps or config.warmup_steps * 10)
        model = compile_model(
            Transformer(config, dtype=PRECISIONS[precision]), config, xla=xla, schedule=schedule
        )
        if os.path.exists(model_path):
            model.optimizer.build(model.trainable_variables)
            checkpoint.restore(model, model_path)
    done = steps_done(model)
    if done:  # the state that belongs to the restored model (see checkpoint.save)
        state = checkpoint.read_state(out_dir, steps=done)
        spent = float(state.get("seconds", spent))
    if distributed.agree(strategy, done, "MEAN") != done:
        raise ValueError(
            f"the workers restored different steps from {model_path}; it must be one file that "
            "every worker reads (shared storage)"
        )
    if done:
        log.info("resuming %s from step %d (%.1f min trained)", model_path, done, spent / 60)
        if state.get("replicas", 1) != strategy.num_replicas_in_sync:
            log.info(
                "%d replicas now, %d before: each global batch is split among them as before, so the "
                "training continues unchanged",
                strategy.num_replicas_in_sync,
                state.get("replicas", 1),
            )
        if isinstance(schedule, BudgetSchedule) and max_steps is None and state.get("schedule"):
            schedule.set(
                state["schedule"]["warmup_steps"], state["schedule"]["total_steps"]
            )  # the same schedule
    if max_steps is not None and done >= max_steps:
        log.info("already trained %d steps (asked for %d); nothing to do", done, max_steps)
        return Training(None, config, tokenizer, {}, "already done", done)
    if isinstance(schedule, BudgetSchedule):
        log.info(
            "learning rate: %s%s",
            schedule.describe(),
            " for now: sized to the budget from the measured speed" if max_steps is None else "",
        )
    else:
        log.info("learning rate: the paper's schedule, %d warm-up steps", config.warmup_steps)

    # The batch stream is seeded: a resumed run skips the batches it already trained on.
    train_ds = data_lib.make_dataset(
        encoded["train"], config, training=True, seed=seed, pad_to_bucket=xla
    ).skip(done)
    dev_ds = (
        data_lib.make_dataset(encoded["dev"], config, training=False, pad_to_bucket=xla)
        if len(encoded["dev"])
        else None
    )
    # With only a time budget, epochs are capped at a number no budget here reaches (for the display).
    total_epochs = math.ceil(max_steps / per_epoch) if max_steps is not None else 1000
    budget, nan_guard = Budget(schedule, max_steps, minutes, spent, strategy=strategy), StopOnNaN()
    callbacks = [*callbacks, budget, nan_guard]
    if chief:  # other workers compute the same weights and logs, and write nothing
        logs_dir = checkpoint.path(out_dir, checkpoint.LOGS_DIR)
        os.makedirs(logs_dir, exist_ok=True)
        callbacks += [
            Checkpoint(model_path, budget, checkpoint_seconds, nan_guard),
            keras.callbacks.CSVLogger(os.path.join(logs_dir, "history.csv"), append=True),
            keras.callbacks.TensorBoard(logs_dir, write_graph=False),
        ]
    # validation_steps: a finite dev set without it makes Keras warn "ran out of data" each epoch.
    dev_steps = None if dev_ds is None else sum(1 for _ in dev_ds)
    fit_args = dict(
        x=train_ds,
        validation_data=dev_ds,
        validation_steps=dev_steps,
        epochs=total_epochs,
        initial_epoch=done // per_epoch,
        steps_per_epoch=per_epoch,
        shuffle=False,
        callbacks=callbacks,
        verbose=verbose,
    )
    real = sum(len(s) + len(t) + 1 for s, t in zip(encoded["train"].source, encoded["train"].target))  # + EOS
    return Training(
        model,
        config,
        tokenizer,
        fit_args,
        steps=done,
        budget=budget,
        nan_guard=nan_guard,
        real_tokens_per_step=real / per_epoch,
        writes=chief,
        precision=precision,
    )

"""`train`: compile + fit, resumable, within a budget, in a few named steps.

The run's options are a TrainOptions (kformer.train.options); its config, corpus and tokenizer
come from kformer.train.run_data, its batches from kformer.train.inputs; the loss and metric are
kformer.train.losses', the schedules kformer.train.schedules', the callbacks
kformer.train.callbacks', the precision choice kformer.train.precision's, the run directory's
files kformer.run_folder's.
"""

import dataclasses
import functools
import logging
import math
import os
import shutil
import typing

import keras

from kformer import locks, run_folder
from kformer.contracts.run import CONFIG_FILE, LOGS_DIR, MODEL_FILE, CorpusRecord, TrainingState
from kformer.data import batches as batches_lib
from kformer.data.batches import Batching
from kformer.model.config import ModelConfig
from kformer.model.transformer import Transformer
from kformer.train import distributed, inputs, judge, precision_probe
from kformer.train import init_from as init_from_lib
from kformer.train.callbacks import (
    INTERRUPTED,
    Budget,
    Checkpoint,
    InputPosition,
    StopOnInterrupt,
    StopOnNaN,
    StopOnSigterm,
    batches_done,
    steps_done,
)
from kformer.train.keep_best import KeepBest
from kformer.train.losses import LabelSmoothedCrossEntropy, MaskedAccuracy
from kformer.train.optimizer import FusedAdam
from kformer.train.options import TrainOptions
from kformer.train.precision import PRECISIONS, choose_precision, onednn_state
from kformer.train.recipe import TrainingRecipe
from kformer.train.run_data import DATA_PREFIX, run_data
from kformer.train.schedules import BudgetSchedule, make_schedule

log = logging.getLogger("kformer")


def compile_model(model, config, recipe, xla=True, schedule=None, fused=True, steps_per_call=1):
    """`model` (of a ModelConfig `config`) compiled as `recipe` (a TrainingRecipe) says:
    Adam(0.9, 0.98, 1e-9) on `schedule` (default: the recipe's, sized for 10 x warmup_steps),
    label-smoothed loss, token accuracy;
    with `ema_momentum`, the optimizer keeps a moving average of the weights (kformer.run_folder).
    `fused=False`: Keras' own Adam (same arithmetic).
    `steps_per_call`: Keras' steps_per_execution, the training steps one call of the train function
    runs (callbacks see every that many steps)."""
    schedule = schedule or make_schedule(recipe, config.d_model, recipe.warmup_steps * 10)
    options = dict(use_ema=True, ema_momentum=recipe.ema_momentum) if recipe.ema_momentum else {}
    if recipe.accumulate_steps > 1:
        options["gradient_accumulation_steps"] = recipe.accumulate_steps
    if recipe.pull_to_start:
        options["pull_to_start"] = recipe.pull_to_start  # FusedAdam's alone
    adam = FusedAdam if fused else keras.optimizers.Adam
    optimizer = adam(schedule, beta_1=0.9, beta_2=0.98, epsilon=1e-9, **options)
    model.compile(
        optimizer=optimizer,
        loss=LabelSmoothedCrossEntropy(recipe.label_smoothing, config.pad_id),
        metrics=[MaskedAccuracy(config.pad_id)],
        jit_compile=xla,
        steps_per_execution=steps_per_call,
    )
    return model


@dataclasses.dataclass
class Training:
    """A run ready to train: `model.fit(**fit_args)`, then `finish(history)`. `model` is None when
    there is nothing left to do (`done` says why)."""

    model: keras.Model | None
    config: ModelConfig
    tokenizer: "sentencepiece.SentencePieceProcessor"  # noqa: F821
    fit_args: dict
    done: str | None = None  # why there is nothing left to train, if so
    steps: int = 0  # steps trained before this run
    budget: Budget | None = None
    nan_guard: StopOnNaN | None = None
    keep_best: KeepBest | None = None  # when the run evaluates a dev sample
    interrupt: StopOnInterrupt | None = None  # in a single-process run
    real_tokens_per_step: float = 0.0  # non-pad source + target tokens of an average batch
    writes: bool = True  # False on a worker other than the chief
    precision: str = "float32"  # compute precision (`choose_precision`); weights are float32
    # drops the run folder's lock (kformer.locks), held from `start`
    release: typing.Callable[[], None] = locks.nothing

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
        best = self.keep_best
        summary = {
            "steps": steps_done(self.model),
            "stopped": (self.interrupt and self.interrupt.reason)
            or self.budget.reason
            or (best and best.reason)
            or "finished",
            "minutes": self.budget.elapsed() / 60,
            "steps_per_s": speed,
            "real_tokens_per_s": speed * self.real_tokens_per_step,
            "onednn": onednn_state(),
            "precision": self.precision,
            **{k: float(v[-1]) for k, v in history.history.items()},
        }
        if best is not None and best.evaluations:
            summary.update(
                best=best.best.to_dict(), evaluations=best.evaluations, evaluation_seconds=best.seconds
            )
            _log_changes(summary, best.changes())
            best.log_what_is_kept(summary["minutes"] * 60)
        log.info(
            "%s after %d steps (%s)",
            "saved model.keras" if self.writes else "trained (the chief saves)",
            summary["steps"],
            summary["stopped"],
        )
        return summary


def _log_changes(summary, changes):
    """Adds a fine-tuning run's dev sample BLEU before and after to `summary`, and logs it."""
    if changes:
        summary["dev_bleu"] = changes
        log.info(
            "dev sample BLEU from the start: %s",
            "; ".join(
                f"{name} {c['start']:.2f} -> {c['end']:.2f} ({c['end'] - c['start']:+.2f})"
                for name, c in changes.items()
            ),
        )


def stop_if_interrupted(summary):
    """Raises `Interrupted` (a command's exit status 130) if Ctrl-C stopped the run of `summary`."""
    if summary.get("stopped") == INTERRUPTED:
        raise distributed.Interrupted(
            f"stopped by Ctrl-C after step {summary['steps']} (saved model.keras); "
            "run the same command to resume"
        )


def train(out_dir, config_name=None, **fields):
    """Trains (or resumes) a model in `out_dir`: the Python API of `kformer train`, whose keywords
    are the fields of TrainOptions. Returns `run`'s summary."""
    return run(out_dir, TrainOptions(config_name=config_name, **fields))


def run(out_dir, options):
    """Trains (or resumes) a model in `out_dir` as `options` (a TrainOptions) say. Returns a
    summary dict (steps, minutes, loss, token accuracy, why it stopped)."""
    training = start(out_dir, options)
    try:
        if training.done:
            return {"steps": training.steps, "stopped": training.done}
        with distributed.worker_failures():
            history = training.model.fit(**training.fit_args)
        return training.finish(history)
    finally:
        training.release()


def start(out_dir, options):
    """Prepares (or resumes) a run in `out_dir` as `options` (a TrainOptions) say: data,
    tokenizer, compiled model, callbacks.
    The run folder is locked (kformer.locks) from here until the returned run's `release()`; a
    second process on it is refused. `release()` also hands back SIGINT and SIGTERM, which the
    run's callbacks hold while it trains: call it after `fit`, whether `fit` returned or raised."""
    if isinstance(options.strategy, str):
        options = dataclasses.replace(options, strategy=distributed.make_strategy(options.strategy))
    chief = distributed.is_chief(options.strategy)
    release = locks.hold(out_dir, "train") if chief else locks.nothing
    try:
        run = _start(out_dir, options)
    except BaseException:
        release()
        raise
    run.release = functools.partial(_release, release, run.fit_args.get("callbacks", []))
    return run


def _release(unlock, callbacks):
    """The lock dropped and the signal handlers of `callbacks` handed back (the callbacks hold them
    from fit's start to its end, but Keras calls no end when fit raises)."""
    try:
        for callback in callbacks:
            if isinstance(callback, (StopOnInterrupt, StopOnSigterm)):
                callback.release()
    finally:
        unlock()


@dataclasses.dataclass(frozen=True)
class _Setup:
    """What a run's start settles before its model is built."""

    config: ModelConfig
    recipe: TrainingRecipe
    tokenizer: "sentencepiece.SentencePieceProcessor"  # noqa: F821
    corpus: CorpusRecord
    encoded: inputs.TrainingCorpus
    source: init_from_lib.Source | None  # the run it starts from
    initial: dict[str, "numpy.ndarray"] | None  # noqa: F821  (the source's weights, for a run with none of its own yet)
    per_epoch: int  # batches (not updates) a pass over the train split takes
    max_steps: int  # the run's total optimizer steps; None for a time budget
    state: TrainingState
    xla: bool
    precision: str | None = None  # compute precision (`_precision`); weights are float32


def _start(out_dir, options):
    """`start` once the run folder is locked."""
    import tensorflow as tf

    xla = _xla(options)
    with distributed.chief_first(options.strategy) as chief:  # only the chief writes the run directory
        _check_the_chief_started(out_dir, chief)
        keras.utils.set_random_seed(options.seed)
        setup = _set_up(out_dir, options, xla)
        if _budget_spent(out_dir, options.minutes, setup.state):
            return Training(
                None, setup.config, setup.tokenizer, {}, "budget already spent", setup.state.steps
            )
        precision, why = _precision(options, setup)
        setup = dataclasses.replace(setup, precision=precision)
        keras.utils.set_random_seed(options.seed)  # as if nothing was measured: the same weights
        if chief:  # training starts: the run's files appear now, its prepared corpus moves in
            setup = _create_run_folder(out_dir, setup)
    strategy = options.strategy or tf.distribute.get_strategy()
    log.info("compute precision: %s (%s)", precision, why)
    model, schedule = _compiled_model(out_dir, setup, strategy)
    done, state = _resumed(model, schedule, out_dir, strategy, setup.state, setup.max_steps)
    if setup.initial is not None and not done:
        init_from_lib.assign(model, setup.initial, setup.source)
    if setup.max_steps is not None and done >= setup.max_steps:
        log.info("already trained %d steps (asked for %d); nothing to do", done, setup.max_steps)
        return Training(None, setup.config, setup.tokenizer, {}, "already done", done)
    _log_schedule(schedule, setup.recipe, setup.max_steps)
    return _training(out_dir, options, setup, model, schedule, state, chief, strategy)


def _precision(options, setup):
    """-> (precision, why), as `choose_precision` decides; where `auto` leaves it to a measurement
    (a CPU that multiplies bfloat16), steps on a batch of the corpus' mean lengths decide
    (kformer.train.precision_probe). Under a strategy every worker must agree: the CPU's flags decide."""
    if options.strategy:
        return choose_precision(options.precision)
    source, target, counts = setup.encoded.lengths
    shape = precision_probe.mean_batch_shape(setup.recipe.micro_batch_tokens, source, target, counts)

    def compiled(precision):
        return compile_model(
            Transformer(setup.config, dtype=PRECISIONS[precision]), setup.config, setup.recipe, xla=setup.xla
        )

    return choose_precision(
        options.precision, measure=precision_probe.measurement(setup.config, shape, compiled)
    )


def _set_up(out_dir, options, xla):
    """The run's config, corpus and tokenizer, its source's weights, and its length in steps."""
    if options.mix_original is not None and not options.init_from:
        raise ValueError("--mix-original draws from the run fine-tuning starts from: give --init-from RUN")
    if (options.recipe_changes or {}).get("pull_to_start") and not options.init_from:
        raise ValueError(
            "--pull-to-start pulls toward the weights fine-tuning starts from: give --init-from RUN"
        )
    config, recipe, tokenizer, folder, corpus = run_data(out_dir, options)
    batching = Batching.of(config, recipe.micro_batch_tokens)
    source = init_from_lib.open_source(options.init_from) if options.init_from else None
    fresh = not os.path.exists(run_folder.path(out_dir, run_folder.MODEL_FILE))  # no weights of its own
    try:
        initial = init_from_lib.trained_weights(source) if source is not None and fresh else None
        encoded = inputs.encode(folder, tokenizer, batching)
        if source is not None:
            original, share = init_from_lib.original_corpus(source, options.mix_original)
            init_from_lib.check_share(out_dir, share)
            encoded = inputs.with_original(encoded, original, share, tokenizer, batching)
        inputs.check_evaluation(options.evaluation, encoded, folder)
        per_epoch = inputs.steps_per_epoch(encoded, batching, xla)  # batches, not updates
    except BaseException:
        if os.path.basename(folder).startswith(DATA_PREFIX):  # prepared for a start that failed
            shutil.rmtree(folder, ignore_errors=True)
        raise
    max_steps = _max_steps(options, per_epoch / recipe.accumulate_steps)
    state = run_folder.read_state(out_dir)
    return _Setup(
        config, recipe, tokenizer, corpus, encoded, source, initial, per_epoch, max_steps, state, xla
    )


def _create_run_folder(out_dir, setup):
    """The run's files written (its source recorded first: config.json marks a run) and its
    prepared corpus moved in; returns the setup with the corpus where it now is."""
    if setup.source is not None:
        init_from_lib.record(out_dir, setup.source, setup.encoded.original_share)
    run_folder.create(
        out_dir, setup.config, setup.recipe, setup.tokenizer, setup.corpus, setup.encoded.folder
    )
    encoded = dataclasses.replace(setup.encoded, folder=run_folder.prepared_folder(out_dir))
    return dataclasses.replace(setup, encoded=encoded)


def _training(out_dir, options, setup, model, schedule, state, chief, strategy):
    """The run ready to fit: its callbacks and model.fit's arguments."""
    plain = (
        options.strategy is None
    )  # fit's iterator is then a plain tf.data one, whose position can be saved
    budget = Budget(
        schedule,
        setup.max_steps,
        options.minutes,
        float(state.seconds),
        strategy=strategy,
        recipe=setup.recipe,
    )
    nan_guard = StopOnNaN()
    position, replay = _input_position(out_dir, state, batches_done(model), plain)
    evaluation = options.evaluation.within(options.minutes)
    keep_best = _keep_best(out_dir, evaluation, setup, chief, strategy, nan_guard)
    interrupt = StopOnInterrupt() if plain else None  # one process: no worker waits for this one
    optional = (position, keep_best, interrupt)
    callbacks = [*options.callbacks, budget, nan_guard, *(c for c in optional if c is not None)]
    # Other workers compute the same weights and logs, and write nothing.
    writers = (
        _chief_callbacks(out_dir, budget, options.checkpoint_seconds, nan_guard, position) if chief else []
    )
    callbacks += [*writers, StopOnSigterm(writers[0].save if writers else None)]
    fit_args = _fit_args(setup, options, batches_done(model), callbacks, replay)
    source, target, counts = setup.encoded.lengths
    real = int(((source + target + 1) * counts).sum())  # non-pad tokens of one pass, EOS included
    return Training(
        model,
        setup.config,
        setup.tokenizer,
        fit_args,
        steps=steps_done(model),  # what _resumed restored
        budget=budget,
        nan_guard=nan_guard,
        keep_best=keep_best,
        interrupt=interrupt,
        real_tokens_per_step=real / setup.per_epoch * setup.recipe.accumulate_steps,
        writes=chief,
        precision=setup.precision,
    )


def _xla(options):
    """Whether the run compiles its step with XLA: as asked, else `default_xla`."""
    if options.xla is None:
        xla = default_xla(options.strategy, options.minutes)
        if not xla and default_xla(options.strategy):
            log.info(
                "XLA off: a %g-minute budget (it compiles each batch shape first; --xla)", options.minutes
            )
        return xla
    if options.xla and options.strategy is not None:
        log.warning("XLA under a tf.distribute strategy: Keras' default turns it off there (--no-xla)")
    return options.xla


# A run with a time budget shorter than this trains without XLA by default: XLA compiles each
# batch shape (up to 16 training and validation shapes, each taking minutes for `base`) before its
# faster steps pay that back.
XLA_MIN_MINUTES = 30


def default_xla(strategy, minutes=None):
    """XLA by default where a GPU is visible, no tf.distribute strategy runs the step, and the run
    has no time budget under XLA_MIN_MINUTES. On CPUs it needs batches padded to the bucket and
    compiles each bucket's shape, and ran no faster than the grouped batches without it; under a
    strategy Keras' own "auto" turns it off, and jit_compile around strategy.run has known
    failures (keras-team/keras#19005, #20763)."""
    import tensorflow as tf

    short = minutes is not None and minutes < XLA_MIN_MINUTES
    return strategy is None and not short and bool(tf.config.list_physical_devices("GPU"))


def _check_the_chief_started(out_dir, chief):
    """A worker other than the chief runs after the chief wrote the run's files (`chief_first`)."""
    config_path = run_folder.path(out_dir, CONFIG_FILE)
    if not chief and not os.path.exists(config_path):
        raise ValueError(
            f"{config_path} not found after the chief started: the chief failed (see its log), or "
            "--out is not on storage every worker reads"
        )


def _keep_best(out_dir, evaluation, setup, chief, strategy, nan_guard):
    """The KeepBest callback of a run that evaluates a dev sample, else None."""
    dev_text = setup.encoded.dev_text
    if not (evaluation.on and dev_text):
        return None
    language = setup.corpus.direction.target
    evaluation = dataclasses.replace(
        evaluation, judge=evaluation.judge or judge.default(setup.source is not None)
    )
    samples = {"dev": dev_text}
    if setup.encoded.original is not None and setup.encoded.original.dev_text:
        samples["original"] = setup.encoded.original.dev_text  # what fine-tuning may forget
    return KeepBest(out_dir, evaluation, samples, setup.tokenizer, language, chief, strategy, nan_guard)


def _max_steps(options, per_epoch):
    """The run's total optimizer steps: as asked, from epochs (`per_epoch`: updates a pass makes),
    none for a time budget, else one epoch."""
    if options.steps is not None:
        return options.steps
    if options.epochs is not None:
        return math.ceil(options.epochs * per_epoch)
    return None if options.minutes is not None else math.ceil(per_epoch)


def _budget_spent(out_dir, minutes, state):
    spent = float(state.seconds)
    if minutes is None or spent < minutes * 60:
        return False
    log.info(
        "%s has already used its budget (%.1f of %g min, %d steps); give a larger --minutes to train on",
        out_dir,
        spent / 60,
        minutes,
        state.steps,
    )
    return True


def _compiled_model(out_dir, setup, strategy):
    """The compiled model in the strategy's scope, with the checkpoint's weights and optimizer
    state where the run has one; and its learning-rate schedule."""
    model_path = run_folder.path(out_dir, MODEL_FILE)
    config, recipe = setup.config, setup.recipe
    with strategy.scope():
        schedule = make_schedule(recipe, config.d_model, setup.max_steps or recipe.warmup_steps * 10)
        model = compile_model(
            Transformer(config, dtype=PRECISIONS[setup.precision]),
            config,
            recipe,
            xla=setup.xla,
            schedule=schedule,
        )
        if os.path.exists(model_path):
            model.optimizer.build(model.trainable_variables)
            run_folder.restore(model, model_path)
    return model, schedule


def _resumed(model, schedule, out_dir, strategy, state, max_steps):
    """-> (steps already trained, the state that belongs to them). Every worker must have
    restored the same step; a budget schedule continues as it was (no second warm-up)."""
    done = steps_done(model)
    if done:  # the state that belongs to the restored model (see run_folder.save)
        state = run_folder.read_state(out_dir, steps=done)
    if distributed.agree(strategy, done, "MEAN") != done:
        raise ValueError(
            f"the workers restored different steps from {run_folder.path(out_dir, MODEL_FILE)}; "
            "it must be one file that every worker reads (shared storage)"
        )
    if not done:
        return done, state
    model_path = run_folder.path(out_dir, MODEL_FILE)
    log.info("resuming %s from step %d (%.1f min trained)", model_path, done, float(state.seconds) / 60)
    if state.replicas != strategy.num_replicas_in_sync:
        log.info(
            "%d replicas now, %d before: the train split is divided among the workers anew, so the "
            "batches differ from those the interrupted run would have taken next",
            strategy.num_replicas_in_sync,
            state.replicas,
        )
    if isinstance(schedule, BudgetSchedule) and max_steps is None and state.schedule:
        schedule.set(state.schedule["warmup_steps"], state.schedule["total_steps"])
    return done, state


def _input_position(out_dir, state, batches, plain):
    """-> (the InputPosition callback or None, batches to replay). Without a strategy, the batch
    stream's position is saved with each checkpoint and a resumed run restores it; with one (its
    iterator cannot be saved), or for a checkpoint saved without it, the stream is rebuilt from the
    start and the `batches` already trained on are skipped (exact, but ~150 batches/s)."""
    saved = run_folder.saved_input(out_dir, state) if batches else None
    replay = 0 if not batches or (plain and saved) else batches
    if replay:
        log.info("rebuilding the %d batches already trained on to continue the same batch stream", replay)
    return (InputPosition(restore_from=saved) if plain else None), replay


def _log_schedule(schedule, recipe, max_steps):
    if isinstance(schedule, BudgetSchedule):
        sized = " for now: sized to the budget from the measured speed" if max_steps is None else ""
        log.info("learning rate: %s%s", schedule.describe(), sized)
    else:
        log.info("learning rate: the paper's schedule, %d warm-up steps", recipe.warmup_steps)


def _chief_callbacks(out_dir, budget, checkpoint_seconds, nan_guard, position):
    """The callbacks that write: checkpoints (with the input position; first), history.csv, TensorBoard."""
    logs_dir = run_folder.path(out_dir, LOGS_DIR)
    os.makedirs(logs_dir, exist_ok=True)
    model_path = run_folder.path(out_dir, MODEL_FILE)
    return [
        Checkpoint(model_path, budget, checkpoint_seconds, nan_guard, position),
        keras.callbacks.CSVLogger(os.path.join(logs_dir, "history.csv"), append=True),
        keras.callbacks.TensorBoard(logs_dir, write_graph=False),
    ]


def _fit_args(setup, options, done, callbacks, replay):
    """model.fit's arguments: the seeded batch stream (after `replay` batches skipped; each worker's
    own with a strategy), the dev split, and epochs counted from where the run stands (`done`
    batches; the config's micro-batches, `per_epoch` and the steps count batches, of which
    accumulation makes several an optimizer step)."""
    batching = Batching.of(setup.config, setup.recipe.micro_batch_tokens)
    xla, seed, strategy = setup.xla, options.seed, options.strategy
    encoded, per_epoch = setup.encoded, setup.per_epoch
    max_batches = None if setup.max_steps is None else setup.max_steps * setup.recipe.accumulate_steps
    if strategy is None:
        train_ds = inputs.train_dataset(encoded, batching, xla, seed)
        train_ds = train_ds.skip(replay) if replay else train_ds
    else:
        train_ds = inputs.worker_datasets(encoded, batching, xla, seed, strategy, replay)
    dev_ds = (
        batches_lib.make_dataset(encoded.dev, batching, training=False, pad_to_bucket=xla)
        if len(encoded.dev)
        else None
    )
    # With only a time budget, epochs are capped at a number no budget here reaches (for the display).
    total_epochs = math.ceil(max_batches / per_epoch) if max_batches is not None else 1000
    return dict(
        x=train_ds,
        validation_data=dev_ds,
        # A finite dev set without validation_steps makes Keras warn "ran out of data" each epoch.
        validation_steps=None if dev_ds is None else sum(1 for _ in dev_ds),
        epochs=total_epochs,
        initial_epoch=done // per_epoch,
        steps_per_epoch=per_epoch,
        shuffle=False,
        callbacks=callbacks,
        verbose=options.verbose,
    )

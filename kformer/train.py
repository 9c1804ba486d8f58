"""`train`: compile + fit, resumable, within a budget, in a few named steps.

The loss and metric are kformer.losses', the schedules kformer.schedules', the callbacks
kformer.callbacks', the precision choice kformer.precision's, the run directory's files
kformer.checkpoint's.
"""

import dataclasses
import logging
import math
import os
import shutil

import keras

from kformer import checkpoint, distributed, folders, locks
from kformer import data as data_lib
from kformer import prepare as prepare_lib
from kformer.callbacks import Budget, Checkpoint, InputPosition, StopOnNaN, StopOnSigterm, steps_done
from kformer.config import (
    DEFAULT_CORPUS,
    DEFAULT_DIRECTION,
    DEFAULT_PRESET,
    PRECISIONS,
    TransformerConfig,
    preset,
    tokenizer_digest,
)
from kformer.losses import LabelSmoothedCrossEntropy, MaskedAccuracy
from kformer.model import Transformer
from kformer.optimizer import FusedAdam
from kformer.precision import choose_precision, onednn_state
from kformer.schedules import BudgetSchedule, make_schedule

log = logging.getLogger("kformer")


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


DATA_PREFIX = ".kformer-data-"  # a new run's corpus, prepared beside its folder until training starts


def prepare(
    out_dir,
    config_name=DEFAULT_PRESET,
    data=DEFAULT_CORPUS,
    direction=DEFAULT_DIRECTION,
    vocab_size=TransformerConfig.vocab_size,
    overrides=None,
):
    """The run's corpus, prepared (kformer.prepare), and its tokenizer and config. A new run's
    corpus is prepared into a temporary sibling of `out_dir`, which `checkpoint.create` moves in
    once training starts (so a failed start leaves no folder behind); a resumed run's is the one it
    recorded, after checking it is the corpus asked for; a prepared folder given as `data` is read
    where it is (its direction is the one it was prepared in). Writes nothing in `out_dir`.
    Returns (config, tokenizer, prepared folder, corpus record)."""
    overrides = dict(overrides or {})
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ValueError(f"--out {out_dir} is a file, not a folder; choose a folder name")
    config = _requested_config(out_dir, config_name, overrides)
    if config is not None:
        folder, corpus = _recorded_corpus(out_dir, data, direction)
    elif prepare_lib.is_prepared(data):
        folder, corpus = os.path.abspath(data), _prepared_record(data)
    else:
        folder = _prepare_beside(out_dir, data, direction, vocab_size)
        corpus = {**prepare_lib.load(folder)["corpus"], "prepared": checkpoint.DATA_DIR}
    manifest = prepare_lib.load(folder)
    log.info("corpus: %s", prepare_lib.summary(manifest))
    tokenizer_path = (
        os.path.join(folder, prepare_lib.TOKENIZER)
        if config is None
        else checkpoint.path(out_dir, checkpoint.TOKENIZER_FILE)
    )
    tokenizer = data_lib.load_tokenizer(tokenizer_path)
    if config is None:
        config = preset(
            config_name,
            vocab_size=tokenizer.get_piece_size(),
            tokenizer_sha256=tokenizer_digest(tokenizer),
            **overrides,
        )
    config.check_tokenizer(tokenizer, tokenizer_path)
    if tokenizer_digest(tokenizer) != manifest["tokenizer"]["sha256"]:
        raise ValueError(f"{folder} was prepared with another tokenizer than {tokenizer_path}'s")
    return config, tokenizer, folder, corpus


def _prepared_record(folder):
    """What a run records of a prepared folder it trains on: the folder and its manifest's digest."""
    digest = data_lib.files_sha256([os.path.join(folder, prepare_lib.MANIFEST)])
    source = prepare_lib.load(folder)["corpus"]
    return {
        "data": os.path.abspath(folder),
        "direction": source["direction"],
        "sha256": digest,
        "prepared": os.path.abspath(folder),
    }


def _recorded_corpus(out_dir, data, direction):
    """(prepared folder, corpus record) of a resumed run, if `data` is the corpus it was trained on."""
    saved = checkpoint.read_corpus(out_dir)
    requested = (
        _prepared_record(data) if prepare_lib.is_prepared(data) else data_lib.corpus_record(data, direction)
    )
    if (saved.get("sha256"), saved["direction"]) != (requested["sha256"], requested["direction"]):
        raise ValueError(
            f"{out_dir} was trained on {saved['data']} ({saved['direction']}), not on {data} "
            f"({direction}) as it is now; use a new --out directory."
        )
    return checkpoint.prepared_folder(out_dir), saved


def _prepare_beside(out_dir, data, direction, vocab_size):
    """A new run's corpus prepared into a temporary sibling of `out_dir` (one of a killed start is
    removed first)."""
    parent = os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    folders.remove_abandoned(parent, DATA_PREFIX)
    folder = os.path.join(parent, f"{DATA_PREFIX}{os.getpid()}-{os.path.basename(os.path.abspath(out_dir))}")
    shutil.rmtree(folder, ignore_errors=True)
    prepare_lib.prepare(data, folder, direction, vocab_size, lock=False)  # the run's lock covers it
    return folder


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
    release: object = locks.nothing  # drops the run folder's lock (kformer.locks), held from `start`

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
    try:
        if run.done:
            return {"steps": run.steps, "stopped": run.done}
        with distributed.worker_failures():
            history = run.model.fit(**run.fit_args)
        return run.finish(history)
    finally:
        run.release()


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
    xla=None: XLA when a GPU is visible (on CPUs it needs batches padded to the bucket and compiles
    each bucket's shape, and ran no faster than the grouped batches without it).
    precision: "auto", "float32", "bfloat16" or "float16" (`choose_precision`; weights stay float32,
    so a run may resume in another precision, and it translates and exports in float32).
    The run folder is locked (kformer.locks) from here until the returned run's `release()`; a
    second process on it is refused."""
    options = dict(locals())  # every argument, for _start
    options["strategy"] = strategy = (
        distributed.make_strategy(strategy) if isinstance(strategy, str) else strategy
    )
    release = locks.hold(out_dir, "train") if distributed.is_chief(strategy) else locks.nothing
    try:
        run = _start(**options)
    except BaseException:
        release()
        raise
    run.release = release
    return run


def _start(
    out_dir,
    config_name,
    data,
    direction,
    minutes,
    steps,
    epochs,
    xla,
    precision,
    batch_tokens,
    seed,
    strategy,
    vocab_size,
    overrides,
    checkpoint_seconds,
    callbacks,
    verbose,
):
    """`start` once the run folder is locked."""
    import tensorflow as tf

    xla = bool(tf.config.list_physical_devices("GPU")) if xla is None else xla
    precision, why = choose_precision(precision)
    overrides = {**(overrides or {}), **({} if batch_tokens is None else {"batch_tokens": batch_tokens})}
    with distributed.chief_first(strategy) as chief:  # only the chief writes the run directory
        _check_the_chief_started(out_dir, chief)
        keras.utils.set_random_seed(seed)
        config, tokenizer, folder, corpus = prepare(
            out_dir, config_name, data, direction, vocab_size, overrides
        )
        try:
            encoded = _encode(folder, tokenizer, config)
            per_epoch = _steps_per_epoch(encoded, config, xla)
        except BaseException:
            if os.path.basename(folder).startswith(DATA_PREFIX):  # prepared for a start that failed
                shutil.rmtree(folder, ignore_errors=True)
            raise
        max_steps = _max_steps(steps, epochs, minutes, per_epoch)
        state = checkpoint.read_state(out_dir)
        if _budget_spent(out_dir, minutes, state):
            return Training(None, config, tokenizer, {}, "budget already spent", state.get("steps", 0))
        if chief:  # training starts: the run's files appear now, its prepared corpus moves in
            checkpoint.create(out_dir, config, tokenizer, corpus, folder)
            encoded.folder = checkpoint.prepared_folder(out_dir)
    plain = strategy is None  # fit's iterator is then a plain tf.data one, whose position can be saved
    strategy = strategy or tf.distribute.get_strategy()
    log.info("compute precision: %s (%s)", precision, why)
    model, schedule = _compiled_model(out_dir, config, precision, xla, strategy, max_steps)
    done, state = _resumed(model, schedule, out_dir, strategy, state, max_steps)
    if max_steps is not None and done >= max_steps:
        log.info("already trained %d steps (asked for %d); nothing to do", done, max_steps)
        return Training(None, config, tokenizer, {}, "already done", done)
    _log_schedule(schedule, config, max_steps)
    budget = Budget(schedule, max_steps, minutes, float(state.get("seconds", 0.0)), strategy=strategy)
    nan_guard = StopOnNaN()
    position, replay = _input_position(out_dir, state, done, plain)
    callbacks = [*callbacks, budget, nan_guard, *([position] if position else [])]
    # Other workers compute the same weights and logs, and write nothing.
    writers = _chief_callbacks(out_dir, budget, checkpoint_seconds, nan_guard, position) if chief else []
    callbacks += [*writers, StopOnSigterm(writers[0].save if writers else None)]
    fit_args = _fit_args(
        encoded,
        config,
        xla,
        seed,
        done,
        per_epoch,
        max_steps,
        callbacks,
        verbose,
        replay,
        None if plain else strategy,
    )
    source, target, counts = encoded.lengths
    real = int(((source + target + 1) * counts).sum())  # non-pad tokens of one pass, EOS included
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


def _check_the_chief_started(out_dir, chief):
    """A worker other than the chief runs after the chief wrote the run's files (`chief_first`)."""
    config_path = checkpoint.path(out_dir, checkpoint.CONFIG_FILE)
    if not chief and not os.path.exists(config_path):
        raise ValueError(
            f"{config_path} not found after the chief started: the chief failed (see its log), or "
            "--out is not on storage every worker reads"
        )


@dataclasses.dataclass
class _Corpus:
    """What training reads of a prepared corpus: where it is, its manifest, the dev split's ids,
    and the lengths of the train pairs that fit the model (source, target, pairs of each)."""

    folder: str
    manifest: dict
    dev: data_lib.EncodedPairs
    lengths: tuple


def _encode(folder, tokenizer, config):
    """The prepared corpus for training; pairs over the max lengths are dropped, with a warning."""
    manifest = prepare_lib.load(folder)
    source, target, counts, dropped = data_lib.prepared_lengths(manifest, config)
    dev = data_lib.encode_pairs(tokenizer, prepare_lib.held_out(folder, "dev"), config)
    for name, count in (("train", dropped), ("dev", dev.dropped_too_long)):
        if count:
            log.warning(
                "%s: dropped %d pairs longer than max lengths (%d source, %d target tokens)",
                name,
                count,
                config.max_source_length,
                config.max_target_length,
            )
    return _Corpus(folder, manifest, dev, (source, target, counts))


def _steps_per_epoch(encoded, config, xla):
    per_epoch = data_lib.prepared_steps_per_epoch(encoded.manifest, config, pad_to_bucket=xla)
    if per_epoch < 1:
        raise ValueError(
            f"the train split ({int(encoded.lengths[2].sum())} pairs) fills no batch of "
            f"batch_tokens={config.batch_tokens}; lower --batch-tokens"
        )
    return per_epoch


def _train_dataset(encoded, config, xla, seed, workers=1, rank=0):
    """The endless seeded training batches of input worker `rank` of `workers` (its part:
    `data.worker_part`): read into memory when that is small (data.IN_MEMORY_TOKENS; each pass
    then in a new order of all its pairs), else streamed from its shards (bounded memory)."""
    all_paths = prepare_lib.shard_paths(encoded.folder, encoded.manifest)
    paths, num_shards, shard_index = data_lib.worker_part(all_paths, workers, rank)
    if workers > 1:
        log.info(
            "input worker %d of %d reads %s",
            rank,
            workers,
            f"{len(paths)} of {len(all_paths)} train shards"
            if num_shards == 1
            else f"every {num_shards}th pair of the {len(all_paths)} train shard(s)",
        )
    dtype = encoded.manifest["train"]["dtype"]
    source, target, counts = encoded.lengths
    tokens = int(((source + target) * counts).sum()) * len(paths) / len(all_paths) / num_shards
    if tokens <= data_lib.IN_MEMORY_TOKENS:
        pairs = data_lib.read_prepared(paths, dtype, config)
        return data_lib.make_dataset(pairs, config, True, seed, num_shards, shard_index, pad_to_bucket=xla)
    log.info("streaming the train split from %d shards", len(paths))
    return data_lib.stream_prepared(paths, dtype, config, seed, xla, num_shards, shard_index)


def _worker_datasets(encoded, config, xla, seed, strategy, replay):
    """The training batches of a tf.distribute strategy: each worker reads only its part of the
    train split (`_train_dataset`) into batches of batch_tokens / replicas tokens, one for each of
    its replicas a step; a resumed run rebuilds and skips the batches already trained on."""
    replicas = strategy.num_replicas_in_sync
    per_replica = config.replace(batch_tokens=config.batch_tokens // replicas)

    def worker_dataset(context):
        ds = _train_dataset(
            encoded, per_replica, xla, seed, context.num_input_pipelines, context.input_pipeline_id
        )
        return ds.skip(replay * replicas // context.num_input_pipelines) if replay else ds

    workers = distributed.workers(strategy)
    shards = len(prepare_lib.shard_paths(encoded.folder, encoded.manifest))
    if shards >= workers > 1 and shards % workers:
        log.warning(
            "%d train shards over %d workers: some workers read more shards than others, and pass over "
            "their pairs less often (kformer prepare --shards, a multiple of %d, evens them)",
            shards,
            workers,
            workers,
        )
    return strategy.distribute_datasets_from_function(worker_dataset)


def _max_steps(steps, epochs, minutes, per_epoch):
    """The run's total steps: as asked, from epochs, none for a time budget, else one epoch."""
    if steps is not None:
        return steps
    if epochs is not None:
        return epochs * per_epoch
    return None if minutes is not None else per_epoch


def _budget_spent(out_dir, minutes, state):
    spent = float(state.get("seconds", 0.0))
    if minutes is None or spent < minutes * 60:
        return False
    log.info(
        "%s has already used its budget (%.1f of %g min, %d steps); give a larger --minutes to train on",
        out_dir,
        spent / 60,
        minutes,
        state.get("steps", 0),
    )
    return True


def _compiled_model(out_dir, config, precision, xla, strategy, max_steps):
    """The compiled model in the strategy's scope, with the checkpoint's weights and optimizer
    state where the run has one; and its learning-rate schedule."""
    model_path = checkpoint.path(out_dir, checkpoint.MODEL_FILE)
    with strategy.scope():
        schedule = make_schedule(config, max_steps or config.warmup_steps * 10)
        model = compile_model(
            Transformer(config, dtype=PRECISIONS[precision]), config, xla=xla, schedule=schedule
        )
        if os.path.exists(model_path):
            model.optimizer.build(model.trainable_variables)
            checkpoint.restore(model, model_path)
    return model, schedule


def _resumed(model, schedule, out_dir, strategy, state, max_steps):
    """-> (steps already trained, the state that belongs to them). Every worker must have
    restored the same step; a budget schedule continues as it was (no second warm-up)."""
    done = steps_done(model)
    if done:  # the state that belongs to the restored model (see checkpoint.save)
        state = {"seconds": state.get("seconds", 0.0), **checkpoint.read_state(out_dir, steps=done)}
    if distributed.agree(strategy, done, "MEAN") != done:
        raise ValueError(
            f"the workers restored different steps from {checkpoint.path(out_dir, checkpoint.MODEL_FILE)}; "
            "it must be one file that every worker reads (shared storage)"
        )
    if not done:
        return done, state
    model_path = checkpoint.path(out_dir, checkpoint.MODEL_FILE)
    log.info("resuming %s from step %d (%.1f min trained)", model_path, done, float(state["seconds"]) / 60)
    if state.get("replicas", 1) != strategy.num_replicas_in_sync:
        log.info(
            "%d replicas now, %d before: the train split is divided among the workers anew, so the "
            "batches differ from those the interrupted run would have taken next",
            strategy.num_replicas_in_sync,
            state.get("replicas", 1),
        )
    if isinstance(schedule, BudgetSchedule) and max_steps is None and state.get("schedule"):
        schedule.set(state["schedule"]["warmup_steps"], state["schedule"]["total_steps"])
    return done, state


def _input_position(out_dir, state, done, plain):
    """-> (the InputPosition callback or None, batches to replay). Without a strategy, the batch
    stream's position is saved with each checkpoint and a resumed run restores it; with one (its
    iterator cannot be saved), or for a checkpoint saved without it, the stream is rebuilt from the
    start and the `done` batches already trained on are skipped (exact, but ~150 batches/s)."""
    saved = checkpoint.saved_input(out_dir, state) if done else None
    replay = 0 if not done or (plain and saved) else done
    if replay:
        log.info("rebuilding the %d batches already trained on to continue the same batch stream", replay)
    return (InputPosition(restore_from=saved) if plain else None), replay


def _log_schedule(schedule, config, max_steps):
    if isinstance(schedule, BudgetSchedule):
        sized = " for now: sized to the budget from the measured speed" if max_steps is None else ""
        log.info("learning rate: %s%s", schedule.describe(), sized)
    else:
        log.info("learning rate: the paper's schedule, %d warm-up steps", config.warmup_steps)


def _chief_callbacks(out_dir, budget, checkpoint_seconds, nan_guard, position):
    """The callbacks that write: checkpoints (with the input position; first), history.csv, TensorBoard."""
    logs_dir = checkpoint.path(out_dir, checkpoint.LOGS_DIR)
    os.makedirs(logs_dir, exist_ok=True)
    model_path = checkpoint.path(out_dir, checkpoint.MODEL_FILE)
    return [
        Checkpoint(model_path, budget, checkpoint_seconds, nan_guard, position),
        keras.callbacks.CSVLogger(os.path.join(logs_dir, "history.csv"), append=True),
        keras.callbacks.TensorBoard(logs_dir, write_graph=False),
    ]


def _fit_args(encoded, config, xla, seed, done, per_epoch, max_steps, callbacks, verbose, replay, strategy):
    """model.fit's arguments: the seeded batch stream (after `replay` batches skipped; each worker's
    own with a strategy), the dev split, and epochs counted from where the run stands (`done` steps)."""
    if strategy is None:
        train_ds = _train_dataset(encoded, config, xla, seed)
        train_ds = train_ds.skip(replay) if replay else train_ds
    else:
        train_ds = _worker_datasets(encoded, config, xla, seed, strategy, replay)
    dev_ds = (
        data_lib.make_dataset(encoded.dev, config, training=False, pad_to_bucket=xla)
        if len(encoded.dev)
        else None
    )
    # With only a time budget, epochs are capped at a number no budget here reaches (for the display).
    total_epochs = math.ceil(max_steps / per_epoch) if max_steps is not None else 1000
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
        verbose=verbose,
    )

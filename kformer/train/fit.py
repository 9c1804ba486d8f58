"""`train`: compile + fit, resumable, within a budget, in a few named steps.

The loss and metric are kformer.train.losses', the schedules kformer.train.schedules', the callbacks
kformer.train.callbacks', the precision choice kformer.train.precision's, the run directory's files
kformer.run_folder's.
"""

import dataclasses
import functools
import logging
import math
import os
import shutil

import keras

from kformer import folders, locks, run_folder
from kformer.data import batches as batches_lib
from kformer.data import corpus as corpus_lib
from kformer.data import prepare as prepare_lib
from kformer.data import shards as shards_lib
from kformer.data import tokenizer as tokenizer_lib
from kformer.model.config import (
    DEFAULT_CORPUS,
    DEFAULT_DIRECTION,
    DEFAULT_PRESET,
    PRECISIONS,
    TransformerConfig,
    preset,
    tokenizer_digest,
)
from kformer.model.transformer import Transformer
from kformer.train import distributed
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
from kformer.train.keep_best import Evaluation, KeepBest
from kformer.train.losses import LabelSmoothedCrossEntropy, MaskedAccuracy
from kformer.train.optimizer import FusedAdam
from kformer.train.precision import choose_precision, onednn_state
from kformer.train.schedules import BudgetSchedule, make_schedule

log = logging.getLogger("kformer")


def compile_model(model, config, xla=True, schedule=None, fused=True, steps_per_call=1):
    """Adam(0.9, 0.98, 1e-9) on `schedule` (default: the config's, sized for 10 x warmup_steps),
    label-smoothed loss, token accuracy; with `ema_momentum`, the optimizer keeps a moving average
    of the weights (see kformer.run_folder). `fused=False`: Keras' own Adam (same arithmetic).
    `steps_per_call`: Keras' steps_per_execution, the training steps one call of the train function
    runs (callbacks see every that many steps)."""
    schedule = schedule or make_schedule(config, config.warmup_steps * 10)
    options = dict(use_ema=True, ema_momentum=config.ema_momentum) if config.ema_momentum else {}
    if config.accumulate_steps > 1:
        options["gradient_accumulation_steps"] = config.accumulate_steps
    adam = FusedAdam if fused else keras.optimizers.Adam
    optimizer = adam(schedule, beta_1=0.9, beta_2=0.98, epsilon=1e-9, **options)
    model.compile(
        optimizer=optimizer,
        loss=LabelSmoothedCrossEntropy(config.label_smoothing, config.pad_id),
        metrics=[MaskedAccuracy(config.pad_id)],
        jit_compile=xla,
        steps_per_execution=steps_per_call,
    )
    return model


def _config(config_name, overrides, source, vocab_size, tokenizer_sha256):
    """A run's config: the preset's (default: DEFAULT_PRESET) with `overrides`, bound to its
    tokenizer; or, starting from a trained run (`source`), that run's with the fine-tuning recipe."""
    if source is not None:
        return init_from_lib.fine_tune_config(source, config_name, overrides)
    return preset(
        config_name or DEFAULT_PRESET, vocab_size=vocab_size, tokenizer_sha256=tokenizer_sha256, **overrides
    )


def _requested_config(out_dir, config_name, overrides, source):
    """The saved config when resuming (the one asked for must agree), or None for a new run."""
    saved_path = run_folder.path(out_dir, run_folder.CONFIG_FILE)
    if not os.path.exists(saved_path):
        return None
    init_from_lib.check_recorded(out_dir, source)
    saved = TransformerConfig.load(saved_path)
    requested = _config(config_name, overrides, source, saved.vocab_size, saved.tokenizer_sha256)
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
    config_name=None,
    data=DEFAULT_CORPUS,
    direction=None,
    vocab_size=TransformerConfig.vocab_size,
    overrides=None,
    init_from=None,
):
    """The run's corpus, prepared (kformer.data.prepare), and its tokenizer and config. A new run's
    corpus is prepared into a temporary sibling of `out_dir`, which `run_folder.create` moves in
    once training starts (so a failed start leaves no folder behind); a resumed run's is the one it
    recorded, after checking it is the corpus asked for; a prepared folder given as `data` is read
    where it is (its direction is the one it was prepared in). Writes nothing in `out_dir`.
    config_name: a preset (default DEFAULT_PRESET); direction: default DEFAULT_DIRECTION.
    init_from: a trained run to start from (kformer.train.init_from): its tokenizer encodes the corpus,
    its direction and model sizes are kept (a config or direction that differs is refused).
    Returns (config, tokenizer, prepared folder, corpus record)."""
    overrides = dict(overrides or {})
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ValueError(f"--out {out_dir} is a file, not a folder; choose a folder name")
    source = init_from_lib.open_source(init_from) if init_from else None
    if source is not None:
        init_from_lib.check_direction(source, direction)
    direction = source.direction if source else direction or DEFAULT_DIRECTION
    config = _requested_config(out_dir, config_name, overrides, source)
    if config is not None:
        folder, corpus = _recorded_corpus(out_dir, data, direction)
    elif prepare_lib.is_prepared(data):
        folder, corpus = os.path.abspath(data), _prepared_record(data)
    else:
        given = None if source is None else source.tokenizer_path
        folder = _prepare_beside(out_dir, data, direction, vocab_size, given)
        corpus = {**prepare_lib.load(folder)["corpus"], "prepared": run_folder.DATA_DIR}
    manifest = prepare_lib.load(folder)
    log.info("corpus: %s", prepare_lib.summary(manifest))
    tokenizer_path = (
        os.path.join(folder, prepare_lib.TOKENIZER)
        if config is None
        else run_folder.path(out_dir, run_folder.TOKENIZER_FILE)
    )
    tokenizer = tokenizer_lib.load_tokenizer(tokenizer_path)
    if config is None:
        if source is not None and tokenizer_digest(tokenizer) != source.tokenizer_sha256:
            raise ValueError(
                f"{folder} was prepared with another tokenizer than --init-from {source.run_dir}'s; "
                "give the corpus as a file, or prepare it with `kformer prepare --tokenizer RUN/tokenizer.model`"
            )
        config = _config(
            config_name, overrides, source, tokenizer.get_piece_size(), tokenizer_digest(tokenizer)
        )
        if source is not None:
            init_from_lib.report_coverage(manifest, source)
    config.check_tokenizer(tokenizer, tokenizer_path)
    if tokenizer_digest(tokenizer) != manifest["tokenizer"]["sha256"]:
        raise ValueError(f"{folder} was prepared with another tokenizer than {tokenizer_path}'s")
    return config, tokenizer, folder, corpus


def _prepared_record(folder):
    """What a run records of a prepared folder it trains on: the folder and its manifest's digest."""
    digest = corpus_lib.files_sha256([os.path.join(folder, prepare_lib.MANIFEST)])
    source = prepare_lib.load(folder)["corpus"]
    return {
        "data": os.path.abspath(folder),
        "direction": source["direction"],
        "sha256": digest,
        "prepared": os.path.abspath(folder),
    }


def _recorded_corpus(out_dir, data, direction):
    """(prepared folder, corpus record) of a resumed run, if `data` is the corpus it was trained on."""
    saved = run_folder.read_corpus(out_dir)
    requested = (
        _prepared_record(data) if prepare_lib.is_prepared(data) else corpus_lib.corpus_record(data, direction)
    )
    if (saved.get("sha256"), saved["direction"]) != (requested["sha256"], requested["direction"]):
        raise ValueError(
            f"{out_dir} was trained on {saved['data']} ({saved['direction']}), not on {data} "
            f"({direction}) as it is now; use a new --out directory."
        )
    return run_folder.prepared_folder(out_dir), saved


def _prepare_beside(out_dir, data, direction, vocab_size, tokenizer=None):
    """A new run's corpus prepared into a temporary sibling of `out_dir` (one of a killed start is
    removed first), encoded with `tokenizer` (a file) if given."""
    parent = os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    folders.remove_abandoned(parent, DATA_PREFIX)
    folder = os.path.join(parent, f"{DATA_PREFIX}{os.getpid()}-{os.path.basename(os.path.abspath(out_dir))}")
    shutil.rmtree(folder, ignore_errors=True)
    prepare_lib.prepare(data, folder, direction, vocab_size, lock=False, tokenizer=tokenizer)  # run's lock
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
    keep_best: object = None  # KeepBest, when the run evaluates a dev sample
    interrupt: object = None  # StopOnInterrupt, in a single-process run
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
            summary.update(best=best.best, evaluations=best.evaluations, evaluation_seconds=best.seconds)
        log.info(
            "%s after %d steps (%s)",
            "saved model.keras" if self.writes else "trained (the chief saves)",
            summary["steps"],
            summary["stopped"],
        )
        return summary


def stop_if_interrupted(summary):
    """Raises `Interrupted` (a command's exit status 130) if Ctrl-C stopped the run of `summary`."""
    if summary.get("stopped") == INTERRUPTED:
        raise distributed.Interrupted(
            f"stopped by Ctrl-C after step {summary['steps']} (saved model.keras); "
            "run the same command to resume"
        )


def train(out_dir, config_name=None, **options):
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
    config_name=None,
    data=DEFAULT_CORPUS,
    direction=None,
    minutes=None,
    steps=None,
    epochs=None,
    xla=None,
    precision="auto",
    batch_tokens=None,
    accumulate=None,
    seed=0,
    strategy=None,
    vocab_size=TransformerConfig.vocab_size,
    overrides=None,
    checkpoint_seconds=300,
    evaluation=None,
    init_from=None,
    callbacks=(),
    verbose="auto",
):
    """Prepares (or resumes) a run in `out_dir`: data, tokenizer, compiled model, callbacks.
    Training stops after `minutes` (in all, across resumes), `steps` (total) or `epochs` (total);
    with none given, after one epoch. `callbacks` are extra Keras callbacks, run before kformer's own.
    xla=None: `default_xla`.
    precision: "auto", "float32", "bfloat16" or "float16" (`choose_precision`; weights stay float32,
    so a run may resume in another precision, and it translates and exports in float32).
    accumulate: optimizer steps of batch_tokens tokens, each the average of the gradients of
    `accumulate` batches of batch_tokens / accumulate (the config's accumulate_steps).
    The run folder is locked (kformer.locks) from here until the returned run's `release()`; a
    second process on it is refused. `release()` also hands back SIGINT and SIGTERM, which the
    run's callbacks hold while it trains: call it after `fit`, whether `fit` returned or raised.
    evaluation: when the run translates a dev sample and keeps the best weights (kformer.train.keep_best).
    init_from: a trained run to start from, with its tokenizer, direction and model sizes and the
    fine-tuning recipe (kformer.train.init_from); the corpus is encoded with its tokenizer."""
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
    accumulate,
    seed,
    strategy,
    vocab_size,
    overrides,
    checkpoint_seconds,
    evaluation,
    init_from,
    callbacks,
    verbose,
):
    """`start` once the run folder is locked."""
    import tensorflow as tf

    if xla is None:
        xla = default_xla(strategy, minutes)
        if not xla and default_xla(strategy):
            log.info("XLA off: a %g-minute budget (it compiles each batch shape first; --xla)", minutes)
    if xla and strategy is not None:
        log.warning("XLA under a tf.distribute strategy: Keras' default turns it off there (--no-xla)")
    evaluation = evaluation or Evaluation()
    precision, why = choose_precision(precision)
    given = {"batch_tokens": batch_tokens, "accumulate_steps": accumulate}
    overrides = {**(overrides or {}), **{k: v for k, v in given.items() if v is not None}}
    with distributed.chief_first(strategy) as chief:  # only the chief writes the run directory
        _check_the_chief_started(out_dir, chief)
        keras.utils.set_random_seed(seed)
        config, tokenizer, folder, corpus = prepare(
            out_dir, config_name, data, direction, vocab_size, overrides, init_from
        )
        source = init_from_lib.open_source(init_from) if init_from else None
        fresh = not os.path.exists(run_folder.path(out_dir, run_folder.MODEL_FILE))  # no weights of its own
        try:
            initial = init_from_lib.trained_weights(source) if source is not None and fresh else None
            encoded = _encode(folder, tokenizer, config)
            _check_evaluation(evaluation, encoded, folder)
            per_epoch = _steps_per_epoch(encoded, config.micro_batches(), xla)  # batches, not updates
        except BaseException:
            if os.path.basename(folder).startswith(DATA_PREFIX):  # prepared for a start that failed
                shutil.rmtree(folder, ignore_errors=True)
            raise
        max_steps = _max_steps(steps, epochs, minutes, per_epoch / config.accumulate_steps)
        state = run_folder.read_state(out_dir)
        if _budget_spent(out_dir, minutes, state):
            return Training(None, config, tokenizer, {}, "budget already spent", state.get("steps", 0))
        if chief:  # training starts: the run's files appear now, its prepared corpus moves in
            if source is not None:  # before config.json, whose presence marks a run
                init_from_lib.record(out_dir, source)
            run_folder.create(out_dir, config, tokenizer, corpus, folder)
            encoded.folder = run_folder.prepared_folder(out_dir)
    plain = strategy is None  # fit's iterator is then a plain tf.data one, whose position can be saved
    strategy = strategy or tf.distribute.get_strategy()
    log.info("compute precision: %s (%s)", precision, why)
    model, schedule = _compiled_model(out_dir, config, precision, xla, strategy, max_steps)
    done, state = _resumed(model, schedule, out_dir, strategy, state, max_steps)
    if initial is not None and not done:
        init_from_lib.assign(model, initial, source)
    if max_steps is not None and done >= max_steps:
        log.info("already trained %d steps (asked for %d); nothing to do", done, max_steps)
        return Training(None, config, tokenizer, {}, "already done", done)
    _log_schedule(schedule, config, max_steps)
    budget = Budget(schedule, max_steps, minutes, float(state.get("seconds", 0.0)), strategy=strategy)
    nan_guard = StopOnNaN()
    position, replay = _input_position(out_dir, state, batches_done(model), plain)
    keep_best = _keep_best(out_dir, evaluation, encoded, tokenizer, corpus, chief, strategy, nan_guard)
    interrupt = StopOnInterrupt() if plain else None  # one process: no worker waits for this one
    optional = (position, keep_best, interrupt)
    callbacks = [*callbacks, budget, nan_guard, *(c for c in optional if c is not None)]
    # Other workers compute the same weights and logs, and write nothing.
    writers = _chief_callbacks(out_dir, budget, checkpoint_seconds, nan_guard, position) if chief else []
    callbacks += [*writers, StopOnSigterm(writers[0].save if writers else None)]
    fit_args = _fit_args(
        encoded,
        config.micro_batches(),
        xla,
        seed,
        batches_done(model),
        per_epoch,
        None if max_steps is None else max_steps * config.accumulate_steps,
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
        keep_best=keep_best,
        interrupt=interrupt,
        real_tokens_per_step=real / per_epoch * config.accumulate_steps,
        writes=chief,
        precision=precision,
    )


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
    config_path = run_folder.path(out_dir, run_folder.CONFIG_FILE)
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
    dev: batches_lib.EncodedPairs
    lengths: tuple
    dev_text: list  # the dev pairs as text (source, target)


def _encode(folder, tokenizer, config):
    """The prepared corpus for training; pairs over the max lengths are dropped, with a warning."""
    manifest = prepare_lib.load(folder)
    source, target, counts, dropped = shards_lib.prepared_lengths(manifest, config)
    dev_text = prepare_lib.held_out(folder, "dev")
    dev = batches_lib.encode_pairs(tokenizer, dev_text, config)
    for name, count in (("train", dropped), ("dev", dev.dropped_too_long)):
        if count:
            log.warning(
                "%s: dropped %d pairs longer than max lengths (%d source, %d target tokens)",
                name,
                count,
                config.max_source_length,
                config.max_target_length,
            )
    return _Corpus(folder, manifest, dev, (source, target, counts), dev_text)


def _keep_best(out_dir, evaluation, encoded, tokenizer, corpus, chief, strategy, nan_guard):
    """The KeepBest callback of a run that evaluates a dev sample, else None."""
    if not (evaluation.on and encoded.dev_text):
        return None
    language = corpus["direction"].split("-")[-1]
    return KeepBest(out_dir, evaluation, encoded.dev_text, tokenizer, language, chief, strategy, nan_guard)


def _check_evaluation(evaluation, encoded, folder):
    if evaluation.early_stop and not (evaluation.on and encoded.dev_text):
        why = "evaluations are off (--eval-minutes 0)" if encoded.dev_text else f"{folder} has no dev split"
        raise ValueError(f"--early-stop needs dev sample evaluations, but {why}")


def _steps_per_epoch(encoded, config, xla):
    per_epoch = shards_lib.prepared_steps_per_epoch(encoded.manifest, config, pad_to_bucket=xla)
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
    paths, num_shards, shard_index = shards_lib.worker_part(all_paths, workers, rank)
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
    if tokens <= shards_lib.IN_MEMORY_TOKENS:
        pairs = shards_lib.read_prepared(paths, dtype, config)
        return batches_lib.make_dataset(pairs, config, True, seed, num_shards, shard_index, pad_to_bucket=xla)
    log.info("streaming the train split from %d shards", len(paths))
    return shards_lib.stream_prepared(paths, dtype, config, seed, xla, num_shards, shard_index)


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
    """The run's total optimizer steps: as asked, from epochs (`per_epoch`: updates a pass makes),
    none for a time budget, else one epoch."""
    if steps is not None:
        return steps
    if epochs is not None:
        return math.ceil(epochs * per_epoch)
    return None if minutes is not None else math.ceil(per_epoch)


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
    model_path = run_folder.path(out_dir, run_folder.MODEL_FILE)
    with strategy.scope():
        schedule = make_schedule(config, max_steps or config.warmup_steps * 10)
        model = compile_model(
            Transformer(config, dtype=PRECISIONS[precision]), config, xla=xla, schedule=schedule
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
        state = {"seconds": state.get("seconds", 0.0), **run_folder.read_state(out_dir, steps=done)}
    if distributed.agree(strategy, done, "MEAN") != done:
        raise ValueError(
            f"the workers restored different steps from {run_folder.path(out_dir, run_folder.MODEL_FILE)}; "
            "it must be one file that every worker reads (shared storage)"
        )
    if not done:
        return done, state
    model_path = run_folder.path(out_dir, run_folder.MODEL_FILE)
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


def _log_schedule(schedule, config, max_steps):
    if isinstance(schedule, BudgetSchedule):
        sized = " for now: sized to the budget from the measured speed" if max_steps is None else ""
        log.info("learning rate: %s%s", schedule.describe(), sized)
    else:
        log.info("learning rate: the paper's schedule, %d warm-up steps", config.warmup_steps)


def _chief_callbacks(out_dir, budget, checkpoint_seconds, nan_guard, position):
    """The callbacks that write: checkpoints (with the input position; first), history.csv, TensorBoard."""
    logs_dir = run_folder.path(out_dir, run_folder.LOGS_DIR)
    os.makedirs(logs_dir, exist_ok=True)
    model_path = run_folder.path(out_dir, run_folder.MODEL_FILE)
    return [
        Checkpoint(model_path, budget, checkpoint_seconds, nan_guard, position),
        keras.callbacks.CSVLogger(os.path.join(logs_dir, "history.csv"), append=True),
        keras.callbacks.TensorBoard(logs_dir, write_graph=False),
    ]


def _fit_args(encoded, config, xla, seed, done, per_epoch, max_batches, callbacks, verbose, replay, strategy):
    """model.fit's arguments: the seeded batch stream (after `replay` batches skipped; each worker's
    own with a strategy), the dev split, and epochs counted from where the run stands (`done`
    batches; `config`, `per_epoch` and `max_batches` count batches, of which accumulation makes
    several an optimizer step)."""
    if strategy is None:
        train_ds = _train_dataset(encoded, config, xla, seed)
        train_ds = train_ds.skip(replay) if replay else train_ds
    else:
        train_ds = _worker_datasets(encoded, config, xla, seed, strategy, replay)
    dev_ds = (
        batches_lib.make_dataset(encoded.dev, config, training=False, pad_to_bucket=xla)
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
        verbose=verbose,
    )

"""Loss, learning-rate schedule, callbacks, and `train`: compile + fit with XLA, resumable.

A training directory holds: config.json, tokenizer.model, corpus.json (what data and split),
model.keras (weights + optimizer state, written atomically), logs/ (TensorBoard, history.csv).
"""

import json
import logging
import math
import os
import time

import keras
from keras import ops

from kformer import data as data_lib
from kformer.config import TransformerConfig, preset
from kformer.model import Transformer

log = logging.getLogger("kformer")

CONFIG_FILE, TOKENIZER_FILE, CORPUS_FILE, MODEL_FILE = "config.json", "tokenizer.model", "corpus.json", "model.keras"


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
        log_probs = ops.log_softmax(ops.cast(y_pred, "float32"), axis=-1)  # (B, T, V)
        y_true = ops.cast(y_true, "int32")
        nll = -ops.squeeze(ops.take_along_axis(log_probs, ops.expand_dims(y_true, -1), axis=-1), -1)  # (B, T)
        uniform = -ops.mean(log_probs, axis=-1)  # (B, T)
        per_token = (1.0 - self.smoothing) * nll + self.smoothing * uniform
        weights = ops.cast(ops.not_equal(y_true, self.pad_id), "float32")
        loss = ops.sum(per_token * weights) / ops.maximum(ops.sum(weights), 1.0)
        # Keras sums gradients over replicas and scales only its own mean reductions by
        # 1/replicas; this loss reduces itself, so it scales itself (Keras unscales it for logs).
        import tensorflow as tf
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
        # argmax is fine here: a training metric, never part of the exported decode graph (which uses top_k).
        hits = ops.cast(ops.equal(ops.cast(ops.argmax(y_pred, axis=-1), "int32"), y_true), "float32")
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


def compile_model(model, config, xla=True):
    optimizer = keras.optimizers.Adam(TransformerSchedule(config.d_model, config.warmup_steps),
                                      beta_1=0.9, beta_2=0.98, epsilon=1e-9)
    model.compile(optimizer=optimizer, loss=LabelSmoothedCrossEntropy(config.label_smoothing, config.pad_id),
                  metrics=[MaskedAccuracy(config.pad_id)], jit_compile=xla)
    return model


# --- callbacks ---

class StopAt(keras.callbacks.Callback):
    """Stops cleanly after `max_steps` optimizer steps in total or `minutes` of this run's wall time."""

    def __init__(self, max_steps=None, minutes=None):
        super().__init__()
        self.max_steps, self.seconds = max_steps, None if minutes is None else minutes * 60.0
        self.reason = None

    def on_train_begin(self, logs=None):
        self.start = time.monotonic()

    def on_train_batch_end(self, batch, logs=None):
        if self.max_steps is not None and int(self.model.optimizer.iterations) >= self.max_steps:
            self.reason, self.model.stop_training = f"reached {self.max_steps} steps", True
        elif self.seconds is not None and time.monotonic() - self.start >= self.seconds:
            self.reason, self.model.stop_training = f"time budget of {self.seconds / 60:g} min used", True


class StopOnNaN(keras.callbacks.Callback):
    """Stops at the first non-finite loss; the last good checkpoint is kept, not overwritten."""

    def __init__(self):
        super().__init__()
        self.failed_at = None

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            self.failed_at = int(self.model.optimizer.iterations)
            self.model.stop_training = True


class Checkpoint(keras.callbacks.Callback):
    """Saves model.keras (weights + optimizer state) every `every_seconds` and at the end of
    each epoch, atomically (write then rename), so a kill loses at most that much progress."""

    def __init__(self, path, every_seconds=300, nan_guard=None):
        super().__init__()
        self.path, self.every_seconds, self.nan_guard = path, every_seconds, nan_guard
        self.last = time.monotonic()

    def save(self):
        if self.nan_guard is not None and self.nan_guard.failed_at is not None:
            return
        save_model(self.model, self.path)
        self.last = time.monotonic()

    def on_train_batch_end(self, batch, logs=None):
        if time.monotonic() - self.last >= self.every_seconds:
            self.save()

    def on_epoch_end(self, epoch, logs=None):
        self.save()


def save_model(model, path):
    tmp = path[: -len(".keras")] + ".tmp.keras"
    model.save(tmp)
    os.replace(tmp, path)


# --- the training run ---

def load_model(out_dir):
    """Loads a trained Transformer, its config and tokenizer from a training directory
    (safe mode on; the config and tokenizer are checked against the weights)."""
    config_path, model_path = os.path.join(out_dir, CONFIG_FILE), os.path.join(out_dir, MODEL_FILE)
    for path in (config_path, model_path):
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path} not found: is {out_dir} a kformer training directory?")
    config = TransformerConfig.load(config_path)
    tokenizer = data_lib.load_tokenizer(os.path.join(out_dir, TOKENIZER_FILE))
    data_lib.check_tokenizer(tokenizer, config, os.path.join(out_dir, TOKENIZER_FILE))
    model = Transformer(config)
    restore_weights(model, model_path)
    return model, config, tokenizer


def restore_weights(model, path):
    """Loads weights (and optimizer state, if compiled) from a .keras file with a clear error."""
    try:
        model.load_weights(path)
    except Exception as e:  # h5py/zip/shape errors all mean the same to a user
        raise ValueError(f"{path}: cannot restore the model from this checkpoint ({type(e).__name__}: {e}). "
                         "It is corrupted or belongs to another config; nothing was overwritten.") from None


def _requested_config(out_dir, config_name, overrides):
    """The config of a new run, or the saved one when resuming (which must agree)."""
    saved_path = os.path.join(out_dir, CONFIG_FILE)
    if not os.path.exists(saved_path):
        return None
    saved = TransformerConfig.load(saved_path)
    requested = preset(config_name, vocab_size=saved.vocab_size, **overrides)
    if requested != saved:
        diff = {k: (v, requested.to_dict()[k]) for k, v in saved.to_dict().items() if requested.to_dict()[k] != v}
        raise ValueError(f"{out_dir} holds a run with another config (saved vs requested: {diff}); "
                         "use a new --out directory. Nothing was overwritten.")
    return saved


def prepare(out_dir, config_name="small", data="default", direction="zh-en", vocab_size=8000, overrides=None):
    """Reads and splits the corpus; trains (or reuses) the tokenizer; writes config.json.
    Returns (config, tokenizer, splits)."""
    overrides = dict(overrides or {})
    os.makedirs(out_dir, exist_ok=True)
    config = _requested_config(out_dir, config_name, overrides)
    corpus_path = os.path.join(out_dir, CORPUS_FILE)
    corpus = {"data": list(data) if isinstance(data, tuple) else data, "direction": direction}  # as JSON stores it
    if config is not None and os.path.exists(corpus_path):
        with open(corpus_path, encoding="utf-8") as f:
            saved_corpus = json.load(f)
        if saved_corpus != corpus:
            raise ValueError(f"{out_dir} was trained on {saved_corpus}, not {corpus}; use a new --out directory.")

    pairs, report = data_lib.read_corpus(data, direction)
    log.info("corpus: %s", report.summary())
    splits = data_lib.split_pairs(pairs)
    log.info("split by source sentence: %s", {k: len(v) for k, v in splits.items()})

    tokenizer_path = os.path.join(out_dir, TOKENIZER_FILE)
    if config is None:
        log.info("training a joint SentencePiece tokenizer (%d pieces) on the train split", vocab_size)
        texts = [text for pair in splits["train"] for text in pair]
        tokenizer = data_lib.train_tokenizer(texts, tokenizer_path, vocab_size)
        config = preset(config_name, vocab_size=tokenizer.get_piece_size(), **overrides)
        config.save(os.path.join(out_dir, CONFIG_FILE))
        with open(corpus_path, "w", encoding="utf-8") as f:
            json.dump(corpus, f, indent=2)
    else:
        tokenizer = data_lib.load_tokenizer(tokenizer_path)
    data_lib.check_tokenizer(tokenizer, config, tokenizer_path)
    return config, tokenizer, splits


def train(out_dir, config_name="small", data="default", direction="zh-en", minutes=None, steps=None, epochs=None,
          xla=True, mixed_precision=False, batch_tokens=None, seed=0, strategy=None, vocab_size=8000,
          overrides=None, checkpoint_seconds=300, callbacks=(), verbose="auto"):
    """Trains (or resumes) a model in `out_dir`. Stops after `minutes`, `steps` (total) or
    `epochs` (total), whichever comes first; with none given, trains for one epoch.
    `callbacks` are extra Keras callbacks, run before kformer's own.
    Returns a summary dict (steps, loss, token accuracy, why it stopped)."""
    import tensorflow as tf

    overrides = dict(overrides or {})
    if batch_tokens is not None:
        overrides["batch_tokens"] = batch_tokens
    keras.utils.set_random_seed(seed)
    config, tokenizer, splits = prepare(out_dir, config_name, data, direction, vocab_size, overrides)

    encoded = {name: data_lib.encode_pairs(tokenizer, pairs, config) for name, pairs in splits.items()}
    for name, split in encoded.items():
        if split.dropped_too_long:
            log.warning("%s: dropped %d pairs longer than max lengths (%d source, %d target tokens)",
                        name, split.dropped_too_long, config.max_source_length, config.max_target_length)
    per_epoch = data_lib.steps_per_epoch(encoded["train"], config)
    if per_epoch < 1:
        raise ValueError(f"the train split ({len(encoded['train'])} pairs) fills no batch of "
                         f"batch_tokens={config.batch_tokens}; lower --batch-tokens")
    train_ds = data_lib.make_dataset(encoded["train"], config, training=True, seed=seed)
    dev_ds = data_lib.make_dataset(encoded["dev"], config, training=False) if len(encoded["dev"]) else None

    strategy = strategy or tf.distribute.get_strategy()
    dtype = "mixed_float16" if mixed_precision else None
    with strategy.scope():
        model = compile_model(Transformer(config, dtype=dtype), config, xla=xla)
        model_path = os.path.join(out_dir, MODEL_FILE)
        if os.path.exists(model_path):
            model.optimizer.build(model.trainable_variables)
            restore_weights(model, model_path)
    done = int(model.optimizer.iterations)
    if done:
        log.info("resuming %s from step %d", model_path, done)

    max_steps = steps if steps is not None else (epochs * per_epoch if epochs is not None else
                                                 None if minutes is not None else per_epoch)
    # With only a time budget, epochs are capped at a number no budget here reaches (for the display).
    total_epochs = math.ceil(max_steps / per_epoch) if max_steps is not None else 1000
    if max_steps is not None and done >= max_steps:
        log.info("already trained %d steps (asked for %d); nothing to do", done, max_steps)
        return {"steps": done, "stopped": "already done"}

    stop, nan_guard = StopAt(max_steps, minutes), StopOnNaN()
    logs_dir = os.path.join(out_dir, "logs")
    os.makedirs(logs_dir, exist_ok=True)
    callbacks = [*callbacks, stop, nan_guard, Checkpoint(model_path, checkpoint_seconds, nan_guard),
                 keras.callbacks.CSVLogger(os.path.join(logs_dir, "history.csv"), append=True),
                 keras.callbacks.TensorBoard(logs_dir, write_graph=False)]
    # validation_steps: a finite dev set without it makes Keras warn "ran out of data" each epoch.
    dev_steps = None if dev_ds is None else sum(1 for _ in dev_ds)
    history = model.fit(train_ds, validation_data=dev_ds, validation_steps=dev_steps, epochs=total_epochs,
                        initial_epoch=done // per_epoch, steps_per_epoch=per_epoch, shuffle=False,
                        callbacks=callbacks, verbose=verbose)

    if nan_guard.failed_at is not None:
        raise FloatingPointError(f"loss became NaN/inf at step {nan_guard.failed_at}; training stopped and "
                                 f"{model_path} keeps the last good checkpoint. Try a lower learning rate "
                                 "(more --warmup) or disable --mixed-precision.")
    save_model(model, model_path)
    summary = {"steps": int(model.optimizer.iterations), "stopped": stop.reason or "finished",
               **{k: float(v[-1]) for k, v in history.history.items()}}
    log.info("saved %s after %d steps (%s)", model_path, summary["steps"], summary["stopped"])
    return summary

"""Keeping the best weights: every so often during training, translate a bounded sample of the dev
split (greedy, batched, in graph mode) with the weights the run would translate with (averaged,
float32), score it (BLEU, chrF) and the whole dev split's loss, and keep the weights that score
best by the run's judge (kformer.train.judge) beside the latest (run_folder.BEST_WEIGHTS_FILE,
with run_folder.BEST_FILE). With `patience`, training stops after that
many evaluations without a gain (early stopping). Evaluations take wall time, so the time budget
counts them, and the budget's speed estimate (hence the schedule) includes them.

A fine-tuning run (kformer.train.init_from) also scores the dev sample of the run it started
from, before its first step and at each evaluation: what it gained on the new corpus and what it
lost on the original are logged, and summarized at the end (`KeepBest.changes`).
"""

import csv
import dataclasses
import logging
import os
import time

import keras

from kformer import evaluate as evaluate_lib
from kformer import run_folder
from kformer.contracts.run import (
    BEST_FILE,
    BEST_WEIGHTS_FILE,
    LOGS_DIR,
    MODEL_FILE,
    BestRecord,
    describe_score,
)
from kformer.train import distributed
from kformer.train import judge as judge_lib
from kformer.train.callbacks import steps_done

log = logging.getLogger("kformer")

EVALUATIONS_FILE = "evaluations.csv"  # in the run's logs/
LOSS_BATCH_TOKENS = 8192  # a batch of the dev loss: the memory of a training batch or less


class KeepBest(keras.callbacks.Callback):
    """Evaluates as `evaluation` (an `Evaluation`) says, and once
    more at the end of training if it evaluated before (not after a NaN); keeps the best weights (`writes`: this
    process writes them; with several workers every worker evaluates, so that all stop together).
    `dev_pairs`: {name: (source, target) pairs}, the first the sample the best is kept by (with
    several, the others are scored beside it from the start; see the module's docstring).
    `reason` says why it stopped training, if it did."""

    def __init__(
        self, run_dir, evaluation, dev_pairs, tokenizer, language, writes=True, strategy=None, nan_guard=None
    ):
        super().__init__()
        self.run_dir = run_dir
        self.samples = {}  # name -> (sources, references), as `kformer evaluate` scores them
        for name, pairs in dev_pairs.items():
            sources, references = evaluate_lib.group_references(pairs)
            self.samples[name] = sources[: evaluation.sentences], references[: evaluation.sentences]
        self.sources, self.references = next(iter(self.samples.values()))
        self.dev_pairs = next(iter(dev_pairs.values()))  # all of them: the loss is scored on each
        self.judge = evaluation.judge or judge_lib.BLEU
        self.dev_batches = None  # of `dev_pairs`, built at the first evaluation (the model's config)
        self.start_scores, self.last_scores = None, None  # {name: scores} before the first step, latest
        self.tokenizer, self.language, self.writes, self.strategy = tokenizer, language, writes, strategy
        self.nan_guard = nan_guard  # StopOnNaN: no evaluation of weights that went non-finite
        self.every_seconds = None if evaluation.steps else evaluation.minutes * 60
        self.every_steps, self.patience = evaluation.steps, evaluation.early_stop
        self.reason, self.seconds, self.evaluations = None, 0.0, 0
        best_path = run_folder.path(run_dir, BEST_FILE)
        self.best = BestRecord.load(best_path) if os.path.exists(best_path) else None  # a resumed run's
        if self.best is not None and self.best.judge != self.judge:
            log.warning(
                "%s was kept by %s, this run keeps the best by %s: its next evaluation starts anew",
                BEST_FILE,
                self.best.judge,
                self.judge,
            )
        self.translator, self.summaries = None, None  # built at the first evaluation

    def on_train_begin(self, logs=None):
        # Time counts from the end of the first step, whose tracing and compiling would otherwise
        # bring a short run's first evaluation forward to step 1.
        self.evaluated_step = steps_done(self.model)
        if len(self.samples) > 1 and self.evaluated_step == 0:  # what fine-tuning starts from
            self.evaluate(0)
            self.start_scores = self.last_scores
        self.last_time = None

    def on_train_batch_end(self, batch, logs=None):
        step = steps_done(self.model)
        if step == self.evaluated_step:  # no update since (gradient accumulation)
            return
        if self.last_time is None:
            self.last_time = time.monotonic()
        due = (
            step % self.every_steps == 0
            if self.every_steps
            else time.monotonic() - self.last_time >= self.every_seconds
        )
        if distributed.agree(self.strategy, due) > 0:
            self.evaluate(step)

    def on_train_end(self, logs=None):
        step = steps_done(self.model)
        failed = self.nan_guard is not None and self.nan_guard.failed_at is not None
        if self.evaluations and step != self.evaluated_step and not failed:
            self.evaluate(step)

    def evaluate(self, step):
        """Scores the dev sample at `step`, keeps the weights if they are the best so far."""
        start = time.monotonic()
        translator = self._translator_of_current_weights()
        self.last_scores = {
            name: evaluate_lib.score(translator.translate(sources), references, self.language)
            for name, (sources, references) in self.samples.items()
        }
        scores = next(iter(self.last_scores.values()))
        scores["loss"] = judge_lib.mean_token_loss(translator.translator.model, self._dev_batches())
        gained = judge_lib.beats(self.judge, scores, self.best)
        since = 0 if gained else self.best.evaluations_since + 1
        if gained:
            self.best = BestRecord(
                step, scores["bleu"], scores["chrf"], loss=scores["loss"], judge=self.judge
            )
        self.best = dataclasses.replace(self.best, evaluations_since=since, sentences=len(self.sources))
        seconds = time.monotonic() - start
        self.evaluations, self.seconds, self.evaluated_step = (
            self.evaluations + 1,
            self.seconds + seconds,
            step,
        )
        if self.writes:
            self._write(step, gained, seconds, translator.translator.model)
        others = "".join(f"; {name} BLEU {s['bleu']:.2f}" for name, s in list(self.last_scores.items())[1:])
        log.info(
            "step %d: dev sample BLEU %.2f chrF %.2f (%d sentences), dev loss %.4f (%d pairs)%s; %.1f s%s",
            step,
            scores["bleu"],
            scores["chrf"],
            len(self.sources),
            scores["loss"],
            len(self.dev_pairs),
            others,
            seconds,
            f" - the best by {self.judge} so far, kept"
            if gained
            else f"; best: step {self.best.step}, {self.best.describe()}",
        )
        if self.patience and since >= self.patience:
            self.reason = f"no dev {self.judge} gain in {since} evaluations (--early-stop {self.patience})"
            self.model.stop_training = True
        self.last_time = time.monotonic()

    def changes(self):
        """{sample name: {"start": BLEU, "end": BLEU}} from before the first step to the last
        evaluation, for a run that scored several samples from its start; else {}."""
        if not self.start_scores or not self.last_scores:
            return {}
        return {
            name: {"start": self.start_scores[name]["bleu"], "end": self.last_scores[name]["bleu"]}
            for name in self.samples
        }

    def log_what_is_kept(self, run_seconds):
        """The run's last words on its evaluations: what they cost, which weights readers take and
        why; a warning, in words, where a fine-tune kept the weights it started from."""
        log.info(
            "%d evaluations of the dev sample took %.0f s (%.0f%% of the run)",
            self.evaluations,
            self.seconds,
            100 * self.seconds / max(run_seconds, 1e-9),
        )
        # A fine-tune whose best is the weights it started from: no later evaluation beat them.
        if self.start_scores is not None and self.best is not None and self.best.step == 0:
            last = next(iter(self.last_scores.values()))
            log.warning(
                "%s holds the weights this run started from: none of its %d later evaluations beat "
                "step 0's %s (%d sentences; the last: %s). translate, evaluate and export take it by "
                "default; what the run learned is in %s: pass --weights last",
                BEST_WEIGHTS_FILE,
                self.evaluations - 1,
                self.best.describe(),
                self.best.sentences,
                describe_score(self.judge, last["bleu"], last["loss"]),
                MODEL_FILE,
            )
        else:
            log.info(
                "readers take %s: the best by %s of %d evaluations",
                run_folder.describe_weights(self.run_dir, run_folder.weights_file(self.run_dir)),
                "the whole dev split's loss" if self.judge == judge_lib.LOSS else "dev sample BLEU",
                self.evaluations,
            )

    def _dev_batches(self):
        """The dev pairs the loss is scored on, batched as the model's config cuts them (built once)."""
        from kformer.data import batches as batches_lib

        if self.dev_batches is None:
            batching = batches_lib.Batching.of(self.model.config, LOSS_BATCH_TOKENS)
            encoded = batches_lib.encode_pairs(self.tokenizer, self.dev_pairs, batching)
            self.dev_batches = batches_lib.make_dataset(
                encoded, batching, training=False, pad_to_bucket=False
            )
        return self.dev_batches

    def _translator_of_current_weights(self):
        """A greedy KerasRunner on a float32 copy of the model holding the weights a reader would
        load (the moving average, where the run keeps one): built once, refreshed each time."""
        from kformer.decode.options import SearchOptions
        from kformer.decode.runner import RunnerSettings
        from kformer.decode.translator import KerasRunner
        from kformer.model.transformer import Transformer

        if self.translator is None:
            copy = Transformer(self.model.config)  # float32 whatever the training precision
            greedy, settings = SearchOptions(beam_size=1), RunnerSettings(batch_size=64)
            self.translator = KerasRunner(copy, self.tokenizer, greedy, settings, self.language)
        copy = self.translator.translator.model
        run_folder.swap_average(self.model)
        try:
            run_folder.assign_weights(copy, {v.path: v.value for v in self.model.weights})
        finally:
            run_folder.swap_average(self.model)
        return self.translator

    def _write(self, step, gained, seconds, weights_model):
        if gained:
            best_path = run_folder.path(self.run_dir, BEST_WEIGHTS_FILE)
            tmp = best_path[: -len(".weights.h5")] + ".tmp.weights.h5"
            weights_model.save_weights(tmp)
            os.replace(tmp, best_path)
        self.best.save(run_folder.path(self.run_dir, BEST_FILE))
        logs = run_folder.path(self.run_dir, LOGS_DIR)
        history = os.path.join(logs, EVALUATIONS_FILE)
        new = not os.path.exists(history)
        prefixes = ["", *(f"{name}_" for name in list(self.samples)[1:])]  # the kept-by sample's unprefixed
        scores = dict(zip(prefixes, self.last_scores.values()))
        with open(history, "a", newline="") as f:
            writer = csv.writer(f)
            if new:
                metrics = [f"{prefix}{metric}" for prefix in prefixes for metric in ("bleu", "chrf")]
                writer.writerow(["step", *metrics, "sentences", "seconds", "best", "loss"])
            values = [f"{s[metric]:.3f}" for s in scores.values() for metric in ("bleu", "chrf")]
            loss = f"{self.last_scores[next(iter(self.samples))]['loss']:.5f}"
            writer.writerow([step, *values, len(self.sources), f"{seconds:.2f}", gained, loss])
        import tensorflow as tf

        if self.summaries is None:  # one events file for the run's evaluations
            self.summaries = tf.summary.create_file_writer(os.path.join(logs, "dev_sample"))
        with self.summaries.as_default():
            for prefix, s in scores.items():
                tf.summary.scalar(f"{prefix}bleu", s["bleu"], step=step)
                tf.summary.scalar(f"{prefix}chrf", s["chrf"], step=step)
        self.summaries.flush()  # one evaluation every few minutes: readable in TensorBoard at once

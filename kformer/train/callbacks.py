"""Keras callbacks of a training run: the budget (steps or minutes), the NaN guard, the checkpoints,
the stops on signals."""

import collections
import logging
import math
import os
import signal
import statistics
import tempfile
import threading
import time
import uuid

import keras
from keras import ops

from kformer import run_folder
from kformer.contracts.run import TrainingState
from kformer.train import distributed
from kformer.train.distributed import Preempted
from kformer.train.schedules import BudgetSchedule, budget_warmup

log = logging.getLogger("kformer")


def steps_done(model):
    """The optimizer's step count (`int(variable)` fails on a multi-worker MirroredVariable)."""
    return int(ops.convert_to_numpy(model.optimizer.iterations))


def batches_done(model):
    """The batches trained on: `steps_done` times the gradient accumulation steps, plus those of an
    update in progress (Keras counts them in the optimizer's private `_iterations`)."""
    return int(ops.convert_to_numpy(model.optimizer._iterations))


class Budget(keras.callbacks.Callback):
    """Stops cleanly after `max_steps` optimizer steps in total or when the time budget is spent
    (`minutes` in all, of which `spent_seconds` were used by earlier runs of this directory).

    With a time budget and a `BudgetSchedule`, the steps the rest of the budget allows are
    re-estimated every `every` steps from the speed measured in this run (the first step, which
    compiles, is not counted), so warm-up and decay fit the budget whatever the machine's speed.
    Later compile stalls (XLA compiles each new bucket shape when it first comes, seconds on a
    GPU whose steps take milliseconds) are left out of the speed too: a step that took more than
    STALL_FACTOR times the median of the recent ones counts as that median.

    With several workers (`strategy`), every time decision is agreed on (the first clock to run
    out stops all, the schedule is sized from the mean estimate), so the workers stop at the same
    step and train on the same learning rate.
    """

    STALL_FACTOR = 5
    RECENT = 50  # step times the median is taken over

    def __init__(
        self, schedule, max_steps=None, minutes=None, spent_seconds=0.0, every=25, strategy=None, recipe=None
    ):
        super().__init__()
        self.schedule, self.max_steps, self.every, self.strategy = schedule, max_steps, every, strategy
        self.recipe = recipe  # the TrainingRecipe whose rule sizes the warm-up
        self.seconds = None if minutes is None else minutes * 60.0
        self.spent_seconds = spent_seconds
        self.reason = None

    def on_train_begin(self, logs=None):
        self.start = time.monotonic()
        self.first = None  # (step, time) after the first step of this run
        self.last, self.recent, self.stalled = None, collections.deque(maxlen=self.RECENT), 0.0

    def elapsed(self):
        return self.spent_seconds + time.monotonic() - self.start

    def steps_per_second(self):
        """Speed of this run after its first step (which traces/compiles), compile stalls left out."""
        if self.first is None:
            return float("nan")
        seconds = time.monotonic() - self.first[1] - self.stalled
        return (steps_done(self.model) - self.first[0]) / max(seconds, 1e-9)

    def _note_step_time(self, now):
        """Counts the excess of a step far slower than the recent median as stalled seconds."""
        if self.last is not None:
            seconds = now - self.last
            if len(self.recent) >= 10:
                typical = statistics.median(self.recent)
                if seconds > self.STALL_FACTOR * typical:
                    self.stalled += seconds - typical
                    seconds = typical
            self.recent.append(seconds)
        self.last = now

    def on_train_batch_end(self, batch, logs=None):
        step = steps_done(self.model)  # with gradient accumulation, several batches end one step
        self._note_step_time(time.monotonic())  # from the second batch on: the first compiles
        if self.first is None:
            self.first, self.estimated_at = (step, time.monotonic()), step
        elif (
            self.seconds is not None
            and (step - self.first[0]) % self.every == 0
            and step != self.estimated_at
        ):
            self.estimated_at = step
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
        warmup = schedule.steps()[0]
        first_estimate = step - self.first[0] == self.every
        if first_estimate and step < warmup and self.recipe is not None:  # size the warm-up too
            warmup = budget_warmup(self.recipe, total)
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


class InputPosition(keras.callbacks.Callback):
    """Knows the iterator `fit` reads its batches from, so that `Checkpoint` saves its position with
    the weights, and sets a resumed run's new iterator to the saved position (`restore_from`) before
    the first step: the run continues the batch stream exactly where the checkpoint left it, in
    seconds at any step, instead of rebuilding every batch already trained on. It wraps
    `model.train_function`, which Keras calls with that iterator. Only for fit without a
    tf.distribute strategy, whose iterator is a plain tf.data one that tf.train.Checkpoint saves."""

    def __init__(self, restore_from=None):
        super().__init__()
        self.iterator, self.restore_from = None, restore_from

    def on_train_begin(self, logs=None):
        self.train_function = train_function = self.model.train_function

        def recording(iterator):
            if iterator is not self.iterator:
                self.iterator = iterator
                if self.restore_from is not None:
                    run_folder.restore_input(iterator, self.restore_from)
                    self.restore_from = None
            return train_function(iterator)

        self.model.train_function = recording

    def on_train_end(self, logs=None):
        self.model.train_function = self.train_function


class Checkpoint(keras.callbacks.Callback):
    """Saves model.keras (weights + optimizer state) and training.json every `every_seconds` and
    at the end of the last epoch (also a cut-short one), atomically, so a kill loses at most that
    much progress; with `position` (an `InputPosition`), the input stream's position too. Runs
    before Keras' end-of-fit averaging, so the raw weights are kept.

    Not at every epoch's end: on a GPU an epoch of a small corpus takes seconds, and so does a
    save of a large model and its input position, which would then take most of the run."""

    def __init__(self, path, budget, every_seconds=300, nan_guard=None, position=None):
        super().__init__()
        self.path, self.budget, self.every_seconds, self.nan_guard = path, budget, every_seconds, nan_guard
        self.position = position
        self.last = time.monotonic()

    def save(self):
        if self.nan_guard is not None and self.nan_guard.failed_at is not None:
            return
        state = TrainingState(
            steps=steps_done(self.model),
            seconds=self.budget.elapsed(),
            schedule=self.budget.schedule.get_config(),
            replicas=self.model.distribute_strategy.num_replicas_in_sync,
        )
        iterator = None if self.position is None else self.position.iterator
        run_folder.save(self.model, self.path, state, input_iterator=iterator)
        self.last = time.monotonic()

    def on_train_batch_end(self, batch, logs=None):
        if time.monotonic() - self.last >= self.every_seconds:
            self.save()

    def on_epoch_end(self, epoch, logs=None):
        last = self.model.stop_training or epoch + 1 >= self.params.get("epochs", epoch + 1)
        if last or time.monotonic() - self.last >= self.every_seconds:
            self.save()


INTERRUPTED = "interrupted by Ctrl-C"  # a summary's "stopped" after StopOnInterrupt stopped it


class StopOnInterrupt(keras.callbacks.Callback):
    """Makes the first Ctrl-C (SIGINT: a terminal's, or a notebook's interrupt button) of a
    single-process run stop training after the current step, as a spent budget does: `Checkpoint`
    saves the run, `reason` says why it stopped, and the same command resumes. A second Ctrl-C
    interrupts at once, as Python's default does. Only without a strategy: another worker would
    wait for this one in the step's all-reduce (the stop that workers agree on is SIGTERM's,
    `StopOnSigterm`); and only in the main thread, where a handler can be set."""

    def __init__(self):
        super().__init__()
        self.reason, self.requested, self.default = None, False, None

    def on_train_begin(self, logs=None):
        if threading.current_thread() is threading.main_thread():
            previous = signal.signal(signal.SIGINT, self._request)
            # None: a handler set outside Python, which cannot be put back; Python's own then.
            self.default = signal.default_int_handler if previous is None else previous

    def _request(self, signum, frame):
        self.requested = True
        self.release()  # the next Ctrl-C: the default KeyboardInterrupt
        log.warning("Ctrl-C: stopping after this step and saving the run (Ctrl-C again: stop now, unsaved)")

    def on_train_batch_end(self, batch, logs=None):
        if self.requested:
            self.reason, self.model.stop_training = INTERRUPTED, True

    def on_train_end(self, logs=None):
        self.release()

    def release(self):
        """Hands SIGINT back; also for a fit that raised, which calls no on_train_end (see
        `kformer.train.fit.start`). Does nothing the second time."""
        if self.default is not None:
            signal.signal(signal.SIGINT, self.default)
            self.default = None


class StopOnSigterm(keras.callbacks.Callback):
    """Makes SIGTERM, what a preemptible VM, Kubernetes or a batch scheduler sends before it stops a
    machine, save the run and stop training (raising `Preempted`) after the current step, instead of
    losing the work since the last checkpoint. The save is `save` (the chief's `Checkpoint.save`;
    None on other workers).

    TensorFlow's PreemptionCheckpointHandler does the agreeing: the worker that got the signal
    tells the others through the cluster's coordination service, and all stop after the same step
    (a worker a step ahead would wait forever in that step's all-reduce); no collective is added to
    the steps. It is built for tf.train.Checkpoint and custom training loops: here its save and
    exit are kformer's, and its own checkpoint manager, which only looks for a checkpoint to
    restore, is given a folder that is never made (so even a killed process leaves nothing behind).
    As TensorFlow does, on a GCP VM it watches GCP's maintenance notices instead of SIGTERM on a
    GPU VM, and does nothing on a CPU VM."""

    def __init__(self, save=None):
        super().__init__()
        self.save, self.handler, self.default = save, None, None

    def on_train_begin(self, logs=None):
        import tensorflow as tf

        unused = os.path.join(tempfile.gettempdir(), f"kformer-preemption-{uuid.uuid4().hex}")
        self.default = signal.getsignal(signal.SIGTERM)
        self.handler = tf.distribute.experimental.PreemptionCheckpointHandler(
            getattr(self.model.distribute_strategy, "cluster_resolver", None),
            tf.train.CheckpointManager(tf.train.Checkpoint(), unused, max_to_keep=1),
            termination_config=tf.distribute.experimental.TerminationConfig(
                exit_fn=self._stop, save_fn=self.save or (lambda: None)
            ),
        )

    def on_train_batch_end(self, batch, logs=None):
        self.handler.save_checkpoint_if_preempted()  # saves and calls _stop at the agreed step

    def on_train_end(self, logs=None):
        self.release()
        # What the handler's __del__ does; its watcher thread holds it, so __del__ would wait for
        # the process's end. A no-op for a single process. Not in `release`: after a preemption the
        # other workers may still be agreeing through the keys this sets.
        self.handler._stop_cluster_wise_termination_watcher_thread()

    def _stop(self):
        self.release()
        saved = "the chief saved it" if self.save is None else "saved model.keras"
        raise Preempted(
            f"stopped by SIGTERM after step {steps_done(self.model)} ({saved}); "
            "run the same command to resume"
        )

    def release(self):
        """Hands SIGTERM back; also for a fit that raised, which calls no on_train_end (see
        `kformer.train.fit.start`). Does nothing the second time."""
        if self.default is not None:
            signal.signal(signal.SIGTERM, self.default)
            self.default = None

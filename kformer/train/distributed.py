"""Data-parallel training on tf.distribute: choosing the strategy, and what several workers must agree on.

`multi-worker` is TensorFlow's MultiWorkerMirroredStrategy, configured the standard way by the
TF_CONFIG environment variable: every worker runs the same command, TF_CONFIG alone says who is who.
Each worker reads only its own shards of the prepared train split (`data.worker_part`) into batches
of batch_tokens / replicas tokens, and the replicas' gradients are averaged: a step trains on about
batch_tokens tokens whatever the number of workers. The run directory must be on storage every
worker can read; only the chief writes to it. SIGTERM on any worker makes all of them stop after the
same step, the chief saving it (`callbacks.StopOnSigterm`).
"""

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys

log = logging.getLogger("kformer")

STRATEGIES = ("default", "mirrored", "multi-worker")
CONNECT_TIMEOUT_SECONDS = 300.0


_WATCHDOG = """
import os, select, signal, sys
pid, seconds, message = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
if not select.select([sys.stdin], [], [], seconds)[0]:  # no word from the worker in time
    print(message, file=sys.stderr, flush=True)
    os.kill(pid, signal.SIGKILL)  # TensorFlow catches SIGTERM, in a handler that cannot run now
"""


def cluster_from_env(environ=os.environ):
    """(number of workers, this worker's rank) from TF_CONFIG; raises ValueError naming the fault."""
    text = environ.get("TF_CONFIG")
    if not text:
        raise ValueError(
            '--strategy multi-worker needs TF_CONFIG, e.g. {"cluster": {"worker": '
            '["host1:2222", "host2:2222"]}, "task": {"type": "worker", "index": 0}}'
        )
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"TF_CONFIG is not valid JSON ({e})") from None
    cluster, task = spec.get("cluster") if isinstance(spec, dict) else None, spec.get("task", {})
    if not isinstance(cluster, dict) or not cluster:
        raise ValueError('TF_CONFIG has no "cluster" ({"worker": ["host:port", ...]})')
    for job, addresses in cluster.items():
        if job not in ("chief", "worker"):
            raise ValueError(f'TF_CONFIG cluster job {job!r}: only "chief" and "worker" train here')
        if (
            not isinstance(addresses, list)
            or not addresses
            or not all(isinstance(a, str) and a.rpartition(":")[2].isdigit() for a in addresses)
        ):
            raise ValueError(f'TF_CONFIG cluster "{job}" must be a list of "host:port", got {addresses!r}')
    if not isinstance(task, dict) or task.get("type") not in cluster:
        raise ValueError(f'TF_CONFIG "task" type must be one of {sorted(cluster)}, got {task!r}')
    index = task.get("index")
    if not isinstance(index, int) or not 0 <= index < len(cluster[task["type"]]):
        raise ValueError(
            f'TF_CONFIG "task" index must be 0..{len(cluster[task["type"]]) - 1} '
            f"for {task['type']!r}, got {index!r}"
        )
    workers = len(cluster.get("chief", [])) + len(cluster.get("worker", []))
    rank = index if task["type"] == "chief" else len(cluster.get("chief", [])) + index
    return workers, rank


def local_cluster(workers):
    """The environments ({"TF_CONFIG": ...}) of `workers` processes forming a cluster on this
    machine (free ports of 127.0.0.1): to try multi-worker training, or to measure it."""
    import socket

    sockets = [socket.socket() for _ in range(workers)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    addresses = [f"127.0.0.1:{s.getsockname()[1]}" for s in sockets]
    for s in sockets:
        s.close()
    return [
        {"TF_CONFIG": json.dumps({"cluster": {"worker": addresses}, "task": {"type": "worker", "index": i}})}
        for i in range(workers)
    ]


def make_strategy(name, connect_timeout=CONNECT_TIMEOUT_SECONDS):
    """The tf.distribute strategy for `name` (one of STRATEGIES), or None for the default.

    multi-worker waits for every worker of TF_CONFIG to start; a worker that cannot reach the
    others within `connect_timeout` seconds says so and exits (TensorFlow would wait an hour)."""
    import tensorflow as tf

    if name == "default":
        return None
    if name == "mirrored":
        return tf.distribute.MirroredStrategy()
    if name != "multi-worker":
        raise ValueError(f"unknown strategy {name!r}; choose one of {STRATEGIES}")
    workers, rank = cluster_from_env()
    _patch_keras_for_multi_worker()

    message = (
        f"kformer: error: worker {rank} could not reach the other {workers - 1} worker(s) of TF_CONFIG within "
        f"{connect_timeout:g} s; start the same command on every worker (TF_CONFIG={os.environ['TF_CONFIG']})"
    )
    # TensorFlow waits for the other workers inside C++ (for up to an hour, holding the interpreter):
    # a separate process keeps the time, and stops this one with the message unless told in time.
    watchdog = subprocess.Popen(
        [sys.executable, "-c", _WATCHDOG, str(os.getpid()), str(connect_timeout), message],
        stdin=subprocess.PIPE,
    )
    try:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()  # collectives: ring on CPU, NCCL on GPU (AUTO)
    finally:
        watchdog.stdin.close()  # connected (or failed otherwise): the watchdog exits
        watchdog.wait()
    log.info("worker %d of %d connected (%d replicas in all)", rank, workers, strategy.num_replicas_in_sync)
    return strategy


def _cluster(strategy):
    """(cluster resolver, {job: [addresses]}) of a strategy; ({}) for one without a cluster."""
    resolver = getattr(strategy, "cluster_resolver", None)
    return resolver, (resolver.cluster_spec().as_dict() if resolver is not None else {})


def workers(strategy):
    """How many processes train together (1 without a cluster)."""
    _, jobs = _cluster(strategy)
    return max(len(jobs.get("chief", [])) + len(jobs.get("worker", [])), 1)


def is_chief(strategy):
    """True where the run directory may be written: a single process, or the chief of a cluster
    (the "chief" task, or worker 0 when there is none)."""
    if workers(strategy) == 1:
        return True
    resolver, jobs = _cluster(strategy)
    return resolver.task_type == "chief" or ("chief" not in jobs and resolver.task_id == 0)


def agree(strategy, value, reduction="SUM"):
    """`value` (a number) summed ("SUM") or averaged ("MEAN") over all workers, so that each takes
    the same decision; a single process gets it back as it is. Also a barrier: it returns once
    every worker has called it."""
    if workers(strategy) == 1:
        return value
    import tensorflow as tf

    return float(strategy.reduce(reduction, tf.constant(float(value)), axis=None))


@contextlib.contextmanager
def chief_first(strategy):
    """Runs the block on the chief, then on the other workers (which wait for it): a new run's
    files (tokenizer, config) are written once, by the chief, and read by the others. Yields
    whether this process is the chief."""
    chief = is_chief(strategy)
    if not chief:
        log.info(
            "waiting for the chief to write the run's files (and prepare its corpus, if it was given a file)"
        )
        agree(strategy, 0)
    try:
        yield chief
    finally:
        if chief:
            agree(strategy, 0)


class Preempted(Exception):
    """Training stopped on SIGTERM (here or on another worker), its last step saved."""

    exit_code = 128 + signal.SIGTERM  # the status of a process ended by SIGTERM: not finished


class Interrupted(Preempted):
    """Training stopped on Ctrl-C (`kformer.train.callbacks.StopOnInterrupt`), its last step saved."""

    exit_code = 128 + signal.SIGINT  # a shell's status for a command stopped by Ctrl-C


class WorkerLost(ConnectionError):
    """A worker of a multi-worker run stopped (or became unreachable) during training."""


@contextlib.contextmanager
def worker_failures():
    """Turns TensorFlow's report of a lost worker into a WorkerLost that says what to do."""
    import tensorflow as tf

    try:
        yield
    except tf.errors.UnavailableError as e:
        first = next(
            (line for line in str(e).splitlines() if "unhealthy" in line or "rror" in line), str(e)[:200]
        )
        raise WorkerLost(
            f"a worker stopped during training ({first.strip()}); start every worker again with the "
            "same command: training resumes from the chief's last checkpoint"
        ) from None


def _patch_keras_for_multi_worker():
    """Two workarounds for Keras 3.15's `fit` under MultiWorkerMirroredStrategy (keras-team/keras#20585):
    - before the first step it reduces the first distributed batch to a mean over workers to build
      the model; that fails for dict inputs (and for batches of different shapes per worker): build
      from this worker's own part of the batch instead;
    - it reduces scalar logs with `axis=0`, which fails on scalars: reduce them with no axis.
    Both are what `fit` does with MirroredStrategy; remove them once Keras fixes #20585."""
    import tensorflow as tf
    from keras.src.backend.tensorflow import trainer

    if getattr(trainer, "_kformer_patched", False):
        return
    original_reduce = trainer.reduce_per_replica

    def reduce_per_replica(values, strategy, reduction):
        if trainer._collective_all_reduce_multi_worker(strategy) and reduction in ("auto", "mean"):
            return tf.nest.map_structure(lambda v: strategy.reduce("MEAN", v, axis=None), values)
        return original_reduce(values, strategy, reduction)

    def maybe_symbolic_build(self, iterator=None, data_batch=None):
        if self._distribute_strategy is None:
            return
        if iterator is not None:
            local = self.distribute_strategy.experimental_local_results
            for _, _, batches in iterator:
                batch = next(batches, None)
                if batch is None:  # a validation iterator already read: built by then
                    return
                data_batch = tf.nest.map_structure(lambda v: local(v)[0], batch)
                break
        with self.distribute_strategy.scope():
            self._symbolic_build(data_batch=data_batch)

    trainer.reduce_per_replica = reduce_per_replica
    trainer.TensorFlowTrainer._maybe_symbolic_build = maybe_symbolic_build
    trainer._kformer_patched = True

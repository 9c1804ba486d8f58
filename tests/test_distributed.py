"""Multi-worker training: workers are local processes on 127.0.0.1 ports, each with its own TF_CONFIG."""

import json
import os
import signal
import subprocess
import time
import types

import numpy as np
import pytest
from conftest import KFORMER, PYTHON, python_lines, run_process, saved_weights

from kformer import run_folder
from kformer.train.distributed import cluster_from_env, local_cluster


@pytest.mark.parametrize(
    "text, message",
    [
        (None, "needs TF_CONFIG"),
        ("{not json", "not valid JSON"),
        ('{"task": {"type": "worker", "index": 0}}', 'no "cluster"'),
        ('{"cluster": {"worker": ["localhost"]}, "task": {"type": "worker", "index": 0}}', '"host:port"'),
        (
            '{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 2}}',
            "index must be 0..1",
        ),
        ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "chief", "index": 0}}', "type must be one of"),
        ('{"cluster": {"ps": ["a:1"], "worker": ["b:2"]}, "task": {"type": "worker", "index": 0}}', "only"),
    ],
)
def test_malformed_tf_config_is_named(text, message):
    with pytest.raises(ValueError, match=message):
        cluster_from_env({} if text is None else {"TF_CONFIG": text})


def test_tf_config_gives_workers_and_rank():
    spec = {"cluster": {"chief": ["a:1"], "worker": ["b:2", "c:3"]}, "task": {"type": "worker", "index": 1}}
    assert cluster_from_env({"TF_CONFIG": json.dumps(spec)}) == (3, 2)
    spec["task"] = {"type": "chief", "index": 0}
    assert cluster_from_env({"TF_CONFIG": json.dumps(spec)}) == (3, 0)


# Two SGD steps of a tiny model on one global batch, with the strategy named by argv[1] and in one
# process: each replica takes half of the batch. Both halves hold the same number of target tokens,
# so the mean of the replicas' token means is the global mean.
STEP_SCRIPT = r"""
import json, sys
import numpy as np
import tensorflow as tf
if sys.argv[1] == "mirrored":  # two replicas on the CPU
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    devices = [d.name for d in tf.config.list_logical_devices("CPU")]
    strategy = tf.distribute.MirroredStrategy(devices)
else:  # before any other TensorFlow op
    from kformer.train.distributed import make_strategy
    strategy = make_strategy("multi-worker", connect_timeout=120)
import keras
from kformer.model.config import preset
from kformer.model.transformer import Transformer
from kformer.train.fit import compile_model
from kformer.train.recipe import recipe

config = preset("tiny", vocab_size=60)
rng = np.random.default_rng(0)
source = rng.integers(4, 60, size=(8, 6)).astype("int32")
source[1::2, 4:] = 0  # padded sources
target = rng.integers(4, 60, size=(8, 5)).astype("int32")
labels = np.roll(target, -1, axis=1)

def one_step(strategy):
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = compile_model(Transformer(config), config, recipe("tiny"), xla=False)
        model.compile(optimizer=keras.optimizers.SGD(1.0), loss=model.loss, jit_compile=False)
    batches = tf.data.Dataset.from_tensors(({"source_ids": source, "target_ids": target}, labels))
    loss = model.fit(batches.repeat(2), epochs=1, verbose=0).history["loss"][0]  # two steps
    return loss, [np.asarray(w) for w in model.weights]

keras.utils.set_random_seed(0)
initial = [np.asarray(w) for w in Transformer(config).weights]
multi_loss, multi = one_step(strategy)
single_loss, single = one_step(tf.distribute.get_strategy())
print(json.dumps({"replicas": strategy.num_replicas_in_sync, "losses": [single_loss, multi_loss],
                  "max_diff": max(float(np.abs(a - b).max()) for a, b in zip(single, multi)),
                  "moved": max(float(np.abs(a - i).max()) for a, i in zip(single, initial))}))
"""


def _start_workers(cluster, argv, cwd, log_dir, tag):
    """One process per worker of `cluster` (`local_cluster`), each with its TF_CONFIG;
    stdout+stderr to log_dir/{tag}{index}.log."""
    processes = []
    for index, worker_env in enumerate(cluster):
        env = dict(os.environ, **worker_env)
        log = open(os.path.join(log_dir, f"{tag}{index}.log"), "w")
        processes.append(subprocess.Popen(argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT))
    return processes


def _wait(processes, timeout=300):
    deadline = time.monotonic() + timeout
    for p in processes:
        p.wait(timeout=max(deadline - time.monotonic(), 1))
    return [p.returncode for p in processes]


def _log(log_dir, name):
    return open(os.path.join(log_dir, name)).read()


def _check_step_report(text):
    report = json.loads(text.strip().splitlines()[-1])
    assert report["replicas"] == 2
    assert report["moved"] > 0.01  # the steps did change the weights
    assert report["max_diff"] < 1e-6, report
    assert report["losses"][0] == pytest.approx(report["losses"][1], rel=1e-6)


def test_mirrored_strategy_takes_the_step_of_one_process():
    _check_step_report("\n".join(python_lines(STEP_SCRIPT, "mirrored")))


def test_two_workers_take_the_step_of_one_process(tmp_path):
    cluster = local_cluster(2)
    workers = _start_workers(
        cluster, [PYTHON, "-c", STEP_SCRIPT, "multi-worker"], str(tmp_path), str(tmp_path), "step"
    )
    assert _wait(workers) == [0, 0], _log(tmp_path, "step0.log")[-3000:]
    for index in range(2):
        _check_step_report(_log(tmp_path, f"step{index}.log"))


def _train_command(corpus_tsv, out, *budget):
    return [
        *KFORMER,
        "train",
        "--config",
        "tiny",
        "--data",
        corpus_tsv,
        "--vocab-size",
        "1200",
        "--out",
        out,
        "--strategy",
        "multi-worker",
        "--connect-timeout",
        "120",
        *budget,
    ]


def _summary(log_text):
    return json.loads(log_text[log_text.rindex("\n{") + 1 :])


def test_multi_worker_cli_survives_a_killed_worker_and_resumes(tmp_path, corpus_tsv):
    out, logs = str(tmp_path / "run"), str(tmp_path)
    cluster = local_cluster(2)
    # 1. Train until the chief has saved a checkpoint (every 1.2 s), then kill worker 1.
    workers = _start_workers(
        cluster,
        _train_command(corpus_tsv, out, "--steps", "2000", "--save-minutes", "0.02"),
        str(tmp_path),
        logs,
        "a",
    )
    state_file = run_folder.path(out, run_folder.STATE_FILE)
    deadline = time.monotonic() + 240
    while not (os.path.exists(state_file) and run_folder.read_state(out).steps >= 20):
        assert time.monotonic() < deadline and all(w.poll() is None for w in workers), _log(logs, "a0.log")[
            -3000:
        ]
        time.sleep(0.2)
    workers[1].send_signal(signal.SIGKILL)
    # The survivor stops with a one-line error, in bounded time, keeping the chief's checkpoint.
    assert _wait(workers, timeout=120)[0] == 2
    survivor = _log(logs, "a0.log")
    assert "a worker stopped during training" in survivor and "Traceback" not in survivor, survivor[-3000:]
    saved = run_folder.read_state(out).steps
    assert saved >= 20, saved

    # 2. Restart both: training resumes from the chief's last checkpoint and reaches the target.
    workers = _start_workers(
        cluster, _train_command(corpus_tsv, out, "--steps", str(saved + 20)), str(tmp_path), logs, "b"
    )
    assert _wait(workers) == [0, 0], _log(logs, "b1.log")[-3000:]
    for index in range(2):
        text = _log(logs, f"b{index}.log")
        assert f"resuming {out}/model.keras from step {saved}" in text
        assert _summary(text)["steps"] == saved + 20
    assert run_folder.read_state(out).steps == saved + 20 and run_folder.read_state(out).replicas == 2

    # 3. A time budget: the workers agree on when it is spent and stop at the same step.
    minutes = run_folder.read_state(out).seconds / 60 + 0.2
    workers = _start_workers(
        cluster, _train_command(corpus_tsv, out, "--minutes", f"{minutes:.4f}"), str(tmp_path), logs, "c"
    )
    assert _wait(workers) == [0, 0], _log(logs, "c1.log")[-3000:]
    chief, other = (_summary(_log(logs, f"c{index}.log")) for index in range(2))
    assert chief["stopped"].startswith("time budget") and chief["steps"] == other["steps"] > saved + 20
    assert chief["loss"] == other["loss"]  # the same logged (all-reduced) loss
    assert chief["onednn"] == other["onednn"] == "on"  # `kformer train` turns on oneDNN's CPU kernels
    assert run_folder.read_state(out).steps == chief["steps"]
    assert "saved model.keras" in _log(logs, "c0.log") and "the chief saves" in _log(logs, "c1.log")
    # Only the chief wrote, and only the run's own files: best.* too where the short budget's
    # evaluations (every quarter of it) found a best.
    assert set(os.listdir(out)) - {"best.json", "best.weights.h5"} == {
        "config.json",
        "corpus.json",
        "data",  # the prepared corpus
        "logs",
        "model.keras",
        "recipe.json",
        "tokenizer.model",
        "training.json",
    }
    assert sorted(os.listdir(tmp_path)) == ["a0.log", "a1.log", "b0.log", "b1.log", "c0.log", "c1.log", "run"]


def test_a_worker_alone_gives_up_in_bounded_time(tmp_path, corpus_tsv):
    out = str(tmp_path / "run")
    cluster = local_cluster(2)
    env = dict(os.environ, **cluster[1])  # worker 0 never starts
    command = _train_command(corpus_tsv, out, "--steps", "5")
    command[command.index("--connect-timeout") + 1] = "3"
    started = time.monotonic()
    result = run_process(command, env=env, timeout=120)
    assert result.status != 0 and time.monotonic() - started < 60
    assert "worker 1 could not reach the other 1 worker(s) of TF_CONFIG within 3 s" in result.stderr
    assert not os.path.exists(out)


def test_the_time_budget_stops_every_worker_when_one_worker_is_out_of_time(monkeypatch):
    """Workers stop at the same step or the others wait forever in the next all-reduce: the stop is
    agreed on. Here this worker has time left, and the (simulated) other worker has none."""
    import keras

    from kformer.train import callbacks

    def other_worker_out_of_time(strategy, value, reduction="SUM"):
        return value + 1 if reduction == "SUM" else value

    monkeypatch.setattr(callbacks.distributed, "agree", other_worker_out_of_time)
    budget = callbacks.Budget(schedule=None, minutes=10)
    model = types.SimpleNamespace(
        optimizer=types.SimpleNamespace(iterations=keras.Variable(1)), stop_training=False
    )
    budget.set_model(model)
    budget.on_train_begin()
    budget.on_train_batch_end(0)
    assert model.stop_training and budget.reason == "time budget of 10 min used"


def test_sigterm_on_one_worker_stops_all_at_one_saved_step_and_a_restart_ends_as_if_uninterrupted(
    tmp_path, corpus_tsv
):
    """A preemptible VM gets SIGTERM before it is stopped: every worker stops after the same step,
    the chief saves it, all exit 143; started again, the run reaches the step count and the weights
    of a run nobody stopped."""
    cluster, logs, steps = local_cluster(2), str(tmp_path), 200
    whole, stopped = str(tmp_path / "whole"), str(tmp_path / "stopped")
    workers = _start_workers(
        cluster, _train_command(corpus_tsv, whole, "--steps", str(steps)), logs, logs, "w"
    )
    assert _wait(workers) == [0, 0], _log(logs, "w1.log")[-3000:]

    stopped_command = _train_command(corpus_tsv, stopped, "--steps", str(steps), "--save-minutes", "0.02")
    workers = _start_workers(cluster, stopped_command, logs, logs, "a")
    deadline = time.monotonic() + 240
    while not (os.path.exists(run_folder.path(stopped, run_folder.STATE_FILE))):  # the first save
        assert time.monotonic() < deadline and all(w.poll() is None for w in workers), _log(logs, "a0.log")[
            -3000:
        ]
        time.sleep(0.1)
    workers[1].send_signal(signal.SIGTERM)
    assert _wait(workers, timeout=120) == [143, 143], _log(logs, "a0.log")[-3000:]
    saved = run_folder.read_state(stopped).steps
    assert 0 < saved < steps
    for index, who in enumerate(("saved model.keras", "the chief saved it")):
        text = _log(logs, f"a{index}.log")
        assert f"kformer train: stopped by SIGTERM after step {saved} ({who}); run the same command" in text
        assert "Traceback" not in text
        assert f"input worker {index} of 2 reads every 2th pair of the 1 train shard(s)" in text

    workers = _start_workers(
        cluster, _train_command(corpus_tsv, stopped, "--steps", str(steps)), logs, logs, "b"
    )
    assert _wait(workers) == [0, 0], _log(logs, "b1.log")[-3000:]
    assert f"resuming {stopped}/model.keras from step {saved}" in _log(logs, "b0.log")
    assert run_folder.read_state(stopped).steps == run_folder.read_state(whole).steps == steps
    reference = saved_weights(run_folder.path(whole, run_folder.MODEL_FILE))
    weights = saved_weights(run_folder.path(stopped, run_folder.MODEL_FILE))
    assert sorted(weights) == sorted(reference)
    for name in reference:
        np.testing.assert_allclose(weights[name], reference[name], atol=1e-6, err_msg=name)

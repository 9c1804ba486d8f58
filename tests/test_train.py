import glob
import hashlib
import json
import os
import subprocess

import keras
import numpy as np
import pytest

from conftest import PYTHON
from kformer.train import (LabelSmoothedCrossEntropy, MaskedAccuracy, TransformerSchedule, load_model,
                           train)


def test_schedule_follows_the_paper():
    schedule = TransformerSchedule(d_model=512, warmup_steps=4000)
    for step in (1, 100, 4000, 20000):
        expected = 512**-0.5 * min(step**-0.5, step * 4000**-1.5)
        assert float(schedule(step - 1)) == pytest.approx(expected, rel=1e-5)  # optimizer steps count from 0


def test_label_smoothed_loss_against_numpy():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 3, 5)).astype("float32")
    labels = np.array([[1, 4, 0], [2, 0, 0]], "int32")
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    target = np.full((2, 3, 5), 0.1 / 5)
    target[np.arange(2)[:, None], np.arange(3)[None], labels] += 0.9
    per_token = -(target * log_probs).sum(-1)
    mask = labels != 0
    expected = per_token[mask].mean()
    assert float(LabelSmoothedCrossEntropy(0.1)(labels, logits)) == pytest.approx(expected, rel=1e-5)


def test_masked_accuracy_ignores_padding():
    logits = np.eye(5, dtype="float32")[[[1, 2, 3], [4, 4, 4]]]
    metric = MaskedAccuracy()
    metric.update_state(np.array([[1, 2, 0], [4, 1, 0]]), logits)
    assert float(metric.result()) == pytest.approx(3 / 4)


def _sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_train_writes_everything_and_resumes(tmp_path, corpus_tsv):
    out = str(tmp_path / "run")
    args = dict(data=corpus_tsv, vocab_size=1200, xla=False, verbose=0, checkpoint_seconds=10**6)
    first = train(out, "tiny", steps=5, **args)
    assert first["steps"] == 5 and np.isfinite(first["loss"])
    assert {"config.json", "tokenizer.model", "corpus.json", "model.keras", "logs"} <= set(os.listdir(out))
    assert glob.glob(os.path.join(out, "logs", "train", "events.out.tfevents*"))
    tokenizer_before = _sha(os.path.join(out, "tokenizer.model"))
    second = train(out, "tiny", steps=8, **args)  # same directory: continues from step 5
    assert second["steps"] == 8
    assert _sha(os.path.join(out, "tokenizer.model")) == tokenizer_before
    model, config, tokenizer = load_model(out)
    assert config.vocab_size == tokenizer.get_piece_size() and model.config == config
    assert len(open(os.path.join(out, "logs", "history.csv")).read().strip().splitlines()) >= 3


def test_mismatched_config_or_corpus_overwrites_nothing(trained_dir, corpus_tsv):
    before = {f: _sha(os.path.join(trained_dir, f)) for f in ("config.json", "model.keras", "tokenizer.model")}
    with pytest.raises(ValueError, match="another config"):
        train(trained_dir, "small", data=corpus_tsv, steps=1, verbose=0)
    with pytest.raises(ValueError, match="was trained on"):
        train(trained_dir, "tiny", data="default", steps=1, verbose=0)
    assert before == {f: _sha(os.path.join(trained_dir, f)) for f in before}


def test_corrupted_checkpoint_is_a_clear_error(tmp_path, trained_dir):
    import shutil
    out = str(tmp_path / "copy")
    shutil.copytree(trained_dir, out)
    path = os.path.join(out, "model.keras")
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    damaged = _sha(path)
    with pytest.raises(ValueError, match="model.keras: cannot restore"):
        load_model(out)
    with pytest.raises(ValueError, match="model.keras: cannot restore"):
        train(out, "tiny", data=json.load(open(os.path.join(out, "corpus.json")))["data"], steps=20, verbose=0)
    assert _sha(path) == damaged  # nothing overwritten


def test_nan_stops_cleanly_and_keeps_the_last_checkpoint(tmp_path, corpus_tsv):
    out = str(tmp_path / "run")
    args = dict(data=corpus_tsv, vocab_size=1200, xla=False, verbose=0, checkpoint_seconds=10**6)
    train(out, "tiny", steps=3, **args)
    good = _sha(os.path.join(out, "model.keras"))

    class Poison(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if int(self.model.optimizer.iterations) >= 5:
                weights = self.model.get_layer("shared_embedding").embeddings
                weights.assign(np.full(weights.shape, np.nan, "float32"))

    with pytest.raises(FloatingPointError, match="NaN.*last good checkpoint"):
        train(out, "tiny", steps=50, callbacks=[Poison()], **args)
    assert _sha(os.path.join(out, "model.keras")) == good


def test_time_budget_stops_and_saves(tmp_path, corpus_tsv):
    out = str(tmp_path / "run")
    summary = train(out, "tiny", data=corpus_tsv, vocab_size=1200, minutes=0.001, xla=False, verbose=0)
    assert summary["stopped"].startswith("time budget") and summary["steps"] >= 1
    assert os.path.exists(os.path.join(out, "model.keras"))


MIRRORED_SCRIPT = r"""
import json, sys
import numpy as np, tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras
from kformer.config import preset
from kformer.model import Transformer
from kformer.train import compile_model

config = preset("tiny", vocab_size=60)
rng = np.random.default_rng(0)
# Same token count in each half of the global batch: per-replica token means then average to the global mean.
source = rng.integers(4, 60, size=(8, 6)).astype("int32")
target = rng.integers(4, 60, size=(8, 5)).astype("int32")
labels = np.roll(target, -1, axis=1)

def one_step(strategy):
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = compile_model(Transformer(config), config, xla=False)
        # Plain SGD makes the step proportional to the gradient, so a replica-scaling error shows
        # (Adam's first step, lr * sign(g), would hide it and magnify rounding where |g| ~ epsilon).
        model.compile(optimizer=keras.optimizers.SGD(1.0), loss=model.loss, jit_compile=False)
    ds = tf.data.Dataset.from_tensors(({"source_ids": source, "target_ids": target}, labels))
    loss = model.fit(ds, epochs=1, verbose=0).history["loss"][0]
    return loss, [np.asarray(w) for w in model.weights]

devices = [d.name for d in tf.config.list_logical_devices("CPU")]
mirrored = tf.distribute.MirroredStrategy(devices)
keras.utils.set_random_seed(0)
initial = [np.asarray(w) for w in Transformer(config).weights]
single_loss, single = one_step(tf.distribute.get_strategy())
multi_loss, multi = one_step(mirrored)
print(json.dumps({"replicas": mirrored.num_replicas_in_sync, "losses": [single_loss, multi_loss],
                  "max_diff": max(float(np.abs(a - b).max()) for a, b in zip(single, multi)),
                  "moved": max(float(np.abs(a - i).max()) for a, i in zip(single, initial))}))
"""


def test_mirrored_strategy_matches_single_device():
    result = subprocess.run([PYTHON, "-c", MIRRORED_SCRIPT], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["replicas"] == 2
    assert report["moved"] > 0.01  # the step did change the weights
    assert report["max_diff"] < 1e-6, report
    assert report["losses"][0] == pytest.approx(report["losses"][1], rel=1e-6)


XLA_SCRIPT = r"""
import json, sys
from kformer import bench
from kformer import data as data_lib
from kformer.train import train, prepare
out, corpus, dump = sys.argv[1:4]
train(out, "tiny", data=corpus, vocab_size=1200, epochs=3, xla=True, verbose=0, checkpoint_seconds=10**6)
config, tokenizer, splits = prepare(out, "tiny", data=corpus)
encoded = data_lib.encode_pairs(tokenizer, splits["train"], config)
train_shapes = {tuple(y.shape) for _, y in data_lib.make_dataset(encoded, config, training=True).take(300)}
# Validation runs the same-named step on the dev split, whose last batch per bucket may be partial.
dev = data_lib.encode_pairs(tokenizer, splits["dev"], config)
dev_shapes = {tuple(y.shape) for _, y in data_lib.make_dataset(dev, config, training=False)}
print(json.dumps({"compilations": bench.count_xla_compilations(dump), "train_shapes": len(train_shapes),
                  "dev_shapes": len(dev_shapes), "buckets": len(data_lib.bucket_plan(config)[0])}))
"""


def test_xla_compilations_bounded_by_bucket_shapes(tmp_path, corpus_tsv):
    from kformer.bench import xla_dump_flags
    dump = str(tmp_path / "xla")
    env = dict(os.environ, XLA_FLAGS=xla_dump_flags(dump))
    result = subprocess.run([PYTHON, "-c", XLA_SCRIPT, str(tmp_path / "run"), corpus_tsv, dump],
                            capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    # One compilation per distinct batch shape, never per batch: train shapes are the buckets.
    assert report["train_shapes"] <= report["buckets"], report
    assert 1 < report["compilations"] <= report["train_shapes"] + report["dev_shapes"], report


def test_mixed_precision_trains_and_reloads_in_float32(tmp_path, corpus_tsv):
    out = str(tmp_path / "run")
    summary = train(out, "tiny", data=corpus_tsv, vocab_size=1200, steps=2, xla=False, mixed_precision=True,
                    verbose=0)
    assert summary["steps"] == 2 and np.isfinite(summary["loss"])
    model, _, _ = load_model(out)  # weights were kept in float32; inference runs in float32
    assert all(w.dtype == "float32" for w in model.weights)

import glob
import hashlib
import json
import logging
import os
import shutil
import sys
import types

import keras
import numpy as np
import pytest
from conftest import python_lines, saved_weights

from kformer import run_folder
from kformer.contracts import TOKENIZER_FILE
from kformer.train.fit import train
from kformer.train.recipe import recipe
from kformer.train.schedules import budget_warmup


def test_averaged_weights_are_the_moving_average_and_resume_is_exact(tmp_path, corpus_tsv):
    """model.keras holds the exponential moving average of the raw weights (computed here by hand
    from the raw weights after every step); a run stopped at step 4 and resumed to step 8 ends with
    the same raw weights and the same average as an uninterrupted 8-step run."""
    momentum = 0.6
    # The paper's schedule: a budget schedule would decay to zero at step 4 in the first half.
    args = dict(
        data=corpus_tsv,
        vocab_size=1200,
        xla=False,
        verbose=0,
        checkpoint_seconds=10**6,
        recipe_changes={"ema_momentum": momentum, "schedule": "noam", "warmup_steps": 4},
    )

    class Record(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.raw = []

        def on_train_batch_end(self, batch, logs=None):
            self.raw.append([np.array(v) for v in self.model.trainable_variables])

    import shutil

    split, whole = str(tmp_path / "split"), str(tmp_path / "whole")
    train(split, "tiny", steps=4, **args)
    assert run_folder.read_state(split).steps == 4
    os.makedirs(whole)
    # the same tokenizer, a fresh model
    for name in ("config.json", "recipe.json", "tokenizer.model", "corpus.json"):
        shutil.copy(os.path.join(split, name), whole)
    shutil.copytree(os.path.join(split, "data"), os.path.join(whole, "data"))  # the same corpus
    record = Record()
    train(whole, "tiny", steps=8, callbacks=[record], **args)
    train(split, "tiny", steps=8, **args)

    average = record.raw[0]
    for raw in record.raw[1:]:
        average = [momentum * a + (1 - momentum) * w for a, w in zip(average, raw)]
    model = run_folder.load(whole).model
    for variable, expected in zip(model.trainable_variables, average):
        np.testing.assert_allclose(np.array(variable), expected, atol=1e-6, err_msg=variable.path)
    assert max(np.abs(a - r).max() for a, r in zip(average, record.raw[-1])) > 1e-3  # averaging did something

    a, b = (
        saved_weights(os.path.join(whole, "model.keras")),
        saved_weights(os.path.join(split, "model.keras")),
    )
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_allclose(a[name], b[name], atol=1e-6, err_msg=name)


def test_a_run_saves_by_time_and_after_its_last_epoch_not_after_every_epoch(
    tmp_path, corpus_tsv, monkeypatch
):
    """A save can take as long as an epoch (a small corpus on a GPU): three epochs with no save
    due by time write one checkpoint, after the last, holding every step."""
    saved_at = []
    save = run_folder.save

    def counted(model, model_path, state=None, input_iterator=None):
        saved_at.append(state.steps)
        save(model, model_path, state, input_iterator)

    monkeypatch.setattr(run_folder, "save", counted)
    out = str(tmp_path / "run")
    summary = train(
        out,
        "tiny",
        data=corpus_tsv,
        vocab_size=1200,
        epochs=3,
        xla=False,
        verbose=0,
        checkpoint_seconds=10**6,
    )
    assert summary["steps"] > 3 and saved_at == [summary["steps"]], saved_at
    assert run_folder.read_state(out).steps == summary["steps"]


class StepClock(keras.callbacks.Callback):
    """A clock for `kformer.train.callbacks` that advances `seconds_per_step` at each training step (listed
    before kformer's callbacks, it ticks before they read it): the budget logic sees a machine of
    exactly known speed, whatever the real machine's speed or stalls."""

    def __init__(self, seconds_per_step):
        super().__init__()
        self.now, self.seconds_per_step = 1000.0, seconds_per_step

    def monotonic(self):
        return self.now

    def on_train_batch_end(self, batch, logs=None):
        self.now += self.seconds_per_step


def test_time_budget_sizes_the_schedule_and_a_spent_budget_changes_nothing(tmp_path, corpus_tsv, monkeypatch):
    clock = StepClock(0.25)  # 4 steps/s: a 30 s budget holds 120 steps, 48 s hold 192
    monkeypatch.setattr(
        sys.modules["kformer.train.callbacks"], "time", types.SimpleNamespace(monotonic=clock.monotonic)
    )
    out = str(tmp_path / "run")
    args = dict(
        data=corpus_tsv,
        vocab_size=1200,
        xla=False,
        verbose=0,
        recipe_changes={"schedule": "budget"},
        callbacks=[clock],
    )
    summary = train(out, "tiny", minutes=0.5, **args)
    state = run_folder.read_state(out)
    assert summary["steps"] == state.steps == 120 and summary["steps_per_s"] == pytest.approx(4)
    assert state.seconds == pytest.approx(30)
    # The decay was sized from the measured speed to end with the budget, not at the initial guess.
    assert state.schedule["total_steps"] == pytest.approx(120)
    assert state.schedule["warmup_steps"] == budget_warmup(recipe("tiny"), 120)
    before = _sha(os.path.join(out, "model.keras"))
    again = train(out, "tiny", minutes=0.5, **args)
    assert again == {"steps": 120, "stopped": "budget already spent"}
    assert _sha(os.path.join(out, "model.keras")) == before
    # A larger budget resumes the same schedule: the warm-up is not repeated, the decay is stretched.
    more = train(out, "tiny", minutes=0.8, **args)
    resumed = run_folder.read_state(out)
    assert more["steps"] == resumed.steps == 192
    assert resumed.schedule["warmup_steps"] == state.schedule["warmup_steps"]
    assert resumed.schedule["total_steps"] == pytest.approx(192)
    assert resumed.seconds == pytest.approx(48)


def _sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_train_writes_everything_and_resumes(tmp_path, corpus_tsv):
    out = str(tmp_path / "run")
    args = dict(data=corpus_tsv, vocab_size=1200, xla=False, verbose=0, checkpoint_seconds=10**6)
    first = train(out, "tiny", steps=5, **args)
    assert first["steps"] == 5 and np.isfinite(first["loss"])
    assert {"config.json", "recipe.json", "tokenizer.model", "corpus.json", "model.keras", "logs"} <= set(
        os.listdir(out)
    )
    assert glob.glob(os.path.join(out, "logs", "train", "events.out.tfevents*"))
    tokenizer_before = _sha(os.path.join(out, "tokenizer.model"))
    second = train(out, "tiny", steps=8, **args)  # same directory: continues from step 5
    assert second["steps"] == 8
    assert _sha(os.path.join(out, "tokenizer.model")) == tokenizer_before
    loaded = run_folder.load(out)
    model, config, tokenizer = loaded.model, loaded.config, loaded.tokenizer
    assert config.vocab_size == tokenizer.get_piece_size() and model.config == config
    assert len(open(os.path.join(out, "logs", "history.csv")).read().strip().splitlines()) >= 3


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def test_a_resume_restores_the_input_position_and_continues_the_same_batches(tmp_path, corpus_tsv):
    """The batch stream's position is saved with each checkpoint (only the newest kept) and a
    resumed run sets its new iterator to it instead of rebuilding the batches already trained on;
    stopped at 5 and resumed to 9, it ends with the weights of a run of 9 steps. Without a saved
    position (a run that saved none), it rebuilds them and ends the same."""
    args = dict(data=corpus_tsv, vocab_size=1200, xla=False, verbose=0, checkpoint_seconds=10**6)
    stopped, whole, replayed = (str(tmp_path / name) for name in ("stopped", "whole", "replayed"))
    train(stopped, "tiny", steps=5, **args)
    assert run_folder.read_state(stopped).input == "input-5"
    assert sorted(n for n in os.listdir(stopped) if n.startswith("input-")) == [
        "input-5.data-00000-of-00001",
        "input-5.index",
    ]
    shutil.copytree(stopped, replayed)
    for name in glob.glob(os.path.join(replayed, "input-*")):
        os.remove(name)
    lines, log = _Lines(), logging.getLogger("kformer")
    level = log.level
    log.addHandler(lines)
    log.setLevel(logging.INFO)
    try:
        train(stopped, "tiny", steps=9, **args)
        restored = list(lines.lines)
        train(replayed, "tiny", steps=9, **args)
    finally:
        log.removeHandler(lines)
        log.setLevel(level)
    assert not [line for line in restored if "rebuilding" in line]
    assert [line for line in lines.lines if "rebuilding the 5 batches" in line]
    os.makedirs(whole)
    for name in (
        run_folder.CONFIG_FILE,
        run_folder.RECIPE_FILE,
        TOKENIZER_FILE,
        run_folder.CORPUS_FILE,
    ):
        shutil.copy(run_folder.path(stopped, name), whole)  # the same tokenizer and corpus
    shutil.copytree(
        run_folder.path(stopped, run_folder.DATA_DIR), run_folder.path(whole, run_folder.DATA_DIR)
    )
    train(whole, "tiny", steps=9, **args)
    reference = saved_weights(run_folder.path(whole, run_folder.MODEL_FILE))
    for run in (stopped, replayed):
        weights = saved_weights(run_folder.path(run, run_folder.MODEL_FILE))
        for name in reference:
            np.testing.assert_allclose(weights[name], reference[name], atol=1e-6, err_msg=f"{run}: {name}")


def test_mismatched_config_or_corpus_overwrites_nothing(trained_dir, corpus_tsv):
    before = {
        f: _sha(os.path.join(trained_dir, f)) for f in ("config.json", "model.keras", "tokenizer.model")
    }
    with pytest.raises(ValueError, match="another config"):
        train(trained_dir, "small", data=corpus_tsv, steps=1, verbose=0)
    with pytest.raises(ValueError, match="was trained on"):
        train(trained_dir, "tiny", data="default", steps=1, verbose=0)
    assert before == {f: _sha(os.path.join(trained_dir, f)) for f in before}


def test_a_failed_start_leaves_no_folder_and_its_advice_works(tmp_path, corpus_tsv):
    out = str(tmp_path / "run")
    args = dict(data=corpus_tsv, xla=False, verbose=0, checkpoint_seconds=10**6)
    with pytest.raises(ValueError, match="lower --batch-tokens"):
        train(out, "tiny", steps=1, vocab_size=1200, batch_tokens=10**7, **args)
    with pytest.raises(ValueError, match="tokenizer training failed with --vocab-size 5"):
        train(out, "tiny", steps=1, vocab_size=5, **args)
    assert not os.path.exists(out)
    assert train(out, "tiny", steps=1, vocab_size=1200, batch_tokens=256, **args)["steps"] == 1


def test_out_that_is_a_file_is_refused(tmp_path, corpus_tsv):
    out = tmp_path / "notes.txt"
    out.write_text("mine")
    with pytest.raises(ValueError, match="is a file, not a folder"):
        train(str(out), "tiny", data=corpus_tsv, steps=1, vocab_size=1200, verbose=0)
    assert out.read_text() == "mine"


def test_a_swapped_tokenizer_is_refused(tmp_path, trained_dir):
    import shutil

    from test_data import same_size_other_tokenizer

    out = str(tmp_path / "copy")
    shutil.copytree(trained_dir, out)
    tokenizer = run_folder.load(out).tokenizer
    with open(os.path.join(out, "tokenizer.model"), "wb") as f:
        f.write(same_size_other_tokenizer(tokenizer).serialized_model_proto())
    with pytest.raises(ValueError, match="not the tokenizer this model was trained with"):
        run_folder.load(out)


def test_the_corpus_is_recorded_by_content_not_by_the_path_typed(tmp_path, corpus_tsv, monkeypatch):
    """A run resumes from any folder with the corpus given by any path, refuses a changed corpus,
    and evaluates on the splits it prepared whatever becomes of the corpus file."""
    import shutil

    from kformer.data import prepare as prepare_lib
    from kformer.evaluate import split_references

    shutil.copy(corpus_tsv, tmp_path / "pairs.tsv")
    monkeypatch.chdir(tmp_path)
    args = dict(vocab_size=1200, xla=False, verbose=0, checkpoint_seconds=10**6)
    train("run", "tiny", data="pairs.tsv", steps=1, **args)  # relative to tmp_path
    open("run/model.tmp.keras", "w").close()  # what a save killed midway leaves
    monkeypatch.chdir("/")
    run = str(tmp_path / "run")
    assert train(run, "tiny", data=str(tmp_path / "pairs.tsv"), steps=2, **args)["steps"] == 2
    assert not os.path.exists(os.path.join(run, "model.tmp.keras"))
    sources, _ = split_references(run, "test")
    with open(tmp_path / "pairs.tsv", encoding="utf-8") as f:  # the rule, applied here to the file
        pairs = [tuple(line.rstrip("\n").split("\t")) for line in f]
    expected = list(dict.fromkeys(source for source, _ in prepare_lib.split_pairs(pairs)["test"]))
    assert sources == expected and expected
    with open(tmp_path / "pairs.tsv", "a", encoding="utf-8") as f:
        f.write("新的。\tNew.\n")
    assert split_references(run, "test")[0] == sources  # the run keeps its prepared splits
    with pytest.raises(ValueError, match="was trained on"):
        train(run, "tiny", data=str(tmp_path / "pairs.tsv"), steps=3, **args)


def test_corrupted_checkpoint_is_a_clear_error(tmp_path, trained_dir):
    import shutil

    out = str(tmp_path / "copy")
    shutil.copytree(trained_dir, out)
    path = os.path.join(out, "model.keras")
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    damaged = _sha(path)
    with pytest.raises(ValueError, match="model.keras: cannot restore"):
        run_folder.load(out)
    with pytest.raises(ValueError, match="model.keras: cannot restore"):
        train(
            out, "tiny", data=json.load(open(os.path.join(out, "corpus.json")))["data"], steps=20, verbose=0
        )
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


def test_a_fit_that_raises_hands_back_the_signals_and_leaves_no_folder(tmp_path, corpus_tsv, monkeypatch):
    """Keras calls no on_train_end when fit raises (a callback's error here; out of memory, a bad
    batch): the run's release still hands SIGINT and SIGTERM back, so a notebook's interrupt button
    works on the next cell; the preemption handler's checkpoint folder is never made (a killed
    process would leave it behind)."""
    import signal
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the handler's folder goes
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)

    class Broken(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 1:
                made.extend(glob.glob(str(tmp_path / "kformer-preemption-*")))  # none, even now
                raise RuntimeError("a callback's bug")

    made = []

    with pytest.raises(RuntimeError, match="a callback's bug"):
        train(
            str(tmp_path / "run"),
            "tiny",
            data=corpus_tsv,
            vocab_size=1200,
            xla=False,
            verbose=0,
            steps=5,
            callbacks=[Broken()],
        )
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    assert not made and not glob.glob(str(tmp_path / "kformer-preemption-*"))


def test_time_budget_stops_and_saves(tmp_path, corpus_tsv):
    out = str(tmp_path / "run")
    summary = train(out, "tiny", data=corpus_tsv, vocab_size=1200, minutes=0.001, xla=False, verbose=0)
    assert summary["stopped"].startswith("time budget") and summary["steps"] >= 1
    assert os.path.exists(os.path.join(out, "model.keras"))


XLA_SCRIPT = r"""
import json, sys
from kformer.contracts.prepared import PreparedCorpus
from kformer.data import batches as batches_lib
from kformer.data import shards as shards_lib
from kformer.data import prepare as prepare_lib
from kformer.bench import train as bench
from kformer.train.fit import train
from kformer.train.options import TrainOptions
from kformer.train.run_data import run_data
out, corpus, dump = sys.argv[1:4]
train(out, "tiny", data=corpus, vocab_size=1200, epochs=3, xla=True, verbose=0, checkpoint_seconds=10**6)
config, recipe, tokenizer, folder, _ = run_data(out, TrainOptions("tiny", data=corpus))
batching = batches_lib.Batching.of(config, recipe.micro_batch_tokens)
manifest = PreparedCorpus.load(folder)
encoded = shards_lib.read_prepared(manifest.shard_paths(folder), manifest.train.dtype, batching)
train_shapes = {tuple(y.shape) for _, y in batches_lib.make_dataset(encoded, batching, training=True).take(300)}
# Validation runs the same-named step on the dev split, whose last batch per bucket may be partial.
dev = batches_lib.encode_pairs(tokenizer, prepare_lib.held_out(folder, "dev"), batching)
dev_shapes = {tuple(y.shape) for _, y in batches_lib.make_dataset(dev, batching, training=False)}
buckets = {(size, boundary - 1) for boundary, size in zip(*batches_lib.bucket_plan(batching, pad_to_bucket=True))}
print(json.dumps({"compilations": bench.count_xla_compilations(dump), "train_shapes": len(train_shapes),
                  "dev_shapes": len(dev_shapes), "buckets": len(buckets),
                  "shapes_not_buckets": len((train_shapes | dev_shapes) - buckets)}))
"""


def test_xla_compilations_bounded_by_bucket_shapes(tmp_path, corpus_tsv):
    from kformer.bench.train import xla_dump_flags

    dump = str(tmp_path / "xla")
    env = dict(os.environ, XLA_FLAGS=xla_dump_flags(dump))
    report = json.loads(python_lines(XLA_SCRIPT, str(tmp_path / "run"), corpus_tsv, dump, env=env)[-1])
    # One compilation per distinct batch shape, never per batch: train and dev shapes are the
    # buckets (a bucket's last dev batch is filled up with empty rows), each compiled once per step
    # function (training, validation).
    assert report["shapes_not_buckets"] == 0 and report["train_shapes"] <= report["buckets"], report
    assert 1 < report["compilations"] <= report["train_shapes"] + report["dev_shapes"], report


@pytest.mark.parametrize("precision", ["bfloat16", "float16"])
def test_mixed_precision_trains_and_reloads_in_float32(tmp_path, corpus_tsv, precision):
    class Dtypes(keras.callbacks.Callback):  # what the model that `fit` trains computes in
        def on_train_begin(self, logs=None):
            seen.update(dtypes(self.model))

    def dtypes(model):  # (the functional model's own policy says nothing: its layers compute)
        layers = model._flatten_layers(include_self=False)
        return {
            "compute": {layer.compute_dtype for layer in layers if layer.weights},
            "weights": {w.dtype for w in model.weights},
        }

    seen = {}
    out = str(tmp_path / "run")
    summary = train(
        out,
        "tiny",
        data=corpus_tsv,
        vocab_size=1200,
        steps=2,
        xla=False,
        precision=precision,
        verbose=0,
        callbacks=[Dtypes()],
    )
    assert summary["steps"] == 2 and np.isfinite(summary["loss"]) and summary["precision"] == precision
    assert seen == {"compute": {precision}, "weights": {"float32"}}  # every weighted layer computes in it
    # weights were kept in float32; inference runs in float32
    assert dtypes(run_folder.load(out).model) == {"compute": {"float32"}, "weights": {"float32"}}


def test_auto_precision_measured_at_the_start_trains_as_the_chosen_precision_would(
    tmp_path, corpus_tsv, monkeypatch, caplog
):
    from kformer.train import precision as precision_lib
    from kformer.train import precision_probe

    monkeypatch.setattr(precision_lib, "cpu_flags", lambda: {"avx512_bf16"})  # a CPU where it measures
    monkeypatch.setattr(precision_lib, "onednn_state", lambda: "on")
    monkeypatch.setenv(precision_probe.CACHE_ENV, str(tmp_path / "cache"))
    settings = dict(data=corpus_tsv, vocab_size=1200, steps=2, xla=False, verbose=0)
    with caplog.at_level(logging.INFO, logger="kformer"):
        auto = train(str(tmp_path / "auto"), "tiny", precision="auto", **settings)
    assert "auto: the faster on this CPU (bfloat16 " in caplog.text and "measured now" in caplog.text
    train(str(tmp_path / "chosen"), "tiny", precision=auto["precision"], **settings)
    weights = [
        saved_weights(run_folder.path(str(tmp_path / r), run_folder.MODEL_FILE)) for r in ("auto", "chosen")
    ]
    assert weights[0].keys() == weights[1].keys()
    for name, value in weights[0].items():  # the probe's models drew nothing the run would have drawn
        np.testing.assert_array_equal(value, weights[1][name], err_msg=name)


def test_xla_is_the_default_on_a_gpu_without_a_strategy(monkeypatch):
    import tensorflow as tf

    from kformer.train.fit import default_xla

    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: ["GPU:0"])
    assert default_xla(None) is True
    assert default_xla(tf.distribute.MirroredStrategy(["/cpu:0"])) is False  # Keras' "auto" does the same
    assert default_xla(None, minutes=10) is False  # compiling would take much of it
    assert default_xla(None, minutes=60) is True
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: [])
    assert default_xla(None) is False

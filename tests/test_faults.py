"""Training killed with SIGKILL at random moments, inside checkpoint saves too, then resumed:
nothing older than the last checkpoint is lost, model.keras and training.json always agree, and
the weights equal those of a run that was never interrupted."""

import os
import random
import shutil
import subprocess
import time

import numpy as np
import pytest
from conftest import KFORMER, PYTHON, run_kformer, saved_weights

from kformer import run_folder
from kformer.contracts import TOKENIZER_FILE
from kformer.contracts.run import TrainingState
from kformer.train.fit import train

STEPS = 60
TRAIN = """
import sys
from kformer.train.fit import train
train(sys.argv[1], "tiny", data=sys.argv[2], vocab_size=1200, steps=int(sys.argv[3]), xla=False, verbose=0,
      checkpoint_seconds=0)  # a save after every step: most of the time is spent inside saves
"""
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _saved_step(out):
    model_path = run_folder.path(out, run_folder.MODEL_FILE)
    return int(saved_weights(model_path)["optimizer/vars/0"]) if os.path.exists(model_path) else 0  # the step


def _train_until_killed(out, corpus, moment, rng):
    """Starts training in a subprocess, waits for it to save past where it started, kills it at
    `moment` ("inside a save": while model.tmp.keras is being written; "random": after a random
    delay); returns the step saved just before the kill."""
    started_at = _saved_step(out)
    process = subprocess.Popen(
        [PYTHON, "-c", TRAIN, out, corpus, str(STEPS)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    deadline = time.monotonic() + 300
    while run_folder.read_state(out).steps <= started_at:
        assert process.poll() is None and time.monotonic() < deadline, "training made no progress"
        time.sleep(0.01)
    if moment == "inside a save":
        while not os.path.exists(run_folder.path(out, "model.tmp.keras")) and process.poll() is None:
            time.sleep(0.001)
    else:
        time.sleep(rng.uniform(0.0, 1.5))
    seen = run_folder.read_state(out).steps
    process.kill()
    assert process.wait() != 0, f"training finished its {STEPS} steps before the kill; raise STEPS"
    return seen


@pytest.mark.slow
def test_sigkill_at_random_moments_loses_nothing_and_resumes_exactly(tmp_path, corpus_tsv):
    rng = random.Random(20261123)
    out, whole, whole_at_kill = (str(tmp_path / name) for name in ("killed", "whole", "whole_at_kill"))
    kept = []  # (step, copy of model.keras) after each kill
    for number, moment in enumerate(["inside a save", "random", "inside a save", "random"]):
        seen = _train_until_killed(out, corpus_tsv, moment, rng)
        step = _saved_step(out)
        assert step >= seen, f"kill {number} ({moment}): the checkpoint went back from step {seen} to {step}"
        assert run_folder.read_state(out, steps=step).steps == step  # the state that belongs to the model
        kept.append(
            (step, shutil.copy(run_folder.path(out, run_folder.MODEL_FILE), tmp_path / f"kill{number}.keras"))
        )
    assert kept[-1][0] < STEPS

    args = dict(data=corpus_tsv, vocab_size=1200, xla=False, verbose=0)
    train(out, "tiny", steps=STEPS, **args)  # resume to the end
    step, killed_model = kept[0]
    for reference, steps in ((whole_at_kill, step), (whole, STEPS)):  # fresh models, never killed or stopped
        os.makedirs(reference)
        for name in (
            run_folder.CONFIG_FILE,
            run_folder.RECIPE_FILE,
            TOKENIZER_FILE,
            run_folder.CORPUS_FILE,
        ):
            shutil.copy(run_folder.path(out, name), reference)  # the same tokenizer and corpus
        shutil.copytree(
            run_folder.path(out, run_folder.DATA_DIR), run_folder.path(reference, run_folder.DATA_DIR)
        )
        train(reference, "tiny", steps=steps, **args)
    _assert_same_weights(killed_model, run_folder.path(whole_at_kill, run_folder.MODEL_FILE))
    _assert_same_weights(
        run_folder.path(out, run_folder.MODEL_FILE), run_folder.path(whole, run_folder.MODEL_FILE)
    )


def test_sigterm_saves_the_step_it_stopped_at_and_a_resume_ends_as_if_uninterrupted(tmp_path, corpus_tsv):
    """What a preemptible VM or Kubernetes sends before stopping the machine: `kformer train` saves
    the step it is at (not the last periodic checkpoint), says so in one line, exits 143."""
    out, whole = str(tmp_path / "stopped"), str(tmp_path / "whole")
    command = [*KFORMER, "train", "--config", "tiny", "--data", corpus_tsv]
    command += ["--vocab-size", "1200", "--out", out, "--steps", "3000", "--no-xla", "--save-minutes", "0.02"]
    process = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 300
    while not os.path.exists(run_folder.path(out, run_folder.STATE_FILE)):  # the first save (every 1.2 s)
        assert process.poll() is None and time.monotonic() < deadline, process.stderr.read()[-3000:]
        time.sleep(0.05)
    time.sleep(0.3)  # past that save
    process.terminate()
    stderr = process.communicate(timeout=120)[1]
    assert process.returncode == 143, stderr[-3000:]
    step = run_folder.read_state(out).steps
    assert _saved_step(out) == step and 0 < step < 3000
    assert stderr.rstrip().endswith(
        f"kformer train: stopped by SIGTERM after step {step} (saved model.keras); run the same command to resume"
    )
    assert "Traceback" not in stderr
    args = dict(data=corpus_tsv, vocab_size=1200, xla=False, verbose=0)
    assert train(out, "tiny", steps=step + 10, **args)["steps"] == step + 10  # resumed
    train(whole, "tiny", steps=step + 10, **args)
    _assert_same_weights(
        run_folder.path(out, run_folder.MODEL_FILE), run_folder.path(whole, run_folder.MODEL_FILE)
    )


def _assert_same_weights(path_a, path_b):
    a, b = saved_weights(path_a), saved_weights(path_b)  # model weights and optimizer state (step, moments)
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_allclose(a[name], b[name], atol=1e-6, err_msg=name)


def test_a_save_killed_between_its_two_renames_keeps_the_state_of_the_new_model(tmp_path, monkeypatch):
    import keras

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model_path = str(tmp_path / run_folder.MODEL_FILE)
    run_folder.save(model, model_path, TrainingState(steps=1, seconds=10.0))
    replace = os.replace

    def killed_before_the_state(source, destination):
        if destination.endswith(os.sep + run_folder.STATE_FILE):
            raise SystemExit("SIGKILL")
        replace(source, destination)

    monkeypatch.setattr(run_folder.os, "replace", killed_before_the_state)
    with pytest.raises(SystemExit):
        # after it, model.keras holds step 2
        run_folder.save(model, model_path, TrainingState(steps=2, seconds=20.0))
    monkeypatch.undo()
    assert run_folder.read_state(str(tmp_path)).steps == 1  # training.json was not replaced
    assert run_folder.read_state(str(tmp_path), steps=2) == TrainingState(steps=2, seconds=20.0)
    assert run_folder.read_state(str(tmp_path), steps=1) == TrainingState(steps=1, seconds=10.0)


def test_ctrl_c_stops_after_the_step_saves_it_and_the_same_command_resumes(tmp_path, corpus_tsv):
    """The first Ctrl-C (SIGINT) stops training after the current step with that step saved, one
    line on stderr, exit status 130; the same command continues from it."""
    import signal

    out = str(tmp_path / "run")

    def command(steps):
        return ["train", "--config", "tiny", "--data", corpus_tsv, "--vocab-size", "1200", "--out", out,
                "--steps", str(steps), "--no-xla", "--eval-minutes", "0"]  # fmt: skip

    stdout, stderr = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with open(stdout, "w") as o, open(stderr, "w") as e:
        process = subprocess.Popen([*KFORMER, *command(3000)], cwd=ROOT, stdout=o, stderr=e)
        deadline = time.monotonic() + 300
        while "ms/step" not in stdout.read_text():  # an epoch's progress line: training is under way
            assert process.poll() is None and time.monotonic() < deadline, stderr.read_text()[-3000:]
            time.sleep(0.1)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=120) == 130, stderr.read_text()[-3000:]
    step = run_folder.read_state(out).steps
    assert 0 < step < 3000 and _saved_step(out) == step
    text = stderr.read_text()
    assert f"kformer train: stopped by Ctrl-C after step {step} (saved model.keras); run the same" in text
    assert "Traceback" not in text

    resumed = run_kformer(*command(step + 5), cwd=ROOT, timeout=300)
    assert resumed.status == 0 and f"resuming {out}/model.keras from step {step}" in resumed.stderr
    assert run_folder.read_state(out).steps == step + 5

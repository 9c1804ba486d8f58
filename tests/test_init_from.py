"""kformer train --init-from RUN: fine-tuning starts from RUN's weights, keeps its tokenizer, leaves it untouched."""

import hashlib
import json
import logging
import os
import shutil
import subprocess

import keras
import numpy as np
import pytest
from conftest import PYTHON

from kformer import run_folder
from kformer.data import corpus as corpus_lib
from kformer.train import init_from
from kformer.train.fit import train
from kformer.train.keep_best import Evaluation

ARGS = dict(xla=False, verbose=0, checkpoint_seconds=10**6, evaluation=Evaluation(0))


def digests(folder):
    """{relative path: sha256} of every file under `folder`."""
    found = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, folder)] = hashlib.sha256(f.read()).hexdigest()
    return found


@pytest.fixture(scope="module")
def domain_tsv(tmp_path_factory):
    """Other pairs of the default corpus than the tiny runs' (every ~140th), and a character the
    runs' tokenizer has never seen."""
    pairs, _ = corpus_lib.read_corpus()
    chosen = pairs[7::97][:300] + [("龘龘。", "Dragons.")] * 3
    path = tmp_path_factory.mktemp("domain") / "domain.tsv"
    path.write_text("".join(f"{s}\t{t}\n" for s, t in chosen), encoding="utf-8")
    return str(path)


class WeightsAtStart(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.weights = {v.path: np.array(v) for v in self.model.weights}


class Messages(logging.Handler):
    """kformer's log messages (an in-process `kformer.cli.main` stops them reaching pytest's caplog)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_fine_tuning_starts_from_the_run_and_leaves_it_untouched(tmp_path, trained_dir, domain_tsv):
    before = digests(trained_dir)
    out, start, logged = str(tmp_path / "tuned"), WeightsAtStart(), Messages()
    logger = logging.getLogger("kformer")
    logger.addHandler(logged)
    level, logger.level = logger.level, logging.INFO
    try:
        summary = train(out, data=domain_tsv, init_from=trained_dir, steps=3, callbacks=[start], **ARGS)
    finally:
        logger.removeHandler(logged)
        logger.setLevel(level)
    assert summary["steps"] == 3
    trained = run_folder.load(trained_dir).model
    for variable in trained.weights:
        np.testing.assert_array_equal(start.weights[variable.path], np.array(variable), err_msg=variable.path)
    source, tuned = (run_folder.load(d).config for d in (trained_dir, out))
    assert tuned == source.replace(**init_from.FINE_TUNE)
    with (
        open(os.path.join(out, "tokenizer.model"), "rb") as a,
        open(os.path.join(trained_dir, "tokenizer.model"), "rb") as b,
    ):
        assert a.read() == b.read()
    recorded = json.load(open(os.path.join(out, init_from.INIT_FILE)))
    assert recorded["run"] == os.path.abspath(trained_dir) and recorded["weights"].startswith("model.keras")
    coverage = [m for m in logged.messages if m.startswith("coverage:")]
    assert len(coverage) == 1 and not coverage[0].startswith("coverage: 0.00%")  # the unseen character
    assert train(out, data=domain_tsv, init_from=trained_dir, steps=5, **ARGS)["steps"] == 5  # resumes
    with pytest.raises(ValueError, match="resume it with --init-from"):
        train(out, data=domain_tsv, steps=6, **ARGS)
    assert digests(trained_dir) == before


def test_bad_init_from_is_one_line_and_changes_nothing(tmp_path, trained_dir, domain_tsv, artifacts):
    corrupted = str(tmp_path / "corrupted")
    shutil.copytree(trained_dir, corrupted)
    with open(os.path.join(corrupted, "model.keras"), "wb") as f:
        f.write(b"not a zip file")
    cases = [
        (["--init-from", str(tmp_path / "missing")], "no such folder"),
        (["--init-from", str(tmp_path)], "not a kformer training directory: config.json not found"),
        (["--init-from", artifacts], "is a `kformer export` folder"),
        (["--init-from", corrupted], "model.keras: cannot restore the model"),
        (["--init-from", trained_dir, "--direction", "en-zh"], "translates zh-en; --direction en-zh"),
        (
            ["--init-from", trained_dir, "--config", "small"],
            "changes the model (d_ff 32 -> 512, d_model 16 -> 256",
        ),
        (["--init-from", trained_dir, "--accumulate", "0"], "--accumulate: must be"),
        (["--init-from", trained_dir, "--average", "1.5"], "--average: must be a number in [0, 1)"),
    ]
    before, before_corrupted = digests(trained_dir), digests(corrupted)
    for number, (args, expected) in enumerate(cases):
        out = str(tmp_path / f"out{number}")
        result = subprocess.run(
            [PYTHON, "-m", "kformer.cli", "train", "--data", domain_tsv, "--out", out, "--steps", "1", *args],
            capture_output=True,
            text=True,
            timeout=300,
        )
        lines = result.stderr.strip().splitlines()
        assert result.returncode != 0 and expected in lines[-1], (args, result.stderr[-2000:])
        assert "Traceback" not in result.stderr and not os.path.exists(out), args
    assert digests(trained_dir) == before and digests(corrupted) == before_corrupted

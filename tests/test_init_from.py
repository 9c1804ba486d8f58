"""kformer train --init-from RUN: fine-tuning starts from RUN's weights, keeps its tokenizer, leaves it untouched."""

import csv
import hashlib
import logging
import os
import shutil

import keras
import numpy as np
import pytest
from conftest import run_kformer

from kformer import run_folder
from kformer.contracts.run import INIT_FILE, InitRecord
from kformer.data import corpus as corpus_lib
from kformer.train.fit import train
from kformer.train.options import Evaluation, TrainOptions
from kformer.train.recipe import FINE_TUNE, TrainingRecipe

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


def logged_messages(run):
    """(run()'s result, kformer's log messages while it ran)."""
    logged, logger = Messages(), logging.getLogger("kformer")
    logger.addHandler(logged)
    level = logger.level
    logger.setLevel(logging.INFO)  # setLevel, not `level =`: it clears the logger's cached answers
    try:
        return run(), logged.messages
    finally:
        logger.removeHandler(logged)
        logger.setLevel(level)


def test_fine_tuning_starts_from_the_run_and_leaves_it_untouched(tmp_path, trained_dir, domain_tsv):
    before = digests(trained_dir)
    out, start = str(tmp_path / "tuned"), WeightsAtStart()
    summary, messages = logged_messages(
        lambda: train(out, data=domain_tsv, init_from=trained_dir, steps=3, callbacks=[start], **ARGS)
    )
    assert summary["steps"] == 3
    trained = run_folder.load(trained_dir).model
    for variable in trained.weights:
        np.testing.assert_array_equal(start.weights[variable.path], np.array(variable), err_msg=variable.path)
    source, tuned = (run_folder.load(d).config for d in (trained_dir, out))
    assert tuned == source
    assert TrainingRecipe.of_run(out) == TrainingRecipe.of_run(trained_dir).replace(**FINE_TUNE)
    with (
        open(os.path.join(out, "tokenizer.model"), "rb") as a,
        open(os.path.join(trained_dir, "tokenizer.model"), "rb") as b,
    ):
        assert a.read() == b.read()
    recorded = InitRecord.load(os.path.join(out, INIT_FILE))
    assert recorded.run == os.path.abspath(trained_dir) and recorded.weights.startswith("model.keras")
    coverage = [m for m in messages if m.startswith("coverage:")]
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
        (["--init-from", trained_dir, "--mix-original", "1"], "--mix-original must be a share in [0, 1)"),
        (["--mix-original", "0.5"], "--mix-original draws from the run fine-tuning starts from"),
    ]
    before, before_corrupted = digests(trained_dir), digests(corrupted)
    for number, (args, expected) in enumerate(cases):
        out = str(tmp_path / f"out{number}")
        result = run_kformer("train", "--data", domain_tsv, "--out", out, "--steps", "1", *args, timeout=300)
        lines = result.stderr.strip().splitlines()
        assert result.status != 0 and expected in lines[-1], (args, result.stderr[-2000:])
        assert "Traceback" not in result.stderr and not os.path.exists(out), args
    assert digests(trained_dir) == before and digests(corrupted) == before_corrupted


def _rows(pairs):
    """{(source ids, target ids)} of an ArrayPairs."""
    source, target = (r.to_list() for r in pairs.ragged())
    return {(tuple(s), tuple(t)) for s, t in zip(source, target)}


def test_mixing_draws_its_share_of_pairs_from_the_runs_shards(tmp_path, trained_dir, domain_tsv):
    from kformer.contracts.prepared import PreparedCorpus
    from kformer.data import shards as shards_lib
    from kformer.data.batches import Batching
    from kformer.train.fit import start

    tuned = str(tmp_path / "tuned")
    options = TrainOptions(data=domain_tsv, init_from=trained_dir, mix_original=0.3, steps=1, **ARGS)
    run = start(tuned, options)
    try:
        batching = Batching.of(run.config, TrainingRecipe.of_run(tuned).micro_batch_tokens)
        original_folder = run_folder.prepared_folder(trained_dir)
        manifest = PreparedCorpus.load(original_folder)
        paths = manifest.shard_paths(original_folder)
        original = _rows(shards_lib.read_prepared(paths, manifest.train.dtype, batching))
        new_folder = run_folder.prepared_folder(tuned)
        new_manifest = PreparedCorpus.load(new_folder)
        new_paths = new_manifest.shard_paths(new_folder)
        new = _rows(shards_lib.read_prepared(new_paths, new_manifest.train.dtype, batching))
        counts = {"original": 0, "new": 0}
        for x, labels in run.fit_args["x"].take(400):
            for source, target in zip(x["source_ids"].numpy(), labels.numpy()):
                row = (tuple(int(i) for i in source if i), tuple(int(i) for i in target if i)[:-1])  # EOS off
                assert row in original or row in new, row
                counts["original" if row not in new else "new"] += 1
    finally:
        run.release()
    share = counts["original"] / sum(counts.values())
    assert sum(counts.values()) > 2000 and abs(share - 0.3) < 0.05, counts
    assert run.fit_args["steps_per_epoch"] > 0


@pytest.mark.parametrize("mix_original", [None, 0])
def test_fine_tuning_scores_both_dev_samples_from_the_start(tmp_path, trained_dir, domain_tsv, mix_original):
    out = str(tmp_path / "tuned")
    args = {**ARGS, "evaluation": Evaluation(minutes=0, steps=2, sentences=6), "mix_original": mix_original}
    summary = train(out, data=domain_tsv, init_from=trained_dir, steps=4, **args)
    assert set(summary["dev_bleu"]) == {"dev", "original"}
    with open(os.path.join(out, "logs", "evaluations.csv")) as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == [0, 2, 4]
    assert all(float(r["original_bleu"]) >= 0 and float(r["bleu"]) >= 0 for r in rows)
    assert summary["dev_bleu"]["original"]["start"] == float(rows[0]["original_bleu"])
    assert summary["dev_bleu"]["dev"]["end"] == float(rows[-1]["bleu"])
    with pytest.raises(ValueError, match="started mixing in"):  # its saved batch position is of that mix
        train(out, data=domain_tsv, init_from=trained_dir, steps=6, **{**args, "mix_original": 0.25})


def test_fine_tuning_without_the_runs_corpus_trains_on_the_new_one_and_says_so(
    tmp_path, trained_dir, domain_tsv
):
    moved = str(tmp_path / "run")
    shutil.copytree(trained_dir, moved)
    shutil.rmtree(run_folder.prepared_folder(moved))
    summary, messages = logged_messages(
        lambda: train(str(tmp_path / "tuned"), data=domain_tsv, init_from=moved, steps=2, **ARGS)
    )
    assert summary["steps"] == 2
    assert any("its prepared corpus" in m and "is gone" in m for m in messages), messages


def _scripted(monkeypatch, bleu, loss):
    """Each evaluation's scores from `bleu(n)` and `loss(n)`, n its number from 1 (two dev samples
    an evaluation: the kept-by one first); returns the list of scored samples."""
    from kformer.train import keep_best

    scored = []

    def score(translations, references, language):
        scored.append(len(scored))
        return {"bleu": bleu((len(scored) + 1) // 2), "chrf": 50.0}

    monkeypatch.setattr(keep_best.evaluate_lib, "score", score)
    monkeypatch.setattr(
        keep_best.judge_lib, "mean_token_loss", lambda model, batches: loss((len(scored) + 1) // 2)
    )
    return scored


@pytest.mark.parametrize("judge", ["loss", "bleu"])
def test_a_fine_tune_whose_start_scores_best_says_so_in_its_last_lines(
    tmp_path, trained_dir, domain_tsv, monkeypatch, judge
):
    """The judged score is best at step 0 (the other score says otherwise): best.weights.h5 is
    the start, and the run ends saying so, and that --weights last holds what it learned; readers
    describe it too."""
    scored = _scripted(
        monkeypatch,
        bleu=lambda n: (50.0 if n == 1 else 10.0) if judge == "bleu" else 10.0 * n,
        loss=lambda n: (1.0 if n == 1 else 2.0) if judge == "loss" else 3.0 - n,
    )
    out = str(tmp_path / "tuned")
    evaluation = Evaluation(minutes=0, steps=2, sentences=6, judge=None if judge == "loss" else judge)
    summary, messages = logged_messages(
        lambda: train(
            out, data=domain_tsv, init_from=trained_dir, steps=4, **{**ARGS, "evaluation": evaluation}
        )
    )
    assert summary["best"]["step"] == 0 and summary["best"]["judge"] == judge and len(scored) == 6
    warning = next(m for m in messages if m.startswith("best.weights.h5 holds the weights this run started"))
    kept = "dev loss 1.0000 (dev sample BLEU 10.00)" if judge == "loss" else "dev sample BLEU 50.00"
    last = "dev loss 2.0000 (dev sample BLEU 30.00)" if judge == "loss" else "dev sample BLEU 10.00"
    assert f"{kept} (6 sentences; the last: {last})" in warning and "--weights last" in warning
    described = run_folder.describe_weights(out, run_folder.weights_file(out))
    assert f"kept by its {kept}: the weights this fine-tune started from" in described
    evaluated = run_kformer("evaluate", "--model", out, "--limit", "2")
    assert "the weights this fine-tune started from" in evaluated.stdout + evaluated.stderr


def test_a_fine_tune_that_gains_says_which_weights_readers_take(
    tmp_path, trained_dir, domain_tsv, monkeypatch
):
    """The loss falls at each evaluation while BLEU on the sample does not move: a fine-tune keeps
    its last evaluation's weights (by default, by the loss), and says which weights readers take."""
    _scripted(monkeypatch, bleu=lambda n: 20.0, loss=lambda n: 3.0 - n)
    args = {**ARGS, "evaluation": Evaluation(minutes=0, steps=2, sentences=6)}
    out = str(tmp_path / "tuned")
    summary, messages = logged_messages(
        lambda: train(out, data=domain_tsv, init_from=trained_dir, steps=4, **args)
    )
    assert summary["best"]["step"] == 4 and summary["best"]["loss"] == 0.0
    assert not [m for m in messages if "this run started from" in m]
    assert any(
        m.startswith("readers take best.weights.h5 (step 4, kept by its dev loss 0.0000") for m in messages
    ), messages[-8:]
    assert any(m.endswith("the best by the whole dev split's loss of 3 evaluations") for m in messages)
    assert any(m.startswith("3 evaluations of the dev sample took ") for m in messages)


def test_a_short_run_evaluates_at_fractions_of_its_budget(tmp_path, trained_dir, domain_tsv):
    """A time budget under BUDGET_EVALUATIONS times --eval-minutes is evaluated every
    1/BUDGET_EVALUATIONS of it: a fine-tune of a few minutes scores its dev sample while it trains."""
    from kformer.train.options import BUDGET_EVALUATIONS

    assert Evaluation(minutes=5).within(3).minutes == 3 / BUDGET_EVALUATIONS
    assert Evaluation(minutes=5).within(60).minutes == 5  # a long run keeps --eval-minutes
    assert Evaluation(minutes=5).within(None).minutes == 5  # no time budget
    assert Evaluation(minutes=5, steps=7).within(3) == Evaluation(minutes=5, steps=7)  # the user's steps
    assert not Evaluation(minutes=0).within(3).on  # off stays off
    out = str(tmp_path / "tuned")
    args = {**ARGS, "evaluation": Evaluation(minutes=5, sentences=6)}
    train(out, data=domain_tsv, init_from=trained_dir, minutes=0.4, **args)
    with open(os.path.join(out, "logs", "evaluations.csv")) as f:
        steps = [int(r["step"]) for r in csv.DictReader(f)]
    assert steps[0] == 0 and len(steps) >= 3, steps  # the start, during the run, its end

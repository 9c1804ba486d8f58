"""Keeping the best weights during training (kformer.train.keep_best), early stopping, and readers' choice."""

import csv
import itertools
import os

import keras
import numpy as np
import pytest

from kformer import evaluate, run_folder
from kformer.contracts.run import BEST_FILE, BestRecord
from kformer.data import prepare
from kformer.decode.options import SearchOptions
from kformer.export.formats import open_runner
from kformer.train.callbacks import steps_done
from kformer.train.fit import train
from kformer.train.options import Evaluation

ARGS = dict(vocab_size=1200, xla=False, verbose=0, checkpoint_seconds=10**6)


class WeightsAt(keras.callbacks.Callback):
    """The raw weights after each optimizer step (listed first, it runs before the evaluation)."""

    def __init__(self):
        super().__init__()
        self.at = {}

    def on_train_batch_end(self, batch, logs=None):
        self.at[steps_done(self.model)] = [np.array(v) for v in self.model.trainable_variables]


def _weights(model):
    return [np.array(v) for v in model.trainable_variables]


def test_the_best_is_kept_training_stops_early_and_readers_take_it(tmp_path, corpus_tsv, monkeypatch):
    scripted = iter([10.0, 12.0, 11.0, 11.5, 99.0])  # BLEU of the evaluations at steps 2, 4, 6, 8
    real_score = evaluate.score

    def score(hypotheses, references, language):
        assert len(hypotheses) == len(references) > 0 and language == "en"
        return {**real_score(hypotheses, references, language), "bleu": next(scripted)}

    monkeypatch.setattr(evaluate, "score", score)
    out, recorded = str(tmp_path / "run"), WeightsAt()
    summary = train(
        out,
        "tiny",
        data=corpus_tsv,
        steps=30,
        evaluation=Evaluation(steps=2, early_stop=2),
        callbacks=[recorded],
        **ARGS,
    )
    assert summary["steps"] == 8 and "--early-stop 2" in summary["stopped"]
    assert summary["evaluations"] == 4 and summary["best"]["step"] == 4 and summary["best"]["bleu"] == 12.0
    with open(os.path.join(out, "logs", "evaluations.csv")) as f:
        rows = list(csv.DictReader(f))
    assert [(r["step"], float(r["bleu"]), r["best"]) for r in rows] == [
        ("2", 10.0, "True"),
        ("4", 12.0, "True"),
        ("6", 11.0, "False"),
        ("8", 11.5, "False"),
    ]
    assert BestRecord.load(os.path.join(out, BEST_FILE)).evaluations_since == 2
    assert os.listdir(os.path.join(out, "logs", "dev_sample"))  # TensorBoard events
    best, last = run_folder.load(out).model, run_folder.load(out, "last").model
    for kept, expected in zip(_weights(best), recorded.at[4]):
        np.testing.assert_array_equal(kept, expected)
    for kept, expected in zip(_weights(last), recorded.at[8]):
        np.testing.assert_array_equal(kept, expected)
    assert run_folder.describe_weights(out, run_folder.weights_file(out)).startswith(
        "best.weights.h5 (step 4"
    )


def test_the_scores_kept_are_those_of_the_weights_kept(tmp_path, corpus_tsv):
    out = str(tmp_path / "run")
    evaluation = Evaluation(steps=3, sentences=5)
    summary = train(out, "tiny", data=corpus_tsv, steps=6, evaluation=evaluation, **ARGS)
    best = summary["best"]
    # kformer evaluate on the same 5 dev sources, greedy, with the weights it picks: the same scores.
    sources, references = evaluate.split_references(out, "dev")
    runner = open_runner(out, options=SearchOptions(beam_size=1))
    again = evaluate.evaluate(runner, sources[:5], references[:5], output=str(tmp_path / "hyp.txt"))
    assert again["sentences"] == 5 and again["chrf"] == pytest.approx(best["chrf"], abs=1e-6)
    assert again["bleu"] == pytest.approx(best["bleu"], abs=1e-6)


def test_early_stop_without_evaluations_is_one_line(tmp_path, corpus_tsv):
    with pytest.raises(
        ValueError, match="--early-stop needs dev sample evaluations, but evaluations are off"
    ):
        train(
            str(tmp_path / "a"),
            "tiny",
            data=corpus_tsv,
            steps=2,
            evaluation=Evaluation(0, early_stop=2),
            **ARGS,
        )
    no_dev = str(tmp_path / "no-dev")
    prepare.prepare(corpus_tsv, no_dev, prepare.PrepareOptions(vocab_size=1200, split_size=0))
    with pytest.raises(ValueError, match="has no dev split"):
        train(str(tmp_path / "b"), "tiny", data=no_dev, steps=2, evaluation=Evaluation(early_stop=2), **ARGS)
    assert not os.path.exists(tmp_path / "a") and not os.path.exists(tmp_path / "b")


def _dev_batches(run, pairs, batch_tokens, pad_to_bucket=False):
    from kformer.data import batches as batches_lib

    batching = batches_lib.Batching.of(run.config, batch_tokens)
    encoded = batches_lib.encode_pairs(run.tokenizer, pairs, batching)
    return batches_lib.make_dataset(encoded, batching, training=False, pad_to_bucket=pad_to_bucket)


def _numpy_mean_loss(run, pairs):
    """The mean token cross-entropy of `pairs`, one pair at a time (no padding), in float64 numpy."""
    total, tokens = 0.0, 0
    for source, target in pairs:
        source_ids, target_ids = run.tokenizer.encode(source), run.tokenizer.encode(target)
        x = {"source_ids": np.array([source_ids]), "target_ids": np.array([[run.config.bos_id, *target_ids]])}
        logits = np.asarray(run.model(x, training=False), np.float64)[0]
        logits -= logits.max(-1, keepdims=True)
        log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        labels = [*target_ids, run.config.eos_id]
        total -= log_probs[np.arange(len(labels)), labels].sum()
        tokens += len(labels)
    return total / tokens


def test_the_dev_loss_is_the_mean_cross_entropy_of_every_dev_token(trained_dir):
    """What the loss judge scores: every target token of the dev split, padded batches or not."""
    from kformer.train.judge import mean_token_loss

    run = run_folder.load(trained_dir)
    pairs = prepare.held_out(run_folder.prepared_folder(trained_dir), "dev")[:40]
    expected = _numpy_mean_loss(run, pairs)
    for batch_tokens, padded in ((64, False), (4096, False), (4096, True)):  # small batches, large, padded
        batches = _dev_batches(run, pairs, batch_tokens, padded)
        assert mean_token_loss(run.model, batches) == pytest.approx(expected, rel=1e-5)


def test_the_loss_judge_keeps_the_better_of_two_models_a_known_distance_apart(tmp_path, corpus_tsv):
    """The weights of one run 10, 20 and 40 steps in (early on, each better than the last): the
    loss ranks them in that order, and keep-best's rule keeps the better whichever comes first."""
    from kformer.train import judge

    out, recorded = str(tmp_path / "run"), WeightsAt()
    train(out, "tiny", data=corpus_tsv, steps=40, evaluation=Evaluation(0), callbacks=[recorded], **ARGS)
    run = run_folder.load(out)
    batches = _dev_batches(run, prepare.held_out(run_folder.prepared_folder(out), "dev"), 4096)
    losses = []
    for step in (10, 20, 40):
        for variable, value in zip(run.model.trainable_variables, recorded.at[step]):
            variable.assign(value)
        losses.append(judge.mean_token_loss(run.model, batches))
    assert losses[0] > losses[1] > losses[2], losses
    same_bleu = {"bleu": 10.0, "chrf": 10.0}
    for worse, better in itertools.pairwise(losses):
        assert judge.beats(
            "loss", {**same_bleu, "loss": better}, BestRecord(0, **same_bleu, loss=worse, judge="loss")
        )
        assert not judge.beats(
            "loss", {**same_bleu, "loss": worse}, BestRecord(0, **same_bleu, loss=better, judge="loss")
        )
    assert judge.beats(
        "loss", {**same_bleu, "loss": losses[0]}, BestRecord(0, 99.0, 99.0)
    )  # kept by BLEU: anew

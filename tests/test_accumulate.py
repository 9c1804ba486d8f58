"""Gradient accumulation (--accumulate N): N batches make the update of their union, steps count updates."""

import os
import re

import numpy as np
import pytest

from kformer import run_folder
from kformer.model.config import preset
from kformer.model.transformer import Transformer
from kformer.train.callbacks import batches_done, steps_done
from kformer.train.fit import compile_model, train
from kformer.train.recipe import TrainingRecipe, recipe

VOCAB = 50


def _batch(rng, rows, length=6):
    """Rows without padding: each batch then has the same number of target tokens, and the mean
    loss of a union is the mean of its halves' mean losses."""
    source = rng.integers(4, VOCAB, size=(rows, length)).astype("int32")
    target = rng.integers(4, VOCAB, size=(rows, length)).astype("int32")
    labels = np.concatenate([target[:, 1:], np.full((rows, 1), 3, "int32")], axis=1)
    return {"source_ids": source, "target_ids": target}, labels


def _half(batch, part):
    x, y = batch
    return {k: v[part] for k, v in x.items()}, y[part]


def _assert_close_but_for_rounding(got, want, name):
    """Within 2e-4 (steps are ~0.1), but for a few elements: near-zero gradients (embedding rows
    that the batches barely touch) make Adam's step follow the rounding of a sum's order, which
    moved 3 of 800 embedding values by up to 1.1e-3 in one run of many. Summing the halves wrong
    moves most elements by a step's size."""
    off = ~np.isclose(got, want, rtol=0, atol=2e-4)
    assert off.mean() <= 0.01 and np.abs(got - want).max() < 1e-2, (
        f"{name}: {off.sum()} of {off.size} values apart, by up to {np.abs(got - want).max():.2e}"
    )


def test_n_batches_make_the_update_of_their_union(tmp_path):
    # The paper's schedule with a short warm-up changes the rate every step, and an average with a
    # low momentum moves far each update: counting batches instead of updates would show in both.
    config = preset("tiny", vocab_size=VOCAB)
    tiny = recipe("tiny", schedule="noam", warmup_steps=3, ema_momentum=0.5)
    reference = Transformer(config)
    rng = np.random.default_rng(0)
    unions = [_batch(rng, 8) for _ in range(3)]
    reference(unions[0][0])
    models = {}
    for n in (1, 2, 4):
        model = Transformer(config)
        model(unions[0][0])
        model.set_weights(reference.get_weights())
        models[n] = compile_model(model, model.config, tiny.replace(accumulate_steps=n), xla=False)
        for union in unions:
            for part in range(n):
                models[n].train_on_batch(*_half(union, slice(part * 8 // n, (part + 1) * 8 // n)))
    for n in (2, 4):
        assert steps_done(models[n]) == 3 and batches_done(models[n]) == 3 * n
        assert float(models[n].optimizer.learning_rate) == float(models[1].optimizer.learning_rate)
        averages = [m.optimizer._model_variables_moving_average for m in (models[1], models[n])]
        pairs = [*zip(models[1].trainable_variables, models[n].trainable_variables), *zip(*averages)]
        for a, b in pairs:
            if re.search("key.bias", a.path):
                # Softmax ignores a shift of all scores, so these gradients are 0 but for rounding;
                # Adam's step, ~lr * sign(gradient), follows the rounding's sign. Not compared.
                continue
            _assert_close_but_for_rounding(np.array(a), np.array(b), f"N={n} {a.path}")
    moved = max(np.abs(a - b).max() for a, b in zip(reference.get_weights(), models[1].get_weights()))
    assert moved > 1e-3


def test_train_with_accumulate_counts_updates_and_resumes(tmp_path, corpus_tsv):
    out = str(tmp_path / "run")
    args = dict(data=corpus_tsv, vocab_size=1200, xla=False, verbose=0, accumulate=2)
    summary = train(out, "tiny", steps=3, **args)
    assert summary["steps"] == run_folder.read_state(out).steps == 3
    trained = TrainingRecipe.of_run(out)
    assert trained.accumulate_steps == 2 and trained.batch_tokens == recipe("tiny").batch_tokens
    assert train(out, "tiny", steps=5, **args)["steps"] == 5
    assert os.path.exists(os.path.join(out, "model.keras"))


def test_a_time_budget_counts_updates_with_accumulation(tmp_path, corpus_tsv, monkeypatch):
    import sys
    import types

    from test_train import StepClock

    clock = StepClock(0.25)  # a batch each 0.25 s: with 2 batches an update, 2 updates/s, 60 in 30 s
    monkeypatch.setattr(
        sys.modules["kformer.train.callbacks"], "time", types.SimpleNamespace(monotonic=clock.monotonic)
    )
    out = str(tmp_path / "run")
    args = dict(data=corpus_tsv, vocab_size=1200, xla=False, verbose=0, accumulate=2, callbacks=[clock])
    summary = train(out, "tiny", minutes=0.5, recipe_changes={"schedule": "budget"}, **args)
    state = run_folder.read_state(out)
    assert summary["steps"] == state.steps == 60 and summary["steps_per_s"] == pytest.approx(2, rel=0.02)
    assert state.schedule["total_steps"] == pytest.approx(60, abs=1)

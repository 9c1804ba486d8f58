import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

from kformer import plots  # noqa: E402


@pytest.fixture()
def no_cjk_font(monkeypatch):
    monkeypatch.setattr(plots, "cjk_font", lambda: None)


def test_token_labels_fall_back_to_code_points_without_a_cjk_font(no_cjk_font):
    assert plots.token_labels(["▁我們", "try", "▁", "Tom汤"]) == ["U+6211 U+5011", "try", "␣", "Tom U+6C64"]


def test_token_labels_keep_characters_with_a_cjk_font(monkeypatch):
    monkeypatch.setattr(plots, "cjk_font", lambda: "Noto Sans CJK SC")
    assert plots.token_labels(["▁我們", "!"]) == ["我們", "!"]


def test_positional_encoding_figure_shows_both_layouts():
    fig = plots.positional_encoding_figure(length=20, d_model=8)
    interleaved, concatenated = [ax.images[0].get_array() for ax in fig.axes[:2]]
    angles = np.arange(20)[:, None] / 10000 ** (
        np.arange(0, 8, 2)[None, :] / 8
    )  # the paper's pos / 10000^(2i/d)
    np.testing.assert_allclose(interleaved[:, 0::2], np.sin(angles), atol=1e-6)
    np.testing.assert_allclose(interleaved[:, 1::2], np.cos(angles), atol=1e-6)
    np.testing.assert_allclose(concatenated, np.concatenate([np.sin(angles), np.cos(angles)], 1), atol=1e-6)
    assert fig.axes[0].get_ylabel() == "position" and fig.axes[0].get_xlabel() == "dimension"


def test_mask_and_attention_figures(no_cjk_font):
    assert np.array_equal(plots.mask_figure(5).axes[0].images[0].get_array(), np.tril(np.ones((5, 5), bool)))
    weights = np.random.default_rng(0).dirichlet(np.ones(3), size=(2, 4))  # (H=2, Tq=4, Tk=3)
    fig = plots.attention_figure(weights, ["a", "b", "c", "d"], ["我", "x", "y"], title="t")
    shown = [ax for ax in fig.axes if ax.images]
    assert len(shown) == 2 and np.allclose(shown[1].images[0].get_array(), weights[1])
    assert [t.get_text() for t in shown[0].get_xticklabels()] == ["U+6211", "x", "y"]
    assert "no CJK font" in fig._suptitle.get_text()


def test_alignment_figure_labels_source_and_generated_tokens(tmp_path):
    weights = np.eye(3)[:2]
    fig = plots.alignment_figure(weights, ["▁a", "b", "c"], ["x", "</s>"])
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "b", "c"]
    assert ax.get_xlabel() == "source token" and ax.get_ylabel() == "generated token"
    fig.savefig(tmp_path / "a.png")
    assert (tmp_path / "a.png").stat().st_size > 1000


def test_beam_trace_history_and_bar_figures(tmp_path):
    steps = [[(["▁a"], -0.5), (["▁b"], -1.0)], [(["▁a", "b"], -1.2)]]
    fig = plots.beam_trace_figure(steps)
    assert len(fig.axes[0].texts) == 3 and "-1.20" in fig.axes[0].texts[2].get_text()
    history = tmp_path / "history.csv"
    history.write_text(
        "epoch,loss,token_accuracy,val_loss,val_token_accuracy\n0,5,0.1,4,0.2\n1,4,0.2,3.5,0.3\n"
    )
    fig = plots.history_figure(str(history))
    assert [len(ax.lines) for ax in fig.axes] == [2, 2]
    fig = plots.bar_figure({"tflite": 10.0, "onnx": 20.0}, "ms", "latency")
    assert [p.get_height() for p in fig.axes[0].patches] == [10.0, 20.0]


def test_alignment_and_attention_command(trained_dir, tmp_path, capsys):
    from kformer import run_folder
    from kformer.cli import main
    from kformer.decode.options import SearchOptions
    from kformer.decode.translator import KerasRunner

    run = run_folder.load(trained_dir)
    model, config, tokenizer = run.model, run.config, run.tokenizer
    # Without the repeat guard, so that the search's output is the model's own argmax at every step.
    runner = KerasRunner(model, tokenizer, SearchOptions(beam_size=2, no_repeat_ngram=0))
    result = plots.alignment(runner, "我們試試看！", options=SearchOptions(beam_size=1))
    assert result["weights"].shape == (len(result["target"]), len(result["source"]))
    np.testing.assert_allclose(result["weights"].sum(-1), 1, atol=1e-5)  # every row attends to the source
    # Row t must be the decoder position that produced target[t]: the full model, fed the same
    # decoder input in one pass (no search, no cache), predicts exactly the target pieces.
    source = [tokenizer.encode("我們試試看！")]
    target = [tokenizer.piece_to_id(p) for p in result["target"]]
    assert [tokenizer.id_to_piece(i) for i in source[0]] == result["source"]
    decoder_input = [[config.bos_id] + target[:-1]]
    assert [tokenizer.id_to_piece(i) for i in decoder_input[0]] == result["decoder_input"]
    logits = model({"source_ids": np.array(source, "int32"), "target_ids": np.array(decoder_input, "int32")})
    assert list(np.argmax(np.asarray(logits)[0], -1)) == target
    cross = model.attention_weights(np.array(source, "int32"), np.array(decoder_input, "int32"))["cross"][-1]
    np.testing.assert_allclose(result["weights"], np.asarray(cross)[0].mean(0), atol=1e-6)  # for that input
    out = tmp_path / "align.png"
    assert main(["attention", "--model", trained_dir, "--out", str(out), "--beam", "2", "我們試試看！"]) == 0
    assert out.stat().st_size > 1000 and "wrote" in capsys.readouterr().out


def test_beam_trace_starts_from_the_models_own_top_first_tokens(trained_dir):
    from kformer import run_folder
    from kformer.decode.options import SearchOptions
    from kformer.decode.translator import KerasRunner

    run = run_folder.load(trained_dir)
    model, config, tokenizer = run.model, run.config, run.tokenizer
    steps = plots.beam_trace(KerasRunner(model, tokenizer, SearchOptions(beam_size=3)), "我們試試看！")
    assert steps and all(len(pieces) == step + 1 for step, alive in enumerate(steps) for pieces, _ in alive)
    assert all(
        len(alive) <= 3 and [p for _, p in alive] == sorted((p for _, p in alive), reverse=True)
        for alive in steps
    )
    # Step 0, computed here in one pass of the full model: the 3 most probable first tokens other than EOS.
    logits = model(
        {
            "source_ids": np.array([tokenizer.encode("我們試試看！")], "int32"),
            "target_ids": np.array([[config.bos_id]], "int32"),
        }
    )
    log_probs = np.asarray(logits)[0, 0] - np.log(np.exp(np.asarray(logits)[0, 0]).sum())
    log_probs[config.eos_id] = -np.inf
    top = np.argsort(-log_probs)[:3]
    assert [pieces[0] for pieces, _ in steps[0]] == [tokenizer.id_to_piece(int(i)) for i in top]
    np.testing.assert_allclose([p for _, p in steps[0]], log_probs[top], atol=1e-4)

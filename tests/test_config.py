import json

import pytest

from kformer.model.config import PRESETS, ModelConfig, preset
from kformer.model.transformer import Transformer
from kformer.train.recipe import RECIPES, TrainingRecipe, recipe


def test_json_round_trip(tmp_path):
    config = preset("small", vocab_size=1234, activation="gelu", norm_position="pre")
    path = str(tmp_path / "config.json")
    config.save(path)
    assert ModelConfig.load(path) == config
    assert json.loads(open(path).read())["vocab_size"] == 1234


def test_presets_are_valid_and_base_matches_paper():
    base = PRESETS["base"]
    assert (
        base.num_encoder_layers,
        base.d_model,
        base.d_ff,
        base.num_heads,
        base.head_size,
        base.dropout,
    ) == (6, 512, 2048, 8, 64, 0.1)
    big = PRESETS["big"]
    assert (big.d_model, big.d_ff, big.num_heads, big.dropout) == (1024, 4096, 16, 0.3)


def expected_parameters(c):
    """Counted by hand: tied embedding V*d; attention Q, K, V, O projections with biases; LayerNorm
    scale and offset; feed-forward d->f->d with biases. Post-LN has no final LayerNorm."""
    d, f = c.d_model, c.d_ff
    attention, norm, feed_forward = 4 * (d * d + d), 2 * d, d * f + f + f * d + d
    encoder_layer = attention + feed_forward + 2 * norm
    decoder_layer = 2 * attention + feed_forward + 3 * norm
    return c.vocab_size * d + c.num_encoder_layers * encoder_layer + c.num_decoder_layers * decoder_layer


@pytest.mark.parametrize("name, paper_millions", [("base", 65), ("big", 213), ("tiny", None)])
def test_parameter_counts_are_exact_and_match_table_3(name, paper_millions):
    # A shared 37,000-token vocabulary (tied embeddings), as in the paper.
    config = preset(name, vocab_size=37000)
    count = Transformer(config).count_params()
    assert count == expected_parameters(config)
    if paper_millions:  # Table 3 rounds: base 63.08M is listed as 65M, big 214.2M as 213M
        assert round(count / 1e6, 1) == {"base": 63.1, "big": 214.2}[name]


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(d_model=10, num_heads=3), "divisible"),
        (dict(dropout=1.5), "dropout"),
        (dict(norm_position="middle"), "norm_position"),
        (dict(activation="tanh"), "activation"),
        (dict(vocab_size=3), "special ids"),
        (dict(pad_id=5), "pad_id"),
        (dict(d_model="16"), 'd_model must be int, got "16"'),
        (dict(tie_embeddings=1), "tie_embeddings must be bool, got 1"),
        (dict(num_heads=2.0), "num_heads must be int, got 2.0"),
    ],
)
def test_invalid_config_is_a_clear_error(changes, message):
    with pytest.raises(ValueError, match=message):
        preset("tiny", **changes)


def test_unknown_keys_and_bad_json_name_the_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**preset("tiny").to_dict(), "hidden_size": 3}))
    with pytest.raises(ValueError, match=r"config\.json.*hidden_size"):
        ModelConfig.load(str(path))
    path.write_text(json.dumps({**preset("tiny").to_dict(), "d_model": "16"}))
    with pytest.raises(ValueError, match=r"config\.json: d_model must be int"):
        ModelConfig.load(str(path))
    path.write_text("{not json")
    with pytest.raises(ValueError, match=r"config\.json: not valid JSON"):
        ModelConfig.load(str(path))


def test_unknown_preset():
    with pytest.raises(ValueError, match="unknown config preset"):
        preset("huge")


def test_every_preset_has_a_recipe_and_the_recipes_are_the_papers_where_they_say_so():
    assert set(RECIPES) == set(PRESETS)
    assert (RECIPES["base"].schedule, RECIPES["base"].warmup_steps, RECIPES["base"].batch_tokens) == (
        "noam",
        4000,
        25000,
    )
    assert RECIPES["base"].label_smoothing == 0.1
    assert recipe("small", batch_tokens=2048, accumulate_steps=4).micro_batch_tokens == 512


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(schedule="cosine"), "schedule must be one of"),
        (dict(learning_rate=2.0), "learning_rate must be in"),
        (dict(ema_momentum=1.0), "ema_momentum must be in"),
        (dict(batch_tokens=0), "batch_tokens must be >= 1"),
        (dict(label_smoothing=True), "label_smoothing must be int or float, got true"),
    ],
)
def test_invalid_recipe_is_a_clear_error(changes, message):
    with pytest.raises(ValueError, match=message):
        recipe("tiny", **changes)


def test_the_recipe_is_saved_apart_from_the_model(tmp_path):
    path = str(tmp_path / "recipe.json")
    recipe("small").save(path)
    assert TrainingRecipe.load(path) == recipe("small")
    assert set(json.loads(open(path).read())).isdisjoint(preset("small").to_dict())


def test_a_decoder_may_start_from_its_pad_token_and_its_first_key_is_attended():
    """Marian's decoder starts from the pad token: bos_id may be pad_id (never unk or eos), and
    the training masks then let every target position attend to position 0."""
    import numpy as np

    from kformer.model.transformer import AttentionMasks

    config = preset("tiny", bos_id=0)
    assert config.starts_with_pad
    with pytest.raises(ValueError, match="special ids"):
        preset("tiny", bos_id=3)  # eos
    target = np.array([[0, 5, 6, 0]])  # start (pad), two tokens, padding
    masks = AttentionMasks(0, starts_with_pad=True)(np.array([[4, 5]]), target)
    decoder = np.asarray(masks["decoder"])[0]
    assert decoder[:, 0].all() and not decoder[:, 3].any() and decoder[2, :3].all()


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(positions="spiral"), "positions must be one of"),
        (dict(layer_norm_epsilon=0.0), "layer_norm_epsilon"),
    ],
)
def test_the_family_fields_are_checked(changes, message):
    with pytest.raises(ValueError, match=message):
        preset("tiny", **changes)

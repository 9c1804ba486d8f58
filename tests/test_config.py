import json

import pytest

from kformer.config import PRESETS, TransformerConfig, preset
from kformer.model import Transformer


def test_json_round_trip(tmp_path):
    config = preset("small", vocab_size=1234, activation="gelu", norm_position="pre")
    path = str(tmp_path / "config.json")
    config.save(path)
    assert TransformerConfig.load(path) == config
    assert json.loads(open(path).read())["vocab_size"] == 1234


def test_presets_are_valid_and_base_matches_paper():
    base = PRESETS["base"]
    assert (base.num_encoder_layers, base.d_model, base.d_ff, base.num_heads, base.head_size, base.dropout) == (
        6, 512, 2048, 8, 64, 0.1)
    big = PRESETS["big"]
    assert (big.d_model, big.d_ff, big.num_heads, big.dropout) == (1024, 4096, 16, 0.3)


@pytest.mark.parametrize("name, paper_millions", [("base", 65), ("big", 213)])
def test_parameter_counts_match_table_3(name, paper_millions):
    # Table 3 counts with a shared 37,000-token vocabulary (tied embeddings).
    model = Transformer(preset(name, vocab_size=37000))
    millions = model.count_params() / 1e6
    assert abs(millions - paper_millions) / paper_millions < 0.05, millions


@pytest.mark.parametrize("changes, message", [
    (dict(d_model=10, num_heads=3), "divisible"),
    (dict(dropout=1.5), "dropout"),
    (dict(norm_position="middle"), "norm_position"),
    (dict(activation="tanh"), "activation"),
    (dict(vocab_size=3), "special ids"),
    (dict(pad_id=5), "pad_id"),
])
def test_invalid_config_is_a_clear_error(changes, message):
    with pytest.raises(ValueError, match=message):
        preset("tiny", **changes)


def test_unknown_keys_and_bad_json_name_the_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**preset("tiny").to_dict(), "hidden_size": 3}))
    with pytest.raises(ValueError, match=r"config\.json.*hidden_size"):
        TransformerConfig.load(str(path))
    path.write_text("{not json")
    with pytest.raises(ValueError, match=r"config\.json: not valid JSON"):
        TransformerConfig.load(str(path))


def test_unknown_preset():
    with pytest.raises(ValueError, match="unknown config preset"):
        preset("huge")

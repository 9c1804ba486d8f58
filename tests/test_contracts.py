"""The on-disk contracts (kformer.contracts): each record reads what it writes, refuses a
malformed file with one line naming the file and field, and reads the files older kformers wrote."""

import json

import pytest

from kformer.contracts import digests
from kformer.contracts.export import ArtifactError, ExportManifest
from kformer.contracts.pair import LanguagePair, language_name
from kformer.contracts.prepared import PreparedCorpus
from kformer.contracts.run import BestRecord, CorpusRecord, InitRecord, RunError, TrainingState
from kformer.model.config import LEGACY_RECIPE_KEYS, ModelConfig, preset
from kformer.train.recipe import TrainingRecipe, recipe


def legacy(training_recipe):
    """The recipe's fields an older config.json held (those it had then, not those added since)."""
    return {k: v for k, v in training_recipe.to_dict().items() if k in LEGACY_RECIPE_KEYS}


# A manifest.json as kformer wrote it before the recipe left the model's config (export format 3).
OLD_MANIFEST = {
    "kformer_export": 3,
    "config": {**preset("tiny", vocab_size=1200).to_dict(), **legacy(recipe("tiny"))},
    "beam_size": 3,
    "alpha": 0.6,
    "max_length": 20,
    "no_repeat_ngram": 4,
    "tokenizer": {"file": "tokenizer.model", "sha256": "ab", "vocab_size": 1200},
    "inputs": {"alpha": {"dtype": "float32", "shape": [], "default": 0.6, "searches": ["beam"]}},
    "artifacts": [
        {
            "file": "onnx/fp32",
            "format": "onnx",
            "variant": "fp32",
            "bytes": 10,
            "seconds": 1.5,
            "sha256": "cd",
            "files": {"greedy": {"file": "onnx/fp32/greedy.onnx", "sha256": "ef"}},
            "check": {"greedy": {"agreement": 1.0, "bleu_delta": None}},
        }
    ],
    "versions": {"onnx": "1.23.2"},
    "trained_in": "/runs/tiny",
    "corpus": {"data": "default", "direction": "zh-en", "sha256": "01", "prepared": "data"},
    "weights": "model.keras (the last saved, step 12)",
    "checked_on": "100 dev sentences",
    "onnx_opset": 17,
}


def test_a_language_pair_is_a_value():
    pair = LanguagePair.parse("zh-en")
    assert (pair.source, pair.target, str(pair), pair.reversed()) == (
        "zh",
        "en",
        "zh-en",
        LanguagePair("en", "zh"),
    )
    for bad in ("zh", "zh-", "zh-en-fr", "", None):
        with pytest.raises(ValueError, match="looks like 'zh-en'"):
            LanguagePair.parse(bad)
    assert (language_name("zh"), language_name("xx")) == ("Chinese", "xx")


def test_an_old_manifest_loads_and_keeps_what_it_says(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps(OLD_MANIFEST))
    manifest = ExportManifest.load(str(tmp_path))
    assert (manifest.beam_size, manifest.pair, manifest.corpus.prepared) == (
        3,
        LanguagePair("zh", "en"),
        "data",
    )
    assert manifest.artifact("onnx", "fp32").files["greedy"].file == "onnx/fp32/greedy.onnx"
    assert manifest.artifact("onnx", "fp32").check["greedy"].agreement == 1.0
    assert ModelConfig.from_dict(manifest.config) == preset("tiny", vocab_size=1200)  # recipe keys left out
    with pytest.raises(ArtifactError, match=r"no tflite fp32 artifact .*\(it has \['onnx/fp32'\]\)"):
        manifest.artifact("tflite")
    manifest.save(str(tmp_path))  # written back: the same values, the interface description too
    again = json.loads((tmp_path / "manifest.json").read_text())
    assert again["artifacts"] == OLD_MANIFEST["artifacts"] and again["corpus"] == OLD_MANIFEST["corpus"]
    assert again["inputs"]["source_ids"]["dtype"] == "int32"
    assert ExportManifest.load(str(tmp_path)) == manifest


@pytest.mark.parametrize(
    "change, message",
    [
        ({"kformer_export": 2}, "written by another kformer .export format 2"),
        ({"artifacts": None}, "manifest.json: artifacts must be list, got null"),
        ({"tokenizer": None}, "manifest.json: tokenizer: expected a JSON object, got NoneType"),
        ({"beam_size": "3"}, 'manifest.json: beam_size must be int, got "3"'),
        (
            {"corpus": {"data": "default", "direction": "zhen"}},
            "corpus: direction: a language pair looks like",
        ),
    ],
)
def test_a_malformed_manifest_is_one_line_naming_the_field(tmp_path, change, message):
    (tmp_path / "manifest.json").write_text(json.dumps({**OLD_MANIFEST, **change}))
    with pytest.raises(ArtifactError, match=message):
        ExportManifest.load(str(tmp_path))
    without = {k: v for k, v in OLD_MANIFEST.items() if k != "beam_size"}
    (tmp_path / "manifest.json").write_text(json.dumps(without))
    with pytest.raises(ArtifactError, match="manifest.json: beam_size is missing"):
        ExportManifest.load(str(tmp_path))


def test_run_records_round_trip_and_refuse_wrong_types(tmp_path):
    records = [
        CorpusRecord(("/a.src", "/a.tgt"), LanguagePair("en", "zh"), "00", "/prepared"),
        TrainingState(12, 3.5, {"warmup_steps": 1, "total_steps": 9}, 2, "input-12"),
        BestRecord(10, 20.5, 40.25, 1, 500),
        InitRecord("/runs/demo", "best.weights.h5 (step 3)", "ff", 0.5),
    ]
    for record in records:
        path = str(tmp_path / "record.json")
        record.save(path)
        assert type(record).load(path) == record
    (tmp_path / "training.json").write_text(json.dumps({"steps": 1.5}))
    with pytest.raises(RunError, match=r"training\.json: steps must be int, got 1\.5"):
        TrainingState.load(str(tmp_path / "training.json"))
    (tmp_path / "training.json").write_text("[1, 2]")
    with pytest.raises(RunError, match=r"training\.json: expected a JSON object, got list"):
        TrainingState.load(str(tmp_path / "training.json"))


def test_a_config_json_written_before_recipe_json_gives_both(tmp_path):
    """A run folder of an older kformer: config.json held the recipe's fields too."""
    old = {**preset("small", vocab_size=900).to_dict(), **legacy(recipe("small", ema_momentum=0.9))}
    (tmp_path / "config.json").write_text(json.dumps(old))
    assert ModelConfig.load(str(tmp_path / "config.json")) == preset("small", vocab_size=900)
    assert TrainingRecipe.of_run(str(tmp_path)) == recipe("small", ema_momentum=0.9)
    (tmp_path / "config.json").write_text(json.dumps({**old, "hidden_size": 3}))
    with pytest.raises(ValueError, match=r"config\.json: unknown ModelConfig keys \['hidden_size'\]"):
        ModelConfig.load(str(tmp_path / "config.json"))


def test_a_prepared_manifest_round_trips(tmp_path):
    values = {
        "kformer_prepared": 1,
        "corpus": {"data": "default", "direction": "zh-en", "sha256": "aa"},
        "read": {"lines": 3, "pairs": 2, "malformed": 1, "malformed_examples": ["x:1: why"]},
        "pairs": {"train": 2, "dev": 0, "test": 0},
        "held_out": {"dev": "hash", "test": "hash"},
        "tokenizer": {
            "file": "tokenizer.model",
            "sha256": "bb",
            "vocab_size": 50,
            "sample_pairs": 2,
            "given": None,
        },
        "train": {
            "dtype": "uint16",
            "shards": [{"file": "train-00000-of-00001.tfrecord", "pairs": 2, "bytes": 9, "sha256": "cc"}],
        },
        "lengths": {"cap": 512, "counts": [[1, 2, 2]]},
        "unknown_pieces": {"unk": 0, "pieces": 6},
        "dropped": {"held-out source in train": 0},
        "dedup": {"digest_bytes": 8, "what": "blake2b of the cleaned pair"},
        "bytes_per_pair": 4.5,
        "seconds": 0.5,
    }
    for name in ("tokenizer.model", "dev.tsv", "test.tsv", "train-00000-of-00001.tfrecord"):
        (tmp_path / name).write_text("")
    (tmp_path / "prepared.json").write_text(json.dumps(values))
    manifest = PreparedCorpus.load(str(tmp_path))
    assert manifest.to_dict() == values and manifest.lengths.counts == ((1, 2, 2),)
    assert manifest.shard_paths("/p") == ["/p/train-00000-of-00001.tfrecord"]
    (tmp_path / "train-00000-of-00001.tfrecord").unlink()
    with pytest.raises(
        ValueError, match=r"train-00000-of-00001\.tfrecord is missing \(listed in .*prepared\.json\)"
    ):
        PreparedCorpus.load(str(tmp_path))


def test_a_folder_digest_covers_names_and_contents(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x").write_bytes(b"1")
    first = digests.tree_sha256(str(tmp_path / "a"))
    (tmp_path / "a" / "x").rename(tmp_path / "a" / "y")
    assert digests.tree_sha256(str(tmp_path / "a")) != first  # a renamed file changes it
    assert digests.tree_sha256(str(tmp_path / "a" / "y")) == digests.files_sha256([str(tmp_path / "a" / "y")])

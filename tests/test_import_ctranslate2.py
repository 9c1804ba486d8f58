"""`kformer import` of CTranslate2 models and Argos packages kformer did not write: an OpenNMT-py
style TransformerSpec (pre-norm, <blank> as pad, its own vocabulary over a SentencePiece model
with no pad, separate embeddings and projection with a bias) built with CTranslate2's own spec
API, random weights scaled so that greedy choices are decisive (the margin is checked), packaged
as an .argosmodel. Greedy tokens of the import equal ctranslate2.Translator's on every line, in
Keras and in the exported runtimes. Also kformer's own Argos package, imported back."""

import functools
import json
import os
import re
import zipfile

import numpy as np
import pytest
from conftest import ctranslate2_beam_differences, run_kformer

from kformer.decode.options import EXTRA_OUTPUT_TOKENS, SearchOptions
from kformer.export.formats import open_listed, open_runner
from kformer.importers import import_model

SENTENCES = 60  # of the test split, one sentence each
SHAPE = {"d_model": 32, "heads": 4, "ffn": 64, "layers": (2, 2), "rows": 48}
SPECIAL = ["<unk>", "<blank>", "<s>", "</s>"]  # OpenNMT-py's vocabulary starts so
MARGIN = 1e-3  # the smallest gap between the best and second logit at any greedy step


def onmt_pieces(tokenizer):
    """An OpenNMT-py vocabulary over a SentencePiece model: its specials first, then the pieces."""
    pieces = [tokenizer.id_to_piece(i) for i in range(tokenizer.get_piece_size())]
    return SPECIAL + [p for p in pieces if p not in SPECIAL and p != "<pad>"]


def spec_of(pieces, seed=0, pre_norm=True, activation="RELU", int8=False, changes=None, tables=True):
    """A TransformerSpec of SHAPE, random weights; the projection and EOS's row scaled so that
    greedy choices are decisive and outputs end at varied steps; `changes`: {variable: value};
    `tables` False: no stored position tables (CTranslate2 computes its own, as OpenNMT-tf's)."""
    from ctranslate2.specs import common_spec, transformer_spec

    from kformer.model.layers import sinusoidal_table

    m, f, rng = SHAPE["d_model"], SHAPE["ffn"], np.random.default_rng(seed)
    spec = transformer_spec.TransformerSpec.from_config(
        SHAPE["layers"],
        SHAPE["heads"],
        pre_norm=pre_norm,
        activation=getattr(common_spec.Activation, activation),
    )

    def linear(layer, rows, columns, scale=1.0):
        layer.weight = (rng.normal(size=(rows, columns)) * scale / np.sqrt(columns)).astype(np.float32)
        layer.bias = (rng.normal(size=rows) * 0.1).astype(np.float32)

    def norm(layer):
        layer.gamma = (1 + 0.1 * rng.normal(size=m)).astype(np.float32)
        layer.beta = (0.1 * rng.normal(size=m)).astype(np.float32)

    v = len(pieces)
    spec.encoder.embeddings[0].weight = rng.normal(size=(v, m)).astype(np.float32) / np.sqrt(m)
    spec.decoder.embeddings.weight = rng.normal(size=(v, m)).astype(np.float32) / np.sqrt(m)
    linear(spec.decoder.projection, v, m, scale=32.0)
    spec.decoder.projection.weight[pieces.index("</s>")] *= 1.4
    for stack in (spec.encoder, spec.decoder):
        if tables:
            stack.position_encodings.encodings = sinusoidal_table(SHAPE["rows"], m, "halves")
        if pre_norm:
            norm(stack.layer_norm)
        for layer in stack.layer:
            linear(layer.self_attention.linear[0], 3 * m, m)
            linear(layer.self_attention.linear[1], m, m)
            norm(layer.self_attention.layer_norm)
            if hasattr(layer, "attention"):
                linear(layer.attention.linear[0], m, m)
                linear(layer.attention.linear[1], 2 * m, m)
                linear(layer.attention.linear[2], m, m)
                norm(layer.attention.layer_norm)
            linear(layer.ffn.linear_0, f, m)
            linear(layer.ffn.linear_1, m, f)
            norm(layer.ffn.layer_norm)
    for name, value in (changes or {}).items():
        scope, attribute = name.rsplit("/", 1)
        setattr(functools.reduce(getattr, scope.split("/"), spec), attribute, value)
    spec.register_source_vocabulary(pieces)
    spec.register_target_vocabulary(pieces)
    spec.validate()
    spec.optimize(quantization="int8" if int8 else None)
    return spec


def write_package(folder, spec, spm_bytes, direction="zh-en"):
    """An .argosmodel of `spec`, as Argos' own packages are laid out."""
    source, target = direction.split("-")
    root = folder / f"translate-{source}_{target}-1_0"
    (root / "model").mkdir(parents=True)
    spec.save(str(root / "model"))
    (root / "sentencepiece.model").write_bytes(spm_bytes)
    (root / "metadata.json").write_text(
        json.dumps({"from_code": source, "to_code": target, "type": "translate"})
    )
    (root / "README.md").write_text("a test package: CC0\n")
    path = folder / f"{root.name}.argosmodel"
    with zipfile.ZipFile(path, "w") as archive:
        for file in sorted(root.rglob("*")):
            archive.write(file, file.relative_to(folder))
    return str(path)


@pytest.fixture(scope="module")
def onmt_tokenizer(corpus_pairs, tmp_path_factory):
    """A SentencePiece model as OpenNMT-py and Argos train it: no pad piece, <unk> 0, <s> 1, </s> 2."""
    import io

    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter([t for pair in corpus_pairs for t in pair]),
        model_writer=model,
        vocab_size=1500,
        character_coverage=0.9995,
        hard_vocab_limit=False,
        minloglevel=2,
    )
    return spm.SentencePieceProcessor(model_proto=model.getvalue())


@pytest.fixture(scope="module")
def sources():
    from kformer.data import corpus as corpus_lib
    from kformer.data import prepare as prepare_lib

    test = prepare_lib.split_pairs(corpus_lib.read_corpus()[0])["test"]
    return [s for s, _ in test if len(s) <= 20][:SENTENCES]


@pytest.fixture(scope="module")
def package(onmt_tokenizer, tmp_path_factory):
    folder = tmp_path_factory.mktemp("argos")
    pieces = onmt_pieces(onmt_tokenizer)
    return write_package(folder, spec_of(pieces), onmt_tokenizer.serialized_model_proto()), pieces


@pytest.fixture(scope="module")
def imported(package, tmp_path_factory):
    run = str(tmp_path_factory.mktemp("imported") / "run")
    import_model(package[0], run, progress=lambda *a, **k: None)
    return run


def ctranslate2_greedy(package_path, pieces_of_sources, limits, tmp_path):
    """ctranslate2.Translator's greedy pieces for each source (pieces), each with its own limit."""
    import ctranslate2

    with zipfile.ZipFile(package_path) as archive:
        archive.extractall(tmp_path)
    (model,) = tmp_path.glob("*/model")
    translator = ctranslate2.Translator(str(model), device="cpu")
    return [
        translator.translate_batch(
            [pieces], beam_size=1, max_decoding_length=limit, min_decoding_length=0, return_end_token=False
        )[0].hypotheses[0]
        for pieces, limit in zip(pieces_of_sources, limits)
    ]


GREEDY = SearchOptions(beam_size=1, no_repeat_ngram=0, max_length=SHAPE["rows"] - 1)


def assert_greedy_equals_ctranslate2(runner, package_path, sources, tmp_path):
    tokenizer = runner.tokenizer
    ids = [tokenizer.encode(s) for s in sources]
    ours, _ = runner.translate_ids(ids)
    limits = [min(len(row) + EXTRA_OUTPUT_TOKENS, GREEDY.max_length) for row in ids]
    theirs = ctranslate2_greedy(
        package_path, [[tokenizer.id_to_piece(i) for i in row] for row in ids], limits, tmp_path
    )
    found = [[tokenizer.id_to_piece(int(i)) for i in row if i != tokenizer.eos_id()] for row in ours]
    assert found == theirs
    ended = sum(len(t) < limit for t, limit in zip(theirs, limits))
    assert 0 < ended < len(sources)  # some rows end by their own EOS, some run to the limit


def test_the_import_keeps_what_the_spec_is(imported):
    from kformer.model.config import ModelConfig

    config = ModelConfig.load(os.path.join(imported, "config.json"))
    assert (config.norm_position, config.activation, config.positions) == ("pre", "relu", "halves")
    assert not config.tie_embeddings and config.scale_embedding
    assert (config.max_source_length, config.max_target_length) == (SHAPE["rows"], SHAPE["rows"])
    with open(os.path.join(imported, "vocabulary.json"), encoding="utf-8") as f:
        assert json.load(f)[:4] == ["<blank>", "<unk>", "<s>", "</s>"]  # the pad first
    record = json.loads(open(os.path.join(imported, "import.json")).read())
    assert (
        record["kind"] == "argos"
        and record["direction"] == "zh-en"
        and record["licence"] == "SOURCE-README.md"
    )


def test_greedy_tokens_in_keras_equal_ctranslate2s(package, imported, sources, tmp_path):
    runner = open_runner(imported, options=GREEDY)
    assert_greedy_equals_ctranslate2(runner, package[0], sources, tmp_path)


def test_a_spec_without_position_tables_takes_ctranslate2s_own_sinusoid(onmt_tokenizer, sources, tmp_path):
    """No stored tables (OpenNMT-tf's conversions, as older Argos packages): CTranslate2 computes
    tensor2tensor's timescales, and so does the import ("timescales"): greedy tokens equal."""
    from kformer.model.config import ModelConfig

    pieces = onmt_pieces(onmt_tokenizer)
    path = write_package(tmp_path, spec_of(pieces, tables=False), onmt_tokenizer.serialized_model_proto())
    run = str(tmp_path / "run")
    import_model(path, run, progress=lambda *a, **k: None)
    config = ModelConfig.load(os.path.join(run, "config.json"))
    assert (config.positions, config.max_source_length) == ("timescales", 256)
    assert_greedy_equals_ctranslate2(open_runner(run, options=GREEDY), path, sources, tmp_path / "x")


def test_greedy_choices_are_decisive(imported, sources):
    """Every greedy step's best logit beats the second by MARGIN: the parity is not a coin toss."""
    runner = open_runner(imported, options=GREEDY)
    model, tokenizer = runner.translator.model, runner.tokenizer
    ids = [tokenizer.encode(s) for s in sources]
    outputs, _ = runner.translate_ids(ids)
    margins = []
    for source, output in zip(ids, outputs):
        output = [int(i) for i in output if i != 0]  # the chosen tokens, EOS included, no padding
        target = [tokenizer.bos_id(), *output[:-1]]  # step t's input: what was chosen before it
        logits = np.asarray(model({"source_ids": np.array([source]), "target_ids": np.array([target])}))[0]
        best = np.sort(logits, axis=-1)[:, -2:]
        margins.append((best[:, 1] - best[:, 0]).min())
    assert min(margins) > MARGIN, min(margins)


@pytest.fixture(scope="module")
def exported(imported, tmp_path_factory):
    from kformer.export.exporter import export

    folder = str(tmp_path_factory.mktemp("exported") / "export")
    export(imported, folder, ("savedmodel", "tflite", "onnx"), progress=lambda *a, **k: None)
    return folder


@pytest.mark.parametrize("runtime", ["savedmodel", "tflite", "onnx"])
def test_greedy_tokens_of_an_export_equal_ctranslate2s(package, exported, sources, runtime, tmp_path):
    runner = open_listed(exported, runtime, options=GREEDY)
    assert_greedy_equals_ctranslate2(runner, package[0], sources, tmp_path)


def test_an_int8_package_imports_its_weights_dequantized(onmt_tokenizer, package, imported, tmp_path):
    """int8 rows times their scales: within half a quantization step of the float weights; the
    greedy agreement of the two imports is measured (not required: int8 changes choices)."""
    pieces = package[1]
    path = write_package(tmp_path, spec_of(pieces, int8=True), onmt_tokenizer.serialized_model_proto())
    run = str(tmp_path / "int8")
    import_model(path, run, progress=lambda *a, **k: None)
    floats, int8 = (open_runner(r).translator.model for r in (imported, run))
    for a, b in zip(floats.weights, int8.weights):
        step = np.abs(a.numpy()).max() / 127  # the largest row's quantization step bounds every row's
        assert a.path == b.path and np.abs(a.numpy() - b.numpy()).max() <= step / 2 + 1e-7, a.path


@pytest.fixture(scope="module")
def own_import(trained_dir, tmp_path_factory):
    """kformer's Argos export of `trained_dir`, imported back."""
    from kformer.export.exporter import export

    folder = tmp_path_factory.mktemp("own")
    export(trained_dir, str(folder / "export"), formats=("argos",), progress=lambda *a, **k: None)
    (package_path,) = (folder / "export" / "argos").glob("*.argosmodel")
    import_model(str(package_path), str(folder / "run"), progress=lambda *a, **k: None)
    return folder / "run"


def test_kformers_own_package_imports_with_its_own_tokenizer(trained_dir, own_import, sources):
    """The vocabulary is its SentencePiece model's pieces, so the run keeps that model (every
    export format takes it), and translates as the run it was exported from."""
    assert sorted(p.name for p in own_import.iterdir()) == [
        "SOURCE-README.md", "config.json", "import.json", "model.keras", "tokenizer.model"
    ]  # fmt: skip
    options = SearchOptions(beam_size=1, max_length=30)
    original, back = (open_runner(str(r), options=options) for r in (trained_dir, own_import))
    assert back.translate(sources) == original.translate(sources)


def test_an_imports_argos_export_says_its_bleu_is_not_measured(own_import, tmp_path, capsys):
    """An import has no test split: its package's BLEU is said to be unmeasured, not "None"."""
    from kformer.export.exporter import export

    export(str(own_import), str(tmp_path / "export"), formats=("argos",), progress=print)
    said = capsys.readouterr().out
    assert "BLEU not measured (no test split), wrote argos/" in said and "None" not in said


def test_an_imports_package_keeps_its_source_rule_and_licence(package, imported, sources, tmp_path):
    """The Argos package of the OpenNMT-py-style import (its vocabulary reordered, so a vocabulary
    tokenizer; trained without a source EOS): CTranslate2 appends none, the package imported back
    gives ctranslate2.Translator's greedy pieces of the original package, and the original's
    licence travels as LICENSE."""
    from kformer.export.exporter import export

    manifest = export(imported, str(tmp_path / "export"), formats=("argos",), progress=lambda *a, **k: None)
    path = str(tmp_path / "export" / manifest.packages[0].file)
    with zipfile.ZipFile(path) as archive:
        root = archive.namelist()[0].split("/")[0]
        config = json.loads(archive.read(f"{root}/model/config.json"))
        licence = archive.read(f"{root}/LICENSE").decode()
        readme = archive.read(f"{root}/README.md").decode()
    assert config["add_source_eos"] is False and licence == "a test package: CC0\n"
    assert "imported by kformer" in readme and "in LICENSE beside this file" in readme
    back = str(tmp_path / "back")
    import_model(path, back, progress=lambda *a, **k: None)
    assert_greedy_equals_ctranslate2(open_runner(back, options=GREEDY), package[0], sources, tmp_path / "ct2")


def test_an_import_fine_tunes_and_the_pull_holds_it_near_its_start(own_import, corpus_tsv, tmp_path):
    """`train --init-from IMPORTED`: no corpus of its own to mix in (asking for one is one line);
    with --pull-to-start its weights move less from the imported ones than without; the tuned run's
    Argos package carries the import's licence."""
    import keras

    from kformer import run_folder
    from kformer.export.exporter import export
    from kformer.train.fit import train
    from kformer.train.options import Evaluation

    args = dict(
        data=corpus_tsv, init_from=str(own_import), steps=6, xla=False, verbose=0, evaluation=Evaluation(0)
    )
    start = [v.numpy() for v in run_folder.load(str(own_import)).model.weights]
    moved = {}
    for pull in (0.0, 2000.0):  # lr x pull: up to 0.4 of the distance a step
        out = str(tmp_path / f"pull-{pull:g}")
        changes = {"pull_to_start": pull, "ema_momentum": 0.0}  # the weights themselves, not an average
        assert train(out, recipe_changes=changes, **args)["steps"] == 6
        tuned = run_folder.load(out, "last").model.weights
        moved[pull] = np.mean(
            [np.abs(keras.ops.convert_to_numpy(v) - s).mean() for v, s in zip(tuned, start)]
        )
    assert 0 < moved[2000.0] < moved[0.0] / 2, moved
    export(out, str(tmp_path / "export"), formats=("argos",), progress=lambda *a, **k: None)
    (package,) = (tmp_path / "export" / "argos").iterdir()
    with zipfile.ZipFile(package) as archive:  # the licence of what it was fine-tuned from goes along
        root = archive.namelist()[0].split("/")[0]
        readme, licence = (archive.read(f"{root}/{name}").decode() for name in ("README.md", "LICENSE"))
    assert "imported by kformer and fine-tuned on" in readme and licence.startswith("# ")
    with pytest.raises(
        ValueError, match=r"--mix-original 0\.5: --init-from \S+ was imported and has no corpus"
    ):
        train(str(tmp_path / "mixed"), mix_original=0.5, **args)


def ctranslate2_folder(tmp_path, onmt_tokenizer, **spec_settings):
    """A CTranslate2 folder of spec_of(...), its sentencepiece.model beside it."""
    folder = tmp_path / "ct2" / "model"
    folder.mkdir(parents=True)
    spec_of(onmt_pieces(onmt_tokenizer), **spec_settings).save(str(folder))
    (folder.parent / "sentencepiece.model").write_bytes(onmt_tokenizer.serialized_model_proto())
    return folder


LEARNED = np.random.default_rng(1).normal(size=(SHAPE["rows"], SHAPE["d_model"])).astype(np.float32)


@pytest.mark.parametrize(
    "settings, edit, message",
    [
        ({"activation": "GELUTanh"}, None, r"encoder/activation 1: kformer runs ReLU, GELU and SiLU"),
        ({"changes": {"encoder/position_encodings/encodings": LEARNED}}, None, r"not a sinusoid \(learned\)"),
        ({}, "config.json", r"add_source_bos True: kformer's model takes False"),
        ({}, "sentencepiece.model", r"no SentencePiece model \(source\.spm/target\.spm or sentencepiece\.model\)"),
        ({}, "model.bin", r"model\.bin: cut short"),
        ({}, "target_vocabulary", r"source_vocabulary and target_vocabulary differ"),
        ({}, "direction", r"records no language pair; give --direction"),
    ],
)  # fmt: skip
def test_what_kformer_cannot_import_from_ctranslate2_is_one_line(
    onmt_tokenizer, tmp_path, settings, edit, message
):
    folder = ctranslate2_folder(tmp_path, onmt_tokenizer, **settings)
    if edit == "config.json":
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "add_source_bos": True}))
    elif edit == "sentencepiece.model":
        (folder.parent / edit).unlink()
    elif edit == "model.bin":
        data = (folder / edit).read_bytes()
        (folder / edit).write_bytes(data[: len(data) // 2])
    elif edit == "target_vocabulary":
        pieces = json.loads((folder / "shared_vocabulary.json").read_text())
        (folder / "source_vocabulary.json").write_text(json.dumps(pieces))
        (folder / "target_vocabulary.json").write_text(json.dumps(pieces[::-1]))
        (folder / "shared_vocabulary.json").unlink()
    out = tmp_path / "run"
    direction = [] if edit == "direction" else ["--direction", "zh-en"]
    ran = run_kformer("import", str(folder), "--out", str(out), *direction)
    assert ran.status == 2 and ran.stderr.strip().splitlines()[-1].startswith("kformer import: error: ")
    assert re.search(message, ran.stderr), ran.stderr
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".kformer-import-")]


def test_a_package_whose_entries_leave_its_folder_is_refused(tmp_path):
    path = tmp_path / "evil.argosmodel"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("translate-zh_en-1_0/metadata.json", "{}")
        archive.writestr("translate-zh_en-1_0/../../escaped.txt", "x")
    with pytest.raises(ValueError, match=r"evil\.argosmodel: not an Argos package \(one top folder"):
        import_model(str(path), str(tmp_path / "run"), progress=lambda *a, **k: None)
    assert not (tmp_path / "escaped.txt").exists() and not (tmp_path / "run").exists()


def test_beam_4_without_length_normalization_equals_ctranslate2s_or_beats_it(
    package, imported, sources, tmp_path
):
    """Beam 4 ranking hypotheses by their log-probability alone (alpha 0: both searches' length
    penalties are 1). Where kformer's best differs from ctranslate2.Translator's, the rule is: it
    scores higher under CTranslate2's own scoring (score_batch), by as much as kformer's scores
    say: CTranslate2's search let a better hypothesis go, the model is the same."""
    import ctranslate2

    options = SearchOptions(beam_size=4, alpha=0.0, no_repeat_ngram=0, max_length=SHAPE["rows"] - 1)
    runner = open_runner(imported, options=options)
    tokenizer = runner.tokenizer
    ids = [tokenizer.encode(s) for s in sources]
    ours, our_scores = runner.translate_ids(ids)
    with zipfile.ZipFile(package[0]) as archive:
        archive.extractall(tmp_path)
    (model,) = tmp_path.glob("*/model")
    translator = ctranslate2.Translator(str(model), device="cpu")
    pieces = [[tokenizer.id_to_piece(i) for i in row] for row in ids]
    mine = [
        ([tokenizer.id_to_piece(int(i)) for i in output if i not in (0, tokenizer.eos_id())], score)
        for output, score in zip(ours, our_scores)
    ]
    limits = [min(len(row) + EXTRA_OUTPUT_TOKENS, options.max_length) for row in ids]
    differing = ctranslate2_beam_differences(translator, pieces, mine, limits)
    assert differing <= len(sources) // 10  # the rule explains the rare line; most are equal

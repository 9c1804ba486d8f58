"""kformer's Argos packages (`kformer export --formats argos`) in the real Argos Translate and
LibreTranslate, each in a venv of its own that `make test` installs inside the running venv
(Makefile: ARGOS_VENVS). Without those venvs these tests skip, saying why; in CI (CI=true) they
fail instead."""

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
import zipfile

import numpy as np
import pytest
from conftest import output, python_lines, venv_python

from kformer.bench.argos import argos_translations, bench_argos, offline_environment
from kformer.contracts import TOKENIZER_FILE
from kformer.contracts.export import ExportManifest
from kformer.data import corpus as corpus_lib
from kformer.data import prepare as prepare_lib
from kformer.decode.sentences import split_sentences
from kformer.export import argos
from kformer.export.exporter import export

ARGOSTRANSLATE = "argostranslate"  # PyPI argostranslate==1.11.0
LIBRETRANSLATE = "libretranslate"  # PyPI libretranslate==1.9.6, with argos-translate-lt==1.12.1
SENTENCES = 40  # of the test split, per direction


@pytest.fixture(scope="module")
def exports(trained_dir, trained_en_zh_dir, tmp_path_factory):
    """{direction: export folder with an Argos package} of a tiny zh-en and a tiny en-zh model."""
    found = {}
    for direction, run in (("zh-en", trained_dir), ("en-zh", trained_en_zh_dir)):
        found[direction] = str(tmp_path_factory.mktemp("argos") / direction)
        export(run, found[direction], formats=("argos",), progress=lambda *a, **k: None)
    return found


def package_path(export_dir):
    (entry,) = ExportManifest.load(export_dir).packages
    return os.path.join(export_dir, entry.file)


def test_package_holds_one_folder_with_the_exported_model(exports):
    export_dir = exports["zh-en"]
    with zipfile.ZipFile(package_path(export_dir)) as archive:
        names = archive.namelist()
        top = {name.split("/")[0] for name in names}
        assert top == {"translate-zh_en-100_0"}
        meta = json.loads(archive.read("translate-zh_en-100_0/metadata.json"))
        tokenizer = archive.read("translate-zh_en-100_0/sentencepiece.model")
        readme = archive.read("translate-zh_en-100_0/README.md").decode()
    assert {n.split("/", 1)[1] for n in names} >= {"minisbd/zh.onnx", "model/config.json"}
    assert (meta["from_code"], meta["to_code"], meta["type"]) == ("zh", "en", "translate")
    assert meta["package_version"] == argos.PACKAGE_VERSION
    with open(os.path.join(export_dir, TOKENIZER_FILE), "rb") as f:
        assert tokenizer == f.read()
    bleu = ExportManifest.load(export_dir).packages[0].test_bleu  # the model: test_argos_settings_...
    assert isinstance(bleu, float) and f"{bleu:.2f}" in readme


def test_export_refuses_a_model_without_a_language_pair(model_dir, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(model_dir, run)
    (run / "corpus.json").unlink()  # a run whose corpus record is gone: no language pair
    with pytest.raises(ValueError, match="--formats argos needs the model's language pair"):
        export(str(run), str(tmp_path / "out"), formats=("argos",), progress=lambda *a, **k: None)
    assert not (tmp_path / "out").exists()


SPLIT_TEXTS = [
    "我們試試看！他很高興，因為他的朋友們都來參加了他的生日聚會。好嗎？",
    'Tom is here. He said "Hi." Then he left... and came back! OK?',
    "他说：“好。”然后走了。",
    "It is 3.14 m tall. Really?! e.g. this one stays.",
    "Mr. Smith met (J. Doe) at 5 p.m. today. He is as tall as I. Dr. No? No.",
    "好!我来了",
    "One sentence only",
]

SPLITTER = """
import json, sys
from minisbd import SBDetect
detector = SBDetect(sys.argv[1], use_gpu=False)
print(json.dumps([detector.sentences(text) for text in json.load(sys.stdin)]))
"""


def test_packaged_splitter_splits_as_kformer(exports, tmp_path):
    """The package's minisbd model, run by the real MiniSBD that LibreTranslate pins, splits as
    kformer.decode.sentences on hand-made texts and on test-split sentences run together into
    paragraphs."""
    python = venv_python(LIBRETRANSLATE)
    with zipfile.ZipFile(package_path(exports["zh-en"])) as archive:
        archive.extractall(tmp_path)
    splitter = tmp_path / "translate-zh_en-100_0" / "minisbd" / "zh.onnx"
    test = prepare_lib.split_pairs(corpus_lib.read_corpus()[0])["test"]
    paragraphs = [" ".join(s for s, _ in test[i : i + 5]) for i in range(0, 200, 5)]
    paragraphs += [" ".join(t for _, t in test[i : i + 5]) for i in range(0, 200, 5)]
    texts = SPLIT_TEXTS + paragraphs
    found = json.loads(output([python, "-c", SPLITTER, str(splitter)], stdin=json.dumps(texts)))
    expected = [split_sentences(text) for text in texts]
    differ = [i for i in range(len(texts)) if found[i] != expected[i]]
    assert not differ, [(texts[i], found[i], expected[i]) for i in differ[:3]]
    assert sum(len(s) for s in expected) > len(texts) * 3  # paragraphs of several sentences


def one_sentence_sources(direction):
    """The first SENTENCES sources of the test split (in the direction's source language) that
    kformer splits into one sentence, so that Argos's splitting cannot change them."""
    test = prepare_lib.split_pairs(corpus_lib.read_corpus()[0])["test"]
    side = 0 if direction == "zh-en" else 1
    sources = [pair[side] for pair in test if len(split_sentences(pair[side])) == 1]
    return list(dict.fromkeys(sources))[:SENTENCES]


def extracted_model(export_dir, tmp_path):
    """The package of `export_dir` unzipped in tmp_path; its one folder."""
    with zipfile.ZipFile(package_path(export_dir)) as archive:
        archive.extractall(tmp_path / "package")
    (folder,) = (tmp_path / "package").iterdir()
    return folder


ARGOS_DECODES = 256  # tokens at most, whatever the model was trained on


def argos_reference(model, tokenizer_file, texts, compute_type, max_length=ARGOS_DECODES):
    """What Argos's translate() gives for one-sentence texts, computed here from its settings
    (argostranslate.translate.apply_packaged_translation): CTranslate2 beam 4, length penalty
    0.2, unknowns replaced, at most 256 tokens; pieces decoded by sentencepiece, "▁" and "_"
    read as spaces, one leading space dropped."""
    import ctranslate2
    import sentencepiece as spm

    translator = ctranslate2.Translator(str(model), compute_type=compute_type)
    tokenizer = spm.SentencePieceProcessor(model_file=str(tokenizer_file))
    results = translator.translate_batch(
        [tokenizer.encode(text, out_type=str) for text in texts],
        beam_size=4,
        length_penalty=0.2,
        replace_unknowns=True,
        max_decoding_length=max_length,
    )
    decoded = [tokenizer.decode_pieces(r.hypotheses[0]).replace("▁", " ").replace("_", " ") for r in results]
    return [text[1:] if text.startswith(" ") else text for text in decoded]


def keras_log_probs(run_dir, source, target, positions):
    """The log-probability of each piece of `target` and then EOS, given the pieces `source`,
    from the run's Keras model rebuilt with position tables of `positions` rows: what
    CTranslate2's score_batch gives on a model of such tables."""
    import keras

    from kformer import run_folder
    from kformer.model.transformer import Transformer

    run = run_folder.load(run_dir)
    model, config, tokenizer = run.model, run.config, run.tokenizer
    longer = Transformer(config.replace(max_source_length=positions, max_target_length=positions))
    longer.set_weights(model.get_weights())  # the tables are not weights: computed for the lengths
    source_ids = np.array([[tokenizer.piece_to_id(p) for p in source]], "int32")
    following = [tokenizer.piece_to_id(p) for p in target] + [config.eos_id]
    target_ids = np.array([[config.bos_id, *following[:-1]]], "int32")
    logits = longer({"source_ids": source_ids, "target_ids": target_ids})[0]  # (T, V)
    log_probs = np.asarray(keras.ops.log_softmax(logits, axis=-1))
    return log_probs[np.arange(len(following)), following]


def test_package_model_decodes_as_the_export_and_past_its_lengths(exports, trained_dir, tmp_path):
    import ctranslate2
    import sentencepiece as spm

    export_dir = exports["zh-en"]
    package = extracted_model(export_dir, tmp_path)
    texts = one_sentence_sources("zh-en")
    cap = ExportManifest.load(export_dir).config["max_target_length"] - 1  # within the export's table
    exported = os.path.join(export_dir, "ctranslate2", "fp32")
    tokenizer = package / "sentencepiece.model"
    for compute_type in ("default", "auto"):  # LibreTranslate's, argostranslate's
        packaged = argos_reference(package / "model", tokenizer, texts, compute_type, max_length=cap)
        assert packaged == argos_reference(exported, tokenizer, texts, compute_type, max_length=cap)
    long_text = texts[0] * 60  # longer than the model's max lengths, as Argos may pass
    source = spm.SentencePieceProcessor(model_file=str(tokenizer)).encode(long_text, out_type=str)
    target = source[:ARGOS_DECODES]  # as long as Argos decodes
    assert len(source) > len(target) == ARGOS_DECODES > cap + 1  # past both of the model's tables
    (scored,) = ctranslate2.Translator(str(package / "model")).score_batch([source], [target])
    reference = keras_log_probs(trained_dir, source, target, argos.POSITIONS)
    np.testing.assert_allclose(scored.log_probs, reference, rtol=0, atol=1e-4)
    with pytest.raises(RuntimeError, match="position"):
        ctranslate2.Translator(exported).translate_batch([["▁"] * 300])


def test_int8_export_packages_the_int8_weights_that_argos_runs(exports, trained_dir, tmp_path):
    """--quantize int8: the package holds the export's CTranslate2 int8 weights, its README and
    manifest say so and score them; argostranslate installs it and translates as CTranslate2 does
    on it; and CTranslate2's `auto` type (argostranslate's) gives the same on the fp32 package,
    whose weights it quantizes when it loads them."""
    import ctranslate2

    out = str(tmp_path / "int8")
    manifest = export(trained_dir, out, formats=("argos",), quantize=("int8",), progress=lambda *a, **k: None)
    (entry,) = manifest.packages
    assert (entry.variant, entry.weights_of) == ("int8", "ctranslate2/int8")
    int8, fp32 = extracted_model(out, tmp_path / "a"), extracted_model(exports["zh-en"], tmp_path / "b")
    assert ctranslate2.Translator(str(int8 / "model")).compute_type.startswith("int8")
    assert ctranslate2.Translator(str(fp32 / "model")).compute_type == "float32"
    sizes = [(folder / "model" / "model.bin").stat().st_size for folder in (int8, fp32)]
    assert sizes[0] < 0.7 * sizes[1], sizes  # this tiny model's biases and norms weigh more than a real one's
    readme = (int8 / "README.md").read_text()
    assert "Weights: int8" in readme and f"{entry.test_bleu:.2f}" in readme
    texts, tokenizer = one_sentence_sources("zh-en"), int8 / "sentencepiece.model"
    cap = manifest.config["max_target_length"] - 1  # within the export's position table
    exported = os.path.join(out, "ctranslate2", "int8")
    packaged = argos_reference(int8 / "model", tokenizer, texts, "default", max_length=cap)
    assert packaged == argos_reference(exported, tokenizer, texts, "default", max_length=cap)
    expected = argos_reference(int8 / "model", tokenizer, texts, "auto")
    assert expected == argos_reference(fp32 / "model", tokenizer, texts, "auto")
    found = argos_translations(
        venv_python(ARGOSTRANSLATE), [package_path(out)], {"zh-en": texts}, tmp_path / "home"
    )
    assert found["zh-en"] == expected


def downloaded_files(home):
    """Files Argos's splitters and models would have fetched (MiniSBD's cache, stanza, spaCy):
    every file in the home but the installed packages and onnxruntime's own device-id database
    (~/.cache/Microsoft/DeveloperTools/.onnxruntime, written by MiniSBD's onnxruntime session)."""
    return [
        str(p) for p in home.rglob("*") if p.is_file() and not {"packages", ".onnxruntime"} & set(p.parts)
    ]


def test_argostranslate_installs_and_translates_offline(exports, tmp_path):
    """The real argostranslate 1.11.0 installs both packages from their files and translates
    both ways with no network, as CTranslate2 does with its settings on the package's model."""
    python = venv_python(ARGOSTRANSLATE)
    home = tmp_path / "home"
    job = {direction: one_sentence_sources(direction) for direction in exports}
    found = argos_translations(python, [package_path(e) for e in exports.values()], job, home)
    assert not downloaded_files(home)
    for direction, export_dir in exports.items():
        package = extracted_model(export_dir, tmp_path / direction)
        expected = argos_reference(package / "model", package / "sentencepiece.model", job[direction], "auto")
        assert found[direction] == expected, direction
        assert len(set(expected)) > 1  # translations, not one repeated output


LT_INSTALL = """
import sys
import argostranslate.package
for path in sys.argv[1:]:
    argostranslate.package.install_from_path(path)
print(sorted((p.from_code, p.to_code) for p in argostranslate.package.get_installed_packages()))
"""
LT_FORMAT = """
import json, sys
from html import unescape
from libretranslate.language import improve_translation_formatting
pairs = json.load(sys.stdin)
print(json.dumps([unescape(improve_translation_formatting(source, output)) for source, output in pairs]))
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post_json(url, body):
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}, method="POST"
    )
    with NO_PROXY.open(request, timeout=300) as response:
        return json.loads(response.read())


NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@pytest.fixture()
def libretranslate(exports, tmp_path):
    """The real LibreTranslate 1.9.6, offline, with both packages installed: its URL."""
    python = venv_python(LIBRETRANSLATE)
    env = offline_environment(tmp_path / "home")
    packages = [package_path(e) for e in exports.values()]
    installed = python_lines(LT_INSTALL, *packages, python=python, env=env)
    assert installed == ["[('en', 'zh'), ('zh', 'en')]"]
    port = free_port()
    command = [
        os.path.join(os.path.dirname(python), "libretranslate"),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    # the server the tests talk to, stopped at the end: no helper waits for it
    server = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            try:
                with NO_PROXY.open(f"{url}/languages", timeout=5):
                    break
            except OSError:
                assert server.poll() is None, server.stdout.read()[-3000:]
                time.sleep(0.5)
        else:
            pytest.fail("LibreTranslate did not answer within 2 minutes")
        yield url, python, env
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_libretranslate_starts_offline_and_translates_both_ways(libretranslate, exports, tmp_path):
    """LibreTranslate answers /translate in both directions with CTranslate2's output on the
    package's model (its settings; LibreTranslate's float32 compute type) as LibreTranslate's
    own formatting rewrites it."""
    url, python, env = libretranslate
    codes = {entry["code"] for entry in json.loads(NO_PROXY.open(f"{url}/languages", timeout=30).read())}
    assert codes == {"en", "zh-Hans"}  # LibreTranslate 1.9.6 names zh so
    for direction, export_dir in exports.items():
        source, target = direction.split("-")
        texts = one_sentence_sources(direction)[:5]
        found = [post_json(f"{url}/translate", {"q": t, "source": source, "target": target}) for t in texts]
        package = extracted_model(export_dir, tmp_path / direction)
        raw = argos_reference(package / "model", package / "sentencepiece.model", texts, "default")
        formatted = output([python, "-c", LT_FORMAT], stdin=json.dumps(list(zip(texts, raw))), env=env)
        assert [f["translatedText"] for f in found] == json.loads(formatted), direction
    assert not downloaded_files(tmp_path / "home")


def test_bench_argos_scores_both_on_the_test_split(exports, capsys):
    from kformer.bench.argos import print_argos_table
    from kformer.evaluate import score, split_references

    results = bench_argos(exports["en-zh"], venv_python(ARGOSTRANSLATE), sentences=5)
    print_argos_table(results)
    sources, ours, theirs = zip(*results["examples"])
    references = split_references(ExportManifest.load(exports["en-zh"]).trained_in)[1][:5]
    assert results["identical"] == sum(a == b for a, b in zip(ours, theirs)) / 5
    assert results["kformer"]["bleu"] == round(score(list(ours), references, "zh")["bleu"], 2)
    assert results["argos"]["bleu"] == round(score(list(theirs), references, "zh")["bleu"], 2)
    assert "identical lines" in capsys.readouterr().out

"""The text graph (kformer.export.text_graph) and TFLite's text files: UTF-8, SentencePiece and
the whole text-in/text-out file against their independent references (Python's codec, the
sentencepiece library, the Python runner over the ids file)."""

import numpy as np
import pytest
import sentencepiece as spm
import tensorflow as tf
from conftest import write_random_model

from kformer.data import corpus as corpus_lib
from kformer.data import prepare as prepare_lib
from kformer.decode.options import SearchOptions
from kformer.export import tflite
from kformer.export.exporter import export
from kformer.export.formats import open_runner
from kformer.export.text_graph import sentencepiece as graph_sentencepiece
from kformer.export.text_graph import translate, utf8
from kformer.export.tflite import utf8_batch

# What an app may send: full-width forms, emoji, mixed scripts, odd spaces, empty lines, text with
# no piece in the vocabulary.
AWKWARD = [
    "",
    " ",
    "   leading and  repeated   spaces  ",
    "ＡＢＣ　全角，標點！",
    "🙂🙃 emoji 😀",
    "mixed 中文 and English, 日本語 かな, 한국어",
    "\ttab\tseparated",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𠀀𠀁",
    "Ωμέγα Жж",
    "\u3000全角空白\u3000",
    "a\u00a0b",
    "ℵℶℷ",
    "▁ already ▁▁ escaped",
    "我們試試看！\n\n他很高興。你呢？\n好",  # lines, a blank one, sentences on a line
    " \n Tom is here. He is happy.\n",
]


@pytest.fixture(scope="module")
def test_split():
    pairs, _ = corpus_lib.read_corpus()
    return prepare_lib.split_pairs(pairs)["test"]


def _padded(rows, dtype):
    batch = np.zeros((len(rows), max([1, *map(len, rows)])), dtype)
    for i, row in enumerate(rows):
        batch[i, : len(row)] = row
    return batch, np.array([len(r) for r in rows], np.int32)


def test_utf8_decodes_and_encodes_as_python():
    rng = np.random.default_rng(0)
    pieces = [bytes([b]) for b in range(256)] + [c.encode() for c in "好é🙂a "]
    samples = [b"", b"\xe2\x82A", b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xf0\x9f\x99"]
    samples += [b"".join(rng.choice(pieces, rng.integers(0, 12))) for _ in range(1500)]
    codes, counts = (t.numpy() for t in utf8.decode(*_padded([list(s) for s in samples], np.uint8)))
    expected = [s.decode("utf-8", errors="replace") for s in samples]
    assert ["".join(map(chr, codes[i, : counts[i]])) for i in range(len(samples))] == expected
    data, sizes = (t.numpy() for t in utf8.encode(codes, counts))
    assert [bytes(data[i, : sizes[i]]) for i in range(len(samples))] == [t.encode() for t in expected]


def _encode(tables, texts):
    chars, counts = _padded([[ord(c) for c in t] for t in texts], np.int32)
    ids, sizes = (t.numpy() for t in graph_sentencepiece.encode(tables, chars, counts))
    return [ids[i, : sizes[i]].tolist() for i in range(len(texts))]


def test_sentencepiece_encodes_and_decodes_as_the_library(tokenizer, test_split):
    tables = graph_sentencepiece.Tables(tokenizer)
    texts = [t for pair in test_split for t in pair] + AWKWARD
    assert _encode(tables, texts) == [tokenizer.encode(t) for t in texts]
    rng = np.random.default_rng(1)  # every kind of piece: control, unknown, "▁" first or not
    sequences = [
        rng.integers(0, tokenizer.get_piece_size(), rng.integers(0, 10)).tolist() for _ in range(1000)
    ]
    sequences += [[2, 5, 6], [1, 1, 7], [3], [0, 1]]
    # Lone "▁" pieces first: sentencepiece drops the "▁" of each piece until one leaves text.
    space = tokenizer.piece_to_id("▁")
    word = next(
        i
        for i in range(tokenizer.get_piece_size())
        if tokenizer.id_to_piece(i).startswith("▁") != (i == space)
    )
    pool = [space, space, word, tokenizer.unk_id(), 1, 2, 7]
    sequences += [rng.choice(pool, rng.integers(1, 6)).tolist() for _ in range(300)]
    text, sizes = (t.numpy() for t in graph_sentencepiece.decode(tables, *_padded(sequences, np.int32)))
    got = ["".join(map(chr, text[i, : sizes[i]])) for i in range(len(sequences))]
    assert got == [tokenizer.decode(s) for s in sequences]


def test_sentencepiece_decodes_as_the_library_without_collapsing_spaces(test_split):
    """A model that keeps extra whitespace: sentencepiece drops the first "▁" piece's space only
    (a lone "▁" first leaves the next piece's), and so does the graph."""
    import io

    proto = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter([t for _, t in test_split]), model_writer=proto, vocab_size=300, minloglevel=2,
        normalization_rule_name="identity", remove_extra_whitespaces=False,
    )  # fmt: skip
    model = spm.SentencePieceProcessor(model_proto=proto.getvalue())
    tables = graph_sentencepiece.Tables(model)
    space = model.piece_to_id("▁")
    word = next(
        i for i in range(model.get_piece_size()) if model.id_to_piece(i).startswith("▁") != (i == space)
    )
    rng = np.random.default_rng(2)
    pool = [space, space, word, model.unk_id(), 1, 2, 7]
    sequences = [rng.choice(pool, rng.integers(1, 6)).tolist() for _ in range(300)]
    text, sizes = (t.numpy() for t in graph_sentencepiece.decode(tables, *_padded(sequences, np.int32)))
    got = ["".join(map(chr, text[i, : sizes[i]])) for i in range(len(sequences))]
    assert got == [model.decode(s) for s in sequences]
    assert sum(model.decode(s).startswith(" ") for s in sequences) > 20  # spaces the rule keeps


def test_sentencepiece_runs_in_litert_with_builtins_only(tokenizer, test_split, tmp_path):
    """The tokenizer alone, converted: the stock interpreter (no custom operator resolver, no Flex
    delegate) gives sentencepiece's ids."""
    from ai_edge_litert.interpreter import Interpreter

    tables = graph_sentencepiece.Tables(tokenizer)
    fn = tf.function(
        lambda chars, counts: dict(zip(("ids", "counts"), graph_sentencepiece.encode(tables, chars, counts))),
        input_signature=[tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([None], tf.int32)],
    )
    path = str(tmp_path / "encode.tflite")
    tflite.write_flatbuffer({"encode": fn.get_concrete_function()}, path, "fp32")
    runner = Interpreter(model_path=path).get_signature_runner("encode")
    for texts in ([s for s, _ in test_split[:300]], AWKWARD):
        chars, counts = _padded([[ord(c) for c in t] for t in texts], np.int32)
        out = runner(chars=chars, counts=counts)
        ids, sizes = (v for _, v in sorted(out.items()))  # output_0 counts (B,), output_1 ids
        ids, sizes = (ids, sizes) if ids.ndim == 2 else (sizes, ids)
        assert [ids[i, : sizes[i]].tolist() for i in range(len(texts))] == [
            tokenizer.encode(t) for t in texts
        ]


def test_refuses_tokenizers_it_cannot_reproduce(corpus_pairs):
    texts = [t for p in corpus_pairs for t in p]
    import io

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=model, vocab_size=1200, minloglevel=2
    )  # sentencepiece's defaults: nmt_nfkc normalization
    nfkc = spm.SentencePieceProcessor(model_proto=model.getvalue())
    assert (
        graph_sentencepiece.refusal(nfkc)
        == "its SentencePiece model's normalization 'nmt_nfkc' is not identity"
    )
    with pytest.raises(Exception, match="cannot tokenize as this model does"):
        graph_sentencepiece.Tables(nfkc)
    assert tflite.FORMAT.planned((), text_graph=False) == ["fp32", "fixed"]
    assert tflite.FORMAT.planned(("int8",)) == [
        "fp32",
        "int8",
        "fixed",
        "int8-fixed",
        "text",
        "int8-text",
        "fixed-text",
    ]


@pytest.fixture(scope="module")
def text_export(tmp_path_factory, tokenizer):
    """A random tiny model whose source limit holds most test sentences, exported to TFLite with
    its text files (fp32 and int8)."""
    folder = tmp_path_factory.mktemp("text_model")
    model_dir = write_random_model(folder, tokenizer, max_source_length=64)
    out = str(tmp_path_factory.mktemp("text_export") / "art")
    export(
        model_dir,
        out,
        ("tflite",),
        ("int8",),
        SearchOptions(beam_size=3, max_length=12),
        progress=lambda *a, **k: None,
    )
    return out


def _paragraphs(sentences, joiner):
    return [joiner.join(sentences[i : i + 3]) for i in range(0, len(sentences) - 2, 3)]


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_text_file_translates_as_the_python_runner(text_export, test_split, tokenizer, search):
    """Every test-split line, and paragraphs of three test sentences, give the text of
    `kformer translate --runtime tflite` (the ids file in the Python runner), except where the
    stated rule differs: a sentence over max_source_length tokens is cut at that limit, not at its
    clauses. Those lines are counted."""
    options = SearchOptions(beam_size=1) if search == "greedy" else SearchOptions(beam_size=3, nbest=3)
    ids_runner = open_runner(text_export, "tflite", "fp32", options=options)
    text_runner = open_runner(text_export, "tflite", "text", options=options)
    sources = [s for s, _ in test_split]
    texts = sources + _paragraphs(sources, "") + _paragraphs([t for _, t in test_split], " ") + AWKWARD
    expected, got = ids_runner.translations(texts), text_runner.translations(texts)
    limit = ids_runner.config.max_source_length
    alike = [translate.translated_alike(tokenizer, t, limit) for t in texts]
    texts_of = lambda t: [a.text for a in t.alternatives]  # noqa: E731
    differ = [i for i, same in enumerate(alike) if same and texts_of(got[i]) != texts_of(expected[i])]
    assert not differ, [(texts[i], texts_of(expected[i]), texts_of(got[i])) for i in differ[:3]]
    assert sum(alike) >= 0.9 * len(texts), f"only {sum(alike)} of {len(texts)} texts within the source limit"
    assert any(len(t.alternatives) > 1 for t in got) == (search == "beam")
    scores = [
        (a.score, b.score)
        for g, e, same in zip(got, expected, alike)
        if same
        for a, b in zip(g.alternatives, e.alternatives)
    ]
    np.testing.assert_allclose(*np.array(scores).T, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_fixed_text_file_translates_as_the_text_file(text_export, test_split, search):
    """The fixed-text file (one text a call, inputs and outputs of one shape, for LiteRT.js) gives
    the text file's translations, alternatives and scores on test-split lines, paragraphs of
    three and the awkward inputs; its signatures have those fixed shapes."""
    options = SearchOptions(beam_size=1) if search == "greedy" else SearchOptions(beam_size=3, nbest=3)
    sources = [s for s, _ in test_split[:150]]
    texts = sources + _paragraphs(sources, "") + AWKWARD
    fixed = open_runner(text_export, "tflite", "fixed-text", options=options)
    expected = open_runner(text_export, "tflite", "text", options=options).translations(texts)
    got = fixed.translations(texts)
    assert [[a.text for a in t.alternatives] for t in got] == [
        [a.text for a in t.alternatives] for t in expected
    ]
    assert any(len(t.alternatives) > 1 for t in got) == (search == "beam")
    scores = [
        (a.score, b.score) for g, e in zip(got, expected) for a, b in zip(g.alternatives, e.alternatives)
    ]
    np.testing.assert_allclose(*np.array(scores).T, rtol=1e-4, atol=1e-4)
    signature, width = fixed.signature(search)
    assert width == translate.FIXED_TEXT_BYTES
    shapes = {name: list(d["shape_signature"]) for name, d in signature.get_output_details().items()}
    assert shapes["translation"] == [1, translate.FIXED_TRANSLATION_BYTES]
    assert all(-1 not in shape for shape in shapes.values()), shapes


def test_fixed_text_file_gives_defined_results_for_bad_input(text_export):
    """An empty text alone translates to ""; a text over the file's width and a translation over
    its room are refused in one line."""
    options = SearchOptions(beam_size=1, max_length=12)
    runner = open_runner(text_export, "tflite", "fixed-text", options=options)
    assert runner.translate([""]) == [""]
    text_signature, _ = open_runner(text_export, "tflite", "text", options=options).signature("greedy")
    (alone,) = tflite.call_text_signature(text_signature, runner.checked(), *utf8_batch([""]))
    assert alone.text == ""
    with pytest.raises(ValueError, match="a text of 4,097 bytes; the fixed-text file takes at most 4,096"):
        runner.translate(["a" * 4097])
    longest = runner.config.max_target_length
    wordy = "a\n" * (translate.FIXED_TEXT_BYTES // 2)  # a line each 2 bytes, each translated to many
    with pytest.raises(ValueError, match="the fixed-text file holds 65,536"):
        runner.translate([wordy], SearchOptions(beam_size=1, max_length=longest))


def test_text_files_use_builtin_operators_only(text_export):
    import glob

    from tensorflow.lite.python import schema_py_generated as schema

    builtins = {name for name in vars(schema.BuiltinOperator) if not name.startswith("_")} - {"CUSTOM"}
    files = sorted(
        glob.glob(f"{text_export}/tflite/*text/*.tflite") + glob.glob(f"{text_export}/tflite/*text.tflite")
    )
    assert [f.split("/tflite/")[1] for f in files] == [
        "fixed-text.tflite",
        "int8-text/beam.tflite",
        "int8-text/greedy.tflite",
        "text/beam.tflite",
        "text/greedy.tflite",
    ]
    for path in files:
        with open(path, "rb") as f:
            used = tflite.operators(f.read())
        assert used <= builtins, f"{path}: {sorted(used - builtins)}"


def test_an_over_long_sentence_is_translated_from_its_first_tokens(text_export, tokenizer):
    """The stated rule: a sentence over max_source_length tokens is cut at that limit (the Python
    runners cut it at its clauses)."""
    runner = open_runner(text_export, "tflite", "text", options=SearchOptions(beam_size=1))
    ids_runner = open_runner(text_export, "tflite", "fp32", options=SearchOptions(beam_size=1))
    limit = runner.config.max_source_length
    sentence = "我們試試看" * limit  # no end mark, no clause mark
    ids = tokenizer.encode(sentence)
    assert len(ids) > limit
    outputs, _ = ids_runner.translate_ids([ids[:limit]])
    assert runner.translate([sentence]) == [tokenizer.decode(outputs[0])]
    assert not translate.translated_alike(tokenizer, sentence, limit)


def test_text_file_gives_defined_results_for_bad_input(text_export):
    runner = open_runner(text_export, "tflite", "text", options=SearchOptions(beam_size=1))
    signature, _ = runner.signature("greedy")
    options = runner.checked()
    bad = [b"\xff\xfe ok", b"\xe4\xbd", "好".encode() + b"\x80" * 3]
    text, lengths = _padded([list(b) for b in bad], np.uint8)
    outputs = [t.text for t in tflite.call_text_signature(signature, options, text, lengths)]
    assert outputs == runner.translate([b.decode("utf-8", errors="replace") for b in bad])
    empty = tflite.call_text_signature(
        signature, options, np.zeros((0, 4), np.uint8), np.zeros((0,), np.int32)
    )
    assert empty == []
    long_text = "我們試試看！" * 500  # 500 sentences in one text
    (out,) = tflite.call_text_signature(signature, options, *utf8_batch([long_text]))
    assert out.text == runner.translate([long_text])[0] == ids_translation(text_export, long_text)
    assert runner.translate(["", "   "]) == ["", ""]


def ids_translation(text_export, text):
    return open_runner(text_export, "tflite", "fp32", options=SearchOptions(beam_size=1)).translate([text])[0]


def test_int8_text_file_agrees_with_the_int8_ids_file(text_export, test_split):
    options = SearchOptions(beam_size=1)
    sources = [s for s, _ in test_split[:200]]
    expected = open_runner(text_export, "tflite", "int8", options=options).translate(sources)
    got = open_runner(text_export, "tflite", "int8-text", options=options).translate(sources)
    assert sum(a == b for a, b in zip(got, expected)) >= 0.95 * len(sources)


def test_translate_command_runs_the_text_file(text_export):
    from conftest import run_kformer

    ran = run_kformer(
        "translate", "--model", text_export, "--runtime", "tflite", "--variant", "text", "我們試試看！"
    )
    assert ran.status == 0, ran.stderr[-2000:]
    assert ran.stdout.strip() == ids_translation(text_export, "我們試試看！")

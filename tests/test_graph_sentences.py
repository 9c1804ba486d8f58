"""export/text_graph/sentences.py: the sentence spans its graph finds, in TensorFlow and in LiteRT
(builtin operators only), against kformer.decode.sentences' split_sentences after segment_texts'
line rule, run in Python."""

import random

import numpy as np
import pytest
import tensorflow as tf

from kformer.data import corpus as corpus_lib
from kformer.data import prepare as prepare_lib
from kformer.decode import sentences
from kformer.export.text_graph import lookup
from kformer.export.text_graph import sentences as graph_sentences
from kformer.export.tflite import operators

SIGNATURE = [
    tf.TensorSpec([None, None], tf.int32, name="chars"),
    tf.TensorSpec([None], tf.int32, name="lengths"),
]
SPACES = " \t\u3000\u00a0\u2028\u2029\u205f\u0085\x0b\x1c"
EDGE_CASES = [
    "Dr. Smith went to Washington. He said hi.",
    "We met in the u.\u212a. Then we left. \u212a. Smith. \u212a.",
    "e.g. this works. U.K. is an abbreviation. And u.\u212a. is one too.",
    "MR. Brown. \u212a. Smith. \u0130. Next. i.e. this. approx. 5. Approx. Six.",
    "J. Smith agreed. (J. Smith) came. (J. Smith came. 'J. Smith. \"(J. Smith.",
    "It costs 3.14 dollars. Yahoo!Japan is here. 好!我 在。",
    "好。J. Smith 好。(J. Smith 好！Dr. Who",
    "...",
    "?!",
    "。。",
    "",
    " \t\n\u3000 ",
    ".",
    "1. Item. 1 . Item. é. Done. 😀. Emoji. x.",
    '"Go!" he said. "Go!" He went. "Stop." she said.',
    "Tom (the cat) sleeps. (Really.) Yes",
    "Wait... what?! Yes. Wait... and then.",
    "Mixed 中文 and English. 日本語です。한국어 문장입니다. Ελληνικά. Русский текст.",
    "a.b.c. d. e.g.. Next",
    "Dr.\nSmith. Line two.\n\n\nLine five. \n  \t\n",
    "\n\n  Leading and trailing.  \n\n",
    "word.\u3000Next.\u00a0next.\u2028Other. end.\u205fX",
]


def reference(text):
    """[(start, end, line)]: segment_texts' sentences of `text`, located in it."""
    spans, stripped = [], text.strip(sentences.WHITESPACE)
    cursor = len(text) - len(text.lstrip(sentences.WHITESPACE))
    for index, line in enumerate(stripped.split("\n")):
        for sentence in sentences.split_sentences(line):
            start = text.index(sentence, cursor)
            assert text[cursor:start].strip(sentences.WHITESPACE) == ""  # only whitespace between
            spans.append((start, start + len(sentence), index))
            cursor = start + len(sentence)
        cursor = text.index("\n", cursor) + 1 if index < stripped.count("\n") else cursor
    return spans


def encoded(texts, width=None):
    """(chars (B, N), lengths (B,)) of texts, padded with U+0000 (or to `width`)."""
    width = max([len(t) for t in texts] + [0]) if width is None else width
    chars = np.zeros((len(texts), width), np.int32)
    for row, text in enumerate(texts):
        chars[row, : len(text)] = [ord(c) for c in text]
    return chars, np.array([len(t) for t in texts], np.int32)


def spans(found):
    """segment's result -> [(start, end, line)] of each text."""
    found = {name: np.asarray(value) for name, value in found.items()}
    return [
        list(zip(*(found[name][row, :count].tolist() for name in ("starts", "ends", "lines"))))
        for row, count in enumerate(found["counts"].tolist())
    ]


@pytest.fixture(scope="module")
def segment():
    return tf.function(graph_sentences.segment, input_signature=SIGNATURE)


def assert_split_as_python(segment, texts, batch=500):
    wrong = []
    for first in range(0, len(texts), batch):
        chunk = texts[first : first + batch]
        found = spans(segment(*encoded(chunk)))
        wrong += [(t, [t[s:e] for s, e, _ in f]) for t, f in zip(chunk, found) if f != reference(t)]
    assert wrong == []


def test_the_test_split_and_its_paragraphs_split_as_python_does(segment):
    """Every test-split sentence of both languages, and three consecutive ones run together with
    " " and with ""."""
    pairs, _ = corpus_lib.read_corpus()
    sides = list(zip(*prepare_lib.split_pairs(pairs)["test"]))
    texts = [text for side in sides for text in side]
    for side in sides:
        texts += [joiner.join(side[i : i + 3]) for i in range(0, len(side), 3) for joiner in (" ", "")]
    assert_split_as_python(segment, texts)
    assert sum(len(reference(t)) == 3 for t in texts) > 1000  # the paragraphs split


def test_lines_and_whitespace_split_as_python_does(segment):
    lines = ["First one. Second one!", "第一句。第二句！", "", "   ", "Last?"]
    texts = ["\n".join(lines), "\n\n".join(lines), "  \n" + "\n \t\n".join(lines) + "\n \u3000"]
    texts += [space.join(lines) + space for space in SPACES]
    texts += [space + "Mr. Smith." + space + "Yes." + space for space in SPACES]
    texts += ["\n", "\n\n\n", " \n ", "a\n\nb", "a.\n", "\na.", "a\u2028b. c"]
    assert_split_as_python(segment, texts)


def test_edge_cases_split_as_python_does(segment):
    assert_split_as_python(segment, EDGE_CASES)
    expected = {  # what the reference says, spelled out for the cases the rules name
        "好。J. Smith 好。(J. Smith 好！Dr. Who": ["好。", "J. Smith 好。", "(J. Smith 好！", "Dr. Who"],
        "e.g. this works. U.K. is an abbreviation. And u.\u212a. is one too.": [
            "e.g. this works.",
            "U.K. is an abbreviation.",
            "And u.\u212a. is one too.",
        ],
        "We met in the u.\u212a. Then we left. \u212a. Smith. \u212a.": [
            "We met in the u.\u212a. Then we left.",
            "\u212a. Smith.",
            "\u212a.",
        ],
        "": [],
        " \t\n\u3000 ": [],
        ".": ["."],
    }
    texts = list(expected)
    for text, found in zip(texts, spans(segment(*encoded(texts)))):
        assert [text[start:end] for start, end, _ in found] == expected[text]


def test_random_texts_split_as_python_does(segment):
    """Random strings of the characters and words the rules read: what finds the hard cases."""
    pieces = list(sentences.ENDS + sentences.CLOSERS + sentences.OPENERS + "aAeEgGiIJkKmMnpPsStTuUxz")
    pieces += ["Dr", "e.g", "u.k", "approx", "\u212a", "\u0130", "好", "我", "ア", "한", "1", ",", "😀", "é"]
    pieces += list(SPACES) + ["\n"] * 3
    rng = random.Random(1234)
    texts = ["".join(rng.choices(pieces, k=rng.randrange(0, 60))) for _ in range(10000)]
    assert_split_as_python(segment, texts)


def test_tables_are_pythons():
    """The graph's character classes equal Python's for every code point, and no code point whose
    lower() is several characters can lower into an abbreviation."""
    codes = np.arange(lookup.CODE_POINTS, dtype=np.int32)
    classes = graph_sentences._classes(tf.constant(codes[None]))
    characters = [chr(c) for c in codes]
    assert np.array_equal(classes.alpha.numpy()[0], [c.isalpha() for c in characters])
    assert np.array_equal(classes.space.numpy()[0], [c in sentences.WHITESPACE for c in characters])
    assert np.array_equal(classes.closer.numpy()[0], [c in sentences.CLOSERS for c in characters])
    lowered = {c.lower() for c in characters if len(c.lower()) == 1}
    digits = classes.digit.numpy()[0]
    alphabet = graph_sentences.ABBREVIATION_ALPHABET
    assert all(digits[ord(c)] == alphabet.index(c.lower()) + 1 for c in characters if c.lower() in alphabet)
    assert np.count_nonzero(digits) == sum(c.lower() in alphabet for c in characters) and lowered
    several = [c.lower() for c in characters if len(c.lower()) > 1]
    assert several and all(any(x not in alphabet for x in lower) for lower in several)
    assert sentences.WHITESPACE == "".join(c for c in characters if c.isspace())  # what str.split() splits at


@pytest.fixture(scope="module")
def litert(segment):
    """segment converted to a TFLite flatbuffer (builtins only) and run in LiteRT."""
    from ai_edge_litert.interpreter import Interpreter

    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [segment.get_concrete_function()], tf.Module()
    )
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    flatbuffer = converter.convert()
    assert not [op for op in operators(flatbuffer) if op.startswith("CUSTOM") or "FLEX" in op]
    runner = Interpreter(model_content=flatbuffer).get_signature_runner()
    return lambda chars, lengths: runner(chars=chars, lengths=lengths)


def test_litert_splits_as_tensorflow_does(segment, litert):
    """LiteRT gives TensorFlow's spans for batches of two shapes (resized inputs), past-the-end
    characters set to anything, no texts, and empty texts."""
    texts = EDGE_CASES + ["\n".join(EDGE_CASES), "Short. One."]
    for batch in (texts, texts[3:9]):
        chars, lengths = encoded(batch, width=max(map(len, batch)) + 5)
        chars[chars == 0] = ord(".")  # past each text's length: ignored
        found = litert(chars, lengths)
        assert spans(found) == spans(segment(chars, lengths)) == [reference(t) for t in batch]
        assert found["starts"].shape[1] == max(map(len, spans(found)))
    for rows, width in ((0, 5), (3, 0), (0, 0), (2, 4)):  # no texts, empty texts, blank texts
        found = litert(np.full((rows, width), ord(" "), np.int32), np.full(rows, width, np.int32))
        assert found["counts"].tolist() == [0] * rows and found["starts"].shape == (rows, 0)

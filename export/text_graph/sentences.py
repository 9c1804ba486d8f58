"""Where texts split into sentences, inside a TensorFlow graph: the spans of
kformer/decode/text_batches.py's `segment_texts` (a text stripped, cut at "\\n", each line through
kformer/decode/sentences.py's `split_sentences`), computed from code points with TFLite builtin
operators only, so that a .tflite file can take raw text.

No strings and no loop over characters: every rule of `split_sentences` is a mask over the code
points, and "the next/last position where ..." is a running min/max along the text, in log2(N)
doubling steps. The rules' character sets come from kformer.decode.sentences, and `str.isalpha`
and `str.lower` from Python's own tables, read when the graph is built.

Letters: B texts, N code points a text, W = N + 1 positions inside (a column past every text's
end, so that a "next position" always exists), K sentences a text at most.
"""

import functools
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from kformer.decode import sentences as rules
from kformer.export.text_graph import lookup
from kformer.export.text_graph.lookup import look_up, two_stage

# A word that a "." follows without ending the sentence is an abbreviation or a single letter. Its
# characters lowered, each a digit in base 32 (0: a character no abbreviation holds), make a key.
ABBREVIATION_ALPHABET = "".join(sorted(set("".join(rules.ABBREVIATIONS))))
LONGEST_ABBREVIATION = max(map(len, rules.ABBREVIATIONS))
_BASE = 32


def _digits():
    """{character: its digit (1-based)} in the abbreviations' alphabet."""
    return {c: i + 1 for i, c in enumerate(ABBREVIATION_ALPHABET)}


def _every_code_point():
    """(codes, characters) of every code point (a surrogate is of no class, as Python says)."""
    codes = np.arange(lookup.CODE_POINTS)
    return codes, [chr(c) for c in codes]


@functools.cache
def _character_tables():
    """Two two-stage tables of every code point: (str.isalpha,) and (whether it is in WHITESPACE,
    ENDS, WIDE_ENDS, CLOSERS, OPENERS, "!?"; is_wide; its digit). Apart, as the letters take many
    blocks and the rest few. Only a code point whose lower() is one character gets a
    digit: one lowering to several (U+0130 -> "i" + U+0307) yields a non-ASCII mark that no
    abbreviation holds (tests check it)."""
    codes, characters = _every_code_point()
    alpha = np.array([c.isalpha() for c in characters])
    members = (rules.WHITESPACE, rules.ENDS, rules.WIDE_ENDS, rules.CLOSERS, rules.OPENERS, "!?")
    classes = np.stack([np.isin(codes, [ord(c) for c in m]) for m in members], axis=1)
    wide = np.array([rules.is_wide(c) for c in characters])
    digits, lowered = _digits(), [c.lower() for c in characters]
    digit = np.array([digits.get(c, 0) for c in lowered], np.int32)
    return two_stage(alpha), two_stage(classes, wide, digit)


class _Classes(NamedTuple):
    """Each character's classes, each (B, W) bool, and its digit (B, W) int32."""

    space: tf.Tensor
    end: tf.Tensor
    wide_end: tf.Tensor
    closer: tf.Tensor
    opener: tf.Tensor
    bang: tf.Tensor  # "!" or "?"
    alpha: tf.Tensor
    wide: tf.Tensor
    digit: tf.Tensor


def _classes(chars):
    """The classes of code points chars (B, W) (any int32: out of range reads as U+0000)."""
    letters, others = _character_tables()
    chars = tf.where((chars >= 0) & (chars < lookup.CODE_POINTS), chars, 0)
    (alpha,) = look_up(chars, letters)
    members, wide, digit = look_up(
        chars, others
    )  # members (B, W, 6): sliced, as LiteRT unpacks no empty batch
    # space, end, wide_end, closer, opener, bang: _Classes' first six, in `members`' order
    return _Classes(*(members[:, :, i] for i in range(6)), alpha, wide, digit)


def is_whitespace(chars):
    """Whether each code point of chars (B, W) is whitespace as kformer.decode.sentences (and
    Python's str.split) reads it."""
    return _classes(chars).space


@functools.cache
def _abbreviation_table():
    """A table with each abbreviation's key at slot key % len(table), -1 elsewhere: the smallest
    size that gives every key a slot of its own. A word's key sums each digit times _BASE**j,
    j counted from the word's last character."""
    digits = _digits()
    keys = [sum(digits[c] * _BASE**j for j, c in enumerate(reversed(word))) for word in rules.ABBREVIATIONS]
    size = next(n for n in range(len(keys), 100 * len(keys)) if len({k % n for k in keys}) == len(keys))
    table = np.full(size, -1, np.int32)
    table[[k % size for k in keys]] = keys
    return table


def _running(values, from_right):
    """The running max of values (S, W) along the text, or with from_right the running min from
    the end: log2(W) steps, each combining every position with the one `shift` away (clamped to
    the text's ends, which the running max/min already covers). The loop runs on the transposed
    (W, S), where a shifted copy is a gather of whole rows."""
    values = tf.transpose(values)  # (W, S)
    width = tf.shape(values)[0]
    positions = tf.range(width)

    def step(values, shift):
        if from_right:
            return tf.minimum(values, tf.gather(values, tf.minimum(positions + shift, width - 1))), shift * 2
        return tf.maximum(values, tf.gather(values, tf.maximum(positions - shift, 0))), shift * 2

    values, _ = tf.while_loop(lambda values, shift: shift < width, step, [values, tf.constant(1)])
    return tf.transpose(values)


def _scan(flags, positions, from_right):
    """For each of the (B, W) masks in `flags`: the first position >= p where it holds (W if none)
    with from_right, else the last position <= p where it holds (-1 if none). The masks go
    through one loop together, stacked along the batch."""
    missing = tf.shape(positions)[1] if from_right else -1
    stacked = tf.concat([tf.where(flag, positions, missing) for flag in flags], axis=0)  # (S * B, W)
    return tf.split(_running(stacked, from_right), len(flags), axis=0)


def _before(values, fill):
    """values (B, W) moved one position right: position p holds values[p - 1] (fill at 0)."""
    return tf.pad(values[:, :-1], [[0, 0], [1, 0]], constant_values=fill)


def _at(values, index):
    """values[b, index[b, ...]] for values (B, W) and index (B, ...) within [0, W)."""
    return tf.gather(values, index, batch_dims=1)


class _Text(NamedTuple):
    """Code points and their classes, each (B, W) but text_end (B, 1)."""

    chars: tf.Tensor
    positions: tf.Tensor
    classes: _Classes  # none past the text's length
    space: tf.Tensor  # whitespace within the text's length
    solid: tf.Tensor  # any other character within it
    newline: tf.Tensor  # a "\n" between two lines of the stripped text
    line_of: tf.Tensor  # how many such "\n" come up to p: the line index of a character
    text_end: tf.Tensor  # the stripped text's end: one past its last solid character


def _read(chars, lengths):
    """The texts' code points, a column past every end added, and their classes."""
    lengths = tf.minimum(lengths, tf.shape(chars)[1])[:, None]  # (B, 1): the added column is past every end
    chars = tf.pad(chars, [[0, 0], [0, 1]])  # (B, W)
    positions = tf.broadcast_to(tf.range(tf.shape(chars)[1])[None], tf.shape(chars))
    valid = positions < lengths
    classes = _classes(tf.where(valid, chars, 0))  # U+0000 is of no class
    space = classes.space
    solid = valid & ~space
    text_start = tf.reduce_min(tf.where(solid, positions, lengths), axis=1, keepdims=True)
    text_end = tf.reduce_max(tf.where(solid, positions, -1), axis=1, keepdims=True) + 1
    newline = tf.equal(chars, ord("\n")) & (positions > text_start) & (positions < text_end)
    line_of = tf.cumsum(tf.cast(newline, tf.int32), axis=1)
    return _Text(chars, positions, classes, space, solid, newline, line_of, text_end)


class _Runs(NamedTuple):
    """split_sentences' runs of sentence ends with their closers (line[end:after]), read at the
    position of the run's first end, and the nearest positions the rules read; each (B, W)."""

    first: tf.Tensor  # a run starts here
    after: tf.Tensor  # one past its closers
    wide: tf.Tensor  # it holds a WIDE_ENDS: it ends a sentence whatever follows
    marks: tf.Tensor  # an end or a closer
    owner: tf.Tensor  # the last position <= p where a run starts (-1 if none)
    previous: tf.Tensor  # the last solid position < p (-1 if none)
    rest: tf.Tensor  # the first position >= p that is no whitespace within a line
    unopened: tf.Tensor  # the first position >= p that is no opener


def _runs(text):
    """The runs of sentence ends (where each starts, stops, whether it holds a wide end) and the
    nearest positions of a kind, found in two loops."""
    ends, closers, openers = text.classes.end, text.classes.closer, text.classes.opener
    first = ends & ~_before(ends, False)
    inline_space = text.space & ~text.newline & (text.positions < text.text_end)
    run_end, past_closers, rest, unopened = _scan(
        [~ends, ~closers, ~inline_space, ~openers], text.positions, from_right=True
    )  # the sentinel column is none of these: every position found is within (B, W)
    last_solid, owner = _scan([text.solid, first], text.positions, from_right=False)
    after = _at(past_closers, run_end)  # the ends are one run: no end is a closer
    wide = tf.cumsum(tf.cast(text.classes.wide_end, tf.int32), axis=1, exclusive=True)
    has_wide = _at(wide, run_end) > wide
    return _Runs(first, after, has_wide, ends | closers, owner, _before(last_solid, -1), rest, unopened)


def _closing(text, runs, splits):
    """(B, W): p is the last character of a run (its closers included) that `splits` (B, W, read
    at the run's first end) says ends a sentence."""
    owner = tf.maximum(runs.owner, 0)
    return (runs.owner >= 0) & tf.equal(_at(runs.after, owner), text.positions + 1) & _at(splits, owner)


def _abbreviated(text, runs, cuts):
    """(B, W): the word that ends at p (from the last cut before it, its openers dropped) is a
    single letter or an abbreviation, so that a "." after it does not end a sentence.

    A word ends where split_sentences' `line[start:end].split()[-1]` ends; it starts after the
    last whitespace, or where a sentence began inside the word: `cuts` holds the characters
    such a sentence follows. A word ending in an end or a closer is neither (none is a letter,
    no abbreviation ends in one), so whatever cut it does not matter."""
    (last_cut,) = _scan([cuts], text.positions, from_right=False)
    start = _at(runs.unopened, _before(last_cut, -1) + 1)  # (B, W): word.lstrip(OPENERS)
    size = text.positions - start + 1
    letter = tf.equal(size, 1) & text.classes.alpha
    width = tf.shape(size)[1]
    digits = tf.pad(text.classes.digit, [[0, 0], [LONGEST_ABBREVIATION, 0]])  # (B, W + longest)
    key, unknown = tf.zeros_like(size), (size < 1) | (size > LONGEST_ABBREVIATION)
    for j in range(LONGEST_ABBREVIATION):  # the digit of the word's character j from its end
        begin = LONGEST_ABBREVIATION - j
        digit = digits[:, begin : begin + width]  # (B, W): position p holds digit[p - j]
        inside = j < size
        unknown |= inside & tf.equal(digit, 0)
        key += tf.where(inside, digit * _BASE**j, 0)
    table = _abbreviation_table()
    known = ~unknown & tf.equal(tf.gather(tf.constant(table), tf.math.floormod(key, len(table))), key)
    return (letter | known) & ~runs.marks


def _splits(text, runs):
    """(B, W): the run starting at p ends its sentence (`_ends_here`); False elsewhere.

    `_ends_here` reads the sentence's start only for the word before a ".". A sentence starts
    inside a word only after a run that a solid character follows, and those runs' verdicts do
    not read the start; so they are decided first, then the words, then the other runs."""
    inside = _at(text.solid, runs.after)  # "3.14", "Yahoo!Japan", "好!我"
    bang_wide = text.classes.bang & _at(text.classes.wide, runs.after)
    inner = runs.first & (runs.wide | inside & bang_wide)
    # A run at a line's end (`after == len(line)`) needs no rule: the line ends its sentence either
    # way. Elsewhere whitespace follows, then a solid character or a "\n": line[after:].lstrip()[0].
    rest_char = _at(text.chars, _at(runs.rest, runs.after))
    lower = (rest_char >= ord("a")) & (rest_char <= ord("z"))
    period = tf.equal(text.chars, ord(".")) & tf.equal(runs.after, text.positions + 1)  # run == "."
    word_end = tf.maximum(runs.previous, 0)
    same_line = (runs.previous >= 0) & tf.equal(_at(text.line_of, word_end), text.line_of)
    abbreviated = _abbreviated(text, runs, text.space | _closing(text, runs, inner))
    spaced = ~lower & ~(period & same_line & _at(abbreviated, word_end))
    return runs.first & (runs.wide | tf.where(inside, inner, spaced))


def _sentences(text, runs, closes):
    """starts, ends, lines (B, K) and counts (B,) of the sentences: a sentence starts at a solid
    character with a line start or a sentence's end between it and the solid character before."""
    previous = tf.maximum(runs.previous, 0)  # (B, W)
    starts_here = text.solid & (
        (runs.previous < 0) | tf.not_equal(_at(text.line_of, previous), text.line_of) | _at(closes, previous)
    )
    counts = tf.reduce_sum(tf.cast(starts_here, tf.int32), axis=1)  # (B,)
    most = tf.reduce_max(tf.concat([counts, [0]], axis=0))  # K; 0 for no texts
    width = tf.shape(text.chars)[1]
    starts = tf.math.top_k(tf.where(starts_here, width - text.positions, 0), k=most).indices  # (B, K)
    order = tf.range(most)[None]  # (1, K)
    live = order < counts[:, None]
    following = tf.pad(starts[:, 1:], [[0, 0], [0, 1]])  # the next sentence's start
    ends = tf.where(order + 1 < counts[:, None], _at(previous, following) + 1, text.text_end)
    zeros = tf.zeros_like(starts)
    return {
        "starts": tf.where(live, starts, zeros),
        "ends": tf.where(live, ends, zeros),
        "lines": tf.where(live, _at(text.line_of, starts), zeros),
        "counts": counts,
    }


def segment(chars, lengths):
    """The sentences of B texts, as `segment_texts` cuts them: each text stripped, cut at "\\n",
    each line split by `split_sentences`.

    chars: int32 (B, N), the code points of each text (past lengths[b], anything); lengths: int32
    (B,). Returns int32 tensors: "starts", "ends" (B, K), each sentence's span in its text's code
    points (end exclusive; positions in the unstripped text); "lines" (B, K), the index of its line
    in text.strip(WHITESPACE).split("\\n"); "counts" (B,), how many sentences a text has (0 for a
    blank text). K is the largest count; entries past a text's count are 0."""
    text = _read(tf.convert_to_tensor(chars, tf.int32), tf.convert_to_tensor(lengths, tf.int32))
    runs = _runs(text)
    return _sentences(text, runs, _closing(text, runs, _splits(text, runs)))

"""A translation search with text around it: UTF-8 bytes in, UTF-8 bytes out, everything between
(sentences, SentencePiece, joining) in graph operations that TFLite has built in. What
`kformer.decode.text_batches` does in Python, with one difference: a sentence longer than the
model's max_source_length tokens is translated from its first max_source_length tokens (the
search keeps them), not cut at its clauses.

Letters: B texts, N bytes (C code points) a text, S sentences of all texts, K sentences a text."""

from typing import NamedTuple

import tensorflow as tf

from kformer.decode import sentences as sentences_lib
from kformer.decode.text_batches import NEG_INF_SCORE
from kformer.export.text_graph import ragged, sentencepiece, sentences, utf8

NEWLINE = 0x0A


class Sentences(NamedTuple):
    """The sentences of a batch of texts, in order."""

    text: tf.Tensor  # (S, L) code points
    lengths: tf.Tensor  # (S,)
    text_of: tf.Tensor  # (S,) the text each is from
    lines: tf.Tensor  # (S,) its line in its text
    per_text: tf.Tensor  # (B,) how many each text has
    joiner: list = []  # code points between two translated sentences of a line


def _sentences(chars, counts):
    """(B, C) code points, counts (B,) -> the Sentences of the texts (kformer.decode.sentences'
    rules, in kformer.export.text_graph.sentences)."""
    found = sentences.segment(chars, counts)
    per_text = tf.shape(found["starts"])[1]
    keep = tf.range(per_text)[tf.newaxis, :] < found["counts"][:, tf.newaxis]  # (B, K)
    flat = tf.range(tf.size(keep))[tf.newaxis, :]
    which, _ = ragged.compact(flat, tf.reshape(keep, [1, -1]))
    which = which[0]  # (S,) index into the flattened (B, K)
    starts, ends, lines = (tf.gather(tf.reshape(found[k], [-1]), which) for k in ("starts", "ends", "lines"))
    text_of = which // tf.maximum(per_text, 1)  # LiteRT checks the divisor of an empty division too
    one = tf.ones_like(which)[:, tf.newaxis]  # (S, 1): one part a sentence
    text, lengths = ragged.join_parts(
        chars, text_of[:, tf.newaxis] * one, starts[:, tf.newaxis], (ends - starts)[:, tf.newaxis]
    )
    return Sentences(text, lengths, text_of, lines, found["counts"])


def translated_alike(tokenizer, text, max_source_length):
    """Whether the text graph translates `text` as kformer.decode.text_batches does: each of its
    sentences is at most max_source_length tokens (a longer one is cut at its clauses there, at
    its token limit here)."""
    lines = text.strip(sentences_lib.WHITESPACE).split("\n")
    return all(
        len(tokenizer.encode(sentence)) <= max_source_length
        for line in lines
        for sentence in sentences_lib.split_sentences(line)
    )


def _padded_to(values, width):
    """(R, W) -> (R, width), zeros added on the right (width >= W)."""
    return tf.pad(values, [[0, 0], [0, width - tf.shape(values)[1]]])


def _readable(tables, text, lengths):
    """(S,) bool: whether any character of a sentence other than whitespace is a piece. From
    unknown ids alone the model would invent a sentence, so one that is not is output as it is
    (kformer.decode.text_batches does the same)."""
    inside = tf.range(tf.shape(text)[1])[tf.newaxis, :] < lengths[:, tf.newaxis]
    solid = ~sentences.is_whitespace(text)
    return tf.reduce_any(inside & solid & sentencepiece.is_piece(tables, text), axis=1)


def _decoded(tables, tokens, config):
    """(S, T) output tokens -> (text (S, M) code points, lengths (S,)): the tokens before the first
    EOS, padding left out, detokenized."""
    before_eos = tf.equal(tf.cumsum(tf.cast(tf.equal(tokens, config.eos_id), tf.int32), axis=1), 0)
    ids, counts = ragged.compact(tokens, before_eos & tf.not_equal(tokens, config.pad_id))
    return sentencepiece.decode(tables, ids, counts)


def _joined(translations, lengths, per_text, lines, joiner):
    """Each text's sentences' translations in order: "\\n" between lines (as many as the lines
    they are apart), `joiner` (code points) between the sentences of a line -> ((B, M), (B,))."""
    sentences_count = tf.shape(translations)[0]
    widest = tf.reduce_max(tf.concat([per_text, [0]], 0))
    k = tf.range(widest)[tf.newaxis, :]  # (1, K)
    valid = k < per_text[:, tf.newaxis]  # (B, K)
    row = tf.minimum(
        tf.cumsum(per_text, exclusive=True)[:, tf.newaxis] + k, tf.maximum(sentences_count - 1, 0)
    )
    line = tf.gather(tf.concat([lines, [0]], 0), row)
    before = tf.gather(tf.concat([lines, [0]], 0), tf.maximum(row - 1, 0))
    newlines = tf.where(valid, tf.where(tf.equal(k, 0), line, line - before), 0)  # (B, K)
    width = tf.maximum(
        tf.shape(translations)[1], tf.reduce_max(tf.concat([tf.reshape(newlines, [-1]), [len(joiner)]], 0))
    )
    table = tf.concat(
        [
            _padded_to(translations, width),
            tf.fill([1, width], NEWLINE),
            _padded_to(tf.constant([list(joiner) or [0]], tf.int32), width),
        ],
        axis=0,
    )
    separator_row = tf.where(newlines > 0, sentences_count, sentences_count + 1)
    separator_length = tf.where(newlines > 0, newlines, tf.where(valid & (k > 0), len(joiner), 0))
    translation_length = tf.where(valid, tf.gather(tf.concat([lengths, [0]], 0), row), 0)
    rows = tf.reshape(tf.stack([separator_row, row], axis=2), [tf.shape(valid)[0], -1])  # (B, 2K)
    parts = tf.reshape(tf.stack([separator_length, translation_length], axis=2), [tf.shape(valid)[0], -1])
    return ragged.join_parts(table, rows, tf.zeros_like(rows), parts)


def _searched(search, tables, config, text, lengths, options):
    """Sentences (S, L) code points -> their hypotheses: tokens (S, K, T), scores (S, K) (K = 1 for
    greedy search)."""
    ids, _ = sentencepiece.encode(tables, text, lengths)  # (S, T)
    # A row and a column at least: a batch without sentences still runs.
    empty = tf.cast(tf.equal(tf.shape(ids)[0], 0), tf.int32)
    ids = tf.pad(ids, [[0, empty], [0, tf.maximum(1 - tf.shape(ids)[1], 0)]], constant_values=config.pad_id)
    found = search(ids, *options)
    count = tf.shape(lengths)[0]
    tokens, scores = found["tokens"][:count], found["scores"][:count]
    if tokens.shape.rank == 2:  # greedy: (S, T) -> (S, 1, T)
        tokens, scores = tokens[:, tf.newaxis], scores[:, tf.newaxis]
    return tokens, scores


def _hypothesis_texts(tables, config, tokens, scores, text, lengths):
    """Hypotheses (S, K, T) -> their texts (S * K, M) code points, lengths (S * K,), scores (S, K):
    a sentence none of whose characters is a piece keeps its own text, score 0 (as
    kformer.decode.text_batches does)."""
    beams = tokens.shape[1]
    out, out_lengths = _decoded(tables, tf.reshape(tokens, [-1, tf.shape(tokens)[2]]), config)
    readable = tf.repeat(_readable(tables, text, lengths), beams)  # (S * K,)
    own = tf.repeat(text, beams, axis=0)
    width = tf.maximum(tf.shape(out)[1], tf.shape(text)[1])
    out = tf.where(readable[:, tf.newaxis], _padded_to(out, width), _padded_to(own, width))
    out_lengths = tf.where(readable, out_lengths, tf.repeat(lengths, beams))
    return out, out_lengths, tf.where(tf.reshape(readable, [-1, beams]), scores, 0.0)


def _versions(texts, lengths, scores, nbest, sentences):
    """Each text's versions: version i joins each sentence's i-th hypothesis (its last where it has
    fewer: a slot is a hypothesis if it is the first, or scores above NEG_INF_SCORE, and under
    nbest), i < K -> (code points (B, K, M), lengths (B, K), scores (B, K))."""
    beams = scores.shape[1]
    slot = tf.range(beams)[tf.newaxis, :]
    found = (slot < nbest) & (tf.equal(slot, 0) | (scores > NEG_INF_SCORE))  # (S, K)
    last = tf.reduce_sum(tf.cast(found, tf.int32), axis=1) - 1  # (S,)
    by_text = tf.one_hot(sentences.text_of, tf.shape(sentences.per_text)[0], dtype=tf.float32)  # (S, B)
    joined, joined_lengths, totals = [], [], []
    for i in range(beams):
        pick = tf.minimum(i, last)  # (S,)
        row = tf.range(tf.shape(last)[0]) * beams + pick
        version, size = _joined(
            tf.gather(texts, row),
            tf.gather(lengths, row),
            sentences.per_text,
            sentences.lines,
            sentences.joiner,
        )
        joined.append(version)
        joined_lengths.append(size)
        totals.append(tf.reduce_sum(by_text * tf.gather(scores, pick, batch_dims=1)[:, tf.newaxis], 0))
    width = tf.reduce_max(tf.stack([tf.shape(v)[1] for v in joined]))
    stacked = tf.stack([_padded_to(v, width) for v in joined], axis=1)  # (B, K, M)
    return stacked, tf.stack(joined_lengths, axis=1), tf.stack(totals, axis=1)


def _distinct(versions, lengths, nbest):
    """(B, K) whether version i is an alternative: i < nbest and its text differs from every
    earlier version's (kformer.decode.text_batches.join_translations leaves duplicates out)."""
    beams = versions.shape[1]
    inside = tf.range(tf.shape(versions)[2])[tf.newaxis, tf.newaxis, :] < lengths[:, :, tf.newaxis]
    versions = tf.where(inside, versions, -1)
    same = tf.reduce_all(tf.equal(versions[:, :, tf.newaxis], versions[:, tf.newaxis]), axis=3)  # (B, K, K)
    earlier = tf.range(beams)[tf.newaxis, :] < tf.range(beams)[:, tf.newaxis]  # (K, K) j < i
    repeats = tf.reduce_any(same & earlier[tf.newaxis], axis=2)
    return ~repeats & (tf.range(beams)[tf.newaxis, :] < nbest)


def _alternatives(versions, lengths, scores, nbest):
    """Each text's distinct versions, best first -> {"alternatives": (B, K, M') UTF-8,
    "alternative_lengths" (B, K), "alternative_scores" (B, K), "alternative_counts" (B,)}."""
    keep = _distinct(versions, lengths, nbest)
    order, counts = ragged.compact(tf.range(tf.shape(keep)[1]) + tf.zeros_like(tf.cast(keep, tf.int32)), keep)
    beams = versions.shape[1]
    order = tf.pad(order, [[0, 0], [0, beams - tf.shape(order)[1]]])  # (B, K)
    kept = tf.range(beams)[tf.newaxis, :] < counts[:, tf.newaxis]
    chosen = tf.gather(versions, order, batch_dims=1)
    chosen_lengths = tf.where(kept, tf.gather(lengths, order, batch_dims=1), 0)
    flat, flat_sizes = utf8.encode(
        tf.reshape(chosen, [-1, tf.shape(chosen)[2]]), tf.reshape(chosen_lengths, [-1])
    )
    return {
        "alternatives": tf.reshape(flat, [tf.shape(chosen)[0], beams, -1]),
        "alternative_lengths": tf.reshape(flat_sizes, [-1, beams]),
        "alternative_scores": tf.where(kept, tf.gather(scores, order, batch_dims=1), 0.0),
        "alternative_counts": counts,
    }


# The fixed-shape text file (LiteRT.js plans each tensor once, so the inputs and outputs keep one
# shape; what lies between still follows the text): one text a call of at most FIXED_TEXT_BYTES
# bytes, translations written into FIXED_TRANSLATION_BYTES (cut there, their lengths kept whole).
FIXED_TEXT_BYTES = 4096
FIXED_TRANSLATION_BYTES = 16 * FIXED_TEXT_BYTES


def with_fixed_shapes(text_fn, beam_size):
    """`text_search`'s function -> the same whose outputs, for one text, have static shapes:
    texts (1, W) and alternatives (1, beam_size, W), W = FIXED_TRANSLATION_BYTES, zeros after;
    per-alternative values (1, beam_size), zeros after the counted ones; lengths unchanged (over
    W: cut)."""
    return lambda *inputs: _fixed_shape(text_fn(*inputs), beam_size)


def _fixed_shape(outputs, beam_size):
    width = FIXED_TRANSLATION_BYTES
    shapes = {
        "translation": [1, width],
        "lengths": [1],
        "scores": [1],
        "alternatives": [1, beam_size, width],
        "alternative_lengths": [1, beam_size],
        "alternative_scores": [1, beam_size],
        "alternative_counts": [1],
    }
    return {name: _static(value, shapes[name]) for name, value in outputs.items()}


def _static(value, shape):
    """`value`, zeros added or values cut on every axis to `shape` (int32 in between: TFLite has
    no uint8 PAD)."""
    wide = tf.cast(value, tf.int32) if value.dtype == tf.uint8 else value
    # Padded first, so that the cut (TFLite's SLICE) never reads past the end.
    wide = tf.pad(wide, [[0, tf.maximum(size - tf.shape(wide)[axis], 0)] for axis, size in enumerate(shape)])
    wide = wide[tuple(slice(0, size) for size in shape)]
    return tf.cast(tf.reshape(wide, shape), value.dtype)


def text_search(search, tables, config, joiner, beam):
    """`search(source_ids, *options) -> {"tokens", "scores"}` (a Translator's) -> a function
    (text (B, N) uint8 UTF-8, lengths (B,) int32, *options) -> {"translation": (B, M) uint8 UTF-8,
    "lengths": (B,) int32, "scores": (B,) float32: the sum of its sentences'}; beam search adds
    "alternatives" (B, K, M') uint8 (the distinct versions, best first, as
    text_batches.Translation.alternatives), "alternative_lengths" (B, K), "alternative_scores"
    (B, K) and "alternative_counts" (B,). joiner: what goes between the translated sentences of a
    line (kformer.decode.sentences.joiner)."""
    joiner = [ord(c) for c in joiner]

    def translate(text, lengths, options, nbest):
        chars, counts = utf8.decode(text, lengths)
        found = _sentences(chars, counts)._replace(joiner=joiner)
        tokens, scores = _searched(search, tables, config, found.text, found.lengths, options)
        texts, text_lengths, scores = _hypothesis_texts(
            tables, config, tokens, scores, found.text, found.lengths
        )
        versions, version_lengths, version_scores = _versions(texts, text_lengths, scores, nbest, found)
        if not beam:
            data, sizes = utf8.encode(versions[:, 0], version_lengths[:, 0])
            return {"translation": data, "lengths": sizes, "scores": version_scores[:, 0]}
        out = _alternatives(versions, version_lengths, version_scores, nbest)  # the best kept first
        best = {
            "translation": "alternatives",
            "lengths": "alternative_lengths",
            "scores": "alternative_scores",
        }
        return {**out, **{name: out[alternatives][:, 0] for name, alternatives in best.items()}}

    # Named inputs, as the ids files' (the options by name, in the order the search takes them).
    if beam:
        return lambda text, lengths, alpha, max_length, no_repeat_ngram, nbest: translate(
            text, lengths, (alpha, max_length, no_repeat_ngram, nbest), nbest
        )
    return lambda text, lengths, max_length, no_repeat_ngram: translate(
        text, lengths, (max_length, no_repeat_ngram), 1
    )

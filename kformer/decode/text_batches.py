"""Text <-> id batching around a translation graph. Pure Python + numpy (no TensorFlow), so the
device runners of `export/` share it with `kformer.decode.translator`; export/web/kformer.js follows it
line for line.

A text is cut into units the model can take (kformer.decode.sentences: lines, then sentences, and a
sentence over the model's source length at its clauses), the units of all texts are translated
together in length-sorted batches, and each text's translation is its units' joined in order.
"""

import dataclasses
import logging
from typing import NamedTuple

import numpy as np

from kformer.decode import sentences as sentences_lib

log = logging.getLogger("kformer")
# Scores at or below it mark a beam slot without a hypothesis: search.NEG_INF, which a float16 file
# (TFLite fp16) holds as float16's lowest finite value. No hypothesis scores this low.
NEG_INF_SCORE = -65504.0
# A greedy call's memory grows with its rows times their padded length: a batch of long sentences
# takes fewer of them, at most this many source tokens a sentence of its size (rows x longest,
# padding included): without the cap a file's last batch of long sentences set every runtime's
# peak, at the same speed and translations (`kformer bench runtimes` reports peaks). Beam calls
# capped at this length were slower; a beam call's cap is BEAM_TOKENS_PER_SENTENCE, for larger
# calls (`Runner.sentences_per_call`).
TOKENS_PER_SENTENCE = 16
# A beam call in a runner with `Runner.beam_capped` (onnxruntime's and LiteRT's graphs) takes at
# most this many source tokens a sentence: large beam calls are faster than small ones, and the
# cap keeps their peak near a small call's.
BEAM_TOKENS_PER_SENTENCE = 12


@dataclasses.dataclass(frozen=True)
class Hypothesis:
    text: str
    score: float  # the search's own: log-probability (greedy) or it over the length penalty (beam)


@dataclasses.dataclass(frozen=True)
class Translation:
    """A text's translation, its score, and its alternatives (best first, the translation first).
    A text of several units (sentences) scores the sum of its units' scores; its alternative i
    joins each unit's i-th hypothesis (its last, if it has fewer), duplicates left out."""

    text: str
    score: float
    alternatives: tuple

    def to_dict(self):
        return {
            "translation": self.text,
            "score": self.score,
            "alternatives": [{"translation": h.text, "score": h.score} for h in self.alternatives],
        }


class Unit(NamedTuple):
    """A piece of a text the model translates in one go: a sentence, or part of an over-long one."""

    text: str
    ids: list  # its token ids, at most the model's max_source_length


def _quoted(text, width=24):
    return repr(text if len(text) <= width else text[: width - 1] + "…")


def unknown_characters(tokenizer, text):
    """(characters of the text that become <unk>, its characters), whitespace left out. Every
    character the tokenizer was trained to cover is one of its pieces (unigram models keep them
    all), so a character that is no piece is one that becomes <unk>."""
    characters = "".join(text.split())
    return sum(tokenizer.piece_to_id(c) == tokenizer.unk_id() for c in characters), len(characters)


def _readable(tokenizer, sentence):
    """False (with a warning) when none of the sentence's characters is in the vocabulary: from
    <unk> pieces alone the model would invent a sentence, so it is output as it is. A sentence
    mostly outside the vocabulary is translated, with a warning."""
    unknown, characters = unknown_characters(tokenizer, sentence)
    if unknown == characters:
        log.warning(
            "input %s: none of its characters is in the model's vocabulary; output untranslated",
            _quoted(sentence),
        )
        return False
    if unknown * 2 > characters:
        log.warning(
            "input %s: %d of its %d characters are not in the model's vocabulary; "
            "its translation may be invented",
            _quoted(sentence),
            unknown,
            characters,
        )
    return True


def _fitted(tokenizer, sentence, max_source_length):
    """A sentence as Units of at most max_source_length tokens: the whole sentence if it fits,
    else its clauses packed in order (by their own token counts), and only a clause that alone is
    over the limit cut (`_cut`), with a warning."""
    ids = tokenizer.encode(sentence)
    if len(ids) <= max_source_length:
        return [Unit(sentence, ids)]
    packed, current, count = [], "", 0
    for clause in sentences_lib.split_clauses(sentence):
        size = len(tokenizer.encode(clause.strip(sentences_lib.WHITESPACE)))
        if current and count + size > max_source_length:
            packed.append(current)
            current, count = "", 0
        current, count = current + clause, count + size
    packed.append(current)
    pieces = []
    for text in packed:
        text = text.strip(sentences_lib.WHITESPACE)
        ids = tokenizer.encode(text)
        if len(ids) <= max_source_length:
            pieces.append(Unit(text, ids))
            continue
        log.warning(
            "input %s has %d tokens and no clause break within the model's maximum source "
            "length %d; cut into pieces of at most %d tokens",
            _quoted(text),
            len(ids),
            max_source_length,
            max_source_length,
        )
        pieces += _cut(tokenizer, text, max_source_length)
    return pieces


def _cut(tokenizer, text, max_source_length):
    """Units of a text with no clause break: each the longest run of characters that encodes to
    at most max_source_length tokens (found by bisection, among at most 8 characters a token).
    Cut between characters, not tokens, so that every runtime tokenizes each piece alike (the
    text ONNX file tokenizes inside its graph)."""
    units = []
    while text:
        fits, over = 1, min(len(text), 8 * max_source_length) + 1
        while over - fits > 1:
            middle = (fits + over) // 2
            if len(tokenizer.encode(text[:middle].strip(sentences_lib.WHITESPACE))) <= max_source_length:
                fits = middle
            else:
                over = middle
        piece = text[:fits].strip(sentences_lib.WHITESPACE)
        if piece:
            units.append(Unit(piece, tokenizer.encode(piece)[:max_source_length]))
        text = text[fits:]
    return units


def segment_texts(tokenizer, texts, max_source_length):
    """Cuts texts into units: returns (units, layouts). units: every Unit to translate;
    layouts[t]: text t as its lines, each a list of an index into units or a string to output as
    it is (a sentence none of whose characters is in the vocabulary). A blank text is one empty
    line; a lone surrogate (no character: no tokenizer takes it) is "?", as its UTF-8 with
    errors="replace" gives, which the TFLite text files are sent; nothing is ever an error."""
    units_all, layouts = [], []
    for text in texts:
        text = text.encode("utf-8", errors="replace").decode("utf-8")
        lines = []
        for line in text.strip(sentences_lib.WHITESPACE).split("\n"):
            units = []
            for sentence in sentences_lib.split_sentences(line):
                if not _readable(tokenizer, sentence):
                    units.append(sentence)
                    continue
                for unit in _fitted(tokenizer, sentence, max_source_length):
                    units.append(len(units_all))
                    units_all.append(unit)
            lines.append(units)
        layouts.append(lines)
    return units_all, layouts


def join_translations(layout, hypotheses, joiner, nbest):
    """One text's Translation from its layout and each unit's hypotheses [(text, score), ...]."""

    def version(i):  # the text's alternative i: each unit's i-th hypothesis, or its last
        texts, score = [], 0.0
        for units in layout:
            parts = []
            for unit in units:
                if isinstance(unit, str):
                    parts.append(unit)
                    continue
                text, unit_score = hypotheses[unit][min(i, len(hypotheses[unit]) - 1)]
                parts.append(text)
                score += unit_score
            texts.append(joiner.join(parts))
        return Hypothesis("\n".join(texts), score)

    alternatives, seen = [], set()
    for i in range(nbest):
        hypothesis = version(i)
        if hypothesis.text not in seen:
            seen.add(hypothesis.text)
            alternatives.append(hypothesis)
    return Translation(alternatives[0].text, alternatives[0].score, tuple(alternatives))


def translate_texts(tokenizer, texts, max_source_length, translate_units, joiner=" ", nbest=1):
    """list[str] -> list[Translation] through `translate_units(units) -> per Unit a list of
    (translation, score)`, best first. `joiner` goes between the sentences of a line (see
    kformer.decode.sentences.joiner)."""
    units, layouts = segment_texts(tokenizer, texts, max_source_length)
    hypotheses = translate_units(units)
    return [join_translations(layout, hypotheses, joiner, nbest) for layout in layouts]


def translations(tokenizer, texts, max_source_length, search_ids, joiner=" ", nbest=1):
    """`translate_texts` through `search_ids(ids, nbest) -> per row its hypotheses` (`search_units`
    with its search and batching bound): what every runner and
    kformer.decode.translator.Translator do with texts."""

    def translate_units(units):
        found = search_ids([u.ids for u in units], nbest=nbest)
        return [[(tokenizer.decode(output), score) for output, score in unit] for unit in found]

    return translate_texts(tokenizer, texts, max_source_length, translate_units, joiner, nbest)


def length_sorted_batches(ids, batch_size, max_tokens=None):
    """Yields (indices, (B, S) int32 padded batch); similar lengths together, every row once. A
    batch has at most `batch_size` rows and, with `max_tokens`, at most that many B x S (a longer
    row still goes alone)."""
    chunk = []
    for i in sorted(range(len(ids)), key=lambda i: len(ids[i])):  # the row added is the longest
        over_budget = max_tokens is not None and (len(chunk) + 1) * len(ids[i]) > max_tokens
        if chunk and (len(chunk) == batch_size or over_budget):
            yield chunk, _padded(ids, chunk)
            chunk = []
        chunk.append(i)
    if chunk:
        yield chunk, _padded(ids, chunk)


def tokens_per_call(batch_size, search, beam_capped=False):
    """The most padded source tokens one call of `search` ("greedy" or "beam") takes, for calls of
    `batch_size` sentences: TOKENS_PER_SENTENCE a sentence for greedy search; for beam search
    BEAM_TOKENS_PER_SENTENCE a sentence where `beam_capped`, else no limit (None)."""
    if search == "greedy":
        return batch_size * TOKENS_PER_SENTENCE
    return batch_size * BEAM_TOKENS_PER_SENTENCE if beam_capped else None


def _padded(ids, chunk):
    batch = np.zeros((len(chunk), max(1, max(len(ids[i]) for i in chunk))), np.int32)
    for row, i in enumerate(chunk):
        batch[row, : len(ids[i])] = ids[i]
    return batch


def strip_special(tokens, eos_id, pad_id=0):
    """Output ids up to (not including) the first EOS, without padding."""
    tokens = [int(t) for t in tokens]
    if eos_id in tokens:
        tokens = tokens[: tokens.index(eos_id)]
    return [t for t in tokens if t != pad_id]


def search_units(search, ids, batch_size, eos_id, pad_id=0, nbest=1, max_tokens=None, map_batches=map):
    """Runs `search((B, S) int32) -> (tokens (B, [K,] T), scores (B, [K]))` over length-sorted
    batches (`length_sorted_batches`; max_tokens: see `tokens_per_call`); returns per row of `ids`,
    in input order, its best `nbest` hypotheses as (output ids without EOS/pad, score), best first
    (fewer when the search finished fewer). `map_batches(search, batches)` yields the searches'
    results in order: `map` runs them one after another, an executor's map several at once
    (Runner's `parallel`)."""
    results = [None] * len(ids)
    batches = list(length_sorted_batches(ids, batch_size, max_tokens))
    for (chunk, _), (tokens, scores) in zip(batches, map_batches(search, [batch for _, batch in batches])):
        tokens, scores = np.asarray(tokens), np.asarray(scores)
        if tokens.ndim == 2:  # greedy: (B, T) -> (B, 1, T)
            tokens, scores = tokens[:, None], scores[:, None]
        for row, i in enumerate(chunk):
            kept = [k for k in range(min(nbest, tokens.shape[1])) if k == 0 or scores[row, k] > NEG_INF_SCORE]
            results[i] = [
                (strip_special(tokens[row, k], eos_id, pad_id), float(scores[row, k])) for k in kept
            ]
    return results


def translate_ids(search, ids, batch_size, eos_id, pad_id=0, max_tokens=None, map_batches=map):
    """`search_units` for the best hypothesis only: (output ids, scores), in input order."""
    units = search_units(search, ids, batch_size, eos_id, pad_id, 1, max_tokens, map_batches)
    best = [unit[0] for unit in units]
    return [output for output, _ in best], [score for _, score in best]

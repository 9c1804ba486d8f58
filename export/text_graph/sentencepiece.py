"""A SentencePiece unigram model as graph operations: text (code points) -> ids by its Viterbi
search, ids -> text, exactly as the sentencepiece library does for the models kformer trains
(identity normalization, no byte fallback, no user-defined pieces). The pieces live in constant
tables: the characters of the vocabulary, sorted, and a trie of the pieces as sorted
(node, character) keys, both read by binary search.

Letters: B rows, N code points a row, L the longest piece (characters), T ids a row."""

import numpy as np
import tensorflow as tf

from kformer.export.artifact_format import ExportError
from kformer.export.text_graph import lookup, ragged

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
UNIGRAM = 1
UNK_PENALTY = 10.0  # sentencepiece's kUnkPenalty: an unknown character scores min score - 10
SPACE, VISIBLE_SPACE = 0x20, 0x2581  # " " and "▁", SentencePiece's visible space
# The converter's min_elements_for_weights: smaller constants are never quantized.
QUANTIZATION_MINIMUM = 1024


def refusal(tokenizer):
    """Why the text graph cannot tokenize as `tokenizer` does (a sentence), or None when it can."""
    from sentencepiece import sentencepiece_model_pb2

    from kformer.data import vocabulary

    if vocabulary.maps_through_vocabulary(tokenizer):
        return "its tokenizer maps SentencePiece pieces through a vocabulary (tokenizer.json)"
    model = sentencepiece_model_pb2.ModelProto.FromString(tokenizer.serialized_model_proto())
    normalizer, trainer = model.normalizer_spec, model.trainer_spec
    refusals = [
        (trainer.model_type != UNIGRAM, f"type {trainer.model_type} is not unigram"),
        (trainer.byte_fallback, "byte fallback is on"),
        (bool(normalizer.precompiled_charsmap), f"normalization {normalizer.name!r} is not identity"),
        (not normalizer.escape_whitespaces, "spaces are not escaped"),
        (trainer.treat_whitespace_as_suffix, "whitespace is a suffix"),
        (
            any(p.type in (USER_DEFINED, BYTE) for p in model.pieces),
            "pieces include user-defined or byte ones",
        ),
    ]
    return next((f"its SentencePiece model's {why}" for refused, why in refusals if refused), None)


def _model(processor):
    """The processor's ModelProto, checked to be what this module reproduces exactly."""
    from sentencepiece import sentencepiece_model_pb2

    why = refusal(processor)
    if why:
        raise ExportError(f"the text graph cannot tokenize as this model does: {why}")
    return sentencepiece_model_pb2.ModelProto.FromString(processor.serialized_model_proto())


class Tables:
    """The constant tables of a SentencePiece model (numpy), built once per export."""

    def __init__(self, processor):
        model = _model(processor)
        self.add_dummy_prefix = model.normalizer_spec.add_dummy_prefix
        self.remove_extra_whitespaces = model.normalizer_spec.remove_extra_whitespaces
        pieces = [(p.piece, p.score, p.type) for p in model.pieces]
        self.unk_id = next(i for i, (_, _, kind) in enumerate(pieces) if kind == UNKNOWN)
        scores = [score for _, score, kind in pieces if kind == NORMAL]
        self.unk_score = np.float32(np.float32(min(scores)) - np.float32(UNK_PENALTY))
        self.scores = np.array([score for _, score, _ in pieces], np.float32)
        # Characters of the vocabulary, ids from 1 (0: none of them), by code point; whether each is
        # a piece by itself (one that is not becomes the unknown id).
        characters = sorted({ord(c) for piece, _, _ in pieces for c in piece})
        ids = np.zeros(lookup.CODE_POINTS, np.int32)
        ids[characters] = np.arange(1, len(characters) + 1)
        singles = np.zeros(lookup.CODE_POINTS, bool)
        singles[[ord(p) for p, _, _ in pieces if len(p) == 1]] = True
        self.characters = lookup.two_stage(ids, singles)
        index = dict(zip(characters, range(1, len(characters) + 1)))
        self._trie(
            [
                ([index[ord(c)] for c in piece], i)
                for i, (piece, _, kind) in enumerate(pieces)
                if kind == NORMAL
            ]
        )
        self._surfaces(pieces, model.trainer_spec.unk_surface)

    def _trie(self, matched):
        """The trie of the pieces the search matches (as their character ids), a double array
        whose nodes' values are the pieces they end (-1: none)."""
        children, ends = {}, [-1]  # (node, character id) -> node; node -> piece
        for symbols, piece_id in matched:
            node = 0
            for symbol in symbols:
                if (node, symbol) not in children:
                    children[node, symbol] = len(ends)
                    ends.append(-1)
                node = children[node, symbol]
            ends[node] = piece_id
        self.trie = lookup.DoubleArray(children, ends)
        self.longest = max((len(p) for p, _ in matched), default=1)

    def _surfaces(self, pieces, unk_surface):
        """Each piece's text as code points, "▁" read as a space (control pieces none, the unknown
        piece its surface), in one flat row with each piece's start and length."""
        texts = [
            unk_surface if kind == UNKNOWN else "" if kind == CONTROL else piece.replace("\u2581", " ")
            for piece, _, kind in pieces
        ]
        self.surface_lengths = np.array([len(t) for t in texts], np.int32)
        self.surface_starts = np.concatenate([[0], np.cumsum(self.surface_lengths)[:-1]]).astype(np.int32)
        self.surface_text = np.array([ord(c) for t in texts for c in t] or [0], np.int32)
        self.unknown_kinds = np.array([kind == UNKNOWN for _, _, kind in pieces])


def exact_constant(values):
    """A float32 constant that quantization leaves alone: TFLite's dynamic-range quantization
    stores every constant of QUANTIZATION_MINIMUM elements or more as int8, and the search must add
    the model's own float32 scores. Chunks under that size, joined in the graph."""
    step = QUANTIZATION_MINIMUM - 1
    return tf.concat(
        [tf.constant(values[i : i + step], tf.float32) for i in range(0, len(values), step)], axis=0
    )


def normalize(tables, chars, counts):
    """chars (B, N) int32 code points, counts (B,) -> (normalized (B, N'), counts (B,)): the
    identity normalizer: spaces trimmed and runs of them made one (remove_extra_whitespaces),
    "▁" for every space, and one before the text (add_dummy_prefix) unless it is empty."""
    inside = tf.range(tf.shape(chars)[1])[tf.newaxis, :] < counts[:, tf.newaxis]  # (B, N)
    space = tf.equal(chars, SPACE) & inside
    keep = inside
    if tables.remove_extra_whitespaces:
        word = inside & ~space
        after_word = tf.concat(
            [tf.zeros_like(word[:, :1]), word[:, :-1]], axis=1
        )  # the one before is no space
        word_follows = tf.cumsum(tf.cast(word, tf.int32), axis=1, reverse=True) > 0
        keep = word | (space & after_word & word_follows)
    kept, counts = ragged.compact(tf.where(tf.equal(chars, SPACE), VISIBLE_SPACE, chars), keep)
    if tables.add_dummy_prefix:
        prefix = tf.fill([tf.shape(kept)[0], 1], VISIBLE_SPACE)
        kept, counts = tf.concat([prefix, kept], axis=1), tf.where(counts > 0, counts + 1, 0)
    return kept, counts


def _candidates(tables, chars, counts):
    """The pieces the text holds: (scores (B, N + 1, L), ids (B, N + 1, L)) of the piece that ends
    before each position (0..N) and is l = L..1 characters long (longest first), -inf / -1 where
    none; an unknown character is a 1-character piece of the unknown id and score."""
    width = tf.shape(chars)[1]
    inside = tf.range(width)[tf.newaxis, :] < counts[:, tf.newaxis]
    character = tf.where(inside, _characters(tables, chars)[0], 0)  # (B, N) ids
    padded = tf.concat([character, tf.zeros([tf.shape(chars)[0], tables.longest], tf.int32)], axis=1)
    node, by_length = tf.zeros_like(character), []  # node: the trie node of chars[i : i + l]
    for length in range(1, tables.longest + 1):
        node = tables.trie.step(node, padded[:, length - 1 : length - 1 + width])
        by_length.append(tables.trie.value(node))  # (B, N) the piece of chars[i : i + length]
    # sentencepiece's unknown node: where no piece is the single character.
    by_length[0] = tf.where((by_length[0] < 0) & inside, tables.unk_id, by_length[0])
    starting = tf.stack(by_length[::-1], axis=2)  # (B, N, L) by start, lengths L..1
    # By end: the piece of length l ending before position j starts at j - l; row N, added, is -1
    # for those that would start before the text.
    batch, longest = tf.shape(chars)[0], tables.longest
    starting = tf.concat([starting, tf.fill([batch, 1, longest], -1)], axis=1)  # (B, N + 1, L)
    starts = tf.range(width + 1)[:, tf.newaxis] - tf.range(longest, 0, -1)[tf.newaxis, :]  # (N + 1, L)
    flat = tf.where(starts >= 0, starts, width) * longest + tf.range(longest)[tf.newaxis, :]
    flat = tf.reshape(flat, [1, -1]) + tf.zeros([batch, 1], tf.int32)  # (B, (N + 1) * L)
    ids = tf.gather(tf.reshape(starting, [batch, -1]), flat, batch_dims=1)
    ids = tf.reshape(ids, [batch, width + 1, longest])  # (B, N + 1, L)
    scores = tf.gather(exact_constant(tables.scores), tf.maximum(ids, 0))
    scores = tf.where(tf.equal(ids, tables.unk_id), tables.unk_score, tf.where(ids >= 0, scores, -np.inf))
    return scores, ids


def _best_paths(scores, ids, counts, longest):
    """Viterbi: (B, N + 1, L) candidates -> (B, N + 1) the id of the piece ending at each position
    on the best path, -1 off it. Scores add in float32 and ties go to the first candidate
    sentencepiece tries (the earliest start: the longest piece), as in its EncodeOptimized."""
    batch, ends = tf.shape(scores)[0], tf.shape(scores)[1]
    back = tf.range(longest, 0, -1)  # (L,) the lengths, longest first
    at = tf.range(ends)[tf.newaxis, :]  # (1, N + 1)
    neg_inf = tf.fill([batch, ends], -np.inf)
    best = tf.where(tf.equal(at, 0), 0.0, neg_inf)  # (B, N + 1) best path score to each position
    chosen = tf.zeros([batch, ends], tf.int32)  # (B, N + 1) the length of its last piece

    def step(j, best, chosen):
        starts = j - back  # (L,)
        before = tf.gather(best, tf.maximum(starts, 0), axis=1)  # (B, L)
        total = tf.where(starts >= 0, before, -np.inf) + tf.gather(scores, j, axis=1)
        value, index = tf.math.top_k(total, k=1)  # the first of equal maxima
        here = tf.equal(at, j)
        best = tf.where(here, value, best)
        chosen = tf.where(here, tf.gather(back, index[:, 0])[:, tf.newaxis], chosen)
        return j + 1, best, chosen

    longest_row = tf.reduce_max(tf.concat([counts, [0]], 0))
    _, best, chosen = tf.while_loop(lambda j, *_: j <= longest_row, step, [tf.constant(1), best, chosen])
    # Back from each row's end along the chosen pieces.
    position, on_path = counts, tf.zeros([batch, ends], tf.bool)

    def back_step(position, on_path):
        on_path = on_path | (tf.equal(at, position[:, tf.newaxis]) & (position[:, tf.newaxis] > 0))
        return tf.maximum(position - tf.gather(chosen, position, batch_dims=1), 0), on_path

    _, on_path = tf.while_loop(lambda p, _: tf.reduce_any(p > 0), back_step, [position, on_path])
    column = longest - tf.maximum(chosen, 1)  # (B, N + 1) the chosen piece's column in `ids`
    picked = tf.reduce_sum(ids * tf.one_hot(column, longest, dtype=tf.int32), axis=2)
    return tf.where(on_path, picked, -1)


def encode(tables, chars, counts):
    """chars (B, N) int32 code points, counts (B,) -> (ids (B, T) int32, zeros after each row's
    end; counts (B,)): sentencepiece's `encode` of each row (a run of unknown characters one
    unknown id, as sentencepiece merges them)."""
    chars, counts = normalize(tables, chars, counts)
    scores, ids = _candidates(tables, chars, counts)
    path = _best_paths(scores, ids, counts, tables.longest)  # (B, N + 1)
    unknown = tf.equal(path, tables.unk_id)
    after_unknown = tf.concat([tf.zeros_like(unknown[:, :1]), unknown[:, :-1]], axis=1)
    return ragged.compact(path, (path >= 0) & ~(unknown & after_unknown))


def _characters(tables, chars):
    """(character ids, whether each is a piece by itself) of code points of any shape."""
    return lookup.look_up(tf.clip_by_value(chars, 0, lookup.CODE_POINTS - 1), tables.characters)


def is_piece(tables, chars):
    """chars int32 code points of any shape -> bool: whether the character alone is a piece (one
    that is not becomes the unknown id)."""
    return _characters(tables, chars)[1]


def decode(tables, ids, counts):
    """ids (B, T) int32, counts (B,) -> (text (B, M) int32 code points, zeros after each row's
    end; counts (B,)): sentencepiece's `decode`: control pieces vanish, the unknown piece reads
    as its surface, and a piece's "▁" before any text is dropped: with remove_extra_whitespaces,
    that of every piece until one leaves a character (a lone "▁" leaves none), else the first's."""
    inside = tf.range(tf.shape(ids)[1])[tf.newaxis, :] < counts[:, tf.newaxis]
    ids = tf.where(inside, ids, 0)
    lengths = tf.where(inside, tf.gather(tables.surface_lengths, ids), 0)  # (B, T)
    starts = tf.gather(tables.surface_starts, ids)
    leading_space = tf.equal(tf.gather(tf.constant(tables.surface_text), starts), SPACE)
    leading_space &= (lengths > 0) & ~tf.gather(tables.unknown_kinds, ids)
    if tables.remove_extra_whitespaces:  # pieces before it all empty once their "▁" is dropped
        leaves_text = (lengths - tf.cast(leading_space, tf.int32)) > 0
        first = tf.cumsum(tf.cast(leaves_text, tf.int32), axis=1, exclusive=True) == 0
    else:  # nothing before it but empty pieces
        first = tf.cumsum(lengths, axis=1, exclusive=True) == 0
    drop = tf.cast(first & leading_space, tf.int32)
    drop *= int(tables.add_dummy_prefix or tables.remove_extra_whitespaces)  # sentencepiece's condition
    text = tf.constant(tables.surface_text)[tf.newaxis, :]  # (1, all pieces' characters)
    return ragged.join_parts(text, tf.zeros_like(ids), starts + drop, lengths - drop)

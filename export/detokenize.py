"""Output ids prepared so that TF Text's SentencePiece decoder (the SavedModel's text signatures)
gives the text the sentencepiece library gives. The two differ at the start of a text only:
sentencepiece drops a piece's "▁" there while nothing has been written (every such piece's with
remove_extra_whitespaces, so a lone "▁" leaves nothing; the first one's without), never the
unknown piece's " ⁇ ", and control pieces write nothing; TF Text drops the first piece's leading
space, whatever the piece (with add_dummy_prefix), and control pieces count as that first piece.

Shapes: B rows, T ids a row."""

import dataclasses

import tensorflow as tf

from kformer.export.text_graph.sentencepiece import CONTROL, NORMAL, UNKNOWN


@dataclasses.dataclass(frozen=True)
class LeadingSpaces:
    """What a SentencePiece model (its ids) needs: `space` the id of the piece "▁" alone (-1:
    none), `unknown` and `control` ids, and its normalizer's two settings."""

    space: int
    unknown: int
    control: tuple
    add_dummy_prefix: bool
    remove_extra_whitespaces: bool

    @classmethod
    def of(cls, proto):
        """Of a SentencePiece model's bytes."""
        from sentencepiece import sentencepiece_model_pb2

        model = sentencepiece_model_pb2.ModelProto.FromString(proto)
        kinds = [(p.piece, p.type) for p in model.pieces]
        return cls(
            space=next(
                (i for i, (piece, kind) in enumerate(kinds) if (piece, kind) == ("\u2581", NORMAL)), -1
            ),
            unknown=next(i for i, (_, kind) in enumerate(kinds) if kind == UNKNOWN),
            control=tuple(i for i, (_, kind) in enumerate(kinds) if kind == CONTROL),
            add_dummy_prefix=model.normalizer_spec.add_dummy_prefix,
            remove_extra_whitespaces=model.normalizer_spec.remove_extra_whitespaces,
        )

    @property
    def needed(self):
        """Whether TF Text's decoder drops a first space that this model's must keep, or keeps one
        it drops, in a way `as_sentencepiece_decodes` mends: where it drops none (no dummy
        prefix), sentencepiece's own dropping is not mended (texts may keep a leading space)."""
        return self.add_dummy_prefix and self.space >= 0


def as_sentencepiece_decodes(tokens, keep, rule):
    """(tokens, keep) (B, T) int32 ids and bool -> (B, T + 1): control pieces left out, then (with
    remove_extra_whitespaces) the lone "▁" pieces before any text, and a lone "▁" put first where
    the first piece left is the unknown one (TF Text drops its space, not the unknown's)."""
    if rule.control:
        keep &= ~tf.reduce_any(tf.equal(tokens[:, :, tf.newaxis], tf.constant(rule.control)), axis=2)
    if rule.remove_extra_whitespaces:
        space = tf.equal(tokens, rule.space)
        keep &= ~space | (tf.cumsum(tf.cast(keep & ~space, tf.int32), axis=1) > 0)
    first = keep & (tf.cumsum(tf.cast(keep, tf.int32), axis=1) == 1)  # the first piece kept
    unknown_first = tf.reduce_any(first & tf.equal(tokens, rule.unknown), axis=1, keepdims=True)
    tokens = tf.concat([tf.fill([tf.shape(tokens)[0], 1], rule.space), tokens], axis=1)
    return tokens, tf.concat([unknown_first, keep], axis=1)

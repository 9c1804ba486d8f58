"""What both searches and their loops share: the special ids, the output lengths, the scores of
a slot without a hypothesis, and row bookkeeping.

Shape letters: B batch, R some of its rows, S source length, T buffer length, V vocabulary, N a
count of positions.
"""

from collections.abc import Callable
from typing import NamedTuple, Union

import tensorflow as tf

from kformer.decode.options import EXTRA_OUTPUT_TOKENS

NEG_INF = -1.0e9  # finite: -inf would turn 0 * inf into NaN in the searches' blends

# A nest of batch-first tensors (tf.nest): a step's cache; () where a part is empty.
Nest = Union[tf.Tensor, tuple, list, dict]
# `step(tokens (B,), cache, index ()) -> (logits (B, V), cache)`: the model, to a search.
StepFunction = Callable[[tf.Tensor, Nest, tf.Tensor], tuple[tf.Tensor, Nest]]


class TokenIds(NamedTuple):
    """The special ids a search reads: every output starts after `bos` and ends with `eos`, and
    `pad` fills its buffer after the end."""

    bos: int
    eos: int
    pad: int = 0


class Lengths(NamedTuple):
    """How long outputs may be: `limits` (B,) int32 per row (0 = empty output) and `buffer`, the
    scalar int32 T >= max(limits) of the output buffers."""

    limits: tf.Tensor
    buffer: int | tf.Tensor


def output_limits(source_ids, pad_id, cap, extra=EXTRA_OUTPUT_TOKENS, buffer_cap=None):
    """Per-row maximum output length: source length + `extra` (the paper's rule), at most `cap`
    (an int or an int32 scalar tensor, a run-time option); 0 for an empty source, which yields an
    empty output.

    Returns Lengths((B,) limits, T), the buffer length T = min(S + extra, buffer_cap) (default:
    cap). A Python int `buffer_cap` >= cap makes T depend on the padded input shape alone, not on
    values (XLA compiles one program per input shape; LiteRT.js needs static shapes).
    """
    source_lengths = tf.reduce_sum(tf.cast(tf.not_equal(source_ids, pad_id), tf.int32), axis=1)
    limits = tf.where(source_lengths > 0, tf.minimum(source_lengths + extra, cap), 0)
    return Lengths(
        limits, tf.minimum(tf.shape(source_ids)[1] + extra, cap if buffer_cap is None else buffer_cap)
    )


def length_penalty(length, alpha):
    """GNMT length penalty ((5 + length) / 6)^alpha."""
    return tf.pow((5.0 + tf.cast(length, tf.float32)) / 6.0, alpha)


def where(mask, dtype=tf.int32):
    """(N,) the positions where (B,) bool `mask` is True, in order; int64 as tf.where (and ONNX's
    NonZero) gives them saves a cast, for indices only gathered by."""
    positions = tf.reshape(tf.where(mask), [-1])
    return positions if dtype == tf.int64 else tf.cast(positions, dtype)


def beams_of(rows, k):
    """(R * k,) the cache rows of source rows `rows` (R,) whose k beams are adjacent, in the type
    of `rows`; the rows themselves for k = 1 (no nodes)."""
    if k == 1:
        return rows
    return tf.reshape(tf.expand_dims(rows * k, 1) + tf.range(k, dtype=rows.dtype), [-1])

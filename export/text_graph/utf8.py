"""UTF-8 bytes <-> Unicode code points as int32 tensors, in TFLite builtins. Decoding is
Python's `bytes.decode("utf-8", errors="replace")`: each maximal ill-formed subsequence (the
Unicode standard's "maximal subpart") becomes one U+FFFD, so an app's bad bytes give a defined
text, never an error.

Letters: B rows, N bytes a row, C code points a row."""

import tensorflow as tf

from kformer.export.text_graph import ragged

REPLACEMENT = 0xFFFD


def _byte_at(data, shift):
    """data (B, N) int32 -> (B, N): the byte `shift` places on, -1 past the row's end."""
    padded = tf.concat([data, tf.fill([tf.shape(data)[0], shift], -1)], axis=1)
    return padded[:, shift:]


def _within(value, low, high):
    return (value >= low) & (value <= high)


def _sequences(data):
    """data (B, N) int32 bytes, -1 past each row's end -> (lengths (B, N): the bytes a sequence
    beginning at each byte takes, its well-formed prefix, at least 1; well_formed (B, N) bool;
    code (B, N): its code point where well formed)."""
    lead, second, third, fourth = (_byte_at(data, k) for k in range(4))
    expected = tf.where(  # continuation bytes a lead byte wants (Unicode's table 3-7); -1: not a lead
        lead < 0x80,
        0,
        tf.where(
            _within(lead, 0xC2, 0xDF),
            1,
            tf.where(_within(lead, 0xE0, 0xEF), 2, tf.where(_within(lead, 0xF0, 0xF4), 3, -1)),
        ),
    )
    # The second byte's range depends on the lead (no overlong forms, surrogates or > U+10FFFF).
    second_low = tf.where(tf.equal(lead, 0xE0), 0xA0, tf.where(tf.equal(lead, 0xF0), 0x90, 0x80))
    second_high = tf.where(tf.equal(lead, 0xED), 0x9F, tf.where(tf.equal(lead, 0xF4), 0x8F, 0xBF))
    ok2 = _within(second, second_low, second_high) & (expected >= 1)
    ok3 = ok2 & _within(third, 0x80, 0xBF) & (expected >= 2)
    ok4 = ok3 & _within(fourth, 0x80, 0xBF) & (expected >= 3)
    taken = 1 + tf.cast(ok2, tf.int32) + tf.cast(ok3, tf.int32) + tf.cast(ok4, tf.int32)
    well_formed = tf.equal(taken, expected + 1)
    low6 = [tf.math.floormod(b, 64) for b in (second, third, fourth)]
    code = tf.where(
        tf.equal(expected, 0),
        lead,
        tf.where(
            tf.equal(expected, 1),
            (lead - 0xC0) * 64 + low6[0],
            tf.where(
                tf.equal(expected, 2),
                ((lead - 0xE0) * 64 + low6[0]) * 64 + low6[1],
                (((lead - 0xF0) * 64 + low6[0]) * 64 + low6[1]) * 64 + low6[2],
            ),
        ),
    )
    return taken, well_formed, code


def decode(data, lengths):
    """data (B, N) uint8 or int32 UTF-8 bytes, lengths (B,) int32 (bytes past them ignored) ->
    (code points (B, C) int32, zeros after each row's end; their counts (B,) int32)."""
    data = tf.cast(data, tf.int32)
    width = tf.shape(data)[1]
    inside = tf.range(width)[tf.newaxis, :] < lengths[:, tf.newaxis]  # (B, N)
    data = tf.where(inside, data, -1)
    taken, well_formed, code = _sequences(data)
    # A byte that is not a continuation byte always begins a sequence (sequences take only
    # continuation bytes after their lead); a continuation byte begins one (an ill-formed one,
    # one byte long) unless the last sequence before it took it.
    continuation = _within(data, 0x80, 0xBF)
    lead_at = ragged.last_index_where(~continuation & inside)  # (B, N)
    lead_taken = tf.gather(taken, tf.maximum(lead_at, 0), batch_dims=1)
    begins = inside & (
        ~continuation | (lead_at < 0) | (tf.range(width)[tf.newaxis, :] - lead_at >= lead_taken)
    )
    return ragged.compact(tf.where(well_formed, code, REPLACEMENT), begins)


def encode(code_points, counts):
    """code points (B, C) int32 (no surrogates), counts (B,) -> (bytes (B, N) uint8, zeros after
    each row's end; their counts (B,) int32)."""
    code_points = tf.pad(
        code_points, [[0, 0], [0, tf.maximum(1 - tf.shape(code_points)[1], 0)]]
    )  # (B, C >= 1)
    inside = tf.range(tf.shape(code_points)[1])[tf.newaxis, :] < counts[:, tf.newaxis]
    sizes = tf.where(
        ~inside,
        0,
        1
        + tf.cast(code_points >= 0x80, tf.int32)
        + tf.cast(code_points >= 0x800, tf.int32)
        + tf.cast(code_points >= 0x10000, tf.int32),
    )  # (B, C)
    ends = tf.cumsum(sizes, axis=1)
    totals = tf.reduce_sum(sizes, axis=1)
    # One column at least: LiteRT fails to read an output of size 0 after a call that gave it a size.
    width = tf.reduce_max(tf.concat([totals, [1]], 0))
    at = tf.range(width)[tf.newaxis, :] + tf.zeros_like(totals)[:, tf.newaxis]  # (B, N)
    which = tf.minimum(ragged.count_at_most(ends, at), tf.maximum(tf.shape(code_points)[1] - 1, 0))
    code = tf.gather(code_points, which, batch_dims=1)
    size = tf.gather(sizes, which, batch_dims=1)
    offset = at - (tf.gather(ends, which, batch_dims=1) - size)  # the byte's place in its sequence
    # Byte `offset` of `size`: the bits above 6 * (size - 1 - offset), under a prefix.
    shift = tf.gather(tf.constant([1, 64, 4096, 262144], tf.int32), tf.maximum(size - 1 - offset, 0))
    bits = code // shift
    lead_prefix = tf.gather(tf.constant([0, 0, 0xC0, 0xE0, 0xF0], tf.int32), size)
    value = tf.where(tf.equal(offset, 0), lead_prefix + bits, 0x80 + tf.math.floormod(bits, 64))
    value = tf.where(at < totals[:, tf.newaxis], value, 0)
    return tf.cast(value, tf.uint8), totals

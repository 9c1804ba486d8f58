"""The one mask convention: boolean, True = may attend.

Masks are built once, at the top of the model, from token ids (pad id 0); blocks only receive them.
Shapes broadcast against attention scores (B, Tq, Tk): B batch, Tq query length, Tk key length.
"""

from keras import ops


def padding_mask(ids, pad_id=0):
    """(B, L) ids -> (B, 1, L): every query may attend to the non-pad keys."""
    return ops.expand_dims(ops.not_equal(ids, pad_id), axis=1)


def causal_mask(query_length, key_length=None, offset=0):
    """(1, Tq, Tk): query i (at absolute position offset + i) may attend keys 0..offset + i.

    `offset` is the position of the first query; a cached decode step passes its step index
    so that one query sees the prefix already written to a key buffer of length `key_length`.
    """
    key_length = query_length if key_length is None else key_length
    query_positions = ops.expand_dims(ops.arange(query_length) + offset, 1)  # (Tq, 1)
    key_positions = ops.arange(key_length)  # (Tk,), broadcast against (Tq, 1)
    return ops.expand_dims(ops.less_equal(key_positions, query_positions), axis=0)


def shifted_step_mask(buffer_length, index):
    """(1, 1, T): the keys a cached decoding step at `index` attends in key/value buffers of
    `buffer_length` T that shift one slot a step (`MultiHeadAttention`'s write="shift"): its own,
    in the last slot, and the `index` keys before it, in the slots before."""
    positions = ops.arange(buffer_length)
    return ops.reshape(ops.greater_equal(positions, buffer_length - 1 - index), (1, 1, -1))


def combine(*masks):
    """Logical AND of broadcastable masks; None entries are ignored."""
    result = None
    for mask in masks:
        if mask is not None:
            result = mask if result is None else ops.logical_and(result, mask)
    return result

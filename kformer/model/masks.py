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


def step_masks(buffer_length, index, dtype="float32"):
    """What a cached decoding step at `index` needs over key/value buffers of `buffer_length` T,
    from one range: its causal mask (1, 1, T), keys 0..index; and its write slot (1, 1, T, 1),
    1 at `index` and 0 elsewhere in `dtype`, which `MultiHeadAttention` adds into the buffers."""
    positions = ops.arange(buffer_length)
    causal = ops.reshape(ops.less_equal(positions, index), (1, 1, -1))
    slot = ops.reshape(ops.cast(ops.equal(positions, index), dtype), (1, 1, -1, 1))
    return causal, slot


def combine(*masks):
    """Logical AND of broadcastable masks; None entries are ignored."""
    result = None
    for mask in masks:
        if mask is not None:
            result = mask if result is None else ops.logical_and(result, mask)
    return result

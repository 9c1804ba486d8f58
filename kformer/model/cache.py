"""The decoder's self-attention cache while decoding step by step: two modes, a class each, with
its buffers, its write and its mask. `Transformer.init_cache(source_ids, buffer_length)` picks
one by that one argument (None: growing); the cache's state names its mode by its one key, so
that a loop's state stays plain tensors.

- `Growing` ("appended"): each step appends its key and value; a buffer holds the steps so far,
  (B, H, index, D), every key one to attend to. What TensorFlow and onnxruntime run: a step
  reads and copies only the keys so far.
- `FixedBuffers` ("self"): zeros of (B, H, Tmax, D), a step's key and value added into its slot,
  the keys after it masked. What XLA (static shapes) and the TFLite files run: LiteRT re-plans a
  loop body whose shapes change.

The encoder-decoder attention's keys and values are computed once per sentence in either mode
(the cache's static part).
"""

from keras import ops

from kformer.model import masks, portable


class Growing:
    KEY = "appended"

    @staticmethod
    def empty(source_ids, heads, size, dtype, buffer_length=None):
        return portable.empty_to_append(source_ids, heads, size, dtype=dtype)

    @staticmethod
    def step(buffer, index):
        """(the step's self-attention mask, its write(buffer, new)): none needed, and an append."""
        return None, lambda keys, new: ops.concatenate([keys, new], axis=2)  # (B, H, T, D) -> T + 1

    @staticmethod
    def grown(buffers, buffer_length, heads, size):
        return buffers  # as long as the output so far already


class FixedBuffers:
    KEY = "self"

    @staticmethod
    def empty(source_ids, heads, size, dtype, buffer_length=None):
        return ops.zeros((ops.shape(source_ids)[0], heads, buffer_length, size), dtype)

    @staticmethod
    def step(buffer, index):
        """(1, 1, Tmax) keys 0..index, and the write of a step's key/value (B, H, 1, D) into the
        slot (1, 1, Tmax, 1) every layer writes at (`masks.step_masks`)."""
        mask, slot = masks.step_masks(ops.shape(buffer)[2], index, buffer.dtype)
        return mask, lambda keys, new: portable.add_to_slot(keys, slot, new)

    @staticmethod
    def grown(buffers, buffer_length, heads, size):
        """Each (B, H, T1, D) buffer with one block of zeros (B, H, T - T1, D) appended."""
        buffer = buffers[0][0]
        shape = ops.shape(buffer)
        zeros = ops.zeros((shape[0], heads, buffer_length - shape[2], size), buffer.dtype)

        def grow(t):  # (B, H, T1, D) -> (B, H, T, D)
            return ops.concatenate([t, zeros], axis=2)

        return [(grow(key), grow(value)) for key, value in buffers]


MODES = {mode.KEY: mode for mode in (Growing, FixedBuffers)}


def mode(buffer_length):
    """The mode `init_cache` starts: growing without a buffer length, else fixed buffers."""
    return Growing if buffer_length is None else FixedBuffers


def mode_of(state):
    """(the mode, its L x (key, value) buffers) of a cache's state."""
    ((key, buffers),) = state.items()
    return MODES[key], buffers

"""The decoder's self-attention cache while decoding step by step: two modes, a class each, with
its buffers, its write and its mask. `Transformer.init_cache(source_ids, mode, buffer_length)`
starts the mode it is given (kformer.decode.recipe picks one per runtime); a cache's state is a
value of its mode's class (a NamedTuple of tensors, as a search loop's state must be), so the
mode is its type, never a key.

- `Growing`: each step appends its key and value; a buffer holds the steps so far, (B, H, index,
  D), every key one to attend to. What TensorFlow and onnxruntime run: a step reads and copies
  only the keys so far.
- `FixedBuffers`: zeros of (B, H, Tmax, D), a step's key and value added into its slot, the keys
  after it masked. What XLA (static shapes) and the TFLite files run: LiteRT re-plans a loop body
  whose shapes change.

The encoder-decoder attention's keys and values are computed once per sentence in either mode
(the cache's static part).
"""

from typing import NamedTuple

from keras import ops

from kformer.model import masks, portable


class Growing(NamedTuple):
    """layers: L x (key, value) each (B, H, T, D), T the steps so far."""

    layers: list

    @classmethod
    def empty(cls, source_ids, layers, heads, size, dtype, buffer_length=None):
        empty = portable.empty_to_append(source_ids, heads, size, dtype=dtype)  # (B, H, 0, D)
        return cls([(empty, empty) for _ in range(layers)])

    def step(self, index):
        """(the step's self-attention mask, its write(buffer, new)): none needed, and an append."""
        return None, lambda keys, new: ops.concatenate([keys, new], axis=2)  # (B, H, T, D) -> T + 1

    def grown(self, buffer_length, heads, size):
        return self  # as long as the output so far already


class FixedBuffers(NamedTuple):
    """layers: L x (key, value) each (B, H, Tmax, D), zeros after the steps so far."""

    layers: list

    @classmethod
    def empty(cls, source_ids, layers, heads, size, dtype, buffer_length=None):
        if buffer_length is None:
            raise ValueError("fixed buffers need a buffer_length: the longest output they hold")
        zeros = ops.zeros((ops.shape(source_ids)[0], heads, buffer_length, size), dtype)
        return cls([(zeros, zeros) for _ in range(layers)])

    def step(self, index):
        """(1, 1, Tmax) keys 0..index, and the write of a step's key/value (B, H, 1, D) into the
        slot (1, 1, Tmax, 1) every layer writes at (`masks.step_masks`)."""
        buffer = self.layers[0][0]
        mask, slot = masks.step_masks(ops.shape(buffer)[2], index, buffer.dtype)
        return mask, lambda keys, new: portable.add_to_slot(keys, slot, new)

    def grown(self, buffer_length, heads, size):
        """Each (B, H, T1, D) buffer with one block of zeros (B, H, T - T1, D) appended."""
        buffer = self.layers[0][0]
        shape = ops.shape(buffer)
        zeros = ops.zeros((shape[0], heads, buffer_length - shape[2], size), buffer.dtype)

        def grow(t):  # (B, H, T1, D) -> (B, H, T, D)
            return ops.concatenate([t, zeros], axis=2)

        return FixedBuffers([(grow(key), grow(value)) for key, value in self.layers])


MODES = (Growing, FixedBuffers)

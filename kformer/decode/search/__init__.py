"""Greedy and beam search over `step(tokens, cache, index) -> (logits, cache)`.

Search knows nothing about the model. Every loop is a `tf.while_loop`: preallocated token
buffers written with one-hot blends, tokens chosen with `top_k` (never argmax), no TensorArray,
no Python loop over steps, so the same graph exports to SavedModel, TFLite and ONNX; the
spellings that keep it so are kformer.model.portable's. The cache's state may grow along its
step axis from step to step (`Transformer.init_cache`).

greedy.py and beam.py are the two searches; loops.py the three ways a loop stops spending steps
on rows that are done (one typed value, which both take); repeat_guard.py the n-gram repeat
guard; common.py what they share; naive.py the uncached reference.
"""

from kformer.decode.search.beam import BeamOptions, beam_search
from kformer.decode.search.common import NEG_INF, Lengths, TokenIds, length_penalty, output_limits
from kformer.decode.search.greedy import greedy_search
from kformer.decode.search.loops import DROP_DONE, ONE_PASS, DropDone, OnePass, TwoPasses
from kformer.decode.search.naive import naive_cache, naive_step

__all__ = [
    "DROP_DONE",
    "NEG_INF",
    "ONE_PASS",
    "BeamOptions",
    "DropDone",
    "Lengths",
    "OnePass",
    "TokenIds",
    "TwoPasses",
    "beam_search",
    "greedy_search",
    "length_penalty",
    "naive_cache",
    "naive_step",
    "output_limits",
]

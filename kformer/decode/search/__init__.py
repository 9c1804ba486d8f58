"""Greedy and beam search over `step(tokens, cache, index) -> (logits, cache)`.

Search knows nothing about the model. Every loop is a `tf.while_loop`: preallocated token
buffers written with one-hot blends, tokens chosen with `top_k` (never argmax), no TensorArray,
no Python loop over steps, so the same graph exports to SavedModel, TFLite and ONNX; the
spellings that keep it so are kformer.model.portable's. The cache's state may grow along its
step axis from step to step (`Transformer.init_cache`).

loops.py holds the three loop strategies (one pass, two passes, dropping the rows that are done),
each a typed value that owns its `tf.while_loop`: the steps, the rows taken and dropped, the
passes merged. greedy.py and beam.py are the two searches: each gives its loop the state of its
rows before the first step, a step over the rows in the loop, what kind each field of its state
is and which of them its outputs are read from (`loops.Search`). repeat_guard.py is the n-gram
repeat guard; common.py what they share; naive.py the uncached reference.
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

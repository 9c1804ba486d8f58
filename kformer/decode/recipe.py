"""How a search graph is built for the runtime that runs it: one value per runtime and format,
chosen here and nowhere else.

A recipe names the self-attention cache's mode (kformer.model.cache), the loop strategy that
stops done rows from stepping (kformer.decode.search.loops), whether greedy search ranks a row's
logits in one top_k, and whether the searches are compiled with XLA. Why each runtime has its
own is docs/design.md's "Caches that grow" and "Done rows stop stepping".
"""

import dataclasses

from kformer.model.cache import FixedBuffers, Growing

ONE_PASS, DROP_DONE, TWO_PASSES = "one pass", "drop done", "two passes"  # the loop strategies


@dataclasses.dataclass(frozen=True)
class DecodeRecipe:
    """cache: the self-attention cache's class; loop: ONE_PASS, DROP_DONE (the batch shrinks as
    rows end: shapes that change from step to step) or TWO_PASSES (short buffers for every row,
    then full-length ones for the rows left: fixed shapes); whole_top_1: greedy search ranks a
    row's logits in one top_k, not in chunks (kformer.model.portable.top_tokens); jit: the
    searches are compiled with XLA (one program per input shape; never exported)."""

    cache: type[Growing] | type[FixedBuffers]
    loop: str
    whole_top_1: bool = False
    jit: bool = False

    def __post_init__(self):
        if self.loop not in (ONE_PASS, DROP_DONE, TWO_PASSES):
            raise ValueError(
                f"a recipe's loop is {ONE_PASS!r}, {DROP_DONE!r} or {TWO_PASSES!r}, not {self.loop!r}"
            )
        if self.loop == DROP_DONE and self.cache is not Growing:
            raise ValueError("dropping done rows needs a cache that grows (its rows are gathered each step)")
        if self.jit and (self.cache, self.loop) != (FixedBuffers, ONE_PASS):
            raise ValueError("XLA compiles static shapes: fixed buffers, one pass")


RECIPES = {
    # TensorFlow (Keras, SavedModel): caches that grow, the batch shrinking as rows end.
    "tensorflow": DecodeRecipe(Growing, DROP_DONE),
    "xla": DecodeRecipe(FixedBuffers, ONE_PASS, jit=True),
    # onnxruntime: as TensorFlow, and a row's top 1 ranked whole (faster there).
    "onnx": DecodeRecipe(Growing, DROP_DONE, whole_top_1=True),
    # LiteRT plans a loop body once, for fixed shapes: fixed buffers, in two passes.
    "tflite": DecodeRecipe(FixedBuffers, TWO_PASSES),
    # The page's fixed-shape file, one row a call: a second pass would be loop bodies that never
    # run, whose weights LiteRT's XNNPACK still packs.
    "tflite-fixed": DecodeRecipe(FixedBuffers, ONE_PASS),
    # Pictures of the search (kformer.plots): every row to the end, the trace kept.
    "trace": DecodeRecipe(Growing, ONE_PASS),
}

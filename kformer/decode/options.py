"""What a translation request may choose at run time, in every runtime: the search, the length
penalty, the output length, the n-gram repeat guard and how many alternatives to return.

Pure Python + numpy, like the runners. Each value is checked here, once, with a one-line error
naming the option; the exported graphs then take alpha, max_length, no_repeat_ngram and nbest as
inputs (the beam width is fixed per file: its buffers are shaped by it)."""

import dataclasses
import math

import numpy as np

from kformer.model.config import BEAM_SIZE, LENGTH_PENALTY, NO_REPEAT_NGRAM

# The graphs' option inputs: name -> numpy type (scalars). Greedy search has no length penalty,
# and finds one hypothesis: nbest is beam search's (how many finished ones a row waits for).
INPUTS = {"alpha": np.float32, "max_length": np.int32, "no_repeat_ngram": np.int32, "nbest": np.int32}
GREEDY_INPUTS = ("max_length", "no_repeat_ngram")


@dataclasses.dataclass(frozen=True)
class SearchOptions:
    """beam_size 1 is greedy search; max_length None is the model's maximum output length;
    no_repeat_ngram 0 turns the guard off; nbest (<= beam_size) alternatives are returned."""

    beam_size: int = BEAM_SIZE
    alpha: float = LENGTH_PENALTY
    max_length: int | None = None
    no_repeat_ngram: int = NO_REPEAT_NGRAM
    nbest: int = 1

    def replace(self, **changes):
        """These options with the `changes` that are not None."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    def checked(self, max_target_length):
        """These options, checked, with max_length set (ValueError naming the option otherwise)."""
        _whole("beam size", self.beam_size, 1)
        _whole("nbest", self.nbest, 1)
        if self.nbest > self.beam_size:
            raise ValueError(f"nbest {self.nbest} is more than the beam size {self.beam_size}")
        alpha = self.alpha
        if (
            isinstance(alpha, bool)
            or not isinstance(alpha, int | float)
            or not math.isfinite(alpha)
            or alpha < 0
        ):
            raise ValueError(f"alpha (the length penalty) must be a finite number >= 0, got {alpha!r}")
        max_length = max_target_length if self.max_length is None else self.max_length
        _whole("max length", max_length, 1)
        if max_length > max_target_length:
            raise ValueError(
                f"max length must be in [1, {max_target_length}] for this model, got {max_length}"
            )
        _whole("no_repeat_ngram", self.no_repeat_ngram, 0)
        return dataclasses.replace(self, alpha=float(alpha), max_length=max_length)

    @property
    def search(self):
        """The graph that runs them: "greedy" for beam size 1, else "beam"."""
        return "greedy" if self.beam_size == 1 else "beam"

    def inputs(self):
        """The option inputs of this search's graph: {name: 0-d numpy array} (checked options)."""
        names = GREEDY_INPUTS if self.search == "greedy" else tuple(INPUTS)
        return {name: np.array(getattr(self, name), INPUTS[name]) for name in names}


def _whole(name, value, smallest):
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < smallest:
        raise ValueError(f"{name} must be a whole number >= {smallest}, got {value!r}")

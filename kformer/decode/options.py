"""What a translation request may choose at run time, in every runtime: the search, the length
penalty, the output length, the n-gram repeat guard and how many alternatives to return.

Pure Python + numpy, like the runners. Each value is checked here, once, with a one-line error
naming the option; the exported graphs then take alpha, max_length, no_repeat_ngram and nbest as
inputs (the beam width is fixed per file: its buffers are shaped by it)."""

import dataclasses
import math

import numpy as np

BEAM_SIZE = 4  # the paper's beam width
LENGTH_PENALTY = 0.6  # the paper's α (GNMT length penalty)
# The n-gram repeat guard's size (0 = off). 4: on the demo model's test split, BLEU unchanged
# and no output repeats a token 4-gram; 2 and 3 also ban short repeats that translations need.
NO_REPEAT_NGRAM = 4
EXTRA_OUTPUT_TOKENS = 50  # maximum output length = source length + 50 (the paper's rule)

# The graphs' option inputs: name -> numpy type (scalars). Greedy search has no length penalty,
# and finds one hypothesis: nbest is beam search's (how many finished ones a row waits for).
INPUTS = {"alpha": np.float32, "max_length": np.int32, "no_repeat_ngram": np.int32, "nbest": np.int32}
GREEDY_INPUTS = ("max_length", "no_repeat_ngram")
LARGEST_WHOLE = np.iinfo(np.int32).max  # the whole-number inputs are int32 scalars


@dataclasses.dataclass(frozen=True)
class SearchOptions:
    """beam_size 1 is greedy search; max_length None is the model's maximum output length;
    no_repeat_ngram 0 turns the guard off; nbest (<= beam_size) alternatives are returned.

    A field left None takes the value of the options these are applied over (`over`): a runner's
    own, an export's defaults, DEFAULTS. So SearchOptions(nbest=3) asks for three alternatives
    and keeps everything else as the runner has it."""

    beam_size: int | None = None
    alpha: float | None = None
    max_length: int | None = None
    no_repeat_ngram: int | None = None
    nbest: int | None = None

    def over(self, base):
        """`base` with the fields of these options that are set."""
        return dataclasses.replace(
            base, **{k: v for k, v in dataclasses.asdict(self).items() if v is not None}
        )

    def checked(self, max_target_length):
        """These options over DEFAULTS, checked, with max_length set (ValueError naming the option
        otherwise)."""
        options = self.over(DEFAULTS)
        _whole("beam size", options.beam_size, 1)
        _whole("nbest", options.nbest, 1)
        if options.nbest > options.beam_size:
            raise ValueError(f"nbest {options.nbest} is more than the beam size {options.beam_size}")
        alpha = options.alpha
        if (
            isinstance(alpha, bool)
            or not isinstance(alpha, int | float)
            or not math.isfinite(alpha)
            or alpha < 0
        ):
            raise ValueError(f"alpha (the length penalty) must be a finite number >= 0, got {alpha!r}")
        max_length = max_target_length if options.max_length is None else options.max_length
        _whole("max length", max_length, 1)
        if max_length > max_target_length:
            raise ValueError(
                f"max length must be in [1, {max_target_length}] for this model, got {max_length}"
            )
        _whole("no_repeat_ngram", options.no_repeat_ngram, 0)
        return dataclasses.replace(options, alpha=float(alpha), max_length=max_length)

    @property
    def search(self):
        """The graph that runs them: "greedy" for beam size 1, else "beam"."""
        return "greedy" if self.beam_size == 1 else "beam"

    def inputs(self):
        """The option inputs of this search's graph: {name: 0-d numpy array} (checked options)."""
        names = GREEDY_INPUTS if self.search == "greedy" else tuple(INPUTS)
        return {name: np.array(getattr(self, name), INPUTS[name]) for name in names}


DEFAULTS = SearchOptions(BEAM_SIZE, LENGTH_PENALTY, None, NO_REPEAT_NGRAM, 1)


def search_label(beam_size):
    """How results name a search: "greedy" for beam size 1, else "beam" and its size ("beam4")."""
    return "greedy" if beam_size == 1 else f"beam{beam_size}"


def _whole(name, value, smallest):
    if (
        isinstance(value, bool)
        or not isinstance(value, int | np.integer)
        or not smallest <= value <= LARGEST_WHOLE
    ):
        raise ValueError(f"{name} must be a whole number in [{smallest}, {LARGEST_WHOLE}], got {value!r}")

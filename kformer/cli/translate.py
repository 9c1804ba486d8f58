"""`kformer translate`: translate TEXT arguments, or stdin one sentence per line."""

import json
import sys

from kformer.arguments import (
    add_model_options,
    add_runner_options,
    add_search_options,
    add_weights_option,
    positive,
    runner_settings,
    search_options,
)
from kformer.decode import gather
from kformer.decode.options import BEAM_SIZE
from kformer.decode.text_batches import BEAM_TOKENS_PER_SENTENCE, TOKENS_PER_SENTENCE

HELP = "translate TEXT arguments, or stdin one sentence per line"


def add_arguments(p):
    add_model_options(p, "training directory, or an export folder with --runtime")
    p.add_argument(
        "--beam", type=positive(int), help=f"beam size (1 = greedy; default {BEAM_SIZE}, or the export's)"
    )
    add_search_options(p, defaults=False, where="or the export's")
    p.add_argument(
        "--nbest", type=positive(int), default=1, help="alternatives per input (at most the beam size)"
    )
    p.add_argument(
        "--format",
        default="text",
        choices=["text", "jsonl"],
        help="text: one line per input (with --nbest: 'rank ||| translation ||| score' lines); "
        'jsonl: {"translation", "score", "alternatives"} per input',
    )
    p.add_argument(
        "--max-chars",
        type=positive(int),
        default=gather.MAX_INPUT_CHARS,
        help=f"longest input line accepted, in characters (default {gather.MAX_INPUT_CHARS:,})",
    )
    add_runner_options(
        p,
        "more sentences a second on a file, slower single sentences",
        "most lines (and sentences) translated together (greedy: fewer long ones, at most "
        f"{TOKENS_PER_SENTENCE} source tokens a sentence; beam in ONNX and TFLite: at most "
        f"{BEAM_TOKENS_PER_SENTENCE}; a beam of K takes K of 2 x batch-size places in the TFLite graphs); "
        "a pipe's lines are translated as they arrive, those that arrive together in one batch (default 32)",
    )
    add_weights_option(p)
    p.add_argument("text", nargs="*")


def main(args):
    from kformer.data import corpus as corpus_lib
    from kformer.export.formats import open_runner

    runner = open_runner(
        args.model, args.runtime, args.variant, runner_settings(args), search_options(args), args.weights
    )
    if args.text:
        batches, where = [args.text], "argument"
    else:  # stdin: what has arrived is translated when the input pauses (kformer.decode.gather), in calls
        # of up to --parallel batches, so that a file's batches run that many at once
        lines = corpus_lib.stream_lines(sys.stdin.buffer, "<stdin>")
        batches, where = (
            gather.gathered(lines, args.batch_size * args.parallel, gather.WINDOW_SECONDS),
            "<stdin> line",
        )
    for lines in gather.checked_lines(batches, args.max_chars, where):
        for result in runner.translations(lines):
            _print_translation(result, args.format, args.nbest)
        sys.stdout.flush()


def _print_translation(result, form, nbest):
    """jsonl: one JSON object per input; text: the translation, or with --nbest N the N-best list
    format of Marian and Moses, "rank ||| translation ||| score" per alternative."""
    if form == "jsonl":
        print(json.dumps(result.to_dict(), ensure_ascii=False))
    elif nbest == 1:
        print(result.text)
    else:
        for rank, hypothesis in enumerate(result.alternatives):
            print(f"{rank} ||| {hypothesis.text} ||| {hypothesis.score:.6f}")

"""`kformer evaluate`: BLEU and chrF of a model, or of an exported file, on a held-out split or on files."""

import os

from kformer.arguments import (
    add_model_options,
    add_runner_options,
    add_search_options,
    add_weights_option,
    positive,
    runner_settings,
    search_options,
)
from kformer.decode.options import BEAM_SIZE

HELP = "BLEU and chrF on a held-out split or on files"


def add_arguments(p):
    add_model_options(p, "training directory, or an export folder with --runtime")
    p.add_argument("--split", default="test", choices=["test", "dev"])
    p.add_argument("--source", help="source sentences, one per line (with --reference)")
    p.add_argument("--reference", help="reference translations, one per line")
    p.add_argument(
        "--beam", type=positive(int), help=f"beam size (1 = greedy; default {BEAM_SIZE}, or the export's)"
    )
    add_search_options(p, defaults=False, where="or the export's")
    p.add_argument("--output", help="hypotheses file (default: MODEL/hypotheses.<split>.txt)")
    p.add_argument("--limit", type=positive(int), help="only the first N sentences")
    add_runner_options(p, "more sentences a second", "sentences translated together (default 32)")
    add_weights_option(p)


def main(args):
    from kformer import evaluate as evaluate_lib
    from kformer.export.formats import open_runner

    if (args.source is None) != (args.reference is None):
        raise ValueError("give both --source and --reference, or neither (to use --split)")
    if args.source is not None:
        sources, references = evaluate_lib.file_references(args.source, args.reference)
        name = os.path.basename(args.source)
    else:
        sources, references = evaluate_lib.split_references(args.model, args.split)
        name = args.split
    sources, references = sources[: args.limit], references[: args.limit]  # limit None: all
    if not sources:
        raise ValueError(f"nothing to evaluate: {name} is empty")
    output = args.output or os.path.join(args.model, f"hypotheses.{name}.txt")
    evaluate_lib.check_writable(output)  # before loading the model
    runner = open_runner(
        args.model, args.runtime, args.variant, runner_settings(args), search_options(args), args.weights
    )
    evaluate_lib.print_scores(evaluate_lib.evaluate(runner, sources, references, output))

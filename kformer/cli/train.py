"""`kformer train`: train (or resume) a model in --out."""

import argparse
import json

from kformer.arguments import add_precision_option, data_spec, positive
from kformer.contracts.run import JUDGES
from kformer.data.corpus import DEFAULT_DIRECTION
from kformer.data.tokenizer import VOCAB_SIZE
from kformer.model.config import DEFAULT_PRESET, PRESETS
from kformer.train.distributed import CONNECT_TIMEOUT_SECONDS, STRATEGIES
from kformer.train.init_from import MIX_ORIGINAL
from kformer.train.options import EVAL_MINUTES, EVAL_SENTENCES, Evaluation, TrainOptions

HELP = "train (or resume) a model in --out"


def add_arguments(p):
    p.add_argument(
        "--config", choices=sorted(PRESETS), help=f"model and recipe preset (default: {DEFAULT_PRESET})"
    )
    p.add_argument(
        "--data",
        nargs="+",
        metavar="PATH",
        help="'default' (Tatoeba zh-en), a TSV of source<TAB>target or two aligned text files (each "
        "plain or gzip; prepared into the run folder), or a `kformer prepare` folder",
    )
    p.add_argument(
        "--direction",
        help="language pair source-target; picks the columns of the default corpus (zh-en or en-zh; "
        f"default: {DEFAULT_DIRECTION}, or --init-from's)",
    )
    p.add_argument("--out", required=True, help="training directory; re-running with it resumes")
    p.add_argument(
        "--init-from",
        metavar="RUN",
        help="start from this training directory's weights (fine-tuning): its tokenizer, direction "
        "and model sizes are kept, --data is encoded with its tokenizer; RUN is only read",
    )
    p.add_argument(
        "--mix-original",
        type=positive(float, zero_allowed=True),
        metavar="SHARE",
        help="with --init-from: the share of each batch's pairs drawn from RUN's own corpus, so that "
        f"the model keeps its general translation (default: {MIX_ORIGINAL}; 0: the new corpus alone)",
    )
    p.add_argument(
        "--pull-to-start",
        type=positive(float),
        metavar="RATE",
        help="with --init-from: each update also moves every weight toward RUN's by the learning rate "
        "x RATE x the difference, against forgetting where no original corpus is mixed in (an "
        "imported model's; e.g. 30)",
    )
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--minutes", type=positive(float), help="stop cleanly after this much training time")
    budget.add_argument("--steps", type=positive(int), help="total optimizer steps")
    budget.add_argument("--epochs", type=positive(int), help="total passes over the train split")
    _step_options(p)
    _evaluation_options(p)
    _strategy_options(p)


def _averaging_momentum(text):
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be a number in [0, 1), got {text!r}")
    return value


def _step_options(p):
    """What a training step computes: XLA, precision, batch, accumulation, averaging; and when it saves."""
    p.add_argument(
        "--xla",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="compile the train step with XLA (default: on with a GPU, no --strategy and no --minutes "
        "under 30; off on CPUs, where it compiles each batch shape for no measured gain)",
    )
    add_precision_option(p)
    p.add_argument(
        "--batch-tokens",
        type=positive(int),
        help="tokens per optimizer step and side (default: the preset's)",
    )
    p.add_argument(
        "--accumulate",
        type=positive(int),
        metavar="N",
        help="each optimizer step averages the gradients of N batches of batch-tokens / N tokens: "
        "a large batch in the memory of a small one (default: the preset's, 1)",
    )
    p.add_argument(
        "--average",
        type=_averaging_momentum,
        metavar="MOMENTUM",
        help="translate with a moving average of the weights (e.g. 0.995; 0: off; default: the "
        "preset's: 0.995 for small, off for the others)",
    )
    p.add_argument(
        "--vocab-size", type=positive(int), default=VOCAB_SIZE, help="SentencePiece vocabulary size"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--save-minutes",
        type=positive(float),
        default=5.0,
        help="save model.keras (and where the batch stream is) this often, and at the end; a kill "
        "loses at most this much training (default: %(default)s)",
    )


def _strategy_options(p):
    p.add_argument(
        "--strategy",
        choices=STRATEGIES,
        default="default",
        help="mirrored: data-parallel over the local accelerators; multi-worker: over the "
        "workers of TF_CONFIG (run the same command on each, --out on storage every worker reads)",
    )
    p.add_argument(
        "--connect-timeout",
        type=positive(float),
        default=CONNECT_TIMEOUT_SECONDS,
        metavar="SECONDS",
        help="multi-worker: give up if the other workers are not all reachable by then",
    )


def _evaluation_options(p):
    group = p.add_argument_group(
        "keeping the best weights (best.weights.h5, used by translate/evaluate/export)"
    )
    group.add_argument(
        "--eval-minutes",
        type=positive(float, zero_allowed=True),
        default=EVAL_MINUTES,
        help="translate a dev sample (greedy) and score it this often, at most a quarter of --minutes; "
        "0: never (default: %(default)s)",
    )
    group.add_argument("--eval-steps", type=positive(int), help="evaluate every N optimizer steps instead")
    group.add_argument(
        "--eval-sentences",
        type=positive(int),
        default=EVAL_SENTENCES,
        help="dev sources an evaluation translates (default: %(default)s)",
    )
    group.add_argument(
        "--early-stop", type=positive(int), metavar="N", help="stop after N evaluations without a gain"
    )
    group.add_argument(
        "--keep-best-by",
        choices=JUDGES,
        help="what the best weights are kept by: the dev sample's BLEU, or the whole dev split's "
        "loss (default: loss for a fine-tune, whose dev split is small; else bleu)",
    )


def options(args):
    """The TrainOptions of the command's arguments."""
    from kformer.train.distributed import make_strategy

    return TrainOptions(
        config_name=args.config,
        data=data_spec(args.data),
        direction=args.direction,
        minutes=args.minutes,
        steps=args.steps,
        epochs=args.epochs,
        xla=args.xla,
        precision=args.precision,
        batch_tokens=args.batch_tokens,
        accumulate=args.accumulate,
        average=args.average,
        seed=args.seed,
        strategy=make_strategy(args.strategy, args.connect_timeout),
        vocab_size=args.vocab_size,
        checkpoint_seconds=args.save_minutes * 60,
        evaluation=Evaluation(
            args.eval_minutes, args.eval_steps, args.eval_sentences, args.early_stop, args.keep_best_by
        ),
        init_from=args.init_from,
        mix_original=args.mix_original,
        recipe_changes={"pull_to_start": args.pull_to_start} if args.pull_to_start else None,
    )


def main(args):
    from kformer.train.fit import run, stop_if_interrupted

    summary = run(args.out, options(args))
    print(json.dumps(summary, indent=2))
    stop_if_interrupted(summary)

"""`kformer prepare`: a corpus of any size into a folder that training reads as a stream."""

from kformer.arguments import data_spec, positive
from kformer.data import prepare as prepare_lib
from kformer.data.corpus import DEFAULT_DIRECTION
from kformer.data.tokenizer import VOCAB_SIZE

HELP = "a corpus of any size into a folder that training reads as a stream"


def add_arguments(p):
    p.add_argument(
        "--data",
        nargs="+",
        metavar="PATH",
        help="'default' (Tatoeba zh-en), a TSV of source<TAB>target, or two aligned text files; each plain or gzip",
    )
    p.add_argument("--out", required=True, help="new folder for the prepared corpus")
    p.add_argument("--direction", default=DEFAULT_DIRECTION, help="language pair source-target")
    p.add_argument("--vocab-size", type=positive(int), default=VOCAB_SIZE)
    p.add_argument("--dev", metavar="TSV", help="the dev split from this file instead of from the corpus")
    p.add_argument("--test", metavar="TSV", help="the test split from this file instead of from the corpus")
    p.add_argument(
        "--split-size",
        type=positive(int),
        default=prepare_lib.SPLIT_SIZE,
        help="pairs at most in the dev and in the test split taken from the corpus",
    )
    p.add_argument(
        "--shards",
        type=positive(int),
        help=f"train shards (default: one per {prepare_lib.SHARD_PAIRS:,} pairs)",
    )
    p.add_argument(
        "--tokenizer-sample",
        type=positive(int),
        default=prepare_lib.TOKENIZER_SAMPLE,
        help="train pairs the tokenizer is trained on, at most",
    )
    p.add_argument(
        "--tokenizer",
        metavar="FILE",
        help="encode with this tokenizer instead of training one: a run's tokenizer.model, or an "
        "imported run's tokenizer.json (to fine-tune it with --init-from)",
    )
    p.add_argument("--seed", type=int, default=0)


def main(args):
    options = prepare_lib.PrepareOptions(
        args.direction,
        args.vocab_size,
        args.dev,
        args.test,
        args.split_size,
        args.shards,
        args.tokenizer_sample,
        args.seed,
        args.tokenizer,
    )
    manifest = prepare_lib.prepare(data_spec(args.data), args.out, options)
    print(f"wrote {args.out}: {prepare_lib.summary(manifest)}")

"""`kformer demo`: train on the default corpus, report BLEU, show translations."""

from kformer.arguments import positive
from kformer.model.config import DEFAULT_PRESET, PRESETS

HELP = "train on the default corpus, report BLEU, show translations"


def add_arguments(p):
    p.add_argument("--out", default="runs/demo")
    p.add_argument("--config", default=DEFAULT_PRESET, choices=sorted(PRESETS))
    p.add_argument("--minutes", type=positive(float), default=20)


def main(args):
    from kformer.demo import demo

    demo(args.out, args.config, args.minutes)

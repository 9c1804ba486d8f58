"""`kformer attention`: a picture of the encoder-decoder alignment for a sentence (PNG)."""

from kformer.arguments import positive
from kformer.decode.options import BEAM_SIZE

HELP = "picture of the encoder-decoder alignment for a sentence (PNG)"


def add_arguments(p):
    p.add_argument("--model", required=True, help="training directory")
    p.add_argument("--out", default="alignment.png")
    p.add_argument("--layer", type=int, default=-1, help="decoder layer (default: the last)")
    p.add_argument("--beam", type=positive(int), default=BEAM_SIZE)
    p.add_argument("text")


def main(args):
    from kformer import plots

    print(plots.save_alignment(args.model, args.text, args.out, layer=args.layer, beam_size=args.beam))
    print(f"wrote {args.out}")

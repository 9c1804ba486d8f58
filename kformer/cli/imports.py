"""`kformer import`: a pretrained translator (a Hugging Face Marian folder: OPUS-MT) into a run folder."""

HELP = "turn a pretrained translator (a Hugging Face Marian folder, e.g. OPUS-MT) into a run folder"


def add_arguments(p):
    p.add_argument(
        "source", help="a local folder (nothing is downloaded): config.json, weights, *.spm, vocab.json"
    )
    p.add_argument("--out", required=True, help="new run folder")
    p.add_argument(
        "--direction", help="language pair source-target, where the folder records none (e.g. en-de)"
    )


def main(args):
    from kformer.importers import import_model

    import_model(args.source, args.out, args.direction)

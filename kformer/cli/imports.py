"""`kformer import`: a pretrained translator (a Hugging Face Marian folder: OPUS-MT; a CTranslate2
model folder; an Argos package) into a run folder."""

HELP = (
    "turn a pretrained translator (OPUS-MT Marian folder, CTranslate2 folder, .argosmodel) into a run folder"
)


def add_arguments(p):
    p.add_argument(
        "source",
        help="a local path (nothing is downloaded): a Marian folder (config.json, weights, *.spm, "
        "vocab.json), a CTranslate2 folder (model.bin; sentencepiece.model in it or beside it) or "
        "an .argosmodel",
    )
    p.add_argument("--out", required=True, help="new run folder")
    p.add_argument(
        "--direction",
        help="language pair source-target, where the source records none (a CTranslate2 folder; e.g. en-de)",
    )


def main(args):
    from kformer.importers import import_model

    import_model(args.source, args.out, args.direction)

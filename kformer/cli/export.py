"""`kformer export`: SavedModel, TFLite and ONNX (and CTranslate2, Argos) translators, verified."""

from kformer.arguments import add_search_options, add_weights_option, positive, search_options
from kformer.decode.options import BEAM_SIZE
from kformer.export.formats import DEFAULT_FORMATS, FORMATS

HELP = "write SavedModel, TFLite and ONNX (and CTranslate2) translators, verified"


def add_arguments(p):
    p.add_argument("--model", required=True, help="training directory")
    p.add_argument("--out", required=True, help="new folder for the artifacts")
    p.add_argument(
        "--formats",
        default=",".join(DEFAULT_FORMATS),
        help=f"comma list of {','.join(FORMATS)},argos (ctranslate2 and argos, an Argos Translate "
        "package of the ctranslate2 model: pip install 'kformer[ctranslate2]')",
    )
    p.add_argument(
        "--quantize",
        default="",
        help="comma list of fp16,int8 (extra variants; int8 also makes the Argos package int8)",
    )
    add_weights_option(p)
    p.add_argument(
        "--beam", type=positive(int), default=BEAM_SIZE, help="beam size of the exported beam search"
    )
    add_search_options(p, defaults=True, where="the files' default; any value at run time")


def main(args):
    from kformer.export.exporter import export, print_summary

    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    quantize = [q.strip() for q in (args.quantize or "").split(",") if q.strip()]
    print_summary(
        export(args.model, args.out, formats, quantize, search_options(args), args.weights), args.out
    )

"""Argument types and options that several commands share (kformer.cli and the benchmarks'
subcommands, kformer.bench)."""

import argparse

from kformer.train.precision import PRECISIONS


def positive(kind, zero_allowed=False, largest=None):
    """An argparse type: a finite number > 0 (>= 0 with `zero_allowed`; <= `largest` if given) of
    `kind`, else argparse's one-line error naming the option."""
    bound = (">= 0" if zero_allowed else "> 0") + ("" if largest is None else f" and <= {largest}")

    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            value = float("nan")
        in_range = (0 <= value if zero_allowed else 0 < value) and value <= (largest or float("inf"))
        if not in_range or value == float("inf"):
            raise argparse.ArgumentTypeError(f"must be a finite {kind.__name__} {bound}, got {text!r}")
        return value

    return parse


def add_precision_option(p):
    p.add_argument(
        "--precision",
        default="auto",
        choices=["auto", *PRECISIONS],
        help="compute precision of training; weights stay float32 (auto: on a CPU with bfloat16 "
        "instructions and oneDNN, the faster of bfloat16 and float32, measured once and cached; "
        "float32 on other CPUs; float16 is for GPUs)",
    )


def add_rounds_option(p, default=3):
    p.add_argument("--rounds", type=positive(int), default=default, help="interleaved rounds")


def add_search_options(p, defaults, where):
    """--alpha, --max-len and --no-repeat-ngram (kformer.decode.options), with their defaults unless
    `defaults` is False (then the runner's own apply)."""
    from kformer.decode.options import LENGTH_PENALTY, NO_REPEAT_NGRAM

    p.add_argument(
        "--alpha",
        type=positive(float, zero_allowed=True),
        default=LENGTH_PENALTY if defaults else None,
        help=f"length penalty exponent of beam search (default {LENGTH_PENALTY}; {where})",
    )
    p.add_argument(
        "--max-len", type=positive(int), help=f"maximum output tokens (default: the model's maximum; {where})"
    )
    p.add_argument(
        "--no-repeat-ngram",
        type=positive(int, zero_allowed=True),
        default=NO_REPEAT_NGRAM if defaults else None,
        metavar="N",
        help=f"never output an n-gram of N tokens twice; 0 = off (default {NO_REPEAT_NGRAM}; {where})",
    )


def search_options(args):
    """The SearchOptions of a command's arguments (those it has; None: the runner's own)."""
    from kformer.decode.options import SearchOptions

    return SearchOptions(
        beam_size=getattr(args, "beam", None),
        alpha=args.alpha,
        max_length=args.max_len,
        no_repeat_ngram=args.no_repeat_ngram,
        nbest=getattr(args, "nbest", None),
    )


def add_runner_options(p, what_parallel_does, batch_size_help=None):
    """--threads, --parallel and --batch-size (kformer.decode.runner.RunnerSettings) of a command
    that runs a model."""
    p.add_argument("--threads", type=positive(int), help="the runtime's threads (default: all cores)")
    p.add_argument(
        "--parallel",
        type=positive(int),
        default=1,
        metavar="N",
        help=f"batches run at once, each on threads / N threads: {what_parallel_does} "
        "(onnx ids variants and ctranslate2; default 1)",
    )
    if batch_size_help:
        p.add_argument("--batch-size", type=positive(int), default=32, help=batch_size_help)
    p.add_argument(
        "--target-language",
        metavar="CODE",
        help="a multilingual model's target language, as its vocabulary names it (fra for >>fra<<)",
    )


def runner_settings(args):
    """The RunnerSettings of a command's arguments."""
    from kformer.decode.runner import RunnerSettings

    return RunnerSettings(
        getattr(args, "batch_size", 32), args.threads, args.parallel, getattr(args, "target_language", None)
    )


def add_weights_option(p):
    from kformer.contracts.run import WEIGHTS

    p.add_argument(
        "--weights",
        choices=WEIGHTS,
        default="best",
        help="best: best.weights.h5 where training kept one (else model.keras); last: model.keras",
    )


def add_model_options(p, model_help):
    """--model, --runtime and --variant of a command that opens a model (kformer.export.formats)."""
    from kformer.export.formats import RUNTIMES, VARIANTS

    p.add_argument("--model", required=True, help=model_help)
    p.add_argument("--runtime", default="keras", choices=RUNTIMES)
    p.add_argument(
        "--variant",
        default="fp32",
        choices=sorted({v for vs in VARIANTS.values() for v in vs}),
        help="tflite: fp32/fp16/int8, fixed/fp16-fixed/int8-fixed (one file of both searches, input "
        "shape fixed, for LiteRT.js and CompiledModel), text/int8-text "
        "(UTF-8 in and out, the text work inside the file), or fixed-text (text in and out, one text "
        "of at most 4,096 bytes a call, for LiteRT.js); "
        "onnx: fp32/int8 (int8: the export's int8-ort file, onnxruntime's own int8 kernels, where it "
        "has one; the portable int8 file is the page's), or text (SentencePiece inside the graph)",
    )


def data_spec(values):
    """--data's paths: "default", one path, or (source path, target path)."""
    if values is None or values == ["default"]:
        return "default"
    return values[0] if len(values) == 1 else tuple(values)

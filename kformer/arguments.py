"""Argument types and options that several commands share (kformer.cli and the benchmarks'
subcommands, kformer.bench)."""

import argparse

from kformer.model.config import PRECISIONS


def positive(kind, zero_allowed=False):
    """An argparse type: a finite number > 0 (>= 0 with `zero_allowed`) of `kind`, else argparse's
    one-line error naming the option."""
    bound = ">= 0" if zero_allowed else "> 0"

    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            value = float("nan")
        if not (0 <= value if zero_allowed else 0 < value) or value == float("inf"):
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

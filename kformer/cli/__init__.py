"""`kformer` command line: each command a module of this package with HELP, `add_arguments(parser)`
and `main(args)`, which parses and calls importable functions; no logic of its own."""

import importlib
import logging
import os
import sys

from kformer import extras
from kformer.train.distributed import Preempted

# command -> its module of kformer.cli ("import" is a keyword of Python)
COMMANDS = {
    name: name
    for name in ("prepare", "train", "translate", "attention", "export", "evaluate", "demo", "serve", "bench")
} | {"import": "imports"}


def _start_tensorflow(args):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # hides the CUDA probe noise on CPU machines
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    if getattr(args, "runtime", "keras") != "keras" or args.command == "bench":
        return  # exported runtimes run without TensorFlow; bench sets XLA flags before it starts
    # TensorFlow's C++ start-up notes (oneDNN, "Could not find cuda drivers") ignore the log level
    # (abseil logs before InitializeLog; abseil-cpp PR 1718): import it once with stderr muted.
    stderr, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        import tensorflow  # noqa: F401
    finally:
        os.dup2(stderr, 2)
        os.close(stderr)
        os.close(devnull)


def build_parser():
    import argparse

    parser = argparse.ArgumentParser(
        prog="kformer", description="Train, translate with and export encoder-decoder Transformers."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(f"kformer.cli.{module_name}")
        p = commands.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(run=module.main)
    return parser


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    not_utf8 = _not_utf8(argv)
    if not_utf8:
        print(f"kformer {args.command}: error: {not_utf8}", file=sys.stderr)
        return 2
    _start_tensorflow(args)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("kformer: %(message)s"))
    log = logging.getLogger("kformer")
    log.addHandler(handler)
    level, propagate = log.level, log.propagate
    log.setLevel(logging.INFO)
    log.propagate = False
    logging.getLogger("tensorflow").setLevel(logging.ERROR)  # converters are chatty at INFO/WARNING
    try:
        return _run(args)
    finally:  # as it was: a caller's next `main` (a test's, a notebook's) gets its own stderr
        log.removeHandler(handler)
        log.setLevel(level)
        log.propagate = propagate


def _not_utf8(argv):
    """What is wrong with the first argument that is not UTF-8, or None. Python reads such a byte
    as a lone surrogate, which no tokenizer, file name or JSON record can take."""
    for number, argument in enumerate(argv, start=1):
        try:
            raw = argument.encode("utf-8", "surrogateescape")
            raw.decode("utf-8")
        except UnicodeEncodeError as e:  # a surrogate no byte gives: an argument made in Python
            return f"argument {number} holds a lone surrogate at {e.start}, which is not text"
        except UnicodeDecodeError as e:
            shown = raw.decode("utf-8", "backslashreplace")
            return (
                f"argument {number} ({shown}) is not valid UTF-8 (byte 0x{raw[e.start]:02x} at {e.start}); "
                "kformer reads its arguments as UTF-8"
            )
    return None


def _run(args):
    """Runs the command; a user's error is one line on stderr and exit status 2."""
    from kformer.export.artifact_format import ExportError

    try:
        args.run(args)
    except Preempted as e:  # saved: the same command resumes
        print(f"kformer {args.command}: {e}", file=sys.stderr)
        return e.exit_code
    except (ValueError, OSError, FloatingPointError, ExportError) as e:
        # User errors (CorpusError and ArtifactError are ValueErrors; OSError: a path that is a folder,
        # not writable or full; FloatingPointError: a NaN loss) are one line; a bug keeps its traceback.
        print(f"kformer {args.command}: error: {e}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as e:  # an optional extra not installed is a user error too
        if e.name is None or extras.extra_for(e.name) is None:
            raise
        print(f"kformer {args.command}: error: {extras.missing(e.name, 'this command')}", file=sys.stderr)
        return 2
    return 0

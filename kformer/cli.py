"""`kformer` command line: parse, then call one importable function. No logic of its own."""

import argparse
import json
import logging
import os
import sys
import tempfile


def _quiet_tensorflow():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")


def _data_spec(values):
    if values is None or values == ["default"]:
        return "default"
    return values[0] if len(values) == 1 else tuple(values)


def _train(args):
    from kformer.train import train

    if args.strategy == "mirrored":
        import tensorflow as tf
        strategy = tf.distribute.MirroredStrategy()
    else:
        strategy = None
    summary = train(args.out, args.config, data=_data_spec(args.data), direction=args.direction,
                    minutes=args.minutes, steps=args.steps, epochs=args.epochs, xla=not args.no_xla,
                    mixed_precision=args.mixed_precision, batch_tokens=args.batch_tokens, seed=args.seed,
                    strategy=strategy, vocab_size=args.vocab_size)
    print(json.dumps(summary, indent=2))


def _bench(args):
    if args.what == "train":
        # XLA reads its flags once, when TensorFlow starts: set them before importing it.
        from kformer import bench
        dump = tempfile.mkdtemp(prefix="kformer-xla-")
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + bench.xla_dump_flags(dump)).strip()
        os.environ[bench.XLA_DUMP_ENV] = dump
        results = bench.bench_train(args.config, steps=args.steps, mixed_precision=args.mixed_precision)
        print(f"train bench, config {results['config']}, {results['steps']} steps on the same batches "
              f"({results['distinct_batch_shapes']} distinct shapes, {results['target_tokens']} target tokens)")
        print(f"{'':8} {'steps/s':>9} {'tokens/s':>10}")
        for name in ("no_xla", "xla"):
            r = results[name]
            print(f"{name:8} {r['steps_per_s']:9.2f} {r['target_tokens_per_s']:10.0f}")
        print(f"XLA speed-up: {results['xla_speedup']:.2f}x; XLA compilations of the train step: "
              f"{results.get('xla_compilations', 'not counted')} (distinct batch shapes: "
              f"{results['distinct_batch_shapes']})")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=2)


def build_parser():
    parser = argparse.ArgumentParser(prog="kformer", description="Train, translate with and export encoder-decoder Transformers.")
    commands = parser.add_subparsers(dest="command", required=True)

    p = commands.add_parser("train", help="train (or resume) a model in --out")
    p.add_argument("--config", default="small", choices=["tiny", "small", "base", "big"])
    p.add_argument("--data", nargs="+", metavar="PATH",
                   help="'default' (Tatoeba zh-en), a TSV of source<TAB>target, or two aligned text files")
    p.add_argument("--direction", default="zh-en",
                   help="language pair source-target; picks the columns of the default corpus (zh-en or en-zh)")
    p.add_argument("--out", required=True, help="training directory; re-running with it resumes")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--minutes", type=float, help="stop cleanly after this much training time")
    budget.add_argument("--steps", type=int, help="total optimizer steps")
    budget.add_argument("--epochs", type=int, help="total passes over the train split")
    p.add_argument("--no-xla", action="store_true", help="compile without XLA (jit_compile=False)")
    p.add_argument("--mixed-precision", action="store_true", help="float16 compute (for GPUs)")
    p.add_argument("--batch-tokens", type=int, help="tokens per batch and side (default: the preset's)")
    p.add_argument("--vocab-size", type=int, default=8000, help="SentencePiece vocabulary size")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--strategy", choices=["default", "mirrored"], default="default",
                   help="mirrored: data-parallel over the local accelerators")
    p.set_defaults(run=_train)

    p = commands.add_parser("bench", help="benchmarks: ratios measured in one run")
    p.add_argument("what", choices=["train"])
    p.add_argument("--config", default="small", choices=["tiny", "small", "base", "big"])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--mixed-precision", action="store_true")
    p.add_argument("--json", help="also write the results to this file")
    p.set_defaults(run=_bench)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    _quiet_tensorflow()
    logging.basicConfig(level=logging.INFO, format="kformer: %(message)s", stream=sys.stderr)
    try:
        args.run(args)
    except (ValueError, FileNotFoundError, FloatingPointError) as e:
        print(f"kformer {args.command}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

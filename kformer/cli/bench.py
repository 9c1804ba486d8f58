"""`kformer bench`: the benchmarks, a subcommand each (kformer.bench)."""

import importlib

HELP = "benchmarks: ratios measured in one run"


def add_arguments(p):
    from kformer import bench

    benchmarks = p.add_subparsers(dest="what", required=True, metavar="BENCHMARK")
    for name in bench.BENCHMARKS:
        module = importlib.import_module(f"kformer.bench.{name}")
        b = benchmarks.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(b)
        b.add_argument("--json", help="also write the results to this file")
        b.set_defaults(run=module.main)


def main(args):
    """Never called: each benchmark's parser sets `run` to its own main (kformer.cli.main runs it)."""

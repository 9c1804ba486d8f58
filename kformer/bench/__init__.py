"""Benchmarks, not tests: each prints ratios measured in one run on the same inputs (interleaved,
so a change in the machine's speed hits every variant alike) and never fails on an absolute time.

train: kformer's training step against keras-hub's; decode: the cached loop against the naive
re-run; runtimes: every exported runtime against CTranslate2; web: the page against Python; argos: Argos
Translate against kformer's runner on the same package; alternatives: the distinct alternatives
every runtime gives; judge: how often each way of keeping the best weights ranks two runs right;
vmap: CTranslate2's vocabulary mapping against its full output.

Each is a subcommand of `kformer bench`: its module has HELP, add_arguments(parser) and main(args).
"""

BENCHMARKS = ("train", "data", "decode", "runtimes", "web", "serve", "argos", "alternatives", "judge", "vmap")

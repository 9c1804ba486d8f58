"""`kformer bench judge`: how often each way of keeping the best weights (kformer.train.judge)
ranks the better of two runs first on a dev split as small as a fine-tune's.

Which run is better is what `--test` says: BLEU, beam 4, on held-out pairs no judge sees. Each
judge scores both runs on bootstrap resamples of `--dev` (as large as it): BLEU and chrF of their
greedy translations (what keep-best translates), or their mean token loss. A judge's share is the
share of resamples on which it prefers the better run (a tie counts half)."""

import itertools
import typing

import numpy as np

from kformer.arguments import positive
from kformer.bench.harness import print_table, report

HELP = "how often each keep-best judge ranks the better of two runs first (bootstrap over a dev split)"


def _pair_losses(run, pairs):
    """(loss sum, tokens) of each (source, target) pair under `run`'s model, one pair a call."""
    from kformer.data.vocabulary import encode_targets
    from kformer.train.judge import mean_token_loss

    sources = run.tokenizer.encode([s for s, _ in pairs])
    targets = encode_targets(run.tokenizer, [t for _, t in pairs])
    sums, tokens = [], []
    for source, target in zip(sources, targets):
        source = source[: run.config.max_source_length]
        target = target[: run.config.max_target_length - 1]
        x = {
            "source_ids": np.array([source], np.int32),
            "target_ids": np.array([[run.config.bos_id, *target]]),
        }
        labels = np.array([[*target, run.config.eos_id]], np.int32)
        tokens.append(len(target) + 1)
        sums.append(mean_token_loss(run.model, [(x, labels)]) * tokens[-1])
    return np.array(sums), np.array(tokens)


def _scored(run_dir, dev, test):
    """What each judge needs of one run on the dev sources (their greedy translations; the loss
    sum and tokens of each source's pairs), and its BLEU on `test` (beam 4). `dev`, `test`:
    (sources, their references, their pairs)."""
    from kformer import evaluate as evaluate_lib
    from kformer import run_folder
    from kformer.decode.options import SearchOptions
    from kformer.decode.translator import KerasRunner

    run = run_folder.load(run_dir)
    language = run.language
    greedy = KerasRunner(run.model, run.tokenizer, SearchOptions(beam_size=1), language=language)
    beam = KerasRunner(run.model, run.tokenizer, SearchOptions(beam_size=4), language=language)
    sums, tokens = _pair_losses(run, dev.pairs)
    position = {source: i for i, source in enumerate(dev.sources)}
    of_source = np.array([position[s] for s, _ in dev.pairs])  # each pair's source
    count = len(dev.sources)
    return {
        "greedy": greedy.translate(dev.sources),
        "losses": (np.bincount(of_source, sums, count), np.bincount(of_source, tokens, count)),
        "test_bleu": evaluate_lib.score(beam.translate(test.sources), test.references, language)["bleu"],
        "language": language,
    }


def _judged(scored, indices, references):
    """{"bleu", "chrf", "loss"} of one run on the resample `indices` of the dev sources (loss
    negated: higher is better for each)."""
    from kformer import evaluate as evaluate_lib

    hypotheses = [scored["greedy"][i] for i in indices]
    scores = evaluate_lib.score(hypotheses, [references[i] for i in indices], scored["language"])
    sums, tokens = scored["losses"]
    return {
        "bleu": scores["bleu"],
        "chrf": scores["chrf"],
        "loss": -sums[indices].sum() / tokens[indices].sum(),
    }


def _shares(better, worse, references, resamples, seed):
    """{judge: share of resamples of the dev sources on which it prefers `better`}; `references`:
    each source's list of references."""
    rng = np.random.default_rng(seed)
    wins = {"bleu": 0.0, "chrf": 0.0, "loss": 0.0}
    for _ in range(resamples):
        indices = rng.integers(len(references), size=len(references))
        a, b = _judged(better, indices, references), _judged(worse, indices, references)
        for judge in wins:
            wins[judge] += 1.0 if a[judge] > b[judge] else 0.5 if a[judge] == b[judge] else 0.0
    return {judge: won / resamples for judge, won in wins.items()}


class _Split(typing.NamedTuple):
    sources: list  # distinct, in order
    references: list  # each source's translations
    pairs: list


def _split(path):
    from kformer import evaluate as evaluate_lib
    from kformer.data import corpus as corpus_lib

    pairs = corpus_lib.read_corpus(path)[0]
    return _Split(*evaluate_lib.group_references(pairs), pairs)


def bench_judge(runs, dev_file, test_file, resamples=1000, seed=0):
    """Each pair of `runs` (run folders), the better by test BLEU first, with each judge's share."""
    dev, test = _split(dev_file), _split(test_file)
    scored = {run: _scored(run, dev, test) for run in runs}
    rows = []
    for a, b in itertools.combinations(runs, 2):
        better, worse = sorted((a, b), key=lambda r: -scored[r]["test_bleu"])
        rows.append(
            {
                "better": better,
                "worse": worse,
                "test_bleu": [scored[better]["test_bleu"], scored[worse]["test_bleu"]],
                **_shares(scored[better], scored[worse], dev.references, resamples, seed),
            }
        )
    return {
        "dev_sources": len(dev.sources),
        "test_sources": len(test.sources),
        "resamples": resamples,
        "pairs": rows,
    }


def print_judge_table(results):
    columns = [
        ("better run", "<28", lambda r: r["better"][-28:]),
        ("worse run", "<28", lambda r: r["worse"][-28:]),
        ("test BLEU", ">13", lambda r: "{:.2f} / {:.2f}".format(*r["test_bleu"])),
        ("BLEU", ">6.3f", "bleu"),
        ("chrF", ">6.3f", "chrf"),
        ("loss", ">6.3f", "loss"),
    ]
    title = (
        f"share of {results['resamples']} resamples of {results['dev_sources']} dev sources on which each "
        f"judge prefers the run better on {results['test_sources']} test sources"
    )
    print_table(columns, results["pairs"], title=title)


def add_arguments(p):
    p.add_argument(
        "--runs", nargs="+", required=True, help="two or more run folders (e.g. a fine-tune's start and end)"
    )
    p.add_argument("--dev", required=True, help="a TSV of dev pairs, as small as the judges see")
    p.add_argument("--test", required=True, help="a TSV of held-out pairs that say which run is better")
    p.add_argument("--resamples", type=positive(int), default=1000, help="bootstrap resamples (default 1000)")


def main(args):
    if len(args.runs) < 2:
        raise ValueError("--runs needs two run folders or more")
    report(bench_judge(args.runs, args.dev, args.test, args.resamples), print_judge_table, args.json)

"""`kformer demo` (the README's `make demo`): train a preset for a time budget, then report BLEU and
chrF on the held-out test split and show a few of its translations."""

import dataclasses
import os

from kformer.evaluate import evaluate, print_scores, split_references
from kformer.export.formats import open_runner
from kformer.model.config import DEFAULT_PRESET
from kformer.train.fit import run, stop_if_interrupted
from kformer.train.options import TrainOptions

EXAMPLES = 8


def demo(out_dir="runs/demo", config_name=DEFAULT_PRESET, minutes=20, options=None):
    """Trains (or resumes) the run in `out_dir` for `minutes` in all, evaluates it on the test split
    with beam search and prints the speed, the scores and a few translations. `options`: a
    TrainOptions for the rest (e.g. `data`, for another corpus). Returns the evaluation result."""
    options = dataclasses.replace(options or TrainOptions(), config_name=config_name, minutes=minutes)
    summary = run(out_dir, options)
    stop_if_interrupted(summary)  # Ctrl-C: saved, and no evaluation
    if "steps_per_s" in summary:
        print(
            f"training speed: {summary['steps_per_s']:.2f} steps/s, {summary['real_tokens_per_s']:.0f} real "
            f"(non-pad) source+target tokens/s ({summary['precision']} compute, oneDNN CPU kernels "
            f"{summary['onednn']})"
        )
    print(
        f"trained {summary['steps']} steps ({summary['stopped']}); token accuracy "
        f"{summary.get('token_accuracy', float('nan')):.3f}, dev token accuracy "
        f"{summary.get('val_token_accuracy', float('nan')):.3f}"
    )
    sources, references = split_references(out_dir, "test")
    result = evaluate(open_runner(out_dir), sources, references, os.path.join(out_dir, "hypotheses.test.txt"))
    print_scores(result)
    print("examples from the held-out test split (source / reference / kformer):")
    examples = result["examples"]
    for source, references, hypothesis in examples[:: max(1, len(examples) // EXAMPLES)][:EXAMPLES]:
        print(f"  {source}\n    ref: {references[0]}\n    out: {hypothesis}")
    print(f'translate more with: kformer translate --model {out_dir} "你好。"')
    return result

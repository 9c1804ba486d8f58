"""`kformer demo` (the README's `make demo`): train a preset for a time budget, then report BLEU and
chrF on the held-out test split and show a few of its translations."""

from kformer.evaluate import evaluate, print_scores
from kformer.model.config import DEFAULT_PRESET
from kformer.train.fit import stop_if_interrupted, train

EXAMPLES = 8


def demo(out_dir="runs/demo", config_name=DEFAULT_PRESET, minutes=20, **train_options):
    """Trains (or resumes) the run in `out_dir` for `minutes` in all, evaluates it on the test split
    with beam search and prints the speed, the scores and a few translations. `train_options` go to
    `kformer.train.fit.train` (e.g. `data`, for another corpus). Returns the evaluation result."""
    summary = train(out_dir, config_name, minutes=minutes, **train_options)
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
    result = evaluate(out_dir, split="test")
    print_scores(result)
    print("examples from the held-out test split (source / reference / kformer):")
    examples = result["examples"]
    for source, references, hypothesis in examples[:: max(1, len(examples) // EXAMPLES)][:EXAMPLES]:
        print(f"  {source}\n    ref: {references[0]}\n    out: {hypothesis}")
    print(f'translate more with: kformer translate --model {out_dir} "你好。"')
    return result

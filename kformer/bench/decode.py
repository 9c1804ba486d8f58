"""`kformer bench decode`: the cached search loop (with and without XLA) against the naive prefix
re-run, on the same sentences, each run to the same number of tokens."""

import logging
import statistics

import numpy as np

from kformer.bench.harness import Stopwatch, interleave, print_table, report
from kformer.decode import text_batches
from kformer.decode.options import search_label

log = logging.getLogger("kformer")


def _without_eos(step, eos_id):
    """Wraps a step so EOS is never chosen: every row then runs to its limit (fixed-work timing)."""
    import tensorflow as tf

    from kformer.decode.search import NEG_INF

    def wrapped(tokens, cache, index):
        logits, cache = step(tokens, cache, index)
        is_eos = tf.equal(tf.range(tf.shape(logits)[-1]), eos_id)
        return tf.where(is_eos, tf.cast(NEG_INF, logits.dtype), logits), cache

    return wrapped


def _search_function(model, beam_size, naive, jit_compile, output_tokens, eager=False):
    import tensorflow as tf

    from kformer.decode import search
    from kformer.decode.translator import SOURCE_SPEC
    from kformer.model.cache import FixedBuffers, Growing

    c = model.config

    def run(source_ids):
        lengths = search.output_limits(source_ids, c.pad_id, output_tokens)
        length, ids = lengths.buffer, search.TokenIds(c.bos_id, c.eos_id, c.pad_id)
        if naive:
            step = search.naive_step(lambda s, t: model({"source_ids": s, "target_ids": t}, training=False))
            cache = search.naive_cache(source_ids, length, c.pad_id)
        else:
            # As the translator: caches that grow, fixed buffers under XLA (kformer.decode.recipe).
            step, cache = (
                model.decode_step,
                model.init_cache(source_ids, FixedBuffers if jit_compile else Growing, length),
            )
        step = _without_eos(step, c.eos_id)
        if beam_size > 1:
            return search.beam_search(step, cache, lengths, ids, beam_size)[0]
        return search.greedy_search(step, cache, lengths, ids)[0]

    if eager:  # the same search run op by op from Python, as tutorial decoders do
        return lambda source_ids: run(tf.constant(source_ids))
    return tf.function(run, input_signature=[SOURCE_SPEC], jit_compile=jit_compile)


# name: (the naive prefix re-run, XLA, driven op by op from Python)
VARIANTS = {
    "cached": (False, False, False),
    "cached_xla": (False, True, False),
    "naive": (True, False, False),
    "naive_eager": (True, False, True),
}


def bench_decode(model_dir, batch_sizes=(1, 32), output_tokens=30, repeats=5):
    """Sentences/s and tokens/s of the cached loop (with and without XLA) and of the naive
    prefix re-run, for greedy and beam 4, on the same test sentences, each run to exactly
    `output_tokens` tokens (EOS suppressed, so every variant does the same work).

    "naive" is the prefix re-run compiled as the same graph loop (the algorithmic comparison);
    "naive_eager" is that re-run driven op by op from Python, as tutorial decoders do."""
    from kformer import run_folder
    from kformer.evaluate import split_references

    run = run_folder.load(model_dir)
    output_tokens = min(output_tokens, run.config.max_target_length)
    sources, _ = split_references(model_dir, "test")
    ids = [row[: run.config.max_source_length] for row in run.tokenizer.encode(sources) if len(row) >= 8]
    ids.sort(key=lambda row: abs(len(row) - 20))  # sentences of about 20 tokens
    rows = []
    for batch_size in batch_sizes:
        _, batch = next(text_batches.length_sorted_batches(ids[:batch_size], batch_size))
        for beam_size in (1, 4):
            functions = {
                name: _search_function(run.model, beam_size, naive, jit, output_tokens, eager)
                for name, (naive, jit, eager) in VARIANTS.items()
            }
            rows += _decode_rows(functions, batch, beam_size, run.config.pad_id, repeats)
    return {"model": model_dir, "output_tokens": output_tokens, "source_tokens": "~20", "rows": rows}


def _timings(functions, batch, repeats):
    """{variant: the median seconds of its calls on `batch`}, the calls in interleaved rounds:
    `repeats` of each, half as many of the naive re-run and one of the eager re-run (both slow)."""
    fewer = {"naive": max(1, repeats // 2), "naive_eager": 1}
    variants = {name: (fn, fewer.get(name, max(1, repeats))) for name, fn in functions.items()}

    def timed(variant, number):
        fn, calls = variant
        if number >= calls:
            return None  # its calls done: it sits out the later rounds
        with Stopwatch() as watch:
            fn(batch)
        return watch.seconds

    found = interleave(variants, max(calls for _, calls in variants.values()), timed)
    return {name: statistics.median(s for s in seconds if s is not None) for name, seconds in found.items()}


def _decode_rows(functions, batch, beam_size, pad_id, repeats):
    """A row a variant: its timing, the tokens it generated, and whether they are the naive
    re-run's (the same work, or the timings compare different work)."""
    outputs = {name: np.asarray(fn(batch)) for name, fn in functions.items()}  # also traces and compiles
    seconds = _timings(functions, batch, repeats)
    rows = []
    for name, output in outputs.items():
        best = output if beam_size == 1 else output[:, 0]  # (B, T)
        generated = int(np.sum(best != pad_id))  # every row runs to output_tokens: EOS is barred
        rows.append(
            {
                "batch": len(batch),
                "search": search_label(beam_size),
                "variant": name,
                "seconds": seconds[name],
                "generated_tokens": generated,
                "sentences_per_s": len(batch) / seconds[name],
                "tokens_per_s": generated / seconds[name],
                "same_tokens_as_naive": bool(np.array_equal(output, outputs["naive"])),
                "speedup_vs_naive": seconds["naive"] / seconds[name],
            }
        )
        log.info("batch %d %s %s: %.3fs", len(batch), rows[-1]["search"], name, seconds[name])
        if not rows[-1]["same_tokens_as_naive"]:
            log.warning(
                "batch %d %s: %s decodes other tokens than the naive re-run",
                len(batch),
                rows[-1]["search"],
                name,
            )
    return rows


def print_decode_table(results):
    columns = [
        ("batch", ">5", "batch"),
        ("search", ">7", "search"),
        ("variant", ">11", "variant"),
        ("seconds", "9.3f", "seconds"),
        ("sent/s", "9.1f", "sentences_per_s"),
        ("tokens/s", "9.0f", "tokens_per_s"),
        ("vs naive", ">9", lambda r: f"{r['speedup_vs_naive']:.1f}x"),
    ]
    print_table(
        columns,
        results["rows"],
        title=f"decode bench, {results['model']}: every row generates exactly {results['output_tokens']} tokens",
    )


HELP = "the cached search loop against re-running the prefix, in Keras"


def add_arguments(p):
    p.add_argument("--model", required=True, help="a training directory")


def main(args):
    report(bench_decode(args.model), print_decode_table, args.json)

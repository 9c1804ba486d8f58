"""`kformer bench decode`: the cached search loop (with and without XLA) against the naive prefix
re-run, on the same sentences, each run to the same number of tokens."""

import logging
import time

import numpy as np

from kformer.bench.harness import report
from kformer.decode import text_batches
from kformer.model.config import search_label

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

    c = model.config

    def run(source_ids):
        lengths = search.output_limits(source_ids, c.pad_id, output_tokens)
        length, ids = lengths.buffer, search.TokenIds(c.bos_id, c.eos_id, c.pad_id)
        if naive:
            step = search.naive_step(lambda s, t: model({"source_ids": s, "target_ids": t}, training=False))
            cache = search.naive_cache(source_ids, length, c.pad_id)
        else:
            # As the translator: caches that grow, fixed buffers under XLA (Transformer.init_cache).
            step, cache = model.decode_step, model.init_cache(source_ids, length if jit_compile else None)
        step = _without_eos(step, c.eos_id)
        if beam_size > 1:
            return search.beam_search(step, cache, lengths, ids, beam_size)[0]
        return search.greedy_search(step, cache, lengths, ids)[0]

    if eager:  # the same search run op by op from Python, as tutorial decoders do
        return lambda source_ids: run(tf.constant(source_ids))
    return tf.function(run, input_signature=[SOURCE_SPEC], jit_compile=jit_compile)


def _median_seconds(fn, batch, runs):
    """The median wall time of `runs` calls of fn(batch)."""
    import statistics

    seconds = []
    for _ in range(runs):
        start = time.perf_counter()
        fn(batch)
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def bench_decode(model_dir, batch_sizes=(1, 32), output_tokens=30, repeats=5):
    """Sentences/s and tokens/s of the cached loop (with and without XLA) and of the naive
    prefix re-run, for greedy and beam 4, on the same test sentences, each run to exactly
    `output_tokens` tokens (EOS suppressed, so every variant does the same work).

    "naive" is the prefix re-run compiled as the same graph loop (the algorithmic comparison);
    "naive_eager" is that re-run driven op by op from Python, as tutorial decoders do."""
    from kformer import run_folder
    from kformer.evaluate import split_references

    model, config, tokenizer, _ = run_folder.load(model_dir)
    output_tokens = min(output_tokens, config.max_target_length)
    sources, _ = split_references(model_dir, "test")
    ids = [row[: config.max_source_length] for row in tokenizer.encode(sources) if len(row) >= 8]
    ids.sort(key=lambda row: abs(len(row) - 20))  # sentences of about 20 tokens
    rows = []
    for batch_size in batch_sizes:
        _, batch = next(text_batches.length_sorted_batches(ids[:batch_size], batch_size))
        for beam_size in (1, 4):
            timings, outputs = {}, {}
            for name, naive, jit, eager in (
                ("cached", False, False, False),
                ("cached_xla", False, True, False),
                ("naive", True, False, False),
                ("naive_eager", True, False, True),
            ):
                fn = _search_function(model, beam_size, naive, jit, output_tokens, eager)
                outputs[name] = np.asarray(fn(batch))  # also traces and compiles
                timings[name] = _median_seconds(
                    fn, batch, 1 if eager else max(1, repeats if not naive else repeats // 2)
                )
                best = outputs[name] if beam_size == 1 else outputs[name][:, 0]  # (B, T)
                generated = int(
                    np.sum(best != config.pad_id)
                )  # every row runs to output_tokens: EOS is barred
                rows.append(
                    {
                        "batch": batch_size,
                        "search": search_label(beam_size),
                        "variant": name,
                        "seconds": timings[name],
                        "generated_tokens": generated,
                        "sentences_per_s": batch_size / timings[name],
                        "tokens_per_s": generated / timings[name],
                    }
                )
                log.info("batch %d %s %s: %.3fs", batch_size, rows[-1]["search"], name, timings[name])
            for row in rows[-4:]:  # the same tokens from every variant, or the timings compare different work
                row["same_tokens_as_naive"] = bool(np.array_equal(outputs[row["variant"]], outputs["naive"]))
                row["speedup_vs_naive"] = timings["naive"] / row["seconds"]
                if not row["same_tokens_as_naive"]:
                    log.warning(
                        "batch %d %s: %s decodes other tokens than the naive re-run",
                        batch_size,
                        row["search"],
                        row["variant"],
                    )
    return {"model": model_dir, "output_tokens": output_tokens, "source_tokens": "~20", "rows": rows}


def print_decode_table(results):
    print(f"decode bench, {results['model']}: every row generates exactly {results['output_tokens']} tokens")
    print(
        f"{'batch':>5} {'search':>7} {'variant':>11} {'seconds':>9} {'sent/s':>9} {'tokens/s':>9} {'vs naive':>9}"
    )
    for r in results["rows"]:
        print(
            f"{r['batch']:>5} {r['search']:>7} {r['variant']:>11} {r['seconds']:9.3f} "
            f"{r['sentences_per_s']:9.1f} {r['tokens_per_s']:9.0f} {r['speedup_vs_naive']:8.1f}x"
        )


HELP = "the cached search loop against re-running the prefix, in Keras"


def add_arguments(p):
    p.add_argument("--model", required=True, help="a training directory")


def main(args):
    report(bench_decode(args.model), print_decode_table, args.json)

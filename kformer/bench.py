"""Benchmarks (not tests): ratios measured in one run on the same inputs; never an absolute bar."""

import glob
import logging
import os
import tempfile
import time

from kformer import batching

log = logging.getLogger("kformer")

XLA_DUMP_ENV = "KFORMER_XLA_DUMP"


def xla_dump_flags(directory):
    """XLA_FLAGS that make XLA write one file per compiled train step (set before TensorFlow starts)."""
    return f"--xla_dump_to={directory} --xla_dump_hlo_as_text"


def count_xla_compilations(directory, function="one_step_on_data"):
    """Number of XLA compilations of Keras' train step recorded in an XLA dump folder."""
    return len(glob.glob(os.path.join(directory, f"*{function}*before_optimizations.txt")))


def _fixed_batches(config_name, count, seed):
    """`count` training batches of the default corpus (all bucket shapes mixed), and the config."""
    from kformer import data as data_lib
    from kformer.train import prepare

    with tempfile.TemporaryDirectory() as work:
        config, tokenizer, splits = prepare(work, config_name)
    encoded = data_lib.encode_pairs(tokenizer, splits["train"], config)
    dataset = data_lib.make_dataset(encoded, config, training=True, seed=seed)
    batches = [(dict((k, v.numpy()) for k, v in x.items()), y.numpy()) for x, y in dataset.take(count)]
    return config, batches


def bench_train(config_name="small", steps=30, seed=0, mixed_precision=False):
    """Steps/s and target tokens/s of `train_on_batch` with and without XLA on the same batches.

    Every distinct batch shape is run once before timing, so compilation is not timed.
    """
    import keras

    from kformer.model import Transformer
    from kformer.train import compile_model

    config, batches = _fixed_batches(config_name, steps, seed)
    shapes = sorted({x["target_ids"].shape for x, _ in batches})
    tokens = sum(int((y != config.pad_id).sum()) for _, y in batches)
    results = {"config": config_name, "steps": steps, "distinct_batch_shapes": len(shapes),
               "target_tokens": tokens}
    for xla in (False, True):
        keras.utils.set_random_seed(seed)
        dtype = "mixed_float16" if mixed_precision else None
        model = compile_model(Transformer(config, dtype=dtype), config, xla=xla)
        warm = {x["target_ids"].shape: (x, y) for x, y in batches}
        start = time.perf_counter()
        for x, y in warm.values():
            model.train_on_batch(x, y)
        warmup = time.perf_counter() - start
        start = time.perf_counter()
        for x, y in batches:
            model.train_on_batch(x, y)
        seconds = time.perf_counter() - start
        name = "xla" if xla else "no_xla"
        results[name] = {"steps_per_s": steps / seconds, "target_tokens_per_s": tokens / seconds,
                         "warmup_s": warmup}
        log.info("%s: %.2f steps/s, %.0f target tokens/s (warm-up with compilation %.1fs)",
                 name, steps / seconds, tokens / seconds, warmup)
    results["xla_speedup"] = results["xla"]["steps_per_s"] / results["no_xla"]["steps_per_s"]
    dump = os.environ.get(XLA_DUMP_ENV)
    if dump:
        results["xla_compilations"] = count_xla_compilations(dump)
    return results


def _without_eos(step, eos_id):
    """Wraps a step so EOS is never chosen: every row then runs to its limit (fixed-work timing)."""
    import tensorflow as tf

    def wrapped(tokens, cache, index):
        logits, cache = step(tokens, cache, index)
        is_eos = tf.equal(tf.range(tf.shape(logits)[-1]), eos_id)
        return tf.where(is_eos, tf.cast(-1e9, logits.dtype), logits), cache
    return wrapped


def _search_function(model, beam_size, naive, jit_compile, output_tokens, eager=False):
    import tensorflow as tf

    from kformer import search
    from kformer.translate import SOURCE_SPEC

    c = model.config

    def run(source_ids):
        limits, length = search.output_limits(source_ids, c.pad_id, output_tokens)
        if naive:
            step = search.naive_step(lambda s, t: model({"source_ids": s, "target_ids": t}, training=False))
            cache = search.naive_cache(source_ids, length, c.pad_id)
        else:
            step, cache = model.decode_step, model.init_cache(source_ids, length)
        step = _without_eos(step, c.eos_id)
        if beam_size > 1:
            return search.beam_search(step, cache, limits, length, beam_size, c.bos_id, c.eos_id)[0]
        return search.greedy_search(step, cache, limits, length, c.bos_id, c.eos_id)[0]

    if eager:  # the same search run op by op from Python, as tutorial decoders do
        return lambda source_ids: run(tf.constant(source_ids))
    return tf.function(run, input_signature=[SOURCE_SPEC], jit_compile=jit_compile)


def bench_decode(model_dir, batch_sizes=(1, 32), output_tokens=30, repeats=5):
    """Sentences/s and tokens/s of the cached loop (with and without XLA) and of the naive
    prefix re-run, for greedy and beam 4, on the same test sentences, each run to exactly
    `output_tokens` tokens (EOS suppressed, so every variant does the same work).

    "naive" is the prefix re-run compiled as the same graph loop (the algorithmic comparison);
    "naive_eager" is that re-run driven op by op from Python, as tutorial decoders do."""
    import statistics

    from kformer.evaluate import split_references
    from kformer.train import load_model

    model, config, tokenizer = load_model(model_dir)
    output_tokens = min(output_tokens, config.max_target_length)
    sources, _ = split_references(model_dir, "test")
    ids = [row[: config.max_source_length] for row in tokenizer.encode(sources) if len(row) >= 8]
    ids.sort(key=lambda row: abs(len(row) - 20))  # sentences of about 20 tokens
    rows = []
    for batch_size in batch_sizes:
        _, batch = next(batching.length_sorted_batches(ids[:batch_size], batch_size))
        for beam_size in (1, 4):
            timings = {}
            for name, naive, jit, eager in (("cached", False, False, False), ("cached_xla", False, True, False),
                                            ("naive", True, False, False), ("naive_eager", True, False, True)):
                fn = _search_function(model, beam_size, naive, jit, output_tokens, eager)
                tokens = fn(batch)  # trace and compile
                assert tokens.shape[-1] == output_tokens
                runs = 1 if eager else max(1, repeats if not naive else repeats // 2)
                seconds = []
                for _ in range(runs):
                    start = time.perf_counter()
                    fn(batch)
                    seconds.append(time.perf_counter() - start)
                timings[name] = statistics.median(seconds)
                rows.append({"batch": batch_size, "search": "greedy" if beam_size == 1 else f"beam{beam_size}",
                             "variant": name, "seconds": timings[name],
                             "sentences_per_s": batch_size / timings[name],
                             "tokens_per_s": batch_size * output_tokens / timings[name]})
                log.info("batch %d %s %s: %.3fs", batch_size, rows[-1]["search"], name, timings[name])
            for row in rows[-4:]:
                row["speedup_vs_naive"] = timings["naive"] / row["seconds"]
    return {"model": model_dir, "output_tokens": output_tokens, "source_tokens": "~20", "rows": rows}

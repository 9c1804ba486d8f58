"""Benchmarks (not tests): ratios measured in one run on the same inputs; never an absolute bar."""

import glob
import logging
import os
import tempfile
import time

import numpy as np

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

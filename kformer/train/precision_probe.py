"""`--precision auto` on a CPU that multiplies bfloat16: which precision trains this model faster on
this machine, measured (a few interleaved steps of each) and remembered per CPU and model shape.

A CPU's bfloat16 instructions do not make its bfloat16 step the faster one: the casts around every
product, the float32 parts of the step and oneDNN's kernels for the shapes at hand decide, and they
differ by CPU class and by model size. So `auto` times both instead of guessing from flags.
"""

import json
import logging
import os
import statistics
import time

from kformer.contracts.json_records import write_json
from kformer.train.precision import cpu_model, usable_cores

log = logging.getLogger("kformer")

CACHE_ENV = "KFORMER_CACHE"  # a folder; default $XDG_CACHE_HOME/kformer, else ~/.cache/kformer
CACHE_FILE = "precision.json"
WARMUP_STEPS = 2  # untimed steps of each candidate: tracing, oneDNN's kernel choice
ROUND_STEPS = 3  # timed steps of each candidate a round
ROUNDS = 3  # the candidates take turns, in an order that rotates; medians decide


def cache_path():
    root = os.environ.get(CACHE_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "kformer"
    )
    return os.path.join(root, CACHE_FILE)


def probe_key(config, shape):
    """What the faster precision depends on: the CPU, the cores this process may use, TensorFlow's
    version, the model's sizes and the batch shape (`shape`: (rows, source length, target length))."""
    import tensorflow as tf

    model = (
        f"d_model {config.d_model}, d_ff {config.d_ff}, layers {config.num_encoder_layers}+"
        f"{config.num_decoder_layers}, heads {config.num_heads}, vocab {config.vocab_size}"
    )
    return f"{cpu_model()}; {usable_cores()} cores; tensorflow {tf.__version__}; {model}; batch {shape}"


def measurement(config, shape, compiled):
    """`choose_precision`'s `measure` for a model of `config` trained on batches of `shape`
    ((rows, source length, target length)); `compiled(precision)`: a compiled model to train."""
    from kformer.data.batches import random_batch

    def measure(candidates):
        key = probe_key(config, shape)
        return faster_precision(candidates, compiled, random_batch(config, shape), key)

    return measure


def mean_batch_shape(batch_tokens, source, target, counts):
    """(rows, source length, target length) of a batch of a corpus' mean lengths (`source`,
    `target`: the pairs' lengths, `counts`: pairs of each; the target gains its BOS or EOS), as
    many rows as `batch_tokens` holds."""
    pairs = counts.sum()
    source_length = max(1, round(float((source * counts).sum() / pairs)))
    target_length = round(float((target * counts).sum() / pairs)) + 1
    return max(1, batch_tokens // max(source_length, target_length)), source_length, target_length


def faster_precision(candidates, compiled, batch, key, measure=None):
    """-> (precision, why): the candidate whose training step measured faster, from the cache when
    `key` is in it, else measured now and cached. `compiled(precision)`: a compiled model to train;
    `batch`: one (x, y) training batch; `measure`: `time_steps`'s stand-in (tests)."""
    cached = _read_cache().get(key)
    if cached and set(cached["steps_per_s"]) == set(candidates):
        return cached["precision"], _why(cached, "measured before, cached in " + cache_path())
    log.info("--precision auto: timing %s steps (once per CPU and model)", " and ".join(candidates))
    rates = (measure or time_steps)({p: compiled(p) for p in candidates}, batch)
    choice = {"precision": max(rates, key=rates.get), "steps_per_s": rates}
    where = _write_cache(key, choice)
    return choice["precision"], _why(choice, "measured now" + (f", cached in {where}" if where else ""))


def _why(choice, when):
    rates = ", ".join(f"{p} {r:.2f} steps/s" for p, r in choice["steps_per_s"].items())
    return f"auto: the faster on this CPU ({rates}; {when})"


def time_steps(models, batch, rounds=ROUNDS):
    """{precision: median training steps/s}: each model trains on `batch`, WARMUP_STEPS untimed,
    then ROUND_STEPS at a time, the models taking turns in an order that rotates, `rounds` times,
    so that a change in the machine's speed hits all alike."""
    x, y = batch
    for model in models.values():
        for _ in range(WARMUP_STEPS):
            model.train_on_batch(x, y)
    names, seconds = list(models), {name: [] for name in models}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start = time.perf_counter()
            for _ in range(ROUND_STEPS):
                models[name].train_on_batch(x, y)
            seconds[name].append(time.perf_counter() - start)
    return {name: ROUND_STEPS / statistics.median(s) for name, s in seconds.items()}


def _read_cache():
    """The cache's choices; {} when it is missing or unreadable (it is then measured again)."""
    try:
        with open(cache_path()) as f:
            cached = json.load(f)
        return cached if isinstance(cached, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_cache(key, choice):
    """Adds `choice` under `key`, written whole or not at all; -> the file, or None where it cannot
    be written (the choice then holds for this run only)."""
    path = cache_path()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_json(path, {**_read_cache(), key: choice})
        return path
    except OSError as error:
        log.warning("could not cache the precision choice in %s: %s", path, error)
        return None

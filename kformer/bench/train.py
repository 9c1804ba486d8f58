"""`kformer bench train`: kformer's training step against the same-size keras-hub model, with and
without XLA, per precision, on the same batches interleaved."""

import argparse
import atexit
import dataclasses
import functools
import glob
import logging
import os
import shutil
import statistics
import tempfile

from kformer import extras
from kformer.arguments import add_precision_option, add_rounds_option, positive
from kformer.bench import peak, profile
from kformer.bench.harness import Stopwatch, interleave, memory_mb, print_table, reduced, report, spread
from kformer.model import flops
from kformer.model.config import DEFAULT_PRESET, PRESETS, preset
from kformer.train.precision import (
    PRECISIONS,
    choose_precision,
    gpu_capability,
    onednn_state,
    usable_cores,
)

log = logging.getLogger("kformer")

XLA_DUMP_ENV = "KFORMER_XLA_DUMP"
CHUNK = 5  # batches a variant trains on before the next takes its turn


def xla_dump_flags(directory):
    """XLA_FLAGS that make XLA write one file per compiled train step (set before TensorFlow starts)."""
    return f"--xla_dump_to={directory} --xla_dump_hlo_as_text"


def count_xla_compilations_from_here():
    """Makes XLA dump what it compiles from now on, so `bench_train` can count its compilations.
    XLA reads its flags once, when TensorFlow starts: call this before importing it."""
    dump = tempfile.mkdtemp(prefix="kformer-xla-")
    atexit.register(shutil.rmtree, dump, ignore_errors=True)  # the HLO text is large
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + xla_dump_flags(dump)).strip()
    os.environ[XLA_DUMP_ENV] = dump


def count_xla_compilations(directory, function="one_step_on_data"):
    """Number of XLA compilations of Keras' train step recorded in an XLA dump folder."""
    return len(glob.glob(os.path.join(directory, f"*{function}*before_optimizations.txt")))


def _fixed_batches(bench, batch_tokens):
    """The bench's `steps` training batches of `batch_tokens` of the default corpus (all bucket
    shapes mixed), twice: as training without XLA batches them (grouped by both lengths, padded to
    the longest row) and with XLA (padded to the bucket)."""
    from kformer.contracts.prepared import PreparedCorpus
    from kformer.data import batches as batches_lib
    from kformer.data import shards as shards_lib
    from kformer.train.options import TrainOptions
    from kformer.train.run_data import run_data

    with tempfile.TemporaryDirectory() as work:  # the corpus is prepared beside the run folder, in here
        config, _, _, folder, _ = run_data(os.path.join(work, "run"), TrainOptions(bench.config_name))
        batching, manifest = batches_lib.Batching.of(config, batch_tokens), PreparedCorpus.load(folder)
        encoded = shards_lib.read_prepared(manifest.shard_paths(folder), manifest.train.dtype, batching)

    def batches(pad_to_bucket):
        dataset = batches_lib.make_dataset(
            encoded, batching, training=True, seed=bench.seed, pad_to_bucket=pad_to_bucket
        )
        return [(dict((k, v.numpy()) for k, v in x.items()), y.numpy()) for x, y in dataset.take(bench.steps)]

    return config, batches(False), batches(True)


def _one_shape_batches(bench, batch_tokens):
    """The bench's `steps` batches of one shape, `length` tokens a side and the rows that
    `batch_tokens` holds, of random ids, no padding: a step's speed with a single compilation per
    variant (a GPU's XLA compiles each bucket shape for ~100 s with `base`)."""
    import numpy as np

    from kformer.data.batches import random_batch

    config, length = preset(bench.config_name), bench.length
    longest = min(config.max_source_length, config.max_target_length)
    if not 0 < length <= longest:
        raise ValueError(f"--length {length}: choose 1..{longest}")
    rng = np.random.default_rng(bench.seed)
    batches = [
        random_batch(config, (max(1, batch_tokens // length), length, length), rng)
        for _ in range(bench.steps)
    ]
    return config, batches, batches


def reference_model(config, dtype=None):
    """The same-size model built from keras-hub layers (post-LN TransformerEncoder/Decoder, a tied
    ReversibleEmbedding scaled by sqrt(d_model), sine positions): the yardstick of `bench train`.
    `dtype`: a Keras dtype policy (e.g. "mixed_bfloat16"), as kformer's model takes it."""
    import keras
    import keras_hub
    from keras import ops

    inputs = {name: keras.Input((None,), dtype="int32", name=name) for name in ("source_ids", "target_ids")}
    embedding = keras_hub.layers.ReversibleEmbedding(
        config.vocab_size, config.d_model, dtype=dtype, name="embedding"
    )
    positions = keras_hub.layers.SinePositionEncoding(dtype=dtype)
    dropout = keras.layers.Dropout(config.dropout, dtype=dtype)
    layer_args = dict(
        intermediate_dim=config.d_ff,
        num_heads=config.num_heads,
        dropout=config.dropout,
        dtype=dtype,
        activation=config.activation,
        layer_norm_epsilon=1e-6,
        normalize_first=config.norm_position == "pre",
    )

    def embed(ids):
        x = embedding(ids) * config.d_model**0.5
        return dropout(x + positions(x))

    source_mask = ops.not_equal(inputs["source_ids"], config.pad_id)
    x = embed(inputs["source_ids"])
    for i in range(config.num_encoder_layers):
        x = keras_hub.layers.TransformerEncoder(**layer_args, name=f"transformer_encoder_{i}")(
            x, padding_mask=source_mask
        )
    y = embed(inputs["target_ids"])
    for i in range(config.num_decoder_layers):
        y = keras_hub.layers.TransformerDecoder(**layer_args, name=f"transformer_decoder_{i}")(
            y,
            x,
            decoder_padding_mask=ops.not_equal(inputs["target_ids"], config.pad_id),
            encoder_padding_mask=source_mask,
        )
    return keras.Model(inputs, embedding(y, reverse=True), name="keras_hub_reference")


@dataclasses.dataclass(frozen=True)
class TrainBench:
    """What `bench_train` measures (see it for each option)."""

    config_name: str = DEFAULT_PRESET
    steps: int = 30
    seed: int = 0
    precision: str = "auto"
    rounds: int = 5
    recipe_changes: dict | None = None  # changes to the preset's TrainingRecipe (kformer.train.recipe)
    reference: bool = True
    length: int | None = None
    profile: str | None = None
    steps_per_call: int = 1
    variants: list[str] | None = None


@dataclasses.dataclass(frozen=True)
class Variant:
    """One way of training that the bench times: the model (`kind`: "kformer" or "keras_hub"), its
    precision, with XLA or not, on batches padded to their bucket or to their longest row, and the
    steps a call of Keras' train function runs."""

    kind: str
    precision: str
    xla: bool = False
    padded: bool = False
    steps_per_call: int = 1


def bench_train(config_name=DEFAULT_PRESET, **options):
    """Target tokens/s and model FLOPs utilization of training through `model.fit`, on the same
    batches, the variants taking turns a few batches at a time, `rounds` times (medians): kformer as it
    trains (`precision`; "auto" here: bfloat16 where the CPU multiplies it, where `kformer train`
    measures which of the two is faster, as this bench shows) without XLA (batches padded to their
    longest row) and with XLA (padded to the bucket, so shapes are bounded); with `reference`, the
    same-size keras-hub model (padded to the longest row) as a Keras user trains it: float32,
    keras.optimizers.Adam with the same settings and moving average; kformer's loss and metric.
    When the precision is not float32, kformer in float32 (and keras-hub in that precision) run too.

    Utilization: the analytic training FLOPs of the batches' real tokens (kformer.model.flops) per
    second, over the device's peak: a GPU's datasheet figure for the precision where known, and
    in every case the matrix-product speed measured here in the same run, on large squares and on
    the model's own product shapes.

    Every distinct batch shape is trained on once before timing, so compilation is not timed: it
    is reported as warm-up seconds (XLA compiles once per bucket shape). `length`: instead of the
    default corpus' batches, batches of one shape (`_one_shape_batches`). `profile`: a folder; each
    kformer variant then also runs its batches once under TensorFlow's profiler, its trace in
    `profile/VARIANT`, and the results say which op types took the time (kformer.bench.profile).
    `steps_per_call` > 1 adds kformer_xla_N: XLA with N steps a call of Keras' train function
    (steps_per_execution) instead of one, whose result the host waits for before the next call; the
    variants then take turns every N steps. `variants`: the names of those to run (default: all).
    """
    from kformer.train.recipe import recipe

    bench = TrainBench(config_name, **options)
    if bench.reference:
        extras.require("keras_hub", "kformer bench train")  # its reference model; before any work
    precision, why = choose_precision(bench.precision)
    runs = _chosen(_runs(bench, precision), bench.variants)  # chosen before any work
    training = recipe(bench.config_name, **(bench.recipe_changes or {}))
    batches = _one_shape_batches if bench.length else _fixed_batches
    config, dynamic, bucketed = batches(bench, training.batch_tokens)
    chunk = -(-CHUNK // bench.steps_per_call) * bench.steps_per_call  # whole calls of every variant
    variants = {
        name: _compiled(config, training, bench.seed, chunk, run, bucketed if run.padded else dynamic)
        for name, run in runs.items()
    }
    peaks = _timed_between_peaks(variants, bench.rounds, config, precision, dynamic)
    results = _results(bench, variants, (dynamic, bucketed), chunk, (precision, why), peaks)
    _add_speeds(results, variants, bench.steps, precision)
    if bench.profile:
        results["profile"] = _profiles(variants, bench.steps, bench.profile)
    if dump := os.environ.get(XLA_DUMP_ENV):
        results["xla_compilations"] = count_xla_compilations(dump)
    return results


def _runs(bench, precision):
    """The variants a bench times, by name."""
    runs = {
        "kformer": Variant("kformer", precision),
        "kformer_xla": Variant("kformer", precision, xla=True, padded=True),
    }
    if bench.steps_per_call > 1:
        runs[f"kformer_xla_{bench.steps_per_call}"] = Variant(
            "kformer", precision, True, True, bench.steps_per_call
        )
    if bench.reference:
        runs["keras_hub"] = Variant("keras_hub", "float32")
    if precision != "float32":
        runs["kformer_float32"] = Variant("kformer", "float32")
        if bench.reference:
            runs[f"keras_hub_{precision}"] = Variant("keras_hub", precision)
    return runs


def _results(bench, variants, batches, chunk, precision, peaks):
    """The results' settings and what every variant shares (`batches`: (dynamic, bucketed);
    `precision`: (chosen, why))."""
    dynamic, bucketed = batches
    first = next(iter(variants.values()))
    return {
        "config": bench.config_name,
        "batches": f"one shape, {bench.length} tokens a side" if bench.length else "the default corpus",
        "steps": bench.steps,
        "chunk": chunk,
        "steps_per_call": bench.steps_per_call,
        "rounds": bench.rounds,
        "target_tokens": first["target"],
        "real_tokens": first["real"],
        "pairs_per_step": sum(len(y) for _, y in dynamic) / bench.steps,
        "precision": precision[0],
        "precision_why": precision[1],
        "variants": list(variants),
        "distinct_bucket_shapes": len({y.shape for _, y in bucketed}),
        "onednn": onednn_state(),
        "cores": usable_cores(),
        "peaks": peaks,
        "peak_memory_mb": _peak_memory_mb(),
    }


def _chosen(runs, names):
    """The runs named in `names` (all when None), in their order; an unknown name is an error."""
    if names is None:
        return runs
    unknown = [n for n in names if n not in runs]
    if unknown or not names:
        raise ValueError(f"--variants {','.join(names)}: choose from {', '.join(runs)}")
    return {name: runs[name] for name in runs if name in names}


def _profiles(variants, steps, directory):
    """{variant: its op types by self-time (kformer.bench.profile.op_types)} for kformer's variants,
    each profiled over its batches once more, after the timing. On a CPU the XLA variant is left
    out: its compiled step is one op to the profiler (on a GPU its kernels are listed)."""
    gpu = gpu_capability() is not None
    found = {}
    for name in (n for n, v in variants.items() if v["kind"] == "kformer" and (gpu or not v["xla"])):
        folder = os.path.join(directory, name)
        found[name] = {
            "trace": folder,
            "ops": profile.op_types(
                profile.profile_fit(variants[name]["model"], variants[name]["chunks"], folder), steps
            ),
        }
    return found


def _timed_between_peaks(variants, rounds, config, precision, batches):
    """Times the variants (`_time_interleaved`) between two measurements of the peaks of
    `precision` and float32 (`_peaks`); returns {precision: the faster of the two of each rate
    (datasheet and device as measured first)}. The machine's speed can drop for seconds at a time,
    and the peak is what the hardware can do."""
    precisions = dict.fromkeys((precision, "float32"))
    before = {p: _peaks(config, p, batches) for p in precisions}
    _time_interleaved(variants, rounds)
    rates = ("squares", "own_shapes")
    return {p: reduced([before[p], _peaks(config, p, batches)], peaks=rates) for p in precisions}


def _peaks(config, precision, batches):
    """{"device", "datasheet", "squares", "own_shapes"}: FLOP/s of `precision` a step's utilization
    is taken against (datasheet None on a CPU or an unlisted GPU). Own shapes: a batch of the
    batches' mean tokens a side."""
    gpu = (gpu_capability() or (None,))[0]
    side = 8192 if gpu else 2048  # large enough to reach the device's peak, small enough to be quick
    tokens = round(sum(y.size for _, y in batches) / len(batches))
    return {
        "device": gpu or "CPU",
        "datasheet": peak.datasheet_peak(gpu, precision) if gpu else None,
        "squares": peak.matmul_rate((side, side, side), precision),
        "own_shapes": peak.own_shapes_rate(flops.product_shapes(config, tokens), precision),
    }


def _peak_memory_mb():
    """Peak memory of this process: the GPU's allocator peak where there is one, else resident."""
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU"):
        return tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20
    return memory_mb("VmHWM")


def _compiled(config, training, seed, chunk, run, batches):
    """A compiled model of `run` (a Variant), of `config`, to train as `training` (a TrainingRecipe)
    says, trained through `fit` once on every distinct batch shape of `batches` (the warm-up:
    tracing and compiling), with its batches as datasets of `chunk` batches each, and their token
    and FLOP counts."""
    import keras

    from kformer.model.transformer import Transformer
    from kformer.train.fit import compile_model

    keras.utils.set_random_seed(seed)
    dtype = PRECISIONS[run.precision]
    model = Transformer(config, dtype=dtype) if run.kind == "kformer" else reference_model(config, dtype)
    model = compile_model(
        model, config, training, xla=run.xla, fused=run.kind == "kformer", steps_per_call=run.steps_per_call
    )
    with Stopwatch() as warmup:
        shapes = {(x["source_ids"].shape, y.shape): (x, y) for x, y in batches}
        model.fit(_dataset(list(shapes.values())), shuffle=False, verbose=0)
    pad = config.pad_id
    target = sum(int((y != pad).sum()) for _, y in batches)
    real = target + sum(int((x["source_ids"] != pad).sum()) for x, _ in batches)
    return {
        "model": model,
        "chunks": [_dataset(batches[i : i + chunk]) for i in range(0, len(batches), chunk)],
        "warmup_s": warmup.seconds,
        "target": target,
        "real": real,
        "padding": 1 - real / sum(x["source_ids"].size + y.size for x, y in batches),
        "flops": sum(
            flops.batch_training_flops(config, x["source_ids"], x["target_ids"]) for x, _ in batches
        ),
        "parameters": model.count_params(),
        "precision": run.precision,
        "kind": run.kind,
        "xla": run.xla,
        "steps_per_call": model.steps_per_execution,
    }


def _dataset(batches):
    """The (x, y) batches as one tf.data pipeline, in order, shapes as they are."""
    import tensorflow as tf

    return functools.reduce(tf.data.Dataset.concatenate, map(tf.data.Dataset.from_tensors, batches))


def _time_interleaved(variants, rounds):
    """Sets every variant's "seconds" (one sum a round) and "cpu_seconds" (the process's, all its
    threads, over its chunks): `fit` over a chunk of batches at a time, the variants taking turns
    chunk by chunk (harness.interleave), every chunk once a round."""
    chunks = len(next(iter(variants.values()))["chunks"])

    def fit(variant, turn):
        with Stopwatch() as watch:
            variant["model"].fit(variant["chunks"][turn % chunks], shuffle=False, verbose=0)
        return watch

    for name, watches in interleave(variants, rounds * chunks, fit).items():
        seconds = [watch.seconds for watch in watches]
        variants[name]["seconds"] = [sum(seconds[i : i + chunks]) for i in range(0, len(seconds), chunks)]
        variants[name]["cpu_seconds"] = sum(watch.cpu_seconds for watch in watches)


def _add_speeds(results, variants, steps, precision):
    """Each variant's median speed and utilization, and the ratios between them, into `results`:
    each the medians' ratio, with (lowest, highest) of the rounds' ratios."""
    for name, v in variants.items():
        r = results[name] = _speed(v, steps, results["peaks"][v["precision"]])
        log.info("%s: %.2f steps/s, %.0f target tokens/s", name, r["steps_per_s"], r["target_tokens_per_s"])
    ratios = {  # name: (variant, over variant), each where both ran
        "xla_speedup": ("kformer_xla", "kformer"),
        "vs_keras_hub": ("kformer", "keras_hub"),  # each as it trains by default
        "vs_keras_hub_same_precision": (
            "kformer",
            "keras_hub" if precision == "float32" else f"keras_hub_{precision}",
        ),
        "vs_keras_hub_float32": ("kformer_float32", "keras_hub"),
        "precision_speedup": ("kformer", "kformer_float32"),
        "steps_per_call_speedup": (f"kformer_xla_{results['steps_per_call']}", "kformer_xla"),
    }
    for name, (a, b) in ratios.items():
        if a in variants and b in variants:
            results[name] = results[a]["target_tokens_per_s"] / results[b]["target_tokens_per_s"]
            results[f"{name}_rounds"] = spread(
                results[a]["rounds_tokens_per_s"], results[b]["rounds_tokens_per_s"]
            )[1:]


def _speed(v, steps, peaks):
    """A variant's median speed and utilization over `peaks` (of its precision)."""
    seconds = statistics.median(v["seconds"])
    achieved = v["flops"] / seconds
    return {
        "steps_per_s": steps / seconds,
        "target_tokens_per_s": v["target"] / seconds,
        "rounds_tokens_per_s": [v["target"] / s for s in v["seconds"]],  # target tokens/s in each round
        "real_tokens_per_s": v["real"] / seconds,
        "tflops": achieved / 1e12,
        **{f"mfu_{k}": achieved / peaks[k] for k in ("datasheet", "squares", "own_shapes") if peaks[k]},
        # how many cores the step keeps busy: ops that run one after another on one thread
        # leave the others idle, whatever the thread settings
        "cores_busy": v["cpu_seconds"] / sum(v["seconds"]),
        **{k: v[k] for k in ("precision", "padding", "warmup_s", "parameters", "steps_per_call")},
    }


def _ratio(results, name):
    """A ratio as the table prints it: the medians' ratio, then the range of the rounds' ratios."""
    low, high = results[f"{name}_rounds"]
    return f"{results[name]:.2f}x (rounds {low:.2f}-{high:.2f})"


def print_train_table(results):
    print(
        f"train bench, config {results['config']}: {results['steps']} batches of {results['batches']} ("
        f"{results['pairs_per_step']:.0f} "
        f"pairs each, {results['target_tokens']} target tokens) through fit, variants taking turns every "
        f"{results['chunk']} batches, median of {results['rounds']} rounds; oneDNN CPU kernels {results['onednn']}; "
        f"kformer's precision {results['precision']} ({results['precision_why']})"
    )
    for precision, p in results["peaks"].items():
        datasheet = f"datasheet {p['datasheet'] / 1e12:.1f}, " if p["datasheet"] else ""
        print(
            f"peak TFLOP/s on {p['device']}, {precision}: {datasheet}matmul squares {p['squares'] / 1e12:.3f}, "
            f"the model's product shapes {p['own_shapes'] / 1e12:.3f} (measured in this run)"
        )
    _print_train_variants(results)
    _print_train_ratios(results)
    for name, found in results.get("profile", {}).items():
        print(
            f"where {name}'s step goes (TensorFlow's profiler, trace in {found['trace']}): ms a step, share"
        )
        for op in found["ops"]:
            label = "idle threads (share of all thread-time)" if op["type"] == "IDLE" else op["type"]
            print(f"  {op['where']:6} {label:40} {op['ms_per_step']:8.2f} {op['share']:6.1%}")


def _print_train_variants(results):
    datasheet = any(p["datasheet"] for p in results["peaks"].values())  # a GPU in the table
    mfu = ("MFU datasheet", ">13", lambda r: f"{r['mfu_datasheet']:.1%}" if "mfu_datasheet" in r else "")
    columns = [
        ("", "<18", "name"),
        ("precision", ">9", "precision"),
        ("steps/s", "8.2f", "steps_per_s"),
        ("target tok/s", "13.0f", "target_tokens_per_s"),
        ("TFLOP/s", "8.3f", "tflops"),
        *([mfu] if datasheet else []),
        ("MFU squares", "11.1%", "mfu_squares"),
        ("MFU shapes", "10.1%", "mfu_own_shapes"),
        ("padding", "8.0%", "padding"),
        ("warm-up s", "10.1f", "warmup_s"),
        ("parameters", "11,", "parameters"),
        (f"cores busy of {results['cores']}", "16.2f", "cores_busy"),
    ]
    print_table(columns, [{"name": name, **results[name]} for name in results["variants"]])


def _print_train_ratios(results):
    precision = results["precision"]
    if "vs_keras_hub" in results:
        print(
            f"kformer ({precision}) vs keras-hub (float32), target tokens/s: {_ratio(results, 'vs_keras_hub')}"
        )
    if "precision_speedup" in results:
        same = (
            f"same precision: {precision} {_ratio(results, 'vs_keras_hub_same_precision')}, float32 "
            f"{_ratio(results, 'vs_keras_hub_float32')}; "
            if "vs_keras_hub_float32" in results
            else ""
        )
        print(f"{same}kformer {precision} vs float32: {_ratio(results, 'precision_speedup')}")
    if "steps_per_call_speedup" in results:
        print(
            f"XLA, {results['steps_per_call']} steps a call vs one: {_ratio(results, 'steps_per_call_speedup')}"
        )
    xla = f"XLA vs no XLA: {_ratio(results, 'xla_speedup')}; " if "xla_speedup" in results else ""
    print(
        f"{xla}XLA compilations of the train step: "
        f"{results.get('xla_compilations', 'not counted')} (bucket shapes: {results['distinct_bucket_shapes']}); "
        f"peak memory {results['peak_memory_mb']:.0f} MB"
    )


HELP = "kformer's training step against a same-size keras-hub model, with MFU"


def add_arguments(p):
    p.add_argument("--config", default=DEFAULT_PRESET, choices=sorted(PRESETS))
    p.add_argument("--steps", type=positive(int), default=30)
    add_rounds_option(p, default=TrainBench.rounds)
    add_precision_option(p)
    p.add_argument(
        "--reference",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time the same-size keras-hub model (needs the bench extra)",
    )
    p.add_argument(
        "--length",
        type=positive(int),
        help="batches of one shape, this many tokens a side, of random ids, instead of the default "
        "corpus' batches: one compilation a variant (on a GPU XLA compiles each of the corpus' bucket "
        "shapes, minutes each for base)",
    )
    p.add_argument(
        "--profile",
        help="also run kformer's variants under TensorFlow's profiler, a trace each in this folder "
        "(TensorBoard's Profile tab reads them), and print the op types that took the time",
    )
    p.add_argument(
        "--steps-per-call",
        type=positive(int),
        default=1,
        help="also time XLA with this many steps a call of Keras' train function "
        "(Keras' steps_per_execution: one return to Python a call instead of one a step)",
    )
    p.add_argument(
        "--variants",
        type=lambda s: [v for v in s.split(",") if v],
        help="time only these variants, comma-separated (names as in the table)",
    )


def main(args):
    count_xla_compilations_from_here()  # before TensorFlow starts
    report(
        bench_train(
            args.config,
            steps=args.steps,
            precision=args.precision,
            rounds=args.rounds,
            reference=args.reference,
            length=args.length,
            profile=args.profile,
            steps_per_call=args.steps_per_call,
            variants=args.variants,
        ),
        print_train_table,
        args.json,
    )

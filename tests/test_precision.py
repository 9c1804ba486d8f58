"""Which precision `--precision auto` picks, by the CPU's flags, oneDNN and GPUs; which kernels
TensorFlow runs once kformer is imported."""

import os

import pytest
from conftest import python_lines


def test_auto_precision_is_bfloat16_only_where_the_cpu_multiplies_it_through_onednn(tmp_path, monkeypatch):
    import tensorflow as tf

    from kformer.train import precision as precision_lib

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 avx512f avx512_bf16 fma\nbogomips\t: 4000\n"
    )
    assert precision_lib.cpu_model(str(cpuinfo)) == "AMD EPYC"
    flags = precision_lib.cpu_flags(str(cpuinfo))
    assert {"avx512_bf16", "avx2"} <= flags and "bogomips" not in flags
    assert precision_lib.cpu_flags(str(tmp_path / "absent")) == set()

    def machine(flags, onednn="on", gpus=()):
        monkeypatch.setattr(precision_lib, "cpu_flags", lambda: set(flags))
        monkeypatch.setattr(precision_lib, "onednn_state", lambda: onednn)
        monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: list(gpus))
        return precision_lib.choose_precision("auto")[0]

    assert machine({"avx2", "avx512f", "avx512_bf16"}) == "bfloat16"
    assert machine({"avx2", "amx_bf16"}) == "bfloat16"
    assert machine({"avx2", "avx512f"}) == "float32"  # bfloat16 without the instructions is slower
    assert machine({"avx512_bf16"}, onednn="off") == "float32"  # and without oneDNN's kernels too
    # with a GPU its tensor cores decide, whatever the CPU
    monkeypatch.setattr(
        tf.config.experimental,
        "get_device_details",
        lambda gpu: {"device_name": "NVIDIA H100 80GB HBM3", "compute_capability": (9, 0)},
    )
    assert machine({"avx2"}, gpus=["GPU:0"]) == "bfloat16"
    assert precision_lib.gpu_capability() == ("NVIDIA H100 80GB HBM3", (9, 0))
    assert precision_lib.choose_precision("auto", gpu=("A100", (8, 0)))[0] == "bfloat16"
    assert precision_lib.choose_precision("auto", gpu=("V100", (7, 0))) == (
        "float16",
        "auto: V100, compute capability 7.0 has float16 tensor cores, no bfloat16; the loss is scaled",
    )
    assert precision_lib.choose_precision("auto", gpu=("P100", (6, 0)))[0] == "float32"
    assert precision_lib.choose_precision("float32", gpu=("H100", (9, 0))) == ("float32", "as asked")
    assert precision_lib.choose_precision("float16") == ("float16", "as asked")
    with pytest.raises(ValueError, match="--precision 'half'"):
        precision_lib.choose_precision("half")


def test_importing_kformer_first_turns_on_onednn_unless_the_user_said_otherwise():
    """kformer/__init__.py: TensorFlow started after kformer runs oneDNN's kernels on any CPU (on
    AVX2-only ones TensorFlow alone leaves them off); an explicit TF_ENABLE_ONEDNN_OPTS=0 wins."""
    code = (
        "import os, kformer, tensorflow; from kformer.train.precision import onednn_state; "
        "print(os.environ.get('TF_ENABLE_ONEDNN_OPTS'), onednn_state())"
    )

    def setting_and_state(**env):
        environment = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
        return python_lines(code, env={**environment, **env})[-1].split()

    assert setting_and_state() == ["1", "on"]
    assert setting_and_state(TF_ENABLE_ONEDNN_OPTS="0") == ["0", "off"]


def test_auto_precision_measures_where_the_cpu_multiplies_bfloat16(monkeypatch):
    from kformer.train import precision as precision_lib

    asked = []

    def measure(candidates):
        asked.append(candidates)
        return "float32", "measured"

    monkeypatch.setattr(precision_lib, "onednn_state", lambda: "on")
    monkeypatch.setattr(precision_lib, "cpu_flags", lambda: {"avx2", "amx_bf16"})
    assert precision_lib.choose_precision("auto", gpu=None, measure=measure) == ("float32", "measured")
    assert precision_lib.choose_precision("bfloat16", gpu=None, measure=measure)[0] == "bfloat16"
    monkeypatch.setattr(precision_lib, "cpu_flags", lambda: {"avx2"})  # no bfloat16: nothing to measure
    assert precision_lib.choose_precision("auto", gpu=None, measure=measure)[0] == "float32"
    assert asked == [("bfloat16", "float32")]


def test_the_faster_precision_is_measured_once_and_cached(tmp_path, monkeypatch, caplog):
    from kformer.train import precision_probe as probe

    monkeypatch.setenv(probe.CACHE_ENV, str(tmp_path / "cache"))
    rates = {"bfloat16": 3.0, "float32": 4.0}
    measured = []

    def measure(models, batch):
        measured.append(sorted(models))
        return dict(rates)

    def choose(key="cpu A; model"):
        return probe.faster_precision(("bfloat16", "float32"), lambda p: p, None, key, measure)

    with caplog.at_level("INFO", logger="kformer"):
        precision, why = choose()
    assert "timing bfloat16 and float32 steps" in caplog.text
    assert precision == "float32" and "bfloat16 3.00 steps/s, float32 4.00 steps/s; measured now" in why
    rates["bfloat16"] = 9.0  # measured again, it would win: the cache answers instead
    caplog.clear()
    caplog.set_level("INFO", logger="kformer")
    assert choose()[0] == "float32" and "cached in" in choose()[1] and len(measured) == 1
    assert "timing" not in caplog.text  # nothing is timed: nothing says so
    assert choose("cpu B; model")[0] == "bfloat16" and len(measured) == 2  # another CPU: measured
    (tmp_path / "cache" / probe.CACHE_FILE).write_text("{not json")  # a damaged cache: measured again
    assert choose()[0] == "bfloat16" and len(measured) == 3
    monkeypatch.setenv(probe.CACHE_ENV, str(tmp_path / "cache" / probe.CACHE_FILE / "below-a-file"))
    assert choose()[0] == "bfloat16"  # the cache cannot be written: the choice holds for this run
    assert "could not cache the precision choice" in caplog.text


def test_the_probe_times_every_candidate_on_the_same_batch():
    from kformer.data.batches import random_batch
    from kformer.model.config import preset
    from kformer.model.transformer import Transformer
    from kformer.train import precision_probe as probe
    from kformer.train.fit import compile_model
    from kformer.train.precision import PRECISIONS
    from kformer.train.recipe import recipe

    config = preset("tiny", vocab_size=64)
    tiny = recipe("tiny", batch_tokens=64)
    models = {
        p: compile_model(Transformer(config, dtype=PRECISIONS[p]), config, tiny, xla=False)
        for p in ("bfloat16", "float32")
    }
    rates = probe.time_steps(models, random_batch(config, (4, 6, 7)), rounds=2)
    assert sorted(rates) == ["bfloat16", "float32"] and all(r > 0 for r in rates.values())
    steps = probe.WARMUP_STEPS + 2 * probe.ROUND_STEPS
    assert all(int(m.optimizer.iterations) == steps for m in models.values())


def test_the_probe_batch_has_the_corpus_mean_lengths_and_fills_batch_tokens():
    import numpy as np

    from kformer.train.precision_probe import mean_batch_shape

    source, target, counts = np.array([2, 6]), np.array([3, 5]), np.array([7, 7])
    assert mean_batch_shape(50, source, target, counts) == (10, 4, 5)  # the target gains its EOS

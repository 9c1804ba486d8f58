"""Which precision `--precision auto` picks, by the CPU's flags, oneDNN and GPUs; which kernels
TensorFlow runs once kformer is imported."""

import os
import subprocess
import sys

import pytest


def test_auto_precision_is_bfloat16_only_where_the_cpu_multiplies_it_through_onednn(tmp_path, monkeypatch):
    import tensorflow as tf

    from kformer.train import precision as precision_lib

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 fma\nbogomips\t: 4000\n")
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
        result = subprocess.run(
            [sys.executable, "-c", code],
            env={**environment, **env},
            capture_output=True,
            text=True,
            check=True,
        )
        return result.stdout.split()[-2:]

    assert setting_and_state() == ["1", "on"]
    assert setting_and_state(TF_ENABLE_ONEDNN_OPTS="0") == ["0", "off"]

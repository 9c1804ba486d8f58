"""The GPU path: training with XLA and bfloat16 through `fit`, decoding on the GPU against the CPU,
and export of a GPU-trained run. Runs only where TensorFlow sees a GPU; skipped, with the reason,
elsewhere. conftest.py turns on memory growth, so these and the processes they start share the
GPU instead of each taking all of it."""

import json
import math
import os

import pytest
from conftest import python_lines


def _gpus():
    import tensorflow as tf

    return tf.config.list_physical_devices("GPU")


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not _gpus(), reason="no GPU visible to TensorFlow (the GPU path runs only on one)"),
]

SENTENCES = 64  # dev sources decoded on both devices


@pytest.fixture(scope="module")
def gpu_run(tmp_path_factory, corpus_tsv):
    """A tiny model trained on the GPU with the defaults there: XLA, precision auto (bfloat16 on
    compute capability 8.0+), through `fit`."""
    from kformer.train.fit import train

    out = str(tmp_path_factory.mktemp("gpu") / "run")
    summary = train(
        out, "tiny", data=corpus_tsv, vocab_size=1200, steps=40, verbose=0, checkpoint_seconds=10**6
    )
    return out, summary


def test_the_gpu_trains_with_xla_and_its_precision_through_fit(gpu_run):
    from kformer.train.fit import default_xla
    from kformer.train.precision import gpu_capability

    out, summary = gpu_run
    _, capability = gpu_capability()
    assert default_xla(None)  # what the run trained with
    assert summary["precision"] == ("bfloat16" if capability >= (8, 0) else "float16")
    assert summary["steps"] == 40 and math.isfinite(summary["loss"]), summary


def test_greedy_translations_on_the_gpu_equal_the_cpus(gpu_run):
    import tensorflow as tf

    from kformer.decode.options import SearchOptions
    from kformer.decode.translator import KerasRunner
    from kformer.evaluate import split_references

    out, _ = gpu_run
    sources = split_references(out, "dev")[0][:SENTENCES]
    runner = KerasRunner.open(out)
    greedy = SearchOptions(beam_size=1)
    # float32 products on Ampere+ tensor cores default to TensorFloat-32 (10-bit mantissas), which
    # can flip a near-tie between two tokens; compared here: the same float32 arithmetic
    tf.config.experimental.enable_tensor_float_32_execution(False)
    try:
        on_gpu = [runner.tokenizer.encode(t) for t in runner.translate(sources, greedy)]
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(True)
    script = (
        "import json, sys; from kformer.decode.options import SearchOptions; "
        "from kformer.decode.translator import KerasRunner; r = KerasRunner.open(sys.argv[1]); "
        "texts = r.translate(json.loads(sys.argv[2]), SearchOptions(beam_size=1)); "
        "print(json.dumps([r.tokenizer.encode(t) for t in texts]))"
    )
    cpu_only = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    on_cpu = json.loads(python_lines(script, out, json.dumps(sources), env=cpu_only)[-1])
    differ = [(s, g, c) for s, g, c in zip(sources, on_gpu, on_cpu) if g != c]
    assert not differ, f"{len(differ)} of {len(sources)} differ, e.g. {differ[:3]}"


def test_a_gpu_trained_run_exports_and_passes_the_parity_checks(gpu_run, tmp_path):
    from kformer.export.exporter import export

    out, _ = gpu_run
    manifest = export(out, str(tmp_path / "export"), formats=("onnx",), progress=lambda *a, **k: None)
    checks = {artifact.file: artifact.check for artifact in manifest.artifacts}
    assert checks and all(c.agreement == 1 for check in checks.values() for c in check.values()), checks

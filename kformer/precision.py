"""Which compute precision training uses on the machine it runs on, and why (weights stay float32)."""

from kformer.config import PRECISIONS


def onednn_state():
    """ "on" or "off": whether TensorFlow runs its oneDNN CPU kernels (TF_ENABLE_ONEDNN_OPTS, read
    when it starts; `kformer train` turns them on); "unknown" if this TensorFlow cannot tell."""
    try:
        from tensorflow.python.util import _pywrap_util_port  # no public API says it

        return "on" if _pywrap_util_port.IsMklEnabled() else "off"
    except (ImportError, AttributeError):
        return "unknown"


NATIVE_BFLOAT16_FLAGS = ("avx512_bf16", "amx_bf16")  # x86 CPUs that multiply bfloat16 in hardware


def cpu_flags(path="/proc/cpuinfo"):
    """The CPU feature flags Linux reports (empty elsewhere)."""
    try:
        with open(path) as f:
            return set(next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), []))
    except OSError:
        return set()


def choose_precision(precision="auto"):
    """-> (precision, why). "auto": bfloat16 compute with float32 weights on a CPU that multiplies
    bfloat16 in hardware through oneDNN (the small preset's training step 1.35-1.47x faster on this
    project's AVX-512 machine; without oneDNN, or without those instructions, bfloat16 is slower
    than float32), else float32. With a GPU, float32 as before (float16 is --precision float16)."""
    if precision not in ("auto", *PRECISIONS):
        raise ValueError(f"--precision {precision!r}: choose auto or one of {', '.join(PRECISIONS)}")
    if precision != "auto":
        return precision, "as asked"
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU"):
        return "float32", "auto: a GPU is visible"
    native = sorted(cpu_flags() & set(NATIVE_BFLOAT16_FLAGS))
    if not native:
        return "float32", "auto: this CPU has no bfloat16 instructions"
    if onednn_state() != "on":
        return "float32", f"auto: the CPU has {native[0]}, but TensorFlow's oneDNN kernels are off"
    return (
        "bfloat16",
        f"auto: the CPU multiplies bfloat16 ({native[0]}) and oneDNN is on; weights stay float32",
    )

"""Which compute precision training uses on the machine it runs on, and why (weights stay float32)."""

import os

# Compute precision of training -> Keras dtype policy (weights stay float32); "auto" picks (choose_precision).
PRECISIONS = {"float32": None, "bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}


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
    return set((_cpuinfo("flags", path) or "").split())


def cpu_model(path="/proc/cpuinfo"):
    """The CPU's model name as Linux reports it (platform's answer elsewhere)."""
    import platform

    return _cpuinfo("model name", path) or platform.processor() or platform.machine() or "unknown CPU"


def usable_cores():
    """The cores this process may run on (its affinity where the OS has one, else all)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def _cpuinfo(field, path):
    """The first CPU's `field` in Linux's cpuinfo at `path`; None where there is none."""
    try:
        with open(path) as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith(field)), None)
    except OSError:
        return None


def gpu_capability():
    """(name, (major, minor)) of the first visible GPU, or None without one."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return None
    details = tf.config.experimental.get_device_details(gpus[0])
    return details.get("device_name", "GPU"), tuple(details.get("compute_capability", (0, 0)))


def choose_precision(precision="auto", gpu=..., measure=None):
    """-> (precision, why). "auto" on a GPU: bfloat16 compute with float32 weights where its tensor
    cores multiply bfloat16 (compute capability 8.0+: A100, L4, H100), float16 where they multiply
    only float16 (7.x: V100, T4; Keras then scales the loss), else float32. On a CPU: float32
    without bfloat16 instructions or without oneDNN (bfloat16 is slower there); where it multiplies
    bfloat16 in hardware through oneDNN, `measure(("bfloat16", "float32"))` decides (it returns
    (precision, why): kformer.train.precision_probe), or bfloat16 without `measure`. `gpu`:
    gpu_capability()'s answer (default: asked)."""
    if precision not in ("auto", *PRECISIONS):
        raise ValueError(f"--precision {precision!r}: choose auto or one of {', '.join(PRECISIONS)}")
    if precision != "auto":
        return precision, "as asked"
    gpu = gpu_capability() if gpu is ... else gpu
    if gpu is not None:
        return _gpu_precision(*gpu)
    native = sorted(cpu_flags() & set(NATIVE_BFLOAT16_FLAGS))
    if not native:
        return "float32", "auto: this CPU has no bfloat16 instructions"
    if onednn_state() != "on":
        return "float32", f"auto: the CPU has {native[0]}, but TensorFlow's oneDNN kernels are off"
    if measure is not None:
        return measure(("bfloat16", "float32"))
    return (
        "bfloat16",
        f"auto: the CPU multiplies bfloat16 ({native[0]}) and oneDNN is on; weights stay float32",
    )


def _gpu_precision(name, capability):
    where = f"{name}, compute capability {capability[0]}.{capability[1]}"
    if capability >= (8, 0):
        return "bfloat16", f"auto: {where} multiplies bfloat16 on its tensor cores; weights stay float32"
    if capability >= (7, 0):
        return "float16", f"auto: {where} has float16 tensor cores, no bfloat16; the loss is scaled"
    return "float32", f"auto: {where} has no tensor cores"

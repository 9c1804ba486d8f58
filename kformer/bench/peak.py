"""The peak a training step's utilization is measured against: a GPU's datasheet figure for the
precision, and the matrix-product speed measured on the machine itself (large squares, and the
model's own product shapes), in the same run as the step it divides."""

import time

# Dense (no sparsity) tensor-core peaks from NVIDIA's datasheets, TFLOP/s: bfloat16, float16, and
# float32 as TensorFlow runs it on these cards (TensorFloat-32, on by default). First match wins,
# so the more specific names come first.
DATASHEET_TFLOPS = [
    ("H100 PCIe", {"bfloat16": 756.0, "float16": 756.0, "float32": 378.0}),
    ("H100 NVL", {"bfloat16": 835.5, "float16": 835.5, "float32": 417.5}),
    ("H100", {"bfloat16": 989.4, "float16": 989.4, "float32": 494.7}),  # SXM
    ("H200", {"bfloat16": 989.4, "float16": 989.4, "float32": 494.7}),
    ("A100", {"bfloat16": 312.0, "float16": 312.0, "float32": 156.0}),
    ("L4", {"bfloat16": 121.0, "float16": 121.0, "float32": 60.0}),
    ("V100", {"float16": 125.0, "float32": 15.7}),
]


def datasheet_peak(device_name, precision):
    """FLOP/s of `precision` on the GPU named `device_name`, or None for a card not in the table."""
    for name, peaks in DATASHEET_TFLOPS:
        if name in device_name:
            tflops = peaks.get(precision)
            return None if tflops is None else tflops * 1e12
    return None


def matmul_rate(shape, dtype, seconds=0.5):
    """FLOP/s of tf.matmul (M, K) x (K, N) in `dtype` on the default device: products repeated
    for about `seconds` after one untimed, best of three such runs."""
    import tensorflow as tf

    m, k, n = shape
    a = tf.random.normal((m, k), dtype="float32")
    b = tf.random.normal((k, n), dtype="float32")
    a, b = tf.cast(a, dtype), tf.cast(b, dtype)
    tf.matmul(a, b).numpy()  # kernels chosen, buffers allocated

    def run(repeats):
        start = time.perf_counter()
        for _ in range(repeats):
            c = tf.matmul(a, b)
        float(tf.reduce_sum(tf.cast(c[:1, :1], "float32")))  # waits for the queued products
        return time.perf_counter() - start

    repeats = 1
    while (elapsed := run(repeats)) < seconds / 4 and repeats < 1 << 16:
        repeats *= 4
    best = min([elapsed, *(run(repeats) for _ in range(2))])
    return 2.0 * m * k * n * repeats / best


def own_shapes_rate(shapes, dtype, seconds=0.3):
    """FLOP/s of a step's products, each shape at its own measured speed, weighted by the
    operations it contributes: `shapes` as flops.product_shapes gives them."""
    operations = sum(2.0 * m * k * n * count for (m, k, n), count in shapes)
    elapsed = sum(
        2.0 * m * k * n * count / matmul_rate((m, k, n), dtype, seconds) for (m, k, n), count in shapes
    )
    return operations / elapsed

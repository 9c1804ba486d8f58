"""The analytic training FLOPs behind `bench train`'s utilization (kformer.model.flops), checked against
the weights of the built model, and the peaks it is divided by (kformer.bench.peak)."""

import numpy as np
import pytest

from kformer.model import flops
from kformer.model.config import preset


def _product_weights(model):
    """Multiply-adds a token makes with the model's weight matrices: every kernel, and the tied
    embedding once more as the output projection."""
    kernels = sum(int(np.prod(w.shape)) for w in model.weights if w.path.endswith("kernel"))
    embedding = next(w for w in model.weights if "embedding" in w.path)
    return kernels, int(np.prod(embedding.shape))


def test_training_flops_count_every_weight_matrix_and_the_attention_products():
    from kformer.model.transformer import Transformer

    config = preset("tiny", vocab_size=97, num_encoder_layers=2, num_decoder_layers=3)
    model = Transformer(config)
    model({"source_ids": np.ones((1, 3), "int32"), "target_ids": np.ones((1, 3), "int32")})
    kernels, output = _product_weights(model)
    d, enc, dec = config.d_model, config.num_encoder_layers, config.num_decoder_layers
    encoder_kernels = enc * (4 * d * d + 2 * d * config.d_ff)  # split the kernels between the sides
    decoder_kernels = kernels - encoder_kernels
    for s, t in [(1, 1), (5, 1), (1, 7), (6, 9)]:
        # each source token meets the encoder's weights and the decoder's cross-attention K and V
        # projections once, each target token the rest; attention: 2 products of (length x length x d)
        linear = 2 * (
            s * (encoder_kernels + dec * 2 * d * d) + t * (decoder_kernels - dec * 2 * d * d + output)
        )
        attention = 2 * 2 * d * (enc * s * s + dec * (t * t + t * s))
        assert flops.forward_flops(config, [s], [t])[0] == linear + attention
    ids = np.array([[5, 6, 7, 0], [5, 0, 0, 0]]), np.array([[2, 8, 0], [2, 8, 9]])
    expected = 3 * flops.forward_flops(config, [3, 1], [2, 3]).sum()
    assert flops.batch_training_flops(config, *ids) == expected  # padding is not counted


def test_product_shapes_hold_the_step_s_weight_products():
    config = preset("small", vocab_size=8000)
    shapes = flops.product_shapes(config, tokens=1000)
    per_token = sum(2 * k * n * count for (m, k, n), count in shapes)
    # one token a side and no attention: all the weight products of forward_flops(1, 1)
    attention = 2 * 2 * config.d_model * (config.num_encoder_layers + 2 * config.num_decoder_layers)
    assert per_token == flops.forward_flops(config, [1], [1])[0] - attention
    assert all(m == 1000 for (m, _, _), _ in shapes)


def test_datasheet_peaks_match_the_most_specific_name():
    from kformer.bench.peak import datasheet_peak

    assert datasheet_peak("NVIDIA H100 80GB HBM3", "bfloat16") == 989.4e12
    assert datasheet_peak("NVIDIA H100 PCIe", "bfloat16") == 756e12  # not the SXM figure
    assert datasheet_peak("NVIDIA H200", "float32") == 494.7e12
    assert datasheet_peak("Tesla V100-SXM2-16GB", "bfloat16") is None  # no bfloat16 tensor cores
    assert datasheet_peak("Some Future GPU", "bfloat16") is None


def test_measured_matmul_rates_are_the_products_speed():
    import time

    import tensorflow as tf

    from kformer.bench.peak import matmul_rate, own_shapes_rate

    shape = (256, 512, 384)
    rate = matmul_rate(shape, "float32", seconds=0.2)
    a, b = tf.ones(shape[:2]), tf.ones(shape[1:])
    start, repeats = time.perf_counter(), 200
    for _ in range(repeats):
        tf.matmul(a, b).numpy()
    naive = 2 * np.prod(shape) * repeats / (time.perf_counter() - start)
    assert 0.3 < rate / naive < 10, (rate, naive)  # the same order; matmul_rate waits once, not each time
    assert own_shapes_rate([(shape, 3)], "float32", seconds=0.2) == pytest.approx(rate, rel=0.7)

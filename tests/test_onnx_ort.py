"""onnxruntime's own int8 (kformer.export.onnx_ort): block quantization against numpy, and the
rewritten products run by onnxruntime against numpy products of the same quantized weights."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from kformer.export import onnx_ort


def _run(model, x):
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})  # every output


def _products_model(w, bias, tied):
    """y = x @ W + bias, and with `tied` z = x @ transpose(T) with T = W^T, a tied table that the
    output projection reads as onnx_rewrite leaves it: through a Transpose node ("transpose") or
    as a Gemm with transB ("gemm")."""
    rows, columns = w.shape
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["xw"]),
        helper.make_node("Add", ["xw", "bias"], ["y"]),
    ]
    initializers = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(bias, "bias")]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, columns])]
    if tied == "transpose":
        nodes += [
            helper.make_node("Transpose", ["table"], ["table_t"], perm=[1, 0]),
            helper.make_node("MatMul", ["x", "table_t"], ["z"]),
        ]
    elif tied == "gemm":
        nodes.append(helper.make_node("Gemm", ["x", "table"], ["z"], transB=1))
    if tied:
        initializers.append(numpy_helper.from_array(np.ascontiguousarray(w.T), "table"))
        outputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [None, columns]))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, rows])],
        outputs,
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("rows", [64, 40])  # 40: the last block padded with zero rows
def test_blocks_hold_the_weights_within_half_a_step(rows):
    w = np.random.default_rng(0).normal(size=(rows, 24)).astype(np.float32)
    w[:, 3] = 0  # a column of zeros keeps a usable scale
    values, scales = onnx_ort.quantize_blocks(w, block=32)
    blocks = -(-rows // 32)
    assert values.shape == (24, blocks, 32) and values.dtype == np.uint8 and scales.shape == (24 * blocks,)
    restored = onnx_ort.dequantize_blocks(values, scales, rows)
    # Each value within half a quantization step of its block's scale (max|w| / 127).
    step = np.repeat(scales.reshape(24, blocks).T, 32, axis=0)[:rows]
    assert np.all(np.abs(restored - w) <= step / 2 + 1e-7)
    assert np.all(restored[:, 3] == 0)


@pytest.mark.parametrize("rows", [64, 40])
@pytest.mark.parametrize("tied", ["transpose", "gemm"])
def test_matmul_nbits_products_are_those_of_the_quantized_weights(rows, tied):
    rng = np.random.default_rng(1)
    w = rng.normal(size=(rows, 48)).astype(np.float32)
    bias = rng.normal(size=48).astype(np.float32)
    x = rng.normal(size=(5, rows)).astype(np.float32)
    model = _products_model(w, bias, tied)
    expected, _ = _run(model, x)

    assert onnx_ort.matmul_nbits(model, block=32) == 2
    ops = [n.op_type for n in model.graph.node]
    assert ops == ["MatMulNBits", "MatMulNBits"]  # the bias Add and the Transpose are gone
    assert sorted(i.name for i in model.graph.initializer if i.data_type == TensorProto.FLOAT) == [
        "bias",
        "table_t/nbits_scales",  # the Gemm's table, transposed, is named so too
        "w/nbits_scales",
    ]  # no fp32 matrix left
    onnx.checker.check_model(model)
    y, z = _run(model, x)
    values, scales = onnx_ort.quantize_blocks(w, 32)
    reference = x @ onnx_ort.dequantize_blocks(values, scales, rows)
    # int8 products: the activations are quantized too (per row and block), ~1% of a product's size
    tolerance = 0.02 * np.abs(x).max() * np.abs(w).max() * np.sqrt(rows)
    np.testing.assert_allclose(y, reference + bias, atol=tolerance, rtol=0)
    np.testing.assert_allclose(z, reference, atol=tolerance, rtol=0)
    np.testing.assert_allclose(y, expected, atol=tolerance, rtol=0)  # and near the fp32 products


def test_a_matrix_read_by_two_products_is_quantized_once():
    w = np.random.default_rng(2).normal(size=(32, 16)).astype(np.float32)
    model = _products_model(w, np.zeros(16, np.float32), tied=None)
    model.graph.node.append(helper.make_node("MatMul", ["x", "w"], ["y2"]))
    model.graph.output.append(helper.make_tensor_value_info("y2", TensorProto.FLOAT, [None, 16]))
    assert onnx_ort.matmul_nbits(model, block=16) == 2
    assert [i.name for i in model.graph.initializer].count("w/nbits") == 1


def test_small_matrices_stay_fp32():
    w = np.ones((16, 8), np.float32)  # 128 values
    model = _products_model(w, np.zeros(8, np.float32), tied=None)
    assert onnx_ort.matmul_nbits(model) == 0
    assert [n.op_type for n in model.graph.node] == ["MatMul", "Add"]

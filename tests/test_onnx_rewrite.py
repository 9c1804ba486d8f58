"""kformer.export.onnx_rewrite on small hand-made graphs: each rewrite gives onnxruntime's values
before and after, and leaves alone what it must not touch."""

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from kformer.export import onnx_rewrite
from kformer.export.onnx import OPSET


@pytest.mark.parametrize("transposed_first", [True, False])
@pytest.mark.parametrize("ids_shape", [[2], [1, 2]])
def test_the_tied_embedding_is_stored_once_as_its_lookup_table(transposed_first, ids_shape):
    """Whichever copy tf2onnx writes first, the table a Gather reads is kept (int8 then scales it
    per token) and the output projection reads it: a Gemm with transB for rows (onnxruntime would
    fold a Transpose into a second table in memory), through a Transpose for another rank."""
    table = np.arange(64 * 32, dtype=np.float32).reshape(64, 32) / 100  # (V, M)
    copies = [numpy_helper.from_array(table, "E"), numpy_helper.from_array(table.T.copy(), "E_T")]
    h = onnx.helper

    def graph():
        return h.make_graph(
            [h.make_node("Gather", ["E", "ids"], ["x"]), h.make_node("MatMul", ["x", "E_T"], ["logits"])],
            "g",
            [h.make_tensor_value_info("ids", onnx.TensorProto.INT64, ids_shape)],
            [h.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, [*ids_shape, 64])],
            initializer=copies[::-1] if transposed_first else copies,
        )

    rewritten = graph()
    counts = onnx_rewrite.simplify(rewritten, OPSET)
    assert [i.name for i in rewritten.initializer] == ["E"]
    ops = [(n.op_type, list(n.input)) for n in rewritten.node]
    if len(ids_shape) == 1:
        assert counts["Gemm"] == 1 and ops == [("Gather", ["E", "ids"]), ("Gemm", ["x", "E"])]
        assert onnx_rewrite._attributes(rewritten.node[1]) == {"transB": 1}
    else:
        assert counts["Gemm"] == 0 and ("Transpose", ["E"]) in ops and ("MatMul", ["x", "E_T"]) in ops
    ids = np.array([5, 63]).reshape(ids_shape)
    np.testing.assert_allclose(
        _run_graph(rewritten, {"ids": ids})[0], _run_graph(graph(), {"ids": ids})[0], rtol=1e-6
    )


def _run_graph(graph, feeds):
    """onnxruntime's outputs of a bare ONNX graph (the rewrite tests' before and after)."""
    import onnxruntime

    h = onnx.helper
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", OPSET)], ir_version=8)
    return onnxruntime.InferenceSession(model.SerializeToString()).run(None, feeds)


def test_blends_become_where():
    """tf2onnx's tf.where, Cast(c) * x + y * Cast(Not(c)), becomes one Where with the same values,
    also where it blends a graph input (a Loop body's carried state)."""
    h = onnx.helper

    def blend(c, x, y, out):
        return [
            h.make_node("Cast", [c], [f"{out}/c"], to=onnx.TensorProto.FLOAT),
            h.make_node("Not", [c], [f"{out}/n"]),
            h.make_node("Cast", [f"{out}/n"], [f"{out}/nc"], to=onnx.TensorProto.FLOAT),
            h.make_node("Mul", [f"{out}/c", x], [f"{out}/a"]),
            h.make_node("Mul", [y, f"{out}/nc"], [f"{out}/b"]),
            h.make_node("Add", [f"{out}/a", f"{out}/b"], [out]),
        ]

    vector = [h.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [4]) for n in ("x", "y")]
    graph = h.make_graph(
        [h.make_node("Relu", ["y"], ["relu"])]
        + blend("c", "relu", "x", "inner")
        + blend("c", "inner", "inner", "out"),
        "g",
        [h.make_tensor_value_info("c", onnx.TensorProto.BOOL, [4]), *vector],
        [h.make_tensor_value_info("out", onnx.TensorProto.FLOAT, [4])],
    )
    feeds = {
        "c": np.array([True, False, True, False]),
        "x": np.array([1.0, -2.0, -3.0, 4.0], np.float32),
        "y": np.array([5.0, -6.0, 7.0, 8.0], np.float32),
    }

    expected = _run_graph(graph, feeds)
    assert onnx_rewrite.simplify(graph, OPSET)["Where"] == 2
    assert [n.op_type for n in graph.node] == ["Relu", "Where", "Where"]
    np.testing.assert_array_equal(_run_graph(graph, feeds), expected)


def test_step_attention_products_become_matmuls():
    """A step's q * k summed over D and weights * v summed over the keys (kformer.attention) become
    matrix products with the same values; a product of two full (B, H, T, D) tensors stays."""
    h, f32 = onnx.helper, onnx.TensorProto.FLOAT
    axes = {
        n: numpy_helper.from_array(np.array([a], np.int64), n) for n, a in (("a3", 3), ("a2", 2), ("m1", -1))
    }
    graph = h.make_graph(
        [
            h.make_node("Mul", ["k", "q"], ["qk"]),
            h.make_node("ReduceSum", ["qk", "a3"], ["scores"], keepdims=0),  # (B, H, T)
            h.make_node("Softmax", ["scores"], ["weights"]),
            h.make_node("Unsqueeze", ["weights", "m1"], ["weights4"]),
            h.make_node("Mul", ["weights4", "k"], ["wv"]),
            h.make_node("ReduceSum", ["wv", "a2"], ["context"], keepdims=0),  # (B, H, D)
            h.make_node("Mul", ["k", "k"], ["kk"]),
            h.make_node("ReduceSum", ["kk", "a3"], ["norms"], keepdims=0),  # not attention: stays
        ],
        "g",
        [
            h.make_tensor_value_info("q", f32, ["B", 2, 1, 3]),
            h.make_tensor_value_info("k", f32, ["B", 2, "T", 3]),
        ],
        [h.make_tensor_value_info(n, f32, None) for n in ("context", "norms")],
        initializer=list(axes.values()),
    )
    rng = np.random.default_rng(0)
    feeds = {
        "q": rng.normal(size=(2, 2, 1, 3)).astype(np.float32),
        "k": rng.normal(size=(2, 2, 5, 3)).astype(np.float32),
    }

    expected = _run_graph(graph, feeds)
    assert onnx_rewrite.simplify(graph, OPSET)["MatMul"] == 2
    ops = [n.op_type for n in graph.node]
    assert ops.count("MatMul") == 2 and ops.count("Mul") == 1 and ops.count("ReduceSum") == 1, ops
    for got, want in zip(_run_graph(graph, feeds), expected):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_penalties_scattered_into_zeros_are_scattered_into_the_logits():
    """The repeat guard's Add(L, Reshape(ScatterND(ConstantOfShape(n, 0), i, u), shape)) becomes
    one ScatterND with reduction add into L: L plus the updates, duplicates summed as TensorFlow
    sums them (numpy's reference; the ScatterND before keeps one of them). A scatter into a
    non-zero fill stays."""
    h, f32, i64 = onnx.helper, onnx.TensorProto.FLOAT, onnx.TensorProto.INT64

    def penalized(fill, out):
        value = h.make_tensor("value", f32, [1], [fill])
        return [
            h.make_node("ConstantOfShape", ["size"], [f"{out}/zeros"], value=value),
            h.make_node("ScatterND", [f"{out}/zeros", "indices", "updates"], [f"{out}/penalties"]),
            h.make_node("Reshape", [f"{out}/penalties", "shape"], [f"{out}/table"]),
            h.make_node("Add", ["logits", f"{out}/table"], [out]),
        ]

    constants = [
        numpy_helper.from_array(np.array([3 * 5], np.int64), "size"),
        numpy_helper.from_array(np.array([-1, 5], np.int64), "shape"),
    ]
    graph = h.make_graph(
        penalized(0.0, "banned") + penalized(1.0, "other"),
        "g",
        [
            h.make_tensor_value_info("logits", f32, ["rows", 5]),
            h.make_tensor_value_info("indices", i64, ["n", 1]),
            h.make_tensor_value_info("updates", f32, ["n"]),
        ],
        [h.make_tensor_value_info(n, f32, None) for n in ("banned", "other")],
        initializer=constants,
    )
    logits = np.random.default_rng(0).normal(size=(3, 5)).astype(np.float32)
    indices = np.array([[1], [7], [7], [0], [14], [10]], np.int64)  # 7 twice: summed
    updates = np.array([-1e9, -1e9, -1e9, 0.0, -1e9, 0.0], np.float32)
    feeds = {"logits": logits, "indices": indices, "updates": updates}
    penalties = np.zeros(15, np.float32)
    np.add.at(penalties, indices[:, 0], updates)

    other = _run_graph(graph, feeds)[1]
    assert onnx_rewrite.simplify(graph, OPSET)["ScatterND"] == 1
    scatters = [n for n in graph.node if n.op_type == "ScatterND"]
    assert [onnx_rewrite._attributes(n).get("reduction", b"none") for n in scatters] == [b"add", b"none"]
    banned, still_other = _run_graph(graph, feeds)
    np.testing.assert_array_equal(banned, logits + penalties.reshape(3, 5))
    np.testing.assert_array_equal(still_other, other)

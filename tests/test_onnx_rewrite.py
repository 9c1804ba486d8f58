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
    """A step's q * k summed over D and weights * v summed over the keys (kformer.model.attention) become
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


def test_scatters_at_row_offsets_become_scatter_elements_along_the_vocabulary():
    """_scatter_adds' ScatterND into the flat logits at row * V + column, the row offsets from a
    Range as a shrinking loop computes them, becomes one ScatterElements at the columns: the logits
    plus the updates, duplicates summed (numpy's reference). Offsets of another width stay."""
    h, f32, i32 = onnx.helper, onnx.TensorProto.FLOAT, onnx.TensorProto.INT32
    rows, vocab, written = 3, 5, 4

    def scattered(width, out):
        return [
            h.make_node("Reshape", ["logits", "flat"], [f"{out}/flat"]),
            h.make_node("Range", ["zero", "rows", "one"], [f"{out}/rows"]),
            h.make_node("Unsqueeze", [f"{out}/rows", "axis_1"], [f"{out}/row"]),
            h.make_node("Mul", [f"{out}/row", width], [f"{out}/offsets"]),
            h.make_node("Add", [f"{out}/offsets", "columns"], [f"{out}/index"]),
            h.make_node("Reshape", [f"{out}/index", "index_shape"], [f"{out}/indices32"]),
            h.make_node("Cast", [f"{out}/indices32"], [f"{out}/indices"], to=onnx.TensorProto.INT64),
            h.make_node("Reshape", ["updates", "flat"], [f"{out}/updates"]),
            h.make_node(
                "ScatterND",
                [f"{out}/flat", f"{out}/indices", f"{out}/updates"],
                [f"{out}/added"],
                reduction="add",
            ),
            h.make_node("Reshape", [f"{out}/added", "shape"], [out]),
        ]

    constants = {
        "flat": np.array([-1], np.int64),
        "index_shape": np.array([-1, 1], np.int64),
        "shape": np.array([-1, vocab], np.int64),
        "axis_1": np.array([1], np.int64),
        "zero": np.array(0, np.int32),
        "one": np.array(1, np.int32),
        "vocab": np.array(vocab, np.int32),
        "other_width": np.array(vocab - 1, np.int32),
    }
    graph = h.make_graph(
        scattered("vocab", "banned") + scattered("other_width", "other"),
        "g",
        [
            h.make_tensor_value_info("logits", f32, ["rows", vocab]),
            h.make_tensor_value_info("rows", i32, []),
            h.make_tensor_value_info("columns", i32, ["rows", written]),
            h.make_tensor_value_info("updates", f32, ["rows", written]),
        ],
        [h.make_tensor_value_info(n, f32, None) for n in ("banned", "other")],
        initializer=[numpy_helper.from_array(v, k) for k, v in constants.items()],
    )
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(rows, vocab)).astype(np.float32)
    columns = np.array([[1, 1, 0, 4], [2, 3, 2, 0], [4, 4, 4, 1]], np.int32)  # repeats: summed
    updates = np.where(rng.random((rows, written)) < 0.6, -1e9, 0.0).astype(np.float32)
    feeds = {"logits": logits, "rows": np.array(rows, np.int32), "columns": columns, "updates": updates}
    expected = logits.copy()
    np.add.at(expected, (np.arange(rows)[:, None].repeat(written, 1), columns), updates)

    other = _run_graph(graph, feeds)[1]
    assert onnx_rewrite.simplify(graph, OPSET)["ScatterElements"] == 1
    assert [n.op_type for n in graph.node].count("ScatterND") == 1  # the other width's
    banned, still_other = _run_graph(graph, feeds)
    np.testing.assert_array_equal(banned, expected)
    np.testing.assert_array_equal(still_other, other)


def test_values_a_loop_passes_on_unchanged_are_read_from_the_enclosing_graph():
    """A Loop's carried values returned unchanged (as Identity, as tf2onnx writes them, or as
    themselves) are dropped from the Loop and read from outside, their final values too; one whose
    final value the graph returns stays, and so do the values that change. Same outputs."""
    h, f32 = onnx.helper, onnx.TensorProto.FLOAT
    scalar = lambda name, t=f32: h.make_tensor_value_info(name, t, [])  # noqa: E731
    body = h.make_graph(
        [
            h.make_node("Identity", ["cond_in"], ["cond_out"]),
            h.make_node("Add", ["x_in", "step_in"], ["sum"]),
            h.make_node("Mul", ["sum", "scale_in"], ["x_out"]),
            h.make_node("Identity", ["step_in"], ["step_out"]),
            h.make_node("Identity", ["scale_in"], ["scale_out"]),
            h.make_node("Add", ["kept_in", "step_in"], ["total"]),
        ],
        "body",
        [scalar("i", onnx.TensorProto.INT64), scalar("cond_in", onnx.TensorProto.BOOL)]
        + [scalar(f"{n}_in") for n in ("x", "step", "scale", "kept", "same")],
        [scalar("cond_out", onnx.TensorProto.BOOL)]
        + [scalar(n) for n in ("x_out", "step_out", "scale_out", "kept_in", "same_in", "total")],
    )
    loop = h.make_node(
        "Loop",
        ["trips", "", "x", "step", "scale", "kept", "same"],
        ["x_final", "step_final", "scale_final", "kept_final", "same_final", "totals"],
        body=body,
    )
    graph = h.make_graph(
        [loop, h.make_node("Mul", ["step_final", "same_final"], ["product"])],
        "g",
        [scalar(n) for n in ("x", "step", "scale", "kept", "same")],
        [scalar(n) for n in ("x_final", "kept_final", "product")]
        + [h.make_tensor_value_info("totals", f32, [None])],
        initializer=[numpy_helper.from_array(np.array(4, np.int64), "trips")],
    )
    feeds = {
        n: np.array(v, np.float32) for n, v in zip(("x", "step", "scale", "kept", "same"), (1, 2, 3, 5, 7))
    }
    before = _run_graph(graph, feeds)

    assert onnx_rewrite.simplify(graph, OPSET)["Loop inputs"] == 3  # step, scale, same
    (loop,) = [n for n in graph.node if n.op_type == "Loop"]
    assert list(loop.input) == ["trips", "", "x", "kept"]
    assert list(loop.output) == ["x_final", "kept_final", "totals"]
    for expected, value in zip(before, _run_graph(graph, feeds)):
        np.testing.assert_array_equal(value, expected)

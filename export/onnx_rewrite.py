"""Fewer, larger ONNX nodes where tf2onnx spells one operation as many.

onnxruntime runs the decoding Loop's body node by node at every step, so the body's node count is a
cost of its own (a few microseconds a node at batch 1). Each rewrite is exact up to float rounding,
keeps standard-domain ops, and runs before the export's parity checks:

- LayerNorm: tf2onnx's thirteen nodes become one LayerNormalization (opset 17).
- A float tf.where, which tf2onnx writes as Cast(c) * x + y * Cast(Not(c)), becomes one Where.
  (The key/value cache writes are additions instead, kformer.model.portable.add_to_slot: as Where nodes
  they made beam search at batch 32 slower.)
- Each weight is stored once: tf2onnx folds transpose(E) of the tied output projection into a
  second copy of the embedding table; the product reads E itself, as a Gemm with transB (or, where
  its operand's rank is unknown, through a Transpose node, folded back at load).
- A decoding step's attention products, which kformer.model.portable spells as a broadcast multiply and
  a sum for TFLite, become matrix products.
- The repeat guard's penalties, scattered into zeros and added to the logits (TFLite's scatter
  starts from zeros), are scattered into the logits themselves: one ScatterND with reduction add,
  then one ScatterElements along the vocabulary, without the flat indices' row offsets.
- A value a Loop passes from step to step unchanged (tf2onnx makes every value a TensorFlow loop
  body reads a loop variable) is read from the enclosing graph instead.
"""

import functools

import numpy as np
from onnx import helper, numpy_helper


def simplify(graph, opset):
    """Rewrites `graph` (and its Loop bodies) in place; returns {rewrite: count}."""
    counts = {
        "LayerNormalization": _replace(graph, _layer_norms),
        "Where": _replace(graph, _wheres),
        "Transpose": _share_transposed_weights(graph),
    }
    shapes = _shapes(graph, opset)
    counts["Gemm"] = _tied_products(graph, shapes)
    counts["MatMul"] = _replace(graph, functools.partial(_attention_products, shapes=shapes))
    counts["ScatterND"] = _replace(graph, _scatter_adds)
    counts["ScatterElements"] = _replace(graph, _row_scatters)
    counts["Loop inputs"] = _loop_invariants(graph)
    prune(graph)
    return counts


def _share_transposed_weights(graph, min_size=1024):
    """tf2onnx folds transpose(E) of the tied output projection into a second copy of the embedding
    table E (a large part of a small model's file). Each such copy becomes Transpose(E) in the main graph:
    the same numbers, one copy on disk (`_tied_products` then has the products read E itself). The
    copy kept is E, the table a Gather looks rows up in, whichever tf2onnx wrote first: quantized, E
    then gets one scale per token (a row of E, a column of transpose(E)); keeping transpose(E)
    instead gave one per feature, and other int8 translations."""
    looked_up = {node.input[0] for g in graphs(graph) for node in g.node if node.op_type == "Gather"}
    by_shape = {}
    for weight in graph.initializer:
        if len(weight.dims) == 2 and weight.dims[0] * weight.dims[1] >= min_size:
            by_shape.setdefault(tuple(weight.dims), []).append(weight)
    replaced = set()
    for weight in list(graph.initializer):
        if weight.name in replaced or weight.name in looked_up or len(weight.dims) != 2:
            continue
        for original in by_shape.get((weight.dims[1], weight.dims[0]), []):
            if original is weight or original.name in replaced:
                continue
            if np.array_equal(numpy_helper.to_array(original).T, numpy_helper.to_array(weight)):
                graph.initializer.remove(weight)
                graph.node.insert(
                    0,
                    helper.make_node(
                        "Transpose",
                        [original.name],
                        [weight.name],
                        perm=[1, 0],
                        name=weight.name.replace(":", "_") + "/shared",
                    ),
                )
                replaced.add(weight.name)
                break
    return len(replaced)


def _tied_products(graph, shapes):
    """MatMul(x (rows, M), Transpose(E)) of `_share_transposed_weights` -> Gemm(x, E, transB=1).
    onnxruntime folds a Transpose of a constant into a new one when it loads the file: a second
    (V, M) table in memory, which Gemm's transB avoids at the same tokens and speed. Gemm takes
    rank-2 operands only: a MatMul whose x has another or an unknown rank keeps the Transpose."""
    shared = {
        node.output[0]: node.input[0]
        for node in graph.node
        if node.op_type == "Transpose" and node.name.endswith("/shared")
    }

    def gemm(g, node, made_by, constants):
        if (
            node.op_type != "MatMul"
            or node.input[1] not in shared
            or len(shapes.get(node.input[0]) or ()) != 2
        ):
            return None
        table = shared[node.input[1]]
        return [helper.make_node("Gemm", [node.input[0], table], list(node.output), name=node.name, transB=1)]

    return _replace(graph, gemm)


def subgraphs(node):
    """The graphs held by a node's attributes (Loop/If/Scan bodies)."""
    for attribute in node.attribute:
        if attribute.g is not None and attribute.g.node:
            yield attribute.g
        yield from attribute.graphs


def graphs(graph):
    """`graph` and every graph nested in it (Loop/If bodies, at any depth)."""
    yield graph
    for node in graph.node:
        for subgraph in subgraphs(node):
            yield from graphs(subgraph)


def _with_constants(graph, outer=None):
    """(g, {name: array} of the initializers g sees, its own and its enclosing graphs') for `graph`
    and every graph nested in it."""
    constants = dict(outer or {})
    constants.update({i.name: numpy_helper.to_array(i) for i in graph.initializer})
    yield graph, constants
    for node in graph.node:
        for subgraph in subgraphs(node):
            yield from _with_constants(subgraph, constants)


def _reads(graph):
    """Every name read by a node of `graph` or of its subgraphs (outer-scope reads included)."""
    return (name for g in graphs(graph) for node in g.node for name in node.input)


def _finder(graph):
    """made_by(name, op_type) -> the node of that type writing `name`, or None. The rewrites only
    replace a pattern's last node; what else reads its inner nodes keeps them (see prune)."""
    producer = {out: node for node in graph.node for out in node.output}

    def made_by(name, op_type):
        node = producer.get(name)
        return node if node is not None and node.op_type == op_type else None

    return made_by


def _replace(graph, rewrite):
    """In `graph` and its subgraphs, each node for which `rewrite(g, node, made_by, constants)`
    finds its pattern becomes the nodes it returns (which write the node's outputs; None: the node
    is kept); returns how many were replaced. Every rewrite below but the shared weights is one of
    these: each matches the pattern ending at `node`, then builds what replaces it."""
    count = 0
    for g, constants in _with_constants(graph):
        made_by = _finder(g)
        nodes = []
        for node in g.node:
            replacement = rewrite(g, node, made_by, constants)
            nodes += [node] if replacement is None else replacement
            count += replacement is not None
        del g.node[:]
        g.node.extend(nodes)
    return count


def _attributes(node):
    """{name: value} of a node's attributes."""
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _one_of(node, made_by, op_type):
    """(the input of a two-input node written by an `op_type` node, the other input's name)."""
    for i in (0, 1):
        found = made_by(node.input[i], op_type)
        if found is not None:
            return found, node.input[1 - i]
    return None, None


def _layer_norms(g, node, made_by, constants):
    """Keras' LayerNormalization reaches ONNX as 13 nodes:
        mean = GlobalAveragePool(x); variance = GlobalAveragePool((x - mean) * (x - mean))
        s = gamma / Sqrt(variance + eps); y = x * s + (Neg(mean) * s + beta)
    (without the "+ beta" where TensorFlow folded a beta of zeros away); for a (rows, D) input
    (a decoding step) each mean is a ReduceMean over axis 1 instead. One LayerNormalization
    (opset 17) each, normalizing over the axes the means average: 2.. for GlobalAveragePool, the
    last for the ReduceMean. Where `node` is the Add that ends one: [that LayerNormalization], its
    gamma and beta (D,) added to `g`; else None."""
    if node.op_type != "Add":
        return None
    shift, scaled_name = _one_of(node, made_by, "Add")
    if shift is not None:  # x * s + (Neg(mean) * s + beta)
        mean_scaled, beta = _one_of(shift, made_by, "Mul")
    else:  # x * s + Neg(mean) * s
        mean_scaled, beta = None, None
        for i in (0, 1):
            product = made_by(node.input[i], "Mul")
            if product is not None and any(made_by(name, "Neg") for name in product.input):
                mean_scaled, scaled_name = product, node.input[1 - i]
    scaled = made_by(scaled_name, "Mul") if mean_scaled else None
    negation, s_name = _one_of(mean_scaled, made_by, "Neg") if scaled else (None, None)
    mean, axis = _mean_of(negation.input[0], made_by) if negation else (None, None)
    if not mean or sorted(scaled.input) != sorted([mean.input[0], s_name]):
        return None
    x = mean.input[0]
    s = made_by(s_name, "Mul")
    reciprocal, gamma = _one_of(s, made_by, "Reciprocal") if s else (None, None)
    root = reciprocal and made_by(reciprocal.input[0], "Sqrt")
    plus_eps = root and made_by(root.input[0], "Add")
    variance, eps = _one_of(plus_eps, made_by, mean.op_type) if plus_eps else (None, None)
    if variance is not None and variance.attribute != mean.attribute:
        return None
    square = variance and made_by(variance.input[0], "Mul")
    difference = square and square.input[0] == square.input[1] and made_by(square.input[0], "Sub")
    if (
        not difference
        or list(difference.input) != [x, mean.output[0]]
        or gamma not in constants
        or _scalar(constants, eps) is None
        or (beta is not None and beta not in constants)
    ):
        return None
    scale = constants[gamma]
    offset = constants[beta] if beta is not None else scale * 0
    if scale.size != scale.shape[-1] or offset.shape != scale.shape:  # (1, ..., D): one per feature
        return None
    if mean.op_type == "ReduceMean" and axis not in (-1, scale.ndim - 1):  # not gamma's: (1, D) on (rows, D)
        return None
    vectors = {f"{node.name}/gamma": scale, f"{node.name}/beta": offset}  # each (D,) in the file
    g.initializer.extend(numpy_helper.from_array(value.reshape(-1), name) for name, value in vectors.items())
    epsilon, inputs = float(_scalar(constants, eps)), [x, *vectors]
    return [
        helper.make_node(
            "LayerNormalization", inputs, list(node.output), name=node.name, axis=axis, epsilon=epsilon
        )
    ]


def _mean_of(name, made_by):
    """(node, the first axis it averages) for the GlobalAveragePool (axes 2..) or the keepdims
    ReduceMean over one axis that writes `name`; (None, None) if neither does."""
    node = made_by(name, "GlobalAveragePool")
    if node is not None:
        return node, 2
    node = made_by(name, "ReduceMean")
    attributes = _attributes(node) if node else {}
    if len(attributes.get("axes", [])) != 1 or not attributes.get("keepdims", 1):
        return None, None
    return node, attributes["axes"][0]


def _wheres(g, node, made_by, constants):
    """tf2onnx writes a tf.where(c, x, y) as Cast(c) * x + y * Cast(Not(c)): six nodes, where one
    Where does (and gives x or y where the blend would give NaN from 0 * inf). (The key/value
    cache writes, for which onnxruntime's Where was slower than the blend, are no tf.where: see
    kformer.model.attention.) [Where(c, x, y)] if `node` is the Add that ends such a blend, else
    None."""
    if node.op_type != "Add":
        return None
    products = [made_by(name, "Mul") for name in node.input]
    if None in products:
        return None
    picks = [_one_of(product, made_by, "Cast") for product in products]  # (Cast(...), the other factor)
    if any(cast is None for cast, _ in picks):
        return None
    (cast_a, a), (cast_b, b) = picks
    for (keep, x), (drop, y) in (((cast_a, a), (cast_b, b)), ((cast_b, b), (cast_a, a))):
        negation = made_by(drop.input[0], "Not")
        if negation is not None and negation.input[0] == keep.input[0]:
            return [helper.make_node("Where", [keep.input[0], x, y], list(node.output), name=node.name)]
    return None


def _attention_products(g, node, made_by, constants, shapes):
    """A decoding step's one query attends as q * k summed over D and weights * v summed over the
    keys (kformer.model.attention: TFLite's XNNPACK repacks the keys of a batched matmul at every step).
    In onnxruntime each is two or three element-wise passes over the (rows, H, T, D) cache, where a
    matrix product of the same values is one (onnxruntime folds the Transpose of k into it):
        ReduceSum(Mul(q (B, H, 1, D), k (B, H, T, D)), [3])  ->  Squeeze(MatMul(q, Transpose(k)), [2])
        ReduceSum(Mul(Unsqueeze(w (B, H, T), [3]), v), [2])  ->  Squeeze(MatMul(Unsqueeze(w, [2]), v), [2])
    Ranks and the query's static length 1 come from ONNX shape inference (`shapes`, from _shapes).
    Where `node` ends one of the two patterns, the three nodes that replace it; else None."""
    product = made_by(node.input[0], "Mul") if node.op_type == "ReduceSum" and len(node.input) == 2 else None
    attributes = _attributes(node)
    axis = _scalar(constants, node.input[1]) if product is not None else None
    if axis is None or attributes.get("keepdims", 1):
        return None
    a, b = product.input
    if len(shapes.get(a) or ()) != 4 or len(shapes.get(b) or ()) != 4:
        return None
    axis = int(axis) % 4
    name = node.name or node.output[0]
    operand, matmul = f"{name}/operand", f"{name}/matmul"
    for x, y in ((a, b), (b, a)):
        unsqueeze = made_by(x, "Unsqueeze") if axis == 2 else None
        unsqueezed = _scalar(constants, unsqueeze.input[-1]) if unsqueeze is not None else None
        if axis == 3 and shapes[x][2] == 1 and shapes[y][2] != 1:  # x: (B, H, 1, D) the query, y the keys
            first = helper.make_node("Transpose", [y], [operand], name=operand, perm=[0, 1, 3, 2])
            factors = [x, operand]
        elif unsqueezed is not None and int(unsqueezed) % 4 == 3:  # x: the weights as (B, H, T, 1)
            weights = unsqueeze.input[0]  # (B, H, T); y the values
            first = helper.make_node("Unsqueeze", [weights, _axes_constant(g, 2)], [operand], name=operand)
            factors = [operand, y]
        else:
            continue
        return [
            first,
            helper.make_node("MatMul", factors, [matmul], name=matmul),
            helper.make_node("Squeeze", [matmul, _axes_constant(g, 2)], list(node.output), name=name),
        ]
    return None


def _scatter_adds(g, node, made_by, constants):
    """kformer.decode.search.RepeatGuard.ban adds to the logits L (rows, V) penalties scattered into zeros
    (duplicate indices summed, as in TensorFlow and TFLite), which tf2onnx writes as
        Add(L, Reshape(ScatterND(ConstantOfShape(n, 0), indices, updates), shape))
    (ONNX's ScatterND keeps one of duplicates unless told to add them). In onnxruntime those are
    four passes over a (rows, V) tensor, one of them filling zeros; one ScatterND with reduction add
    scatters the same updates into L (flattened; a Reshape is no copy), shaped back as the
    penalties were (the Add is of equal shapes):
        Reshape(ScatterND(Reshape(L, [-1]), indices, updates, reduction="add"), shape)
    Those three nodes if `node` is the Add of the pattern, else None."""
    if node.op_type != "Add":
        return None
    reshape, logits = _one_of(node, made_by, "Reshape")
    scatter = reshape and made_by(reshape.input[0], "ScatterND")
    zeros = scatter and made_by(scatter.input[0], "ConstantOfShape")
    if not zeros or _attributes(scatter).get("reduction", b"none") != b"none":
        return None
    value = _attributes(zeros).get("value")  # absent: a float 0
    if value is not None and numpy_helper.to_array(value).reshape(-1).tolist() != [0]:
        return None
    name = node.name or node.output[0]
    flat, added = f"{name}/flat", f"{name}/scatter_add"
    return [
        helper.make_node("Reshape", [logits, _ints_constant(g, "flat_shape", [-1])], [flat], name=flat),
        helper.make_node("ScatterND", [flat, *scatter.input[1:]], [added], name=added, reduction="add"),
        helper.make_node("Reshape", [added, reshape.input[1]], list(node.output), name=name),
    ]


def _row_scatters(g, node, made_by, constants):
    """_scatter_adds' ScatterND into the flat logits, at indices row * V + column of (rows, V) logits
    (kformer.decode.search.RepeatGuard.ban; in a Loop whose batch shrinks, the row offsets are computed
    at every step from a Range), becomes one ScatterElements along the vocabulary at the columns:
        Reshape(ScatterND(Reshape(L, [-1]), Reshape(Mul(Unsqueeze(Range(0, R, 1), [1]), V) + C,
            [-1, 1]), Reshape(U, [-1]), reduction="add"), [-1, V])
        ->  ScatterElements(L, C, U, axis=1, reduction="add")
    the same sums (duplicates added) with ten fewer nodes a step, the same tokens. That
    ScatterElements of L (rows, V), the columns C and the updates U if `node` ends the pattern,
    else None."""
    scatter = made_by(node.input[0], "ScatterND") if node.op_type == "Reshape" else None
    if scatter is None or _attributes(scatter).get("reduction") != b"add":
        return None
    shape = constants.get(node.input[1])
    flat = made_by(scatter.input[0], "Reshape")
    index_cast = made_by(scatter.input[1], "Cast")  # tf2onnx's int32 -> int64 of the indices
    index = made_by(index_cast.input[0] if index_cast else scatter.input[1], "Reshape")
    flat_index = index and made_by(index.input[0], "Add")
    updates = made_by(scatter.input[2], "Reshape")
    if shape is None or shape.shape != (2,) or not (flat and flat_index and updates):
        return None
    for offsets, columns in (flat_index.input, reversed(flat_index.input)):
        if _row_offsets(made_by(offsets, "Mul"), made_by, constants, int(shape[1])):
            return [
                helper.make_node(
                    "ScatterElements",
                    [flat.input[0], columns, updates.input[0]],
                    list(node.output),
                    name=node.name or node.output[0],
                    axis=1,
                    reduction="add",
                )
            ]
    return None


def _row_offsets(product, made_by, constants, vocab):
    """Whether `product` is Mul(Unsqueeze(Range(0, R, 1), [1]), vocab): each row's first flat index."""
    if product is None:
        return False
    rows, factor = _one_of(product, made_by, "Unsqueeze")
    count = rows and made_by(rows.input[0], "Range")
    return bool(
        count
        and _scalar(constants, factor) == vocab
        and _scalar(constants, rows.input[1]) == 1
        and _scalar(constants, count.input[0]) == 0
        and _scalar(constants, count.input[2]) == 1
    )


def _loop_invariants(graph):
    """tf2onnx carries every value a TensorFlow loop body reads through the Loop, the unchanged
    ones as Identity(input) at every step. Each such value is read from the enclosing graph
    instead (onnxruntime hands outer values to a subgraph as they are), and so is the Loop's final
    value of it. Returns how many loop-carried values were dropped (on the demo model 6 of the
    greedy loop's 21, 8 of beam search's 27; their effect: _row_scatters)."""
    loops = [(node, g) for g in graphs(graph) for node in g.node if node.op_type == "Loop"]
    return sum(_drop_invariants(loop, enclosing) for loop, enclosing in loops)


def _drop_invariants(loop, enclosing):
    """_loop_invariants for one Loop node of graph `enclosing`: each carried value j (Loop input
    2 + j, body input 2 + j, body output 1 + j, Loop output j) that the body returns unchanged."""
    (body,) = [a.g for a in loop.attribute if a.name == "body"]
    made_by = _finder(body)
    returned = {o.name for o in enclosing.output}
    dropped = 0
    for j in reversed(range(len(loop.input) - 2)):
        inner, initial, final = body.input[2 + j].name, loop.input[2 + j], loop.output[j]
        result = body.output[1 + j].name
        identity = made_by(result, "Identity")
        unchanged = result == inner or (identity is not None and identity.input[0] == inner)
        # Kept: a value some body output returns as it is, and a final value the graph returns.
        others = {o.name for i, o in enumerate(body.output) if i != 1 + j}
        if not unchanged or inner in others or final in returned:
            continue
        for g, old, new in ((body, inner, initial), (enclosing, final, initial)):
            for sub in graphs(g):
                for node in sub.node:
                    node.input[:] = [new if name == old else name for name in node.input]
        del body.input[2 + j], body.output[1 + j], loop.input[2 + j], loop.output[j]
        dropped += 1
    return dropped


def _scalar(constants, name):
    """The one value of the constant `name` (of any shape) among `constants`, or None."""
    array = constants.get(name)
    return None if array is None or array.size != 1 else array.reshape(()).item()


def _axes_constant(graph, axis):
    """The name of an int64 [axis] initializer of `graph`, added once."""
    return _ints_constant(graph, f"attention_axes_{axis}", [axis])


def _ints_constant(graph, name, values):
    """The name of an int64 1-D initializer `values` of `graph`, added once."""
    if not any(i.name == name for i in graph.initializer):
        graph.initializer.append(numpy_helper.from_array(np.array(values, np.int64), name))
    return name


def _shapes(graph, opset):
    """{value name: dims (None where unknown)} over `graph` and its subgraphs, from ONNX shape
    inference of a copy."""
    import onnx

    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    inferred = onnx.shape_inference.infer_shapes(model).graph
    shapes = {}
    for g in graphs(inferred):
        for value in (*g.input, *g.value_info, *g.output):
            if value.type.tensor_type.HasField("shape"):
                dims = value.type.tensor_type.shape.dim
                shapes[value.name] = [d.dim_value if d.HasField("dim_value") else None for d in dims]
    return shapes


def prune(graph):
    """Drops the nodes and initializers nothing reads any more, subgraphs first (a Loop body's
    dead nodes may be the last readers of the outer graph's initializers)."""
    for node in graph.node:
        for subgraph in subgraphs(node):
            prune(subgraph)
    while True:
        needed = {o.name for o in graph.output} | set(_reads(graph))
        kept = [node for node in graph.node if any(out in needed for out in node.output if out)]
        if len(kept) == len(graph.node):
            break
        del graph.node[:]
        graph.node.extend(kept)
    kept = [i for i in graph.initializer if i.name in needed]
    del graph.initializer[:]
    graph.initializer.extend(kept)

"""onnxruntime's own int8: the weight products of an ONNX file as `com.microsoft.MatMulNBits`.

The portable int8 file (`kformer.export.onnx.quantize`) stores int8 weights and computes in fp32:
onnxruntime restores the weights when it loads it, so it runs at fp32's speed and memory. This
file keeps 8-bit weights in memory and multiplies them with onnxruntime's int8 kernels
(MatMulNBits, accuracy level 4): each row of the activations is quantized on its own, block by
block, so a sentence's translation does not depend on the rest of its batch, as with fp32. Only
onnxruntime runs it (onnxruntime-web gave other tokens for the same file), so the export writes it
beside the portable file, as the variant "int8-ort", which `--runtime onnx --variant int8` takes
where it is there (`kformer.export.formats.open_runner`).

Weights W (K, N) are quantized symmetrically in blocks of BLOCK rows of a column: one fp32 scale
max|w| / 127 per block, values round(w / scale) stored as uint8 with zero point 128.
"""

import numpy as np
from onnx import helper, numpy_helper

from kformer.export import onnx_rewrite

BLOCK = 128  # rows of a column that share a scale (a power of 2, at least 16)
MIN_SIZE = 256  # every weight product of a model (the tiny test model's too); smaller stay fp32
ZERO_POINT = 128
DOMAIN = "com.microsoft"


def quantize_blocks(weight, block=BLOCK):
    """W (K, N) float32 -> (values (N, K / block, block) uint8, scales (N * K / block,) float32),
    MatMulNBits' layout; K is padded with zero rows to a multiple of `block`."""
    rows, columns = weight.shape
    blocks = -(-rows // block)
    padded = np.zeros((blocks * block, columns), np.float32)
    padded[:rows] = weight
    by_block = padded.reshape(blocks, block, columns)  # (K / block, block, N)
    scales = np.abs(by_block).max(axis=1) / 127.0  # (K / block, N)
    scales = np.where(scales > 0, scales, 1.0).astype(np.float32)
    values = np.clip(np.round(by_block / scales[:, None, :]), -127, 127).astype(np.int32) + ZERO_POINT
    return values.transpose(2, 0, 1).astype(np.uint8), np.ascontiguousarray(scales.T).reshape(-1)


def dequantize_blocks(values, scales, rows):
    """The fp32 W (rows, N) that `quantize_blocks`' output stands for: the reference its products
    are tested against."""
    columns, blocks, block = values.shape
    w = (values.astype(np.float32) - ZERO_POINT) * scales.reshape(columns, blocks, 1)
    return w.reshape(columns, blocks * block)[:, :rows].T


def _transposed_constants(graph, constants):
    """{output: initializer} of the main graph's Transposes of a constant matrix."""
    return {
        node.output[0]: node.input[0]
        for node in graph.node
        if node.op_type == "Transpose"
        and node.input[0] in constants
        and [list(a.ints) for a in node.attribute if a.name == "perm"] == [[1, 0]]
    }


def matmul_nbits(model, block=BLOCK, min_size=MIN_SIZE):
    """Rewrites `model` (an fp32 kformer ONNX file, Loop bodies included) in place: every MatMul by
    a constant matrix of at least `min_size` values (an initializer or the Transpose of one, or the
    tied output projection's Gemm by the transposed table) becomes a MatMulNBits, with the bias Add
    after it as its bias input. Each matrix is quantized once, however many nodes read it. Returns
    how many nodes."""
    graph = model.graph
    constants = {i.name: i for i in graph.initializer}
    transposed = _transposed_constants(graph, constants)
    quantized = {}  # weight name -> the names of its (values, scales, zero points)

    def weight_of(name):
        if name in constants:
            return numpy_helper.to_array(constants[name])
        if name in transposed:
            return numpy_helper.to_array(constants[transposed[name]]).T
        return None

    def inputs_for(name, weight):
        if name not in quantized:
            values, scales = quantize_blocks(weight, block)
            stem = name.replace(":", "_")
            names = (f"{stem}/nbits", f"{stem}/nbits_scales", f"{stem}/nbits_zero_points")
            graph.initializer.extend(
                [
                    numpy_helper.from_array(values, names[0]),
                    numpy_helper.from_array(scales, names[1]),
                    numpy_helper.from_array(np.full(scales.shape, ZERO_POINT, np.uint8), names[2]),
                ]
            )
            quantized[name] = names
        return quantized[name]

    count = 0
    for g in onnx_rewrite.graphs(graph):
        readers = {}
        for node in g.node:
            for name in node.input:
                readers.setdefault(name, []).append(node)
        nodes, fused = [], set()
        for node in g.node:
            if id(node) in fused:
                continue
            weight, key = _constant_product(node, weight_of)
            if weight is None or weight.ndim != 2 or weight.size < min_size:
                nodes.append(node)
                continue
            inputs = [node.input[0], *inputs_for(key, weight)]
            output = node.output[0]
            rows, columns = weight.shape
            bias = _bias_add(readers.get(output, []), output, constants, columns)
            if bias is not None:  # MatMulNBits' inputs 4 and 5: group indices (none), bias
                inputs += ["", bias[1]]
                fused.add(id(bias[0]))
                output = bias[0].output[0]
            nodes.append(
                helper.make_node(
                    "MatMulNBits",
                    inputs,
                    [output],
                    domain=DOMAIN,
                    name=f"{node.name or output}/nbits",
                    K=rows,
                    N=columns,
                    bits=8,
                    block_size=block,
                    accuracy_level=4,  # int8 products; activations quantized per row and block
                )
            )
            count += 1
        del g.node[:]
        g.node.extend(nodes)
    onnx_rewrite.prune(graph)
    if not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    return count


def _constant_product(node, weight_of):
    """(W (K, N), a name for W) when `node` multiplies by a constant matrix W: a MatMul's right
    operand, or the table E of the tied output projection's Gemm(x, E, transB=1) (W = E^T; not one
    with a bias or scaling); (None, None) otherwise."""
    if node.op_type == "MatMul":
        return weight_of(node.input[1]), node.input[1]
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    plain = len(node.input) == 2 and attributes.get("alpha", 1.0) == 1.0 and not attributes.get("transA")
    if node.op_type == "Gemm" and plain and attributes.get("transB") == 1:
        table = weight_of(node.input[1])
        return (None, None) if table is None else (table.T, node.input[1] + "_t")
    return None, None


def _bias_add(readers, product, constants, columns):
    """(the Add node, the bias name) when the product's only reader adds a constant (N,) vector."""
    if len(readers) != 1 or readers[0].op_type != "Add":
        return None
    add = readers[0]
    bias = add.input[1] if add.input[0] == product else add.input[0]
    if bias in constants and list(constants[bias].dims) == [columns]:
        return add, bias
    return None

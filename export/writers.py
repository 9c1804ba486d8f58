"""Write one format from an ExportModule, and check what the converter produced.

A converter that succeeds proves nothing: every writer checks the artifact's operator list and
fails loudly on anything the light runtimes cannot run. Parity is checked by the exporter."""

import logging
import os

import tensorflow as tf

from export import onnx_rewrite
from export.runtime import VARIANTS, ExportError

ONNX_OPSET = 17
SEARCH_LOOPS = (
    2  # a search runs in two passes, each one loop: an ONNX Loop, a TFLite WHILE (search._in_two_passes)
)


# --- SavedModel ---


def write_savedmodel(module, path):
    signatures = {
        f"{search}_{kind}": getattr(module, f"{search}_{kind}").get_concrete_function()
        for search in ("greedy", "beam")
        for kind in ("ids", "text")
    }
    tf.saved_model.save(module, path, signatures=signatures)
    return path


# --- TFLite ---


def write_tflite(module, path, variant="fp32"):
    """Frozen graph -> TFLite with builtin ops only: both searches in one file, as the signatures
    "greedy" and "beam", which share one copy of the weights (the converter stores equal constants
    once). fp16: float16 weights; int8: dynamic-range quantized weights
    (activations stay float); fixed: fp32 with the input shape fixed to (1, max_source_length), for
    LiteRT.js in the web page, which cannot resize inputs."""
    functions = []
    for name in ("greedy", "beam"):
        function = module.frozen(name, variant == "fixed")
        function.graph.name = name  # the signature's name
        functions.append(function)
    converter = tf.lite.TFLiteConverter.from_concrete_functions(functions, module)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]  # no Flex fallback
    if variant == "fp16":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.target_spec.supported_types = [tf.float16]
    elif variant == "int8":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    elif variant not in ("fp32", "fixed"):
        raise ValueError(f"unknown TFLite variant {variant!r}; choose from {VARIANTS['tflite']}")
    try:
        flatbuffer = converter.convert()
    except Exception as e:  # the converter raises ConverterError and friends
        raise ExportError(f"TFLite conversion of the searches failed: {e}") from None
    check_tflite_ops(flatbuffer, path)
    with open(path, "wb") as f:
        f.write(flatbuffer)
    return path


def tflite_operators(flatbuffer):
    """Names of the operators in a TFLite flatbuffer: builtins by name, others by custom code."""
    from tensorflow.lite.python import schema_py_generated as schema

    model = schema.ModelT.InitFromObj(schema.Model.GetRootAsModel(flatbuffer, 0))
    names = {value: name for name, value in vars(schema.BuiltinOperator).items() if not name.startswith("_")}
    ops = set()
    for code in model.operatorCodes:
        builtin = max(code.builtinCode, code.deprecatedBuiltinCode)
        if builtin == schema.BuiltinOperator.CUSTOM:
            ops.add("CUSTOM:" + bytes(code.customCode or b"").decode())
        else:
            ops.add(names.get(builtin, str(builtin)))
    return ops


def check_tflite_ops(flatbuffer, path):
    bad = sorted(op for op in tflite_operators(flatbuffer) if op.startswith("CUSTOM:"))
    if bad:
        raise ExportError(f"{path}: Flex/custom ops {bad} would need the TensorFlow runtime; builtins only")


# --- ONNX ---


def write_onnx(module, path):
    """Frozen graph -> one ONNX file with both searches: inputs source_ids (B, S) int32 and beam
    (a bool scalar), outputs tokens (B, N, T) and scores (B, N), N = 1 for greedy search. Each
    pass of each search is an ONNX Loop (see ExportModule._either), the weights stored once;
    standard ops only."""
    import onnx
    import tf2onnx

    frozen = module.frozen("either")
    output_names = [t.name for t in frozen.outputs]
    # Freezing flattens the {"tokens", "scores"} dict: tokens are the int32 output, scores float32.
    by_name = {("tokens" if t.dtype == tf.int32 else "scores"): t.name for t in frozen.outputs}
    logging.getLogger("tf2onnx").setLevel(logging.ERROR)  # it warns per loop variable at INFO/WARNING
    try:
        proto, _ = tf2onnx.convert.from_graph_def(
            frozen.graph.as_graph_def(),
            input_names=[t.name for t in frozen.inputs],
            output_names=output_names,
            opset=ONNX_OPSET,
        )
    except Exception as e:
        raise ExportError(f"ONNX conversion of the searches failed: {e}") from None
    _rename_io(proto, {t.name: t.name.split(":")[0] for t in frozen.inputs}, by_name)
    onnx_rewrite.simplify(proto.graph, ONNX_OPSET)  # weights once, fewer nodes per decoding step
    check_onnx(proto, path)
    onnx.save(proto, path)
    return path


def _rename_io(proto, inputs, outputs):
    """Gives the graph the names of the manifest (source_ids, beam -> tokens, scores) through
    Identity nodes, leaving tf2onnx's internal names (also used inside subgraphs) untouched.
    inputs: {tf2onnx name: public name}; outputs: {public name: tf2onnx name}."""
    from onnx import helper

    graph = proto.graph
    for graph_input in graph.input:
        internal, graph_input.name = graph_input.name, inputs[graph_input.name]
        graph.node.insert(
            0, helper.make_node("Identity", [graph_input.name], [internal], name=f"{graph_input.name}_in")
        )
    for output in graph.output:
        public = next(k for k, v in outputs.items() if v == output.name)
        graph.node.append(helper.make_node("Identity", [output.name], [public], name=f"{public}_out"))
        output.name = public


def write_onnx_text(core_path, tokenizer_proto, config, path):
    """Text in, text out: SentencePiece ops of onnxruntime-extensions around the core searches."""
    import onnx

    from export.onnx_text import build_text_model

    proto = build_text_model(onnx.load(core_path), tokenizer_proto, config, ONNX_OPSET)
    # The searches' Loops, and the per-row SentencepieceDecoder Loop of the text graph.
    check_onnx(proto, path, extra_domains=("ai.onnx.contrib",), top_level_loops=2 * SEARCH_LOOPS + 1)
    onnx.save(proto, path)
    return path


def onnx_nodes(graph):
    """Every node of a graph, including the bodies of Loop/If/Scan."""
    for node in graph.node:
        yield node
        for subgraph in onnx_rewrite.subgraphs(node):
            yield from onnx_nodes(subgraph)


def check_onnx(proto, path, extra_domains=(), top_level_loops=2 * SEARCH_LOOPS):
    """Standard domains only, a top-level Loop per pass of each search (plus those of the text
    graph), and onnx.checker's approval."""
    import onnx

    allowed = ("", "ai.onnx", *extra_domains)
    bad = sorted({f"{n.domain}:{n.op_type}" for n in onnx_nodes(proto.graph) if n.domain not in allowed})
    if bad:
        raise ExportError(f"{path}: non-standard ONNX ops {bad} (tf2onnx exits 0 even when it leaves these)")
    loops = sum(1 for n in proto.graph.node if n.op_type == "Loop")
    if loops != top_level_loops:
        raise ExportError(
            f"{path}: expected {top_level_loops} top-level ONNX Loop(s) (one per pass of each search), "
            f"found {loops}"
        )
    try:
        onnx.checker.check_model(proto, full_check=True)
    except onnx.checker.ValidationError as e:
        raise ExportError(f"{path}: onnx.checker rejected the model: {e}") from None


def quantize_onnx(source, path, min_size=65536):
    """int8 weights, fp32 arithmetic. Each float matrix of at least `min_size` values is stored as
    int8 with one fp32 scale per output column (per row for an embedding table) and restored by a
    Cast and a Mul in the main graph, outside the decoding Loop, which onnxruntime folds into a
    constant when it loads the file. The file shrinks ~4x; translations keep fp32's properties: they
    do not depend on the other sentences of a batch, and onnxruntime-web gives onnxruntime's.
    (onnxruntime's dynamic quantization scales activations by their batch-wide range: 13% of the
    demo model's test sentences changed between batch 1 and 32. Its MatMulNBits kernels quantize
    per row, but onnxruntime-web gave other tokens than onnxruntime, and on AVX2 they were slower
    than fp32 at batch 32.)"""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(source)
    graph = model.graph
    uses = {}  # initializer name -> {(op type, input index)}, Loop body included
    for node in onnx_nodes(graph):
        for index, name in enumerate(node.input):
            uses.setdefault(name, set()).add((node.op_type, index))
    kept, restore = [], []
    for weight in graph.initializer:
        values = numpy_helper.to_array(weight)
        if weight.data_type != onnx.TensorProto.FLOAT or values.ndim != 2 or values.size < min_size:
            kept.append(weight)
            continue
        # A MatMul's right operand (K, N) gets a scale per column; a lookup table (V, D) one per row.
        axis = 0 if uses.get(weight.name) == {("MatMul", 1)} else 1
        scale = np.abs(values).max(axis=axis, keepdims=True) / 127.0
        scale = np.where(scale > 0, scale, 1.0).astype(np.float32)
        quantized = np.clip(np.round(values / scale), -127, 127).astype(np.int8)
        kept += [
            numpy_helper.from_array(quantized, weight.name + "/int8"),
            numpy_helper.from_array(scale, weight.name + "/scale"),
        ]
        restore += [
            helper.make_node(
                "Cast", [weight.name + "/int8"], [weight.name + "/float"], to=onnx.TensorProto.FLOAT
            ),
            helper.make_node("Mul", [weight.name + "/float", weight.name + "/scale"], [weight.name]),
        ]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    nodes = restore + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
    check_onnx(model, path)
    onnx.save(model, path)
    return path


def file_size(path):
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)
    return os.path.getsize(path)


# --- CTranslate2 (optional extra `ctranslate2`) ---


def write_ctranslate2(module, path, tokenizer_proto, variant="fp32"):
    """The same weights as a CTranslate2 TransformerSpec (post- or pre-LN as trained), written to
    the folder `path`. Set explicitly where CTranslate2's defaults differ from kformer: the
    interleaved sinusoid table, epsilon 1e-6, the tied output projection, the SentencePiece pieces
    as vocabulary. int8: CTranslate2's own weight quantization. Its greedy search gives Keras'
    tokens (checked by the exporter); its beam search normalizes length differently from GNMT's
    ((5 + len) / 6)^alpha, so beam outputs may differ."""
    import numpy as np
    from ctranslate2.specs import common_spec, transformer_spec

    model, c = module.translator.model, module.config

    def weights(layer):
        return [np.asarray(w) for w in layer.get_weights()]

    def linear(spec, kernel, bias):  # kernel (inputs..., outputs) -> CTranslate2's (outputs, inputs)
        spec.weight = kernel.reshape(-1, kernel.shape[-1]).T.copy()
        spec.bias = bias

    def fused(
        spec, layers
    ):  # projections of one input, kernels (M, H, D), stacked as CTranslate2 stores them
        pairs = [weights(layer) for layer in layers]
        spec.weight = np.concatenate([k.reshape(k.shape[0], -1).T for k, _ in pairs])
        spec.bias = np.concatenate([b.reshape(-1) for _, b in pairs])

    def attention(spec, layer, norm, self_attention):
        projections = [layer.query, layer.key, layer.value]
        if self_attention:
            fused(spec.linear[0], projections)
        else:
            fused(spec.linear[0], projections[:1])
            fused(spec.linear[1], projections[1:])
        linear(spec.linear[-1], *weights(layer.output_projection))
        spec.layer_norm.gamma, spec.layer_norm.beta = weights(norm)

    def feed_forward(spec, block):
        linear(spec.linear_0, *weights(block.feed_forward.inner))
        linear(spec.linear_1, *weights(block.feed_forward.outer))
        spec.layer_norm.gamma, spec.layer_norm.beta = weights(block.feed_forward_norm)

    activation = {"relu": common_spec.Activation.RELU, "gelu": common_spec.Activation.GELU}[c.activation]
    spec = transformer_spec.TransformerSpec.from_config(
        (c.num_encoder_layers, c.num_decoder_layers),
        c.num_heads,
        pre_norm=c.norm_position == "pre",
        activation=activation,
    )
    source_embedding = weights(model.source_embedding)[0]
    target_embedding = weights(model.target_embedding)[0]
    spec.encoder.embeddings[0].weight = source_embedding
    spec.decoder.embeddings.weight = target_embedding
    spec.encoder.position_encodings.encodings = np.asarray(model.source_positions.table)
    spec.decoder.position_encodings.encodings = np.asarray(model.target_positions.table)
    if model.output_projection is None:
        spec.decoder.projection.weight = target_embedding  # tied: logits = x E^T
    else:
        linear(spec.decoder.projection, *weights(model.output_projection))
    for stack, norm in ((spec.encoder, model.encoder_norm), (spec.decoder, model.decoder_norm)):
        if norm is not None:
            stack.layer_norm.gamma, stack.layer_norm.beta = weights(norm)
    for layer_spec, block in zip(spec.encoder.layer, model.encoder_blocks):
        attention(layer_spec.self_attention, block.self_attention, block.self_attention_norm, True)
        feed_forward(layer_spec.ffn, block)
    for layer_spec, block in zip(spec.decoder.layer, model.decoder_blocks):
        attention(layer_spec.self_attention, block.self_attention, block.self_attention_norm, True)
        attention(layer_spec.attention, block.cross_attention, block.cross_attention_norm, False)
        feed_forward(layer_spec.ffn, block)

    import sentencepiece as spm

    tokenizer = spm.SentencePieceProcessor(model_proto=tokenizer_proto)
    pieces = [tokenizer.id_to_piece(i) for i in range(c.vocab_size)]
    spec.register_source_vocabulary(pieces)
    spec.register_target_vocabulary(pieces)
    for name in ("unk", "bos", "eos"):  # spec.config.unk_token = the piece of config.unk_id, ...
        setattr(spec.config, f"{name}_token", tokenizer.id_to_piece(getattr(c, f"{name}_id")))
    spec.config.decoder_start_token = spec.config.bos_token
    spec.config.layer_norm_epsilon = 1e-6
    spec.validate()
    spec.optimize(quantization=None if variant == "fp32" else "int8")
    os.makedirs(path)
    spec.save(path)
    return path

"""ONNX: standard operators only; each variant is a folder of a file per search.

`onnx/<variant>/greedy.onnx` and `beam.onnx`: inputs source_ids (B, S) int32 and the search's
options (alpha for beam search only, max_length, no_repeat_ngram); outputs tokens (B, T) and scores
(B,) (greedy), (B, K, T) and (B, K) (beam), as TFLite's signatures. Each pass of the search is one
ONNX Loop. Both files read their weights from `weights.bin` beside them (ONNX external data, each
tensor once). onnxruntime prepacks the weights of every Loop body in a file when it loads it: a file
of both searches (a bool input choosing one) held them for four loops where a search runs two,
so a file per search loads and peaks lower at the same tokens and speed. The weights in a file of
their own are stored once for both searches, and the page fetches them once.

Variants: fp32; int8 (int8 weights, fp32 arithmetic); int8-ort (onnxruntime's int8 products,
kformer.export.onnx_ort; written with int8); text (text in, text out: onnxruntime-extensions'
SentencePiece ops around the fp32 graph). The runners need numpy, sentencepiece and onnxruntime
(and onnxruntime-extensions for text) only."""

import logging
import os
import pathlib

import numpy as np

from kformer.contracts.export import ExportManifest
from kformer.decode import text_batches
from kformer.export.artifact_format import SEARCHES, ExportError, Format, beside
from kformer.export.runner import SearchFilesRunner

OPSET = 17
WEIGHTS = "weights.bin"  # the weights of a variant's two search files, once
WEIGHT_ALIGNMENT = 4096  # each tensor's offset in it: a page, so that a runtime may map it
# A search's file has one Loop: its batch shrinks as rows are done (kformer.decode.search's drop_done;
# onnxruntime's Loops take shapes that change from step to step). `check` counts it: a converter
# that unrolled or dropped a loop fails.
SEARCH_LOOPS = 1


class Onnx(Format):
    name = "onnx"
    variants = ("fp32", "text", "int8", "int8-ort")  # fp32 first: the others are made from it
    extension = ".onnx"

    def runtime_variant(self, artifact_dir, variant):
        """int8 -> int8-ort where the export has it: onnxruntime's int8 kernels instead of fp32
        products of int8 weights restored at load."""
        own = f"{variant}-ort"
        listed = {e.variant for e in ExportManifest.load(artifact_dir).artifacts if e.format == self.name}
        return own if own in listed else variant

    def files_per_search(self, variant):
        return True

    def shared_files(self, variant):
        return {"weights": f"{self.file(variant)}/{WEIGHTS}"}

    def write(self, module, path, variant="fp32"):
        os.makedirs(path, exist_ok=True)
        fp32 = beside(path, "fp32", self)
        files = {search: self.search_file(path, search) for search in SEARCHES}
        models = {
            s: _search_model(module, file, variant, s, self.search_file(fp32, s)) for s, file in files.items()
        }
        save_sharing_weights(models, files, os.path.join(path, WEIGHTS))

    def runner_class(self, variant):
        return OnnxTextRunner if variant == "text" else OnnxRunner


def _search_model(module, path, variant, search, fp32):
    """The checked model of one search's file `path` of a variant; `fp32`: that search's fp32 file
    (written first)."""
    import onnx

    domains = ()  # beyond the standard ones
    if variant == "fp32":
        proto = convert(module, search)
    elif variant == "int8":
        proto = quantize(onnx.load(fp32))
    elif variant == "int8-ort":
        from kformer.export import onnx_ort

        proto = onnx.load(fp32)
        onnx_ort.matmul_nbits(proto)
        proto, domains = quantize(proto), (onnx_ort.DOMAIN,)  # the lookup table: int8, as in int8
    else:
        from kformer.data.vocabulary import graph_tables
        from kformer.export.onnx_text import build_text_model

        core = onnx.load(fp32)
        proto = build_text_model(core, graph_tables(module.tokenizer), module.config.to_dict(), OPSET)
        domains = ("ai.onnx.contrib",)  # its SentencePiece ops
    # The text graph adds a Loop of its own: SentencepieceDecoder row by row.
    check(proto, path, domains, SEARCH_LOOPS + (variant == "text"))
    return proto


def save_sharing_weights(models, paths, weights_path, min_bytes=1024):
    """Saves each model of {search: model} to its path in `paths`, every initializer of at least
    `min_bytes` moved to the one external-data file `weights_path` (beside them), each distinct
    tensor once: both searches' files then read the same weights."""
    import hashlib

    from onnx import TensorProto
    from onnx.external_data_helper import set_external_data

    offsets, blob = {}, bytearray()
    for model in models.values():
        for tensor in model.graph.initializer:
            data = tensor.raw_data
            if len(data) < min_bytes:
                continue
            key = (tensor.data_type, tuple(tensor.dims), hashlib.sha256(data).hexdigest())
            if key not in offsets:
                blob += bytes(-len(blob) % WEIGHT_ALIGNMENT)
                offsets[key] = len(blob)
                blob += data
            set_external_data(tensor, os.path.basename(weights_path), offset=offsets[key], length=len(data))
            tensor.ClearField("raw_data")
            tensor.data_location = TensorProto.EXTERNAL
    pathlib.Path(weights_path).write_bytes(blob)
    for search, model in models.items():
        pathlib.Path(paths[search]).write_bytes(model.SerializeToString())


def convert(module, search):
    """The frozen search ("greedy" or "beam") -> an ONNX model with the manifest's input and output
    names, simplified by onnx_rewrite (weights once, fewer nodes per decoding step)."""
    import tensorflow as tf
    import tf2onnx

    from kformer.export import onnx_rewrite

    frozen = module.frozen(search, "onnx")
    # Freezing flattens the {"tokens", "scores"} dict: tokens are the int32 output, scores float32.
    by_name = {("tokens" if t.dtype == tf.int32 else "scores"): t.name for t in frozen.outputs}
    logging.getLogger("tf2onnx").setLevel(logging.ERROR)  # it warns per loop variable at INFO/WARNING
    try:
        proto, _ = tf2onnx.convert.from_graph_def(
            frozen.graph.as_graph_def(),
            input_names=[t.name for t in frozen.inputs],
            output_names=[t.name for t in frozen.outputs],
            opset=OPSET,
        )
    except Exception as e:
        raise ExportError(f"ONNX conversion of the searches failed: {e}") from None
    _rename_io(proto, {t.name: t.name.split(":")[0] for t in frozen.inputs}, by_name)
    onnx_rewrite.simplify(proto.graph, OPSET)
    return proto


def _rename_io(proto, inputs, outputs):
    """Gives the graph the names of the manifest (source_ids, options -> tokens, scores) through
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


def nodes(graph):
    """Every node of a graph, including those of its Loop/If/Scan bodies."""
    from kformer.export import onnx_rewrite

    return (node for g in onnx_rewrite.graphs(graph) for node in g.node)


def check(proto, path, extra_domains=(), top_level_loops=SEARCH_LOOPS):
    """Standard domains only (tf2onnx exits 0 even when it leaves others), the search's one
    top-level Loop (plus that of the text graph), and onnx.checker's approval."""
    import onnx

    allowed = ("", "ai.onnx", *extra_domains)
    bad = sorted({f"{n.domain}:{n.op_type}" for n in nodes(proto.graph) if n.domain not in allowed})
    if bad:
        raise ExportError(f"{path}: non-standard ONNX ops {bad} (tf2onnx exits 0 even when it leaves these)")
    loops = sum(1 for n in proto.graph.node if n.op_type == "Loop")
    if loops != top_level_loops:
        raise ExportError(
            f"{path}: expected {top_level_loops} top-level ONNX Loop(s) (the search's, the text's), "
            f"found {loops}"
        )
    try:
        onnx.checker.check_model(proto, full_check=True)
    except onnx.checker.ValidationError as e:
        raise ExportError(f"{path}: onnx.checker rejected the model: {e}") from None


def quantize(model, min_size=65536):
    """int8 weights, fp32 arithmetic. Each float matrix of at least `min_size` values is stored as
    int8 with one fp32 scale per output column (per row for an embedding table) and restored by a
    Cast and a Mul in the main graph, outside the decoding Loop, which onnxruntime folds into a
    constant when it loads the file. The file is about a quarter of fp32's, and translations keep fp32's
    properties: they do not depend on the other sentences of a batch, and onnxruntime-web gives
    onnxruntime's. Not onnxruntime's dynamic quantization, which scales activations by their
    batch-wide range (a sentence's translation then depends on its batch), nor its MatMulNBits
    kernels (the int8-ort file, kformer.export.onnx_ort), which onnxruntime-web does not run to
    the same tokens."""
    import onnx
    from onnx import helper, numpy_helper

    graph = model.graph
    uses = {}  # initializer name -> {(op type, input index)}, Loop body included
    for node in nodes(graph):
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
    restored = restore + list(graph.node)
    del graph.node[:]
    graph.node.extend(restored)
    return model


def _session(path, threads, custom_ops=False):
    import onnxruntime as ort

    options = ort.SessionOptions()
    if custom_ops:
        from onnxruntime_extensions import get_library_path

        options.register_custom_ops_library(get_library_path())
    options.intra_op_num_threads = threads
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # onnxruntime's own arena (its default) keeps a call's buffers for the next: without it every
    # step's tensors come from malloc, a beam step's (rows, V) logits large ones: slower, most of
    # all for beam search, at about the same peak.
    options.enable_cpu_mem_arena = True
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


class OnnxRunner(SearchFilesRunner):
    """An ids variant (fp32, int8, int8-ort) in onnxruntime, its files opened as
    SearchFilesRunner says."""

    fmt = Onnx.name
    extension = Onnx.extension
    one_file_serves_both = False
    beam_capped = True
    concurrent_searches = True  # an InferenceSession's run may be called from several threads

    def open_file(self, path):
        return _session(path, self.threads)

    def _search(self, options, batch):
        feed = {"source_ids": batch, **options.inputs()}
        return tuple(self.opened(options.search).run(["tokens", "scores"], feed))


class OnnxTextRunner(OnnxRunner):
    """The text-in/text-out file (SentencePiece inside the graph). Use it in a process without
    TensorFlow: the onnxruntime-extensions library crashes next to TensorFlow and
    tensorflow-text, which bundle their own SentencePiece and protobuf."""

    concurrent_searches = False

    def __init__(self, artifact_dir, variant="text", settings=None, options=None):
        super().__init__(artifact_dir, "text", settings, options)

    def open_file(self, path):
        return _session(path, self.threads, custom_ops=True)

    def translations(self, texts, options=None):
        """As Runner's: the text split into units here, each unit's text tokenized in the graph;
        the best translation only (the file returns no alternatives or scores: nbest 1, score 0)."""
        options = self.checked(options)
        if options.nbest > 1:
            raise ValueError(
                "the text ONNX file returns one translation per text; use --variant fp32 for --nbest"
            )

        def translate_units(units):  # in the length-sorted batches of the id runners
            outputs = [None] * len(units)
            ids = [u.ids for u in units]
            sentences, tokens = self.sentences_per_call(options), self.tokens_per_call(options)
            for chunk, _ in text_batches.length_sorted_batches(ids, sentences, tokens):
                feed = {"text": np.array([units[i].text for i in chunk], dtype=object), **options.inputs()}
                for i, translation in zip(chunk, self.opened(options.search).run(["translation"], feed)[0]):
                    outputs[i] = [(str(translation), 0.0)]
            return outputs

        c = self.config
        return text_batches.translate_texts(
            self.tokenizer, texts, c.max_source_length, translate_units, self.joiner
        )

    def _search(self, options, batch):
        raise TypeError("the text ONNX file takes text; use OnnxRunner for token ids")


FORMAT = Onnx()

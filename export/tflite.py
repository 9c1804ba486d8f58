"""TFLite: builtin operators only; the searches are the signatures "greedy" and "beam".

Variants: fp32; fp16 (float16 weights); int8 (dynamic-range quantized weights, float
activations); fixed, fp16-fixed and int8-fixed (each precision's one file of both searches, with
the input shape fixed to (1, max_source_length) and outputs of fixed shapes: for LiteRT.js in the
web page, which cannot resize inputs, and for LiteRT's CompiledModel, which sizes outputs before a
call); text and int8-text (UTF-8 in and out, the sentences, SentencePiece and joining inside the
file: kformer.export.text_graph); fixed-text (text in and out with inputs and outputs of one shape,
one text a call, for LiteRT.js: it plans every input and output once, and ran a text file's
outputs, sized by the text, out of bounds). The runners need numpy, sentencepiece and ai-edge-litert
only.

Files: each variant but those of ONE_FILE is a folder of one file per search,
`tflite/fp32/greedy.tflite` and `tflite/fp32/beam.tflite`, each with the weights once. At its first
call, LiteRT's Interpreter has XNNPACK pack the weights of every loop in the file, whichever search
the call runs: a file of both searches held the packed decoder and output projection four times,
for two loops, so a file per search peaks lower at the same tokens and speed. A device ships the
file of the search it runs; the runner opens its default search's file, and the other's when that
search first runs. The variants of ONE_FILE are one file of both searches: the page downloads it
once and switches searches at run time, and CompiledModel with XNNPACK's weight cache packs each
weight once for both searches' loops."""

import os
import threading

import numpy as np

from kformer.decode.options import SearchOptions
from kformer.decode.text_batches import Hypothesis, Translation
from kformer.export import memory
from kformer.export.artifact_format import SEARCHES, ExportError, Format, quantization
from kformer.export.runner import SearchFilesRunner

FIXED = "fixed"  # one file of both searches, input (1, max_source_length), fp32
FIXED_IDS = (FIXED, "fp16-fixed", "int8-fixed")  # the same file in each precision
TEXT = "text"  # UTF-8 in and out, the text work in the graph (kformer.export.text_graph)
FIXED_TEXT = "fixed-text"  # one file of both searches, one text of at most FIXED_TEXT_BYTES a call
ONE_FILE = (*FIXED_IDS, FIXED_TEXT)  # the variants of one file of both searches, for the page

# One LiteRT call at a time in a process, whichever runner makes it: two runners' interpreters run
# from two threads at once (each interpreter in one thread) failed in most runs (demo model, 500
# test sentences: "gather index out of bounds", "scatter_nd index out of bounds", a failed check in
# subgraph.cc), also with their files' pages kept (export/memory.py not called).
_ONE_CALL_AT_A_TIME = threading.Lock()


class Tflite(Format):
    name = "tflite"
    variants = ("fp32", "fp16", "int8", *FIXED_IDS, TEXT, "int8-text", FIXED_TEXT)
    extension = ".tflite"
    text_graph_only = (TEXT, "int8-text", FIXED_TEXT)  # kformer.export.text_graph holds the tokenizer

    def files_per_search(self, variant):
        """Every variant but those of ONE_FILE (see the module's doc)."""
        return variant not in ONE_FILE

    def write(self, module, path, variant="fp32"):
        if variant not in self.variants:
            raise ValueError(f"unknown TFLite variant {variant!r}; choose from {self.variants}")
        if variant in ONE_FILE:  # one pass, as `fixed`: no second loop for XNNPACK to pack
            _convert(module, path, variant, SEARCHES)
            return
        os.makedirs(path, exist_ok=True)
        for search in SEARCHES:
            _convert(module, self.search_file(path, search), variant, [search])

    def runner_class(self, variant):
        return TfliteTextRunner if variant in self.text_graph_only else TfliteRunner


def _convert(module, path, variant, searches):
    """Frozen searches (an unfrozen loop converts, then fails at invoke with READ_VARIABLE) -> one
    flatbuffer with a signature named after each search (the converter stores equal constants
    once), checked for builtins only. The text variants' searches take and give text
    (module.frozen_text)."""
    # Fixed key/value buffers: LiteRT re-plans a loop body whose shapes change at every step,
    # which made greedy search slower with caches that grow.
    fixed = variant in ONE_FILE
    frozen = module.frozen_text if variant in Tflite.text_graph_only else module.frozen
    functions = {
        name: frozen(name, "tflite-fixed" if fixed else "tflite", fixed_shape=fixed) for name in searches
    }
    write_flatbuffer(functions, path, variant)


def write_flatbuffer(functions, path, variant):
    """{signature name: frozen concrete function} -> the file `path`, converted with builtins only
    and quantized as `variant` says (its quantization: fp16, int8, or none)."""
    import tempfile

    import tensorflow as tf

    quantized = quantization(variant)
    # Through a SavedModel of the functions, as from_concrete_functions converts, but keeping the
    # name of a lone signature (from_concrete_functions calls it "serving_default").
    with tempfile.TemporaryDirectory() as saved:
        tf.saved_model.save(tf.Module(), saved, signatures=functions)
        converter = tf.lite.TFLiteConverter.from_saved_model(saved, signature_keys=list(functions))
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]  # no Flex fallback
        if quantized in ("fp16", "int8"):
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
        if quantized == "fp16":
            converter.target_spec.supported_types = [tf.float16]
        try:
            flatbuffer = converter.convert()
        except Exception as e:  # the converter raises ConverterError and friends
            raise ExportError(f"TFLite conversion of {sorted(functions)} failed: {e}") from None
    # Each TOPK_V2 keeps the converter's signature (batch -1): LiteRT sizes its outputs as the loop
    # runs. With its input's signature removed (outputs sized when the graph is prepared), some
    # fresh interpreters gave other tokens on a call after one of another shape
    # (test_fresh_tflite_interpreters_agree; seen on AVX-512 FP16 CPUs, never without the XNNPACK
    # delegate, which makes that input), for no gain in speed or memory.
    if quantized == "fp16":
        flatbuffer = fp16_products_in_xnnpack(flatbuffer)
    check_ops(flatbuffer, path)
    with open(path, "wb") as f:
        f.write(flatbuffer)


def fp16_products_in_xnnpack(flatbuffer):
    """The fp16 flatbuffer with every loop body's FULLY_CONNECTED reading its weights from a
    DEQUANTIZE of a float16 constant of the body (the buffer shared, no bytes added).

    XNNPACK runs a product whose weights are a DEQUANTIZE of a float16 constant; the converter
    dequantizes the tied embedding table (source and target lookups, output projection) once, in
    the main graph, and hands it to the loops as an input, so the output projection, the largest
    product of a step, ran in TFLite's own kernel: it packed the table at every step, its sums
    depended on the batch size, and the file took far longer than fp32's."""
    from tensorflow.lite.python import schema_py_generated as schema
    from tensorflow.lite.tools import flatbuffer_utils

    model = flatbuffer_utils.read_model_from_bytearray(bytearray(flatbuffer))
    codes = builtin_codes(model)
    if schema.BuiltinOperator.DEQUANTIZE not in codes:
        return flatbuffer
    dequantize = codes.index(schema.BuiltinOperator.DEQUANTIZE)
    for graph in model.subgraphs:
        # tensor -> its float16 constant, for the outputs of this graph's DEQUANTIZEs of one
        halves = {
            op.outputs[0]: graph.tensors[op.inputs[0]]
            for op in graph.operators
            if op.opcodeIndex == dequantize and graph.tensors[op.inputs[0]].type == schema.TensorType.FLOAT16
        }
        for op in graph.operators:
            if codes[op.opcodeIndex] == schema.BuiltinOperator.WHILE:
                body = model.subgraphs[op.builtinOptions.bodySubgraphIndex]
                constants = {body.inputs[i]: halves[t] for i, t in enumerate(op.inputs) if t in halves}
                _dequantize_in_body(body, constants, codes, dequantize, schema)
    return flatbuffer_utils.convert_object_to_bytearray(model)


def _dequantize_in_body(body, constants, codes, dequantize, schema):
    """Rewires the FULLY_CONNECTED weights of `body` that are its inputs in `constants` (input
    tensor -> the float16 constant it was dequantized from) to a DEQUANTIZE of the constant, added
    to the body."""
    added, steps = {}, []  # body input -> its dequantized tensor in the body; the DEQUANTIZEs
    for op in body.operators:
        if codes[op.opcodeIndex] != schema.BuiltinOperator.FULLY_CONNECTED or op.inputs[1] not in constants:
            continue
        if op.inputs[1] not in added:
            source, half = body.tensors[op.inputs[1]], constants[op.inputs[1]]
            step = schema.OperatorT()
            step.opcodeIndex = dequantize
            step.inputs = [
                _add_tensor(body, half.shape, half.type, half.buffer, (half.name or b"") + b"/in_loop")
            ]
            step.outputs = [
                _add_tensor(body, source.shape, source.type, 0, (source.name or b"") + b"/dequantized")
            ]
            steps.append(step)
            added[op.inputs[1]] = step.outputs[0]
        op.inputs[1] = added[op.inputs[1]]
    body.operators[:0] = steps  # constants in, so first


def _add_tensor(graph, shape, dtype, buffer, name):
    """Appends a tensor to `graph` (buffer 0: none, its values computed); returns its index."""
    from tensorflow.lite.python import schema_py_generated as schema

    tensor = schema.TensorT()
    tensor.shape, tensor.type, tensor.buffer, tensor.name = shape, dtype, buffer, name
    graph.tensors.append(tensor)
    return len(graph.tensors) - 1


def builtin_codes(model):
    """The builtin operator of each of a flatbuffer model's operator codes (the larger of its two
    fields: codes past 127 live only in `builtinCode`)."""
    return [max(code.builtinCode, code.deprecatedBuiltinCode) for code in model.operatorCodes]


def operators(flatbuffer):
    """Names of the operators in a TFLite flatbuffer: builtins by name, others by custom code."""
    from tensorflow.lite.python import schema_py_generated as schema

    model = schema.ModelT.InitFromObj(schema.Model.GetRootAsModel(flatbuffer, 0))
    names = {value: name for name, value in vars(schema.BuiltinOperator).items() if not name.startswith("_")}
    ops = set()
    for code, builtin in zip(model.operatorCodes, builtin_codes(model)):
        if builtin == schema.BuiltinOperator.CUSTOM:
            ops.add("CUSTOM:" + bytes(code.customCode or b"").decode())
        else:
            ops.add(names.get(builtin, str(builtin)))
    return ops


def check_ops(flatbuffer, path):
    """A converter that succeeds proves nothing: Flex or custom ops need the TensorFlow runtime."""
    bad = sorted(op for op in operators(flatbuffer) if op.startswith("CUSTOM:"))
    if bad:
        raise ExportError(f"{path}: Flex/custom ops {bad} would need the TensorFlow runtime; builtins only")


class TfliteRunner(SearchFilesRunner):
    """A TFLite variant in LiteRT, its files opened as SearchFilesRunner says. The "fixed" file
    runs one padded row at a time."""

    fmt = Tflite.name
    extension = Tflite.extension
    beam_shares_batch = True
    beam_capped = True
    width_input = "source_ids"  # the input whose width the fixed file fixes

    def __init__(self, artifact_dir, variant="fp32", settings=None, options=None):
        super().__init__(artifact_dir, variant, settings, options)
        self.signatures = {}  # search -> (its signature's runner, input length), once asked for

    def open_file(self, path):
        """LiteRT's interpreter of one file."""
        from ai_edge_litert.interpreter import Interpreter

        # Delegate clustering off: with LiteRT's default, an interpreter made after another of the
        # same file was freed now and then gave other scores or tokens on its first call
        # (test_fresh_tflite_interpreters_agree). Tensors are not kept apart
        # (experimental_preserve_all_tensors is slower and not needed for the
        # decoding graphs as they are written now; the same test guards it).
        return Interpreter(
            model_path=path, num_threads=self.threads, experimental_disable_delegate_clustering=True
        )

    def signature(self, search):
        """(LiteRT's runner of a search's signature, the width of its `width_input`: the fixed
        file's, or -1 for any), opening its file and packing its weights the first time (`_pack`),
        then dropping the file's pages (export/memory.py)."""
        if search not in self.signatures:
            runner = self.opened(search).get_signature_runner(search)
            width = runner.get_input_details()[self.width_input]["shape_signature"][1]
            self.signatures[search] = runner, width
            options = self.checked(
                SearchOptions(beam_size=1 if search == "greedy" else self.manifest.beam_size)
            )
            self._pack(runner, options, width)
            memory.drop_file_pages(self.file_of(search))
        return self.signatures[search]

    def _pack(self, runner, options, length):
        """Has XNNPACK pack the search's weights now, in a call on a source of one token, before
        `signature` drops the file's pages (export/memory.py). A loop packs its weights, read from the mapped
        file, the first time it runs: in a first real call, the file's pages, the packed copies
        and the call's buffers were all resident at once, a higher fp32 peak. The call has the
        search's default options: capped at one output token (buffers of length 1), it left
        LiteRT's next, resized, call giving other tokens in some interpreters
        (test_fresh_tflite_interpreters_agree). kformer.decode.search's
        second pass is a loop of its own, packed by the first call that runs it; packing it here
        too (a call of 4 rows, all empty but one) left fp32 beam's peak higher."""
        one_token = np.full((1, 1 if length == -1 else length), self.config.eos_id, np.int32)
        self._invoke(runner, options, one_token)

    def _search(self, options, batch):
        with _ONE_CALL_AT_A_TIME:  # opening and packing a file included
            return self._search_alone(options, batch)

    def _search_alone(self, options, batch):
        signature, length = self.signature(options.search)
        if length != -1:  # the "fixed" file: rows cut or padded to the fixed length, run one at a time
            batch = np.pad(batch[:, :length], [(0, 0), (0, length - min(batch.shape[1], length))])
            rows = [self._invoke(signature, options, batch[row : row + 1]) for row in range(len(batch))]
            return tuple(np.concatenate(parts) for parts in zip(*rows))
        return self._invoke(signature, options, batch)

    @staticmethod
    def _invoke(signature, options, batch):
        results = signature(source_ids=batch, **options.inputs())  # resizes to the batch's (B, S)
        # Outputs by dtype: tokens are the int32 output, scores the float32 one.
        by_dtype = {value.dtype: value for value in results.values()}
        return by_dtype[np.dtype(np.int32)], by_dtype[np.dtype(np.float32)]


def utf8_batch(texts, width=-1):
    """texts -> (text (B, N) uint8 UTF-8, a row each, zeros after; lengths (B,) int32 in bytes),
    N = `width` where it is not -1 (the fixed-text file's). A lone surrogate (no UTF-8 of its own)
    becomes "?"; the file itself reads bad bytes as U+FFFD."""
    data = [t.encode("utf-8", errors="replace") for t in texts]
    longest = max([1, *map(len, data)])
    if width != -1 and longest > width:
        raise ValueError(
            f"a text of {longest:,} bytes; the fixed-text file takes at most {width:,} a call "
            "(split it at its lines, or run the text variant)"
        )
    batch = np.zeros((len(data), longest if width == -1 else width), np.uint8)
    for row, encoded in enumerate(data):
        batch[row, : len(encoded)] = np.frombuffer(encoded, np.uint8)
    return batch, np.array([len(d) for d in data], np.int32)


def _text(data, size):
    if size > len(data):  # the fixed-text file's translations are cut at its width
        raise ValueError(f"a translation of {size:,} bytes; the fixed-text file holds {len(data):,}")
    return bytes(data[:size]).decode("utf-8")


def call_text_signature(signature, options, text, lengths):
    """One call of a text file's signature: (UTF-8 (B, N) uint8, lengths (B,)) and checked
    options -> a text_batches.Translation a text (alternatives: beam search's, else the one)."""
    out = signature(text=text, lengths=lengths, **options.inputs())
    translations = []
    for row, size in enumerate(out["lengths"]):
        best = Hypothesis(_text(out["translation"][row], size), float(out["scores"][row]))
        alternatives = (best,)
        if "alternatives" in out:
            alternatives = tuple(
                Hypothesis(
                    _text(out["alternatives"][row, k], out["alternative_lengths"][row, k]), float(score)
                )
                for k, score in enumerate(out["alternative_scores"][row, : out["alternative_counts"][row]])
            )
        translations.append(Translation(best.text, best.score, alternatives))
    return translations


class TfliteTextRunner(TfliteRunner):
    """A text variant in LiteRT: each call takes a batch of texts; a text's sentences are found,
    translated and joined inside the file, its alternatives too."""

    width_input = "text"  # the fixed-text file's width: FIXED_TEXT_BYTES

    def _pack(self, runner, options, width):
        """The text signature's weights packed by a first call on one short text (as
        TfliteRunner._pack, for the same reasons)."""
        call_text_signature(runner, options, *utf8_batch(["."], width))

    def translations(self, texts, options=None):
        """Texts -> text_batches.Translations, `sentences_per_call` texts a call, texts of similar
        sizes together (less padding, as the ids runners' length-sorted batches)."""
        options = self.checked(options)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        translations = [None] * len(texts)
        with _ONE_CALL_AT_A_TIME:
            signature, width = self.signature(options.search)
            # As the ids runners' calls (beam: fewer); the fixed-text file, one text a call.
            size = self.sentences_per_call(options) if width == -1 else 1
            for start in range(0, len(texts), size):
                chunk = order[start : start + size]
                found = call_text_signature(signature, options, *utf8_batch([texts[i] for i in chunk], width))
                for i, translation in zip(chunk, found):
                    translations[i] = translation
        return translations

    def _search(self, options, batch):
        raise TypeError("the text TFLite file takes text; use --variant fp32 for token ids")


FORMAT = Tflite()

"""TFLite: builtin operators only, both searches in one file as the signatures "greedy" and
"beam" (the converter stores equal constants once, so the weights are stored once).

Variants: fp32; fp16 (float16 weights); int8 (dynamic-range quantized weights, float
activations); fixed (fp32 with the input shape fixed to (1, max_source_length), for LiteRT.js in
the web page, which cannot resize inputs). The runner needs numpy, sentencepiece and
ai-edge-litert only."""

import numpy as np

from kformer.export.format import ExportError, Format
from kformer.export.runner import ArtifactRunner


class Tflite(Format):
    name = "tflite"
    variants = ("fp32", "fp16", "int8", "fixed")
    extension = ".tflite"

    def write(self, module, path, variant="fp32"):
        """Frozen searches (an unfrozen loop converts, then fails at invoke with READ_VARIABLE) ->
        one flatbuffer, checked for builtins only."""
        import tensorflow as tf

        if variant not in self.variants:
            raise ValueError(f"unknown TFLite variant {variant!r}; choose from {self.variants}")
        functions = []
        for name in ("greedy", "beam"):  # signatures with the inputs source_ids and the options
            # Fixed key/value buffers: LiteRT re-plans a loop body whose shapes change at every
            # step, which made greedy search 1.1-1.2x slower with caches that grow (demo model).
            function = module.frozen(name, variant == "fixed", fixed_buffers=True)
            function.graph.name = name  # the signature's name
            functions.append(function)
        converter = tf.lite.TFLiteConverter.from_concrete_functions(functions, module)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]  # no Flex fallback
        if variant in ("fp16", "int8"):
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
        if variant == "fp16":
            converter.target_spec.supported_types = [tf.float16]
        try:
            flatbuffer = converter.convert()
        except Exception as e:  # the converter raises ConverterError and friends
            raise ExportError(f"TFLite conversion of the searches failed: {e}") from None
        check_ops(flatbuffer, path)
        with open(path, "wb") as f:
            f.write(flatbuffer)

    def open(self, artifact_dir, variant="fp32", beam_size=None, threads=None, batch_size=32, **options):
        return TfliteRunner(artifact_dir, beam_size, variant, threads, batch_size, **options)


def operators(flatbuffer):
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


def check_ops(flatbuffer, path):
    """A converter that succeeds proves nothing: Flex or custom ops need the TensorFlow runtime."""
    bad = sorted(op for op in operators(flatbuffer) if op.startswith("CUSTOM:"))
    if bad:
        raise ExportError(f"{path}: Flex/custom ops {bad} would need the TensorFlow runtime; builtins only")


class TfliteRunner(ArtifactRunner):
    """A TFLite file in LiteRT. The "fixed" file runs one padded row at a time."""

    fmt = Tflite.name
    beam_shares_batch = True

    def __init__(self, artifact_dir, beam_size=None, variant="fp32", threads=None, batch_size=32, **options):
        from ai_edge_litert.interpreter import Interpreter

        super().__init__(artifact_dir, beam_size, variant, threads, batch_size, **options)
        # Delegate clustering off: with LiteRT's default, an interpreter made after another of the
        # same file was freed now and then gave other scores or tokens on its first call
        # (test_fresh_tflite_interpreters_agree). Tensors are not kept apart
        # (experimental_preserve_all_tensors costs 1.17-1.2x the time and is not needed for the
        # decoding graphs as they are written now; the same test guards it).
        interpreter = Interpreter(
            model_path=self.path, num_threads=self.threads, experimental_disable_delegate_clustering=True
        )
        self.signatures = {name: interpreter.get_signature_runner(name) for name in ("greedy", "beam")}
        # The fixed file's (1, max_source_length) input; (-1, -1) in the others.
        self.length = self.signatures["greedy"].get_input_details()["source_ids"]["shape_signature"][1]

    def _search(self, options, batch):
        if self.length != -1:  # the "fixed" file: rows cut or padded to the fixed length, run one at a time
            batch = np.pad(
                batch[:, : self.length], [(0, 0), (0, self.length - min(batch.shape[1], self.length))]
            )
            rows = [self._invoke(options, batch[row : row + 1]) for row in range(len(batch))]
            return tuple(np.concatenate(parts) for parts in zip(*rows))
        return self._invoke(options, batch)

    def _invoke(self, options, batch):
        signature = self.signatures[options.search]
        results = signature(source_ids=batch, **options.inputs())  # resizes to the batch's (B, S)
        # Outputs by dtype: tokens are the int32 output, scores the float32 one.
        by_dtype = {value.dtype: value for value in results.values()}
        return by_dtype[np.dtype(np.int32)], by_dtype[np.dtype(np.float32)]


FORMAT = Tflite()

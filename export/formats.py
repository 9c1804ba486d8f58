"""The registry of export formats, and `open_runner`: the one way to get a translator.

Listing the formats imports no converter or runtime (each format module imports them inside the
functions that use them); `open_runner` imports only the chosen runtime."""

from kformer.config import BEAM_SIZE, LENGTH_PENALTY
from kformer.export import ctranslate2, onnx, savedmodel, tflite

FORMATS = {fmt.name: fmt for fmt in (savedmodel.FORMAT, tflite.FORMAT, onnx.FORMAT, ctranslate2.FORMAT)}
DEFAULT_FORMATS = ("savedmodel", "tflite", "onnx")  # ctranslate2 is an optional extra
RUNTIMES = ("keras", *FORMATS)  # keras: the training folder's model, the reference
VARIANTS = {name: fmt.variants for name, fmt in FORMATS.items()}


def open_runner(
    path,
    runtime="keras",
    variant="fp32",
    beam_size=None,
    batch_size=32,
    threads=None,
    alpha=None,
    max_length=None,
):
    """A `kformer.export.runner.Runner`: `path` is a training directory for runtime "keras" (the
    reference; alpha and max_length apply) or a `kformer export` folder for the others (where they
    were fixed at export)."""
    if runtime not in RUNTIMES:
        raise ValueError(f"unknown runtime {runtime!r}; choose one of {RUNTIMES}")
    if runtime == "keras":
        if variant != "fp32":
            raise ValueError(f"--variant {variant} needs an exported runtime; the keras runtime is fp32")
        from kformer.translate import KerasRunner

        return KerasRunner(
            path,
            BEAM_SIZE if beam_size is None else beam_size,
            LENGTH_PENALTY if alpha is None else alpha,
            max_length,
            batch_size,
        )
    fmt = FORMATS[runtime]
    if variant not in fmt.variants:
        raise ValueError(f"--variant {variant} does not exist for {runtime}; choose one of {fmt.variants}")
    if alpha is not None or max_length is not None:
        raise ValueError("--alpha and --max-len are fixed when exporting; they apply to --runtime keras only")
    return fmt.open(path, variant, beam_size, threads, batch_size)

"""The registry of export formats, and `open_runner`: the one way to get a translator.

Listing the formats imports no converter or runtime (each format module imports them inside the
functions that use them); `open_runner` imports only the chosen runtime."""

from kformer.decode.runner import Runner, RunnerSettings
from kformer.export import ctranslate2, onnx, savedmodel, tflite

FORMATS = {fmt.name: fmt for fmt in (savedmodel.FORMAT, tflite.FORMAT, onnx.FORMAT, ctranslate2.FORMAT)}
DEFAULT_FORMATS = ("savedmodel", "tflite", "onnx")  # ctranslate2 is an optional extra
RUNTIMES = ("keras", *FORMATS)  # keras: the training folder's model, the reference
VARIANTS = {name: fmt.variants for name, fmt in FORMATS.items()}


def runs_batches_at_once(runtime, variant):
    """Whether `open_runner(..., parallel=N)` takes N > 1 for this runtime and variant."""
    return runtime in FORMATS and FORMATS[runtime].runner_class(variant).concurrent_searches


def open_runner(path, runtime="keras", variant="fp32", settings=None, options=None, weights="best"):
    """A `kformer.decode.runner.Runner`: `path` is a training directory for runtime "keras" (the
    reference) or a `kformer export` folder for the others. `settings`: a RunnerSettings (batch
    size, threads, batches at once); `options`: a SearchOptions over the runner's own defaults (an
    export's are in its manifest). `weights`: which of a training directory's
    (kformer.run_folder.weights_file); an export holds the weights it was made from. A runtime
    runs its own file of the variant where the export has one (onnxruntime: int8 -> int8-ort,
    kformer.export.onnx_ort); `open_listed` runs the file listed."""
    settings = settings or RunnerSettings()
    if runtime not in RUNTIMES:
        raise ValueError(f"unknown runtime {runtime!r}; choose one of {RUNTIMES}")
    if runtime == "keras":
        if variant != "fp32":
            raise ValueError(f"--variant {variant} needs an exported runtime; the keras runtime is fp32")
        if settings.parallel != 1:
            raise ValueError(
                f"--parallel {settings.parallel} needs an exported runtime: {Runner.PARALLEL_RUNTIMES}"
            )
        from kformer.decode.translator import KerasRunner

        return KerasRunner.open(path, weights, options, settings)
    if weights != "best":
        raise ValueError(
            f"--weights {weights} is for a training directory (--runtime keras); {path} is an export"
        )
    variant = FORMATS[runtime].runtime_variant(path, _listed(runtime, variant))
    return FORMATS[runtime].open(path, variant, settings, options)


def open_listed(artifact_dir, runtime, variant="fp32", settings=None, options=None):
    """The runner of the export's file of `variant` as its manifest lists it, never a runtime's
    own file in its place: what the export's check, the benches and the page's comparisons run."""
    return FORMATS[runtime].open(artifact_dir, _listed(runtime, variant), settings, options)


def _listed(runtime, variant):
    if runtime not in FORMATS:
        raise ValueError(f"unknown export runtime {runtime!r}; choose one of {tuple(FORMATS)}")
    if variant not in FORMATS[runtime].variants:
        raise ValueError(
            f"--variant {variant} does not exist for {runtime}; choose one of {FORMATS[runtime].variants}"
        )
    return variant

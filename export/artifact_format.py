"""What an export format is: its variants, its files, how each is written and run.

One module per format (savedmodel, tflite, onnx, ctranslate2) subclasses `Format`; the registry
of them is `kformer.export.formats`. A format module imports its converter and runtime only
inside the functions that use them, so that listing the formats imports neither."""

import os

QUANTIZATIONS = ("fp16", "int8")  # variants written only when asked for (`kformer export --quantize`)
SEARCHES = ("greedy", "beam")  # the files of a variant written as a file per search


class ExportError(RuntimeError):
    """A conversion that produced something unusable; the message says what and where."""


class Format:
    """One format of `kformer export`. Every variant it writes serves both searches: one file or
    folder, or a folder of a file per search (`files_per_search`), `greedy.<ext>` and
    `beam.<ext>`: a runtime then holds only what the search it runs needs, and a device ships
    only the file of its search.

    Subclasses set:
        name: the format's name in the CLI and the manifest.
        variants: its variants, in the order they are written (the first, fp32, before those
            made from it); those in QUANTIZATIONS only when asked for.
    and implement `write(module, path, variant)` (module: a `kformer.export.module.ExportModule`)
    and `runner_class(variant)`: the runner `open(artifact_dir, variant, settings, options)` makes.
    """

    name = None
    variants = ("fp32",)
    extension = ""  # of the file of each variant; "" for a folder

    def files_per_search(self, variant):
        """Whether `variant` is a folder of one file per search."""
        return False

    def file(self, variant):
        """The path of a variant's file (or folder of files per search) inside the export folder."""
        return f"{self.name}/{variant}" + ("" if self.files_per_search(variant) else self.extension)

    def search_file(self, path, search):
        """The file of `search` in the folder `path` of a variant written as a file per search."""
        return search_file(path, search, self.extension)

    def shared_files(self, variant):
        """{name: path inside the export folder} of the files a variant's search files share."""
        return {}

    def search_files(self, variant):
        """{search: its file's path inside the export folder (as the manifest writes paths)} of a
        variant of files per search."""
        return {search: f"{self.file(variant)}/{search}{self.extension}" for search in SEARCHES}

    # Variants whose graph tokenizes in its own operations (kformer.export.text_graph), which hold
    # only the SentencePiece models kformer trains: not written for another tokenizer.
    text_graph_only = ()

    def planned(self, quantize=(), text_graph=True):
        """The variants to write: every one that is not a quantization, and those asked for;
        without `text_graph` (the text graph cannot hold the tokenizer), none of `text_graph_only`."""
        return [
            v
            for v in self.variants
            if (quantization(v) not in QUANTIZATIONS or quantization(v) in quantize)
            and not (not text_graph and v in self.text_graph_only)
        ]

    def runtime_variant(self, artifact_dir, variant):
        """The variant the format's runtime runs when `variant` is asked for: itself, unless the
        format has a file of it in its runtime's own operators (ONNX's int8-ort)."""
        return variant

    def write(self, module, path, variant):
        raise NotImplementedError

    def runner_class(self, variant):
        """The kformer.export.runner.ArtifactRunner subclass that runs `variant`'s files."""
        raise NotImplementedError

    def open(self, artifact_dir, variant="fp32", settings=None, options=None):
        """The runner of `variant`: a RunnerSettings and SearchOptions as open_runner's."""
        return self.runner_class(variant)(artifact_dir, variant, settings, options)


def search_file(folder, search, extension):
    """The file of `search` ("greedy" or "beam") in the folder of a variant of files per search."""
    return os.path.join(folder, f"{search}{extension}")


def quantization(variant):
    """What a variant is a form of: "int8-ort" (onnxruntime's own int8 file) is int8."""
    return variant.split("-")[0]


def beside(path, variant, fmt):
    """The file of another variant of the same format, written before `path` in its folder."""
    return os.path.join(os.path.dirname(path), os.path.basename(fmt.file(variant)))

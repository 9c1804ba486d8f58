"""The runners of an export folder's files: a format's runner opens its file (or a file per
search) as the manifest names and verifies it, then runs `_search` on it."""

import os

from kformer.contracts import digests
from kformer.contracts.export import ArtifactError, ExportManifest
from kformer.data import vocabulary
from kformer.decode.options import SearchOptions
from kformer.decode.runner import Runner, RunnerSettings
from kformer.export.artifact_format import SEARCHES, search_file
from kformer.model.config import ModelConfig


def verified_path(artifact_dir, entry):
    """Absolute path of a manifest entry (a FileEntry), after checking that it exists, is in the
    export folder (no link out of it: the manifest's paths are inside it) and is intact."""
    path = os.path.join(artifact_dir, entry.file)
    if not os.path.exists(path):
        raise ArtifactError(f"{path} is missing (listed in manifest.json)")
    folder = os.path.realpath(artifact_dir)
    inside = [path, *(os.path.join(d, f) for d, _, names in os.walk(path) for f in names)]
    for found in inside:
        if os.path.commonpath([os.path.realpath(found), folder]) != folder:
            raise ArtifactError(
                f"{found} is outside the export folder (a link out of it); export the model again"
            )
    if digests.tree_sha256(path) != entry.sha256:
        raise ArtifactError(f"{path} is corrupted or truncated: its sha256 differs from manifest.json")
    return path


def load_tokenizer(artifact_dir, manifest):
    """The export's tokenizer, verified, and checked against the model's config."""
    path = verified_path(artifact_dir, manifest.tokenizer)
    tokenizer = vocabulary.open_tokenizer(artifact_dir, manifest.tokenizer.file)
    try:
        ModelConfig.from_dict(manifest.config, "manifest.json").check_tokenizer(tokenizer, path)
    except ValueError as e:
        raise ArtifactError(str(e)) from None
    return tokenizer


def refused_as_artifact(open_file, path, fmt):
    """open_file(path), where the runtime's refusal of a file (intact by its sha256, yet not one
    it can load) is an ArtifactError naming the file. Runtimes raise their own kinds (onnxruntime's
    derive from Exception alone), so every error of the opening counts."""
    try:
        return open_file(path)
    except Exception as e:  # noqa: BLE001 -- see above
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ArtifactError(
            f"{path}: {RUNTIME_NAMES.get(fmt, fmt)} cannot load it ({first}); export the model again"
        ) from None


RUNTIME_NAMES = {
    "onnx": "onnxruntime",
    "tflite": "LiteRT",
    "ctranslate2": "CTranslate2",
    "savedmodel": "TensorFlow",
}


class ArtifactRunner(Runner):
    """A runner of one file of a `kformer export` folder: the manifest and the tokenizer are read
    and verified first; `path` is the verified file of `fmt`'s `variant`. `settings`: a
    RunnerSettings; `options`: a SearchOptions over the manifest's defaults (its beam size: 1 or
    the exported K)."""

    fmt = None  # the format's name in the manifest

    def __init__(self, artifact_dir, variant="fp32", settings=None, options=None):
        settings = settings or RunnerSettings()
        self.artifact_dir, self.parallel = artifact_dir, self._checked_parallel(settings.parallel, variant)
        self.manifest = ExportManifest.load(artifact_dir)
        m = self.manifest
        tokenizer = load_tokenizer(artifact_dir, m)
        defaults = SearchOptions(m.beam_size, m.alpha, m.max_length, m.no_repeat_ngram)
        language = None if m.pair is None else m.pair.target
        config = ModelConfig.from_dict(m.config, "manifest.json")
        super().__init__(config, tokenizer, (options or SearchOptions()).over(defaults), settings, language)
        self.variant = variant
        self.threads = max(1, (settings.threads or os.cpu_count() or 1) // settings.parallel)  # each batch's
        self.path = verified_path(artifact_dir, m.artifact(self.fmt, variant))

    def _checked_parallel(self, parallel, variant):
        if not isinstance(parallel, int) or isinstance(parallel, bool) or parallel < 1:
            raise ValueError(f"parallel must be a whole number of batches, 1 or more; got {parallel!r}")
        if parallel > 1 and not self.concurrent_searches:
            raise ValueError(
                f"{self.fmt} {variant} runs one batch at a time; --parallel {parallel} needs "
                f"{self.PARALLEL_RUNTIMES}"
            )
        return parallel

    def checked(self, options=None):
        """As Runner's, and the beam size is one the file has (its buffers are shaped by it)."""
        options = super().checked(options)
        exported = self.manifest.beam_size
        if options.beam_size not in (1, exported):
            raise ArtifactError(
                f"this export has greedy search and beam size {exported}, not {options.beam_size}; "
                f"re-export with --beam {options.beam_size}"
            )
        return options


class SearchFilesRunner(ArtifactRunner):
    """A runner of a format whose variants are a folder of a file per search (`Format.
    files_per_search`): the file of its default search is opened at once, the other's when that
    search first runs. Where `one_file_serves_both`, a variant that is one file serves both
    searches (TFLite's `fixed`, and its exports written before the files per search). Subclasses
    implement `open_file(path)`."""

    extension = None  # of the format's files
    one_file_serves_both = True

    def __init__(self, artifact_dir, variant="fp32", settings=None, options=None):
        super().__init__(artifact_dir, variant, settings, options)
        self.handles = {}  # search -> the runtime's handle of the file that runs it, once opened
        self.opened(self.options.search)

    def open_file(self, path):
        """The runtime's handle of one file (a session, an interpreter)."""
        raise NotImplementedError

    def file_of(self, search):
        """The path of the file that runs `search`: its own, or the variant's one file."""
        return self.path if os.path.isfile(self.path) else search_file(self.path, search, self.extension)

    def opened(self, search):
        """The handle of the file that runs `search`, opening it the first time it is asked for."""
        if search not in self.handles:
            if not os.path.isfile(self.path):
                self.handles[search] = refused_as_artifact(self.open_file, self.file_of(search), self.fmt)
            elif self.one_file_serves_both:
                self.handles = dict.fromkeys(
                    SEARCHES, refused_as_artifact(self.open_file, self.path, self.fmt)
                )
            else:
                raise ArtifactError(
                    f"{self.path} is one file of both searches, as kformer wrote {self.fmt} before its "
                    "files per search; export the model again"
                )
        return self.handles[search]

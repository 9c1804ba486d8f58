"""The runners of an export folder's files: a format's runner opens its file (or a file per
search) as the manifest names and verifies it, then runs `_search` on it."""

import os

from kformer.decode.options import SearchOptions
from kformer.decode.runner import Runner
from kformer.export import manifest as manifest_lib
from kformer.export.format import SEARCHES, search_file


class ArtifactRunner(Runner):
    """A runner of one file of a `kformer export` folder: the manifest and the tokenizer are read
    and verified first; `path` is the verified file of `fmt`'s `variant`.

    Args: artifact_dir, beam_size (1 or the exported K; default K), variant, threads (default:
    all cores), batch_size (sentences per call in `translate`; see beam_shares_batch), parallel
    (batches that `translate` runs at once, each on threads // parallel of the threads; > 1 only
    where `concurrent_searches`), and search options (alpha, max_length, no_repeat_ngram, nbest;
    default: the manifest's).

    Why `parallel`: a decoding step of a batch is many small operations, which two threads share
    badly; two batches at a time on a thread each keep both cores busy (`kformer bench runtimes
    --parallel 2`). One sentence at a time runs on threads // parallel."""

    fmt = None  # the format's name in the manifest

    def __init__(
        self, artifact_dir, beam_size=None, variant="fp32", threads=None, batch_size=32, parallel=1, **options
    ):
        self.artifact_dir, self.parallel = artifact_dir, self._checked_parallel(parallel, variant)
        self.manifest = manifest_lib.load(artifact_dir)
        tokenizer = manifest_lib.load_tokenizer(artifact_dir, self.manifest)
        defaults = SearchOptions(
            beam_size=self.manifest["beam_size"],
            alpha=self.manifest["alpha"],
            max_length=self.manifest["max_length"],
            no_repeat_ngram=self.manifest["no_repeat_ngram"],
        )
        config, language = self.manifest["config"], manifest_lib.target_language(self.manifest)
        super().__init__(
            config, tokenizer, defaults.replace(beam_size=beam_size, **options), batch_size, language
        )
        self.variant = variant
        self.threads = max(1, (threads or os.cpu_count() or 1) // parallel)  # each batch's
        entry = manifest_lib.find_artifact(self.manifest, self.fmt, variant)
        self.path = manifest_lib.verified_path(artifact_dir, self.manifest, entry)

    def _checked_parallel(self, parallel, variant):
        if not isinstance(parallel, int) or isinstance(parallel, bool) or parallel < 1:
            raise ValueError(f"parallel must be a whole number of batches, 1 or more; got {parallel!r}")
        if parallel > 1 and not self.concurrent_searches:
            raise ValueError(
                f"{self.fmt} {variant} runs one batch at a time; --parallel {parallel} needs "
                f"{self.PARALLEL_RUNTIMES}"
            )
        return parallel

    def checked(self, options, **changes):
        """As Runner's, and the beam size is one the file has (its buffers are shaped by it)."""
        options = super().checked(options, **changes)
        exported = self.manifest["beam_size"]
        if options.beam_size not in (1, exported):
            raise manifest_lib.ArtifactError(
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

    def __init__(self, artifact_dir, beam_size=None, variant="fp32", threads=None, batch_size=32, **options):
        super().__init__(artifact_dir, beam_size, variant, threads, batch_size, **options)
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
                self.handles[search] = self.open_file(self.file_of(search))
            elif self.one_file_serves_both:
                self.handles = dict.fromkeys(SEARCHES, self.open_file(self.path))
            else:
                raise manifest_lib.ArtifactError(
                    f"{self.path} is one file of both searches, as kformer wrote {self.fmt} before its "
                    "files per search; export the model again"
                )
        return self.handles[search]

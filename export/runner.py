"""The one interface of every translator, whatever runs it; no runtime is imported here.

A runner needs this file, kformer/batching.py, numpy, sentencepiece and its own runtime."""

import concurrent.futures
import contextlib
import os

import numpy as np

from kformer import batching, sentences
from kformer.export import manifest as manifest_lib
from kformer.export.format import SEARCHES, search_file
from kformer.options import SearchOptions


class Runner:
    """`translate(texts) -> list[str]`, `translations(texts) -> list[Translation]` (with scores and
    alternatives), `translate_ids(ids) -> (ids, scores)` and `search((B, S) int32) -> (tokens,
    scores)`. Each takes search options (kformer.options.SearchOptions fields: beam_size, alpha,
    max_length, no_repeat_ngram, nbest) as keywords, over the runner's own.

    Subclasses implement `_search(options, batch) -> (tokens, scores)` for an int32 (B, S) batch
    and checked options (`options.search` is "greedy" or "beam"). `config` is the model's config
    as a dict; `language` the target language (how sentences are joined).
    """

    # How beam search calls are sized (batching.tokens_per_call). Where beam_capped (onnxruntime's
    # and LiteRT's graphs), a beam call takes sentences of at most batching.BEAM_TOKENS_PER_SENTENCE
    # tokens each: `batch_size` of them, or where beam_shares_batch (the TFLite graphs, whose
    # key/value buffers are sized to the longest output), a beam of K takes K of 2 x `batch_size`
    # hypothesis rows: 2 * batch_size // K sentences a call (16 at K = 4). LiteRT, demo model, 500
    # test sentences, time against 8 sentences a call uncapped (4 interleaved rounds in one
    # process) and peak: fp32 16 sentences 0.82-1.01x (medians 0.87-0.88 in two runs) at 142 MB
    # against 151; 12: 0.89-0.92x at 156; 24: 0.86-0.89x at 188; 32 at 16 tokens each 0.91x at 212
    # (against 160); int8 16 0.92-1.16x at 155 MB, as 8. CTranslate2 drops finished hypotheses as
    # it goes: whole batches, uncapped.
    beam_shares_batch = False
    beam_capped = False
    # Whether `_search` may run in several threads at once, on the same opened files (onnxruntime's
    # sessions and CTranslate2's translator are; a LiteRT interpreter is not). `parallel`: how many
    # batches a call of translate runs at once (see ArtifactRunner).
    concurrent_searches = False
    parallel = 1
    # What errors about `parallel` name as the runtimes that take it (the runners with
    # concurrent_searches: onnx.OnnxRunner, ctranslate2.Ctranslate2Runner).
    PARALLEL_RUNTIMES = "--runtime ctranslate2, or onnx with an ids variant (fp32, int8)"

    def __init__(self, config, tokenizer, options, batch_size=32, language=None):
        self.config, self.tokenizer, self.batch_size = config, tokenizer, batch_size
        self.joiner = sentences.joiner(language)
        self.options = self.checked(options)

    @contextlib.contextmanager
    def _batch_mapper(self):
        """`map` over a call's batches: the builtin (one after another), or with `parallel` > 1 a
        thread pool's (that many at once; results in order) where there are several (the pool
        starts its threads as work comes: a call of one batch starts none)."""
        if self.parallel == 1:
            yield map
            return
        with concurrent.futures.ThreadPoolExecutor(self.parallel, thread_name_prefix="kformer-batch") as pool:
            yield lambda search, batches: (pool.map if len(batches) > 1 else map)(search, batches)

    def checked(self, options, **changes):
        """`options` with the `changes` that are not None, checked for this model and runtime."""
        return options.replace(**changes).checked(self.config["max_target_length"])

    def sentences_per_call(self, options):
        """How many sentences one search call takes, for checked options (see beam_shares_batch)."""
        if self.beam_shares_batch and options.search == "beam":
            return max(1, 2 * self.batch_size // options.beam_size)
        return self.batch_size

    def search(self, batch, **options):
        """(B, S) int32 source ids (pad 0) -> (tokens, scores) of the chosen search."""
        batch = np.asarray(batch)
        if batch.dtype != np.int32 or batch.ndim != 2:
            raise TypeError(
                f"source_ids must be an int32 array of shape (batch, length), "
                f"got {batch.dtype} with shape {batch.shape}"
            )
        return self._search(self.checked(self.options, **options), batch)

    def _search(self, options, batch):
        raise NotImplementedError

    def tokens_per_call(self, options):
        """The most padded source tokens one search call takes (`batching.tokens_per_call`)."""
        return batching.tokens_per_call(self.sentences_per_call(options), options.search, self.beam_capped)

    def translate_ids(self, ids, **options):
        """Lists of source ids -> (lists of output ids, scores), best hypothesis only."""
        options, c = self.checked(self.options, **options), self.config
        search = lambda batch: self._search(options, batch)  # noqa: E731
        sentences, tokens = self.sentences_per_call(options), self.tokens_per_call(options)
        with self._batch_mapper() as map_batches:
            return batching.translate_ids(
                search, ids, sentences, c["eos_id"], c["pad_id"], tokens, map_batches
            )

    def translations(self, texts, **options):
        """Texts -> `batching.Translation`s: sentences split and rejoined, scores, alternatives."""
        options, c = self.checked(self.options, **options), self.config
        with self._batch_mapper() as map_batches:
            return batching.translations(
                lambda batch: self._search(options, batch),
                self.tokenizer,
                texts,
                c["max_source_length"],
                self.sentences_per_call(options),
                c["eos_id"],
                c["pad_id"],
                self.joiner,
                options.nbest,
                self.tokens_per_call(options),
                map_batches,
            )

    def translate(self, texts, **options):
        """Texts -> their translations (strings)."""
        return [t.text for t in self.translations(texts, **options)]


class ArtifactRunner(Runner):
    """A runner of one file of a `kformer export` folder: the manifest and the tokenizer are read
    and verified first; `path` is the verified file of `fmt`'s `variant`.

    Args: artifact_dir, beam_size (1 or the exported K; default K), variant, threads (default:
    all cores), batch_size (sentences per call in `translate`; see beam_shares_batch), parallel
    (batches that `translate` runs at once, each on threads // parallel of the threads; > 1 only
    where `concurrent_searches`), and search options (alpha, max_length, no_repeat_ngram, nbest;
    default: the manifest's).

    Why `parallel`: a decoding step of a batch is many small operations, which two threads share
    badly; two batches at a time on a thread each keep both cores busy. Demo model, 500 test
    sentences on 2 cores, against one batch at a time on 2 threads: onnxruntime fp32 0.67x the
    time greedy and 0.73x beam 4, int8-ort 0.67x and 0.74x (CTranslate2's inter_threads=2,
    intra_threads=1: 0.75x and 0.84x). One sentence at a time runs on threads // parallel."""

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

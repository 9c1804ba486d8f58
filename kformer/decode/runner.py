"""The one interface of every translator, whatever runs it; no runtime is imported here.

A runner needs this file, kformer/decode/text_batches.py, numpy, sentencepiece and its own runtime;
the runners of exported files build on kformer.export.runner.ArtifactRunner."""

import concurrent.futures
import contextlib
import dataclasses
import functools

import numpy as np

from kformer.decode import sentences, text_batches
from kformer.decode.options import DEFAULTS, SearchOptions


@dataclasses.dataclass(frozen=True)
class RunnerSettings:
    """How a runner runs, whatever it translates: `batch_size` sentences a search call in
    `translate` (see Runner.beam_shares_batch), the runtime's `threads` (default: all cores),
    and `parallel` batches run at once by one `translate` call, each on threads // parallel of
    the threads (> 1 only where `concurrent_searches`), and the `target_language` a multilingual
    model translates into (its vocabulary's ">>fra<<" token for "fra"; kformer.data.vocabulary).

    Why `parallel`: a decoding step of a batch is many small operations, which two threads share
    badly; two batches at a time on a thread each keep both cores busy (`kformer bench runtimes
    --parallel 2`). One sentence at a time runs on threads // parallel."""

    batch_size: int = 32
    threads: int | None = None
    parallel: int = 1
    target_language: str | None = None


def _for_target(tokenizer, settings):
    """`tokenizer` asking for the target language of `settings`: a multilingual model's only."""
    from kformer.data.vocabulary import maps_through_vocabulary

    if not maps_through_vocabulary(tokenizer):
        raise ValueError(f"--target-language {settings.target_language}: this model is not multilingual")
    return tokenizer.for_target(settings.target_language)


class Runner:
    """`translate(texts) -> list[str]`, `translations(texts) -> list[Translation]` (with scores and
    alternatives), `translate_ids(ids) -> (ids, scores)` and `search((B, S) int32) -> (tokens,
    scores)`. Each takes a SearchOptions (kformer.decode.options) applied over the runner's own
    `options`: `runner.translations(texts, SearchOptions(nbest=3))`.

    Subclasses implement `_search(options, batch) -> (tokens, scores)` for an int32 (B, S) batch
    and checked options (`options.search` is "greedy" or "beam"). `config` is the model's
    ModelConfig; `language` the target language (how sentences are joined and scored).
    """

    # How beam search calls are sized (text_batches.tokens_per_call). Where beam_capped (onnxruntime's
    # and LiteRT's graphs), a beam call takes sentences of at most text_batches.BEAM_TOKENS_PER_SENTENCE
    # tokens each: `batch_size` of them, or where beam_shares_batch (the TFLite graphs, whose
    # key/value buffers are sized to the longest output), a beam of K takes K of 2 x `batch_size`
    # hypothesis rows: 2 * batch_size // K sentences a call (16 at K = 4), the size that was
    # fastest without raising LiteRT's peak (`kformer bench runtimes`). CTranslate2 drops finished
    # hypotheses as it goes: whole batches, uncapped.
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

    def __init__(self, config, tokenizer, options, settings, language=None):
        self.config, self.language = config, language
        self.tokenizer = tokenizer if settings.target_language is None else _for_target(tokenizer, settings)
        self.batch_size = settings.batch_size
        self.joiner = sentences.joiner(language)
        self.options = DEFAULTS  # what `checked` applies `options` over
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

    def checked(self, options=None):
        """`options` (a SearchOptions, None for none) over the runner's own, checked for this model
        and runtime."""
        return (options or SearchOptions()).over(self.options).checked(self.config.max_target_length)

    def sentences_per_call(self, options):
        """How many sentences one search call takes, for checked options (see beam_shares_batch)."""
        if self.beam_shares_batch and options.search == "beam":
            return max(1, 2 * self.batch_size // options.beam_size)
        return self.batch_size

    def search(self, batch, options=None):
        """(B, S) int32 source ids (pad 0) -> (tokens, scores) of the chosen search."""
        batch = np.asarray(batch)
        if batch.dtype != np.int32 or batch.ndim != 2:
            raise TypeError(
                f"source_ids must be an int32 array of shape (batch, length), "
                f"got {batch.dtype} with shape {batch.shape}"
            )
        return self._search(self.checked(options), batch)

    def _search(self, options, batch):
        raise NotImplementedError

    def tokens_per_call(self, options):
        """The most padded source tokens one search call takes (`text_batches.tokens_per_call`)."""
        return text_batches.tokens_per_call(
            self.sentences_per_call(options), options.search, self.beam_capped
        )

    def translate_ids(self, ids, options=None):
        """Lists of source ids -> (lists of output ids, scores), best hypothesis only."""
        options, c = self.checked(options), self.config
        search = lambda batch: self._search(options, batch)  # noqa: E731
        sentences, tokens = self.sentences_per_call(options), self.tokens_per_call(options)
        with self._batch_mapper() as map_batches:
            return text_batches.translate_ids(search, ids, sentences, c.eos_id, c.pad_id, tokens, map_batches)

    def translations(self, texts, options=None):
        """Texts -> `text_batches.Translation`s: sentences split and rejoined, scores, alternatives."""
        options, c = self.checked(options), self.config
        with self._batch_mapper() as map_batches:
            search_ids = functools.partial(
                text_batches.search_units,
                lambda batch: self._search(options, batch),
                batch_size=self.sentences_per_call(options),
                eos_id=c.eos_id,
                pad_id=c.pad_id,
                max_tokens=self.tokens_per_call(options),
                map_batches=map_batches,
            )
            return text_batches.translations(
                self.tokenizer, texts, c.max_source_length, search_ids, self.joiner, options.nbest
            )

    def translate(self, texts, options=None):
        """Texts -> their translations (strings)."""
        return [t.text for t in self.translations(texts, options)]

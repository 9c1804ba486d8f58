"""The graph-mode translator: a tf.Module whose searches are traced once per input signature.

`Translator` is the one object later exported to SavedModel, TFLite and ONNX; its Python
`translate` only tokenizes, batches and detokenizes around the graph.
"""

import functools

import tensorflow as tf

from kformer.decode import options as options_lib
from kformer.decode import search, sentences, text_batches
from kformer.decode.runner import Runner
from kformer.model.config import FIRST_PASS_EXTRA_TOKENS

SOURCE_SPEC = tf.TensorSpec([None, None], tf.int32, name="source_ids")
# The searches' run-time options (kformer.decode.options): scalars, inputs of every exported graph.
OPTION_SPECS = {
    name: tf.TensorSpec([], tf.as_dtype(dtype), name=name) for name, dtype in options_lib.INPUTS.items()
}
GREEDY_SPECS = [SOURCE_SPEC, *(OPTION_SPECS[name] for name in options_lib.GREEDY_INPUTS)]
BEAM_SPECS = [SOURCE_SPEC, *OPTION_SPECS.values()]


class Translator(tf.Module):
    """Greedy and beam-search translation with a key/value cache.

    Args:
        model: a trained `kformer.model.transformer.Transformer`.
        tokenizer: its SentencePiece processor (only needed for text in/out).
        options: the fields of `kformer.decode.options.SearchOptions`: beam_size, K of the `beam`
            graph (the paper and default: 4; the buffers are shaped by it); alpha, max_length,
            no_repeat_ngram, nbest: the defaults of the run-time options (max_length None: the
            config's max_target_length).
        batch_size: sentences per graph call in `translate`.
        jit_compile: compile the searches with XLA (one program per input shape; not exported).
        fixed_buffers: key/value buffers of a fixed length written one slot a step, instead of
            caches that grow by a step each step (`Transformer.init_cache`); XLA's always are.
            LiteRT, which re-plans a loop body whose shapes change, runs these faster.
        drop_done: rows that are done stop taking steps (None: unless `jit_compile`, whose
            static shapes cannot drop them): with growing caches, the loop drops them at every
            step (`search.DropDone`); with fixed buffers, a second pass takes the rows left once
            a quarter of them run on (`search.TwoPasses`).
        whole_top_1: greedy search ranks a row's logits in one top_k (the ONNX files').

    Graph functions (options are scalar inputs: max_length is clipped to [1, max_target_length],
    no_repeat_ngram <= 0 is off):
        greedy(source_ids (B, S) int32 pad 0, max_length, no_repeat_ngram):
            tokens (B, T), scores (B,) log-probability.
        beam(source_ids, alpha, max_length, no_repeat_ngram, nbest):
            tokens (B, K, T) best first, scores (B, K) length-penalized log-probability; a row
            stops once its best candidate has finished and nbest hypotheses have (at most K).
    Output tokens end with EOS (unless cut at the limit) and are padded with 0; a beam slot that
    no hypothesis reached scores search.NEG_INF. Sources longer than the config's
    max_source_length are truncated inside the graph.
    """

    def __init__(
        self,
        model,
        tokenizer=None,
        batch_size=32,
        jit_compile=False,
        fixed_buffers=False,
        drop_done=None,
        whole_top_1=False,
        **options,
    ):
        super().__init__(name="translator")
        config = model.config
        self.options = options_lib.SearchOptions(**options).checked(config.max_target_length)
        beam_size = self.options.beam_size
        self.model, self.config, self.tokenizer = model, config, tokenizer
        self.beam_size, self.max_length = beam_size, self.options.max_length
        self.batch_size = batch_size
        self.drop_done = not jit_compile if drop_done is None else drop_done
        self.fixed_buffers = fixed_buffers or jit_compile
        self.whole_top_1 = whole_top_1
        self.greedy = tf.function(self._greedy, input_signature=GREEDY_SPECS, jit_compile=jit_compile)
        self.beam = tf.function(self._beam, input_signature=BEAM_SPECS, jit_compile=jit_compile)

    def search_inputs(self, source_ids, max_length, drop_done=None):
        """(B, S) source ids and the max_length option -> (search.Lengths, decoder cache, loop) for
        a search; loop: how done rows stop stepping (kformer.decode.search.loops; ONE_PASS when
        they do not: `drop_done=False`; the default is the translator's). Ids beyond the
        positional table would be out of range (an error in TF and ONNX, an unchecked read in
        TFLite): the graph keeps the first max_source_length, in every runtime."""
        c = self.config
        source_ids = source_ids[:, : c.max_source_length]
        cap = tf.clip_by_value(max_length, 1, c.max_target_length)
        drop_done = self.drop_done if drop_done is None else drop_done
        # Buffers as long as the model's longest output whatever max_length is: their shapes then
        # follow from the input's shape alone, as XLA and LiteRT.js (the fixed file) need; a lower
        # max_length stops the loop earlier, in buffers a little longer than needed.
        lengths = search.output_limits(source_ids, c.pad_id, cap, buffer_cap=c.max_target_length)
        if not self.fixed_buffers:  # key/value caches that grow by a step each step (Transformer.init_cache)
            return (
                lengths,
                self.model.init_cache(source_ids),
                search.DROP_DONE if drop_done else search.ONE_PASS,
            )
        if not drop_done:
            return lengths, self.model.init_cache(source_ids, lengths.buffer), search.ONE_PASS
        first_length = tf.minimum(lengths.buffer, tf.shape(source_ids)[1] + FIRST_PASS_EXTRA_TOKENS)
        loop = search.TwoPasses(first_length, self.model.grow_cache)
        return lengths, self.model.init_cache(source_ids, first_length), loop

    def _greedy(self, source_ids, max_length, no_repeat_ngram):
        return self.search_prepared(self.search_inputs(source_ids, max_length), False, 0.0, no_repeat_ngram)

    def _beam(self, source_ids, alpha, max_length, no_repeat_ngram, nbest):
        inputs = self.search_inputs(source_ids, max_length)
        return self.search_prepared(inputs, True, alpha, no_repeat_ngram, nbest)

    def search_prepared(self, inputs, beam, alpha, no_repeat_ngram, nbest=1):
        """Beam search (`beam` True) or greedy search over a batch from `search_inputs`."""
        lengths, cache, loop = inputs
        c, step = self.config, self.model.decode_step
        ids = search.TokenIds(c.bos_id, c.eos_id, c.pad_id)
        if beam:
            options = search.BeamOptions(alpha, nbest, no_repeat_ngram)
            tokens, scores = search.beam_search(step, cache, lengths, ids, self.beam_size, options, loop)
        else:
            tokens, scores = search.greedy_search(
                step, cache, lengths, ids, loop, no_repeat_ngram=no_repeat_ngram, whole_top_1=self.whole_top_1
            )
        return {"tokens": tokens, "scores": scores}

    def options_for(self, **changes):
        """The translator's options with `changes` (those not None), checked."""
        options = self.options.replace(**changes).checked(self.config.max_target_length)
        if options.beam_size not in (1, self.beam_size):
            raise ValueError(
                f"this Translator's beam graph has beam size {self.beam_size}, not {options.beam_size}"
            )
        return options

    def run(self, batch, options):
        """(B, S) int32 source ids and checked options -> the graph's {"tokens", "scores"} (tensors)."""
        graph = self.greedy if options.search == "greedy" else self.beam
        return graph(tf.constant(batch, tf.int32), **options.inputs())

    # --- Python side: text <-> ids around the graph (shared with the device runners) ---

    def encode(self, texts):
        """Token ids of one-sentence texts, the first max_source_length (for tools that look at
        one sentence: kformer.plots); `translations` splits and fits texts instead."""
        return [self.tokenizer.encode(t.strip())[: self.config.max_source_length] for t in texts]

    def search(self, batch, **options):
        """(B, S) int32 source ids -> numpy (tokens, scores) of beam search, or greedy for beam 1."""
        result = self.run(batch, self.options_for(**options))
        return result["tokens"].numpy(), result["scores"].numpy()

    def _searcher(self, options):
        """`search(batch) -> numpy (tokens, scores)` of the graph for these checked options."""

        def search_batch(batch):
            result = self.run(batch, options)
            return result["tokens"].numpy(), result["scores"].numpy()

        return search_batch

    def translate_ids(self, ids, **options):
        """Lists of source ids -> (lists of output ids without EOS/pad, scores), in input order.
        Sentences of similar length are batched together; each row is independent of its batch."""
        options, c = self.options_for(**options), self.config
        tokens = text_batches.tokens_per_call(self.batch_size, options.search)
        return text_batches.translate_ids(
            self._searcher(options), ids, self.batch_size, c.eos_id, c.pad_id, tokens
        )

    def translations(self, texts, language=None, **options):
        """Texts -> `text_batches.Translation`s (kformer.decode.text_batches: sentences split and rejoined with
        `language`'s spacing; blank texts give "", sentences with no character in the vocabulary
        are output as they are)."""
        if self.tokenizer is None:
            raise ValueError("this Translator has no tokenizer; use translate_ids")
        options, c = self.options_for(**options), self.config
        search_ids = functools.partial(
            text_batches.search_units,
            self._searcher(options),
            batch_size=self.batch_size,
            eos_id=c.eos_id,
            pad_id=c.pad_id,
            max_tokens=text_batches.tokens_per_call(self.batch_size, options.search),
        )
        return text_batches.translations(
            self.tokenizer, texts, c.max_source_length, search_ids, sentences.joiner(language), options.nbest
        )

    def translate(self, texts, language=None, **options):
        """Translates a list of strings (see `translations`)."""
        return [t.text for t in self.translations(texts, language, **options)]


class KerasRunner(Runner):
    """The training folder's Keras model behind the runners' interface: the reference runtime.
    Options as `kformer.decode.options.SearchOptions` (beam_size sets the beam graph's width)."""

    def __init__(self, model_dir, batch_size=32, weights="best", **options):
        from kformer import run_folder

        model, config, tokenizer, corpus = run_folder.load(model_dir, weights)
        options = options_lib.SearchOptions().replace(**options)
        language = (corpus or {}).get("direction", "").split("-")[-1] or None
        super().__init__(config.to_dict(), tokenizer, options, batch_size, language)
        self.translator = Translator(
            model, tokenizer, beam_size=self.options.beam_size, batch_size=batch_size
        )

    def _search(self, options, batch):
        result = self.translator.run(batch, options)
        return result["tokens"].numpy(), result["scores"].numpy()

    def checked(self, options, **changes):
        options = super().checked(options, **changes)
        translator = getattr(self, "translator", None)
        if translator is not None and options.beam_size not in (1, translator.beam_size):
            self.translator = Translator(
                translator.model, self.tokenizer, beam_size=options.beam_size, batch_size=self.batch_size
            )
        return options

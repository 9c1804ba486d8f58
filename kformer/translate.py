"""The graph-mode translator: a tf.Module whose searches are traced once per input signature.

`Translator` is the one object later exported to SavedModel, TFLite and ONNX; its Python
`translate` only tokenizes, batches and detokenizes around the graph.
"""

import tensorflow as tf

from kformer import batching, search
from kformer.config import BEAM_SIZE, FIRST_PASS_EXTRA_TOKENS, LENGTH_PENALTY
from kformer.export.runner import Runner

SOURCE_SPEC = tf.TensorSpec([None, None], tf.int32, name="source_ids")


class Translator(tf.Module):
    """Greedy and beam-search translation with a fixed-shape KV cache.

    Args:
        model: a trained `kformer.model.Transformer`.
        tokenizer: its SentencePiece processor (only needed for text in/out).
        beam_size: K for `beam` (the paper and default: 4).
        alpha: length penalty exponent (GNMT, the paper: 0.6).
        max_length: cap on output tokens (default and upper bound: the config's max_target_length).
        batch_size: sentences per graph call in `translate`.
        jit_compile: compile the searches with XLA (one program per input shape; not exported).
            The searches run in two passes (`search._in_two_passes`) except under XLA, which needs
            static shapes where the second pass takes only the rows left.

    Graph functions, `(B, S) int32 source ids (pad 0) -> {"tokens", "scores"}`:
        greedy: tokens (B, T), scores (B,) log-probability.
        beam: tokens (B, K, T) best first, scores (B, K) length-penalized log-probability.
    Output tokens end with EOS (unless cut at the limit) and are padded with 0. Sources longer
    than the config's max_source_length are truncated inside the graph.
    """

    def __init__(
        self,
        model,
        tokenizer=None,
        beam_size=BEAM_SIZE,
        alpha=LENGTH_PENALTY,
        max_length=None,
        batch_size=32,
        jit_compile=False,
    ):
        super().__init__(name="translator")
        config = model.config
        if beam_size < 1:
            raise ValueError(f"beam size must be >= 1, got {beam_size}")
        cap = config.max_target_length if max_length is None else int(max_length)
        if not 1 <= cap <= config.max_target_length:
            raise ValueError(
                f"max length must be in [1, {config.max_target_length}] for this model, got {max_length}"
            )
        self.model, self.config, self.tokenizer = model, config, tokenizer
        self.beam_size, self.alpha, self.max_length = beam_size, float(alpha), cap
        self.batch_size = batch_size
        self.two_passes = not jit_compile
        self.greedy = tf.function(self._greedy, input_signature=[SOURCE_SPEC], jit_compile=jit_compile)
        self.beam = tf.function(self._beam, input_signature=[SOURCE_SPEC], jit_compile=jit_compile)

    def prepare(self, source_ids, two_passes=None):
        """(B, S) source ids -> (per-row output limits, buffer length, decoder cache, first pass)
        for a search (first pass: `search.greedy_search`'s argument; None for one pass, which
        `two_passes=False` asks for; the default is the translator's).
        Ids beyond the positional table would be out of range (an error in TF and ONNX, an
        unchecked read in TFLite): the graph keeps the first max_source_length, in every runtime."""
        source_ids = source_ids[:, : self.config.max_source_length]
        limits, length = search.output_limits(source_ids, self.config.pad_id, self.max_length)
        first_pass = None
        if self.two_passes if two_passes is None else two_passes:
            first_length = tf.minimum(length, tf.shape(source_ids)[1] + FIRST_PASS_EXTRA_TOKENS)
            first_pass = (first_length, self.model.grow_cache)
        cache = self.model.init_cache(source_ids, length if first_pass is None else first_pass[0])
        return limits, length, cache, first_pass

    def _greedy(self, source_ids):
        return self.search_prepared(self.prepare(source_ids), beam=False)

    def _beam(self, source_ids):
        return self.search_prepared(self.prepare(source_ids), beam=True)

    def search_prepared(self, prepared, beam):
        """Beam search (`beam` True) or greedy search over a batch from `prepare`."""
        limits, length, cache, first_pass = prepared
        c = self.config
        if beam:
            tokens, scores = search.beam_search(
                self.model.decode_step,
                cache,
                limits,
                length,
                self.beam_size,
                c.bos_id,
                c.eos_id,
                self.alpha,
                c.pad_id,
                first_pass=first_pass,
            )
        else:
            tokens, scores = search.greedy_search(
                self.model.decode_step, cache, limits, length, c.bos_id, c.eos_id, c.pad_id, first_pass
            )
        return {"tokens": tokens, "scores": scores}

    # --- Python side: text <-> ids around the graph (shared with the device runners) ---

    def encode(self, texts):
        """Token ids per text (see `batching.encode_texts`: never an error)."""
        return batching.encode_texts(self.tokenizer, texts, self.config.max_source_length)[0]

    def search(self, batch, beam_size=None):
        """(B, S) int32 source ids -> numpy (tokens, scores) of beam search, or greedy for beam 1."""
        fn = self.beam if (self.beam_size if beam_size is None else beam_size) > 1 else self.greedy
        result = fn(tf.constant(batch, tf.int32))
        return result["tokens"].numpy(), result["scores"].numpy()

    def translate_ids(self, ids, beam_size=None):
        """Lists of source ids -> (lists of output ids without EOS/pad, scores), in input order.
        Sentences of similar length are batched together; each row is independent of its batch."""
        return batching.translate_ids(
            lambda batch: self.search(batch, beam_size),
            ids,
            self.batch_size,
            self.config.eos_id,
            self.config.pad_id,
        )

    def translate(self, texts, beam_size=None):
        """Translates a list of strings; an empty or blank string gives an empty translation, a
        string with no character in the vocabulary is output as it is (`batching.encode_texts`)."""
        if self.tokenizer is None:
            raise ValueError("this Translator has no tokenizer; use translate_ids")
        return batching.translate_texts(
            self.tokenizer,
            texts,
            self.config.max_source_length,
            lambda ids: self.translate_ids(ids, beam_size),
        )


class KerasRunner(Runner):
    """The training folder's Keras model behind the runners' interface: the reference runtime."""

    def __init__(self, model_dir, beam_size=BEAM_SIZE, alpha=LENGTH_PENALTY, max_length=None, batch_size=32):
        from kformer import checkpoint

        model, config, tokenizer, _ = checkpoint.load(model_dir)
        beam_size = max(1, beam_size)
        super().__init__(config.to_dict(), tokenizer, beam_size, batch_size)
        self.translator = Translator(
            model, tokenizer, beam_size=beam_size, alpha=alpha, max_length=max_length, batch_size=batch_size
        )

    def _search(self, search, batch):
        return self.translator.search(batch)

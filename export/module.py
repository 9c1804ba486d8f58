"""The exportable translator: one tf.Module whose functions every format is written from."""

import tensorflow as tf
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

from kformer.config import BEAM_SIZE, LENGTH_PENALTY
from kformer.translate import Translator

TEXT_SPEC = tf.TensorSpec([None], tf.string, name="text")
IDS_SPEC = tf.TensorSpec([None, None], tf.int32, name="source_ids")
BEAM_FLAG_SPEC = tf.TensorSpec([], tf.bool, name="beam")


class ExportModule(tf.Module):
    """Token-id searches of `kformer.translate.Translator` plus text-in/text-out functions with
    the SentencePiece model inside the graph (tensorflow-text's FastSentencepieceTokenizer: one
    tokenizer object, used by both text functions).

    Functions (all batched, dynamic batch and length):
        greedy_ids / beam_ids: source_ids int32 (B, S) -> tokens int32, scores float32.
        greedy_text / beam_text: text string (B,) -> translation string (B,).
    and, for ONNX (no signatures), frozen("either"): source_ids, beam bool () -> tokens int32
    (B, N, T), scores float32 (B, N), N = K (beam search) or 1 (greedy): both searches behind one
    switch, in one file with one copy of the weights.
    """

    def __init__(self, model, tokenizer_proto, beam_size=BEAM_SIZE, alpha=LENGTH_PENALTY, max_length=None):
        super().__init__(name="kformer_translator")
        import tensorflow_text as tf_text  # only the SavedModel text functions need it

        self.translator = Translator(model, beam_size=beam_size, alpha=alpha, max_length=max_length)
        self.config = model.config
        self.tokenizer_proto = tokenizer_proto  # for the formats that carry the tokenizer inside
        self.tokenizer = tf_text.FastSentencepieceTokenizer(tokenizer_proto)
        self.greedy_ids = self.translator.greedy
        self.beam_ids = self.translator.beam
        self.greedy_text = tf.function(
            lambda text: self._text(self.translator.greedy, text), input_signature=[TEXT_SPEC]
        )
        self.beam_text = tf.function(
            lambda text: self._text(self.translator.beam, text), input_signature=[TEXT_SPEC]
        )

    def _either(self, source_ids, beam):
        # Both searches run, one on the whole batch and the other on none of its rows, rather than
        # each in a branch of an If: onnxruntime prepacks a MatMul's weights only from the MatMul's
        # own scope or the one above, and a Loop body inside an If's branch is two scopes below the
        # weights, which made beam search at batch 1 ~1.35x slower. The source is encoded once, for
        # both (a fifth fewer nodes in the main graph). Only the choice of output is an If.
        rows = tf.where(beam, tf.shape(source_ids)[0], 0)  # the beam search's rows; the others are greedy's
        limits, length, cache, first_pass = self.translator.prepare(source_ids)

        def rows_of(part):  # the prepared batch of the rows `part` selects (every tensor is batch-first)
            return (limits[part], length, tf.nest.map_structure(lambda t: t[part], cache), first_pass)

        greedy = self.translator.search_prepared(rows_of(slice(rows, None)), beam=False)
        beam_search = self.translator.search_prepared(rows_of(slice(None, rows)), beam=True)
        greedy_as_beam_of_one = {name: value[:, None] for name, value in greedy.items()}
        return tf.cond(beam, lambda: beam_search, lambda: greedy_as_beam_of_one)

    def _text(self, search, text):
        c = self.config
        ids = self.tokenizer.tokenize(text)  # ragged (B, None); `search` keeps the first max_source_length
        source = ids.to_tensor(default_value=c.pad_id, shape=[None, None])
        source = tf.cast(source, tf.int32)
        tokens = search(source)["tokens"]
        if tokens.shape.rank == 3:
            tokens = tokens[:, 0]  # best beam
        # Keep the tokens before the first EOS, without padding.
        before_eos = tf.equal(tf.cumsum(tf.cast(tf.equal(tokens, c.eos_id), tf.int32), axis=1), 0)
        kept = tf.ragged.boolean_mask(tokens, before_eos & tf.not_equal(tokens, c.pad_id))
        return {"translation": self.tokenizer.detokenize(kept)}

    def frozen(self, search, fixed_shape=False):
        """The ids function of `search` ("greedy", "beam" or "either") with variables folded into
        constants: what TFLite and tf2onnx need (an unfrozen loop converts, then fails at invoke
        with READ_VARIABLE).
        fixed_shape: input (1, max_source_length) instead of (batch, length), for runtimes that
        cannot resize inputs (LiteRT.js)."""
        if search == "either":  # not an attribute: the SavedModel would keep a third copy of the searches
            fn = tf.function(self._either, input_signature=[IDS_SPEC, BEAM_FLAG_SPEC])
        else:
            fn = getattr(self.translator, search)
        if fixed_shape:
            spec = tf.TensorSpec([1, self.config.max_source_length], tf.int32, name=IDS_SPEC.name)
            fn = tf.function(lambda source_ids, search=fn: search(source_ids), input_signature=[spec])
        return convert_variables_to_constants_v2(fn.get_concrete_function())

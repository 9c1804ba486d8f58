"""The exportable translator: one tf.Module whose functions every format is written from."""

import tensorflow as tf
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

from kformer.config import BEAM_SIZE, LENGTH_PENALTY
from kformer.translate import Translator

TEXT_SPEC = tf.TensorSpec([None], tf.string, name="text")


class ExportModule(tf.Module):
    """Token-id searches of `kformer.translate.Translator` plus text-in/text-out functions with
    the SentencePiece model inside the graph (tensorflow-text's FastSentencepieceTokenizer: one
    tokenizer object, used by both text functions).

    Functions (all batched, dynamic batch and length):
        greedy_ids / beam_ids: source_ids int32 (B, S) -> tokens int32, scores float32.
        greedy_text / beam_text: text string (B,) -> translation string (B,).
    """

    def __init__(self, model, tokenizer_proto, beam_size=BEAM_SIZE, alpha=LENGTH_PENALTY, max_length=None):
        super().__init__(name="kformer_translator")
        import tensorflow_text as tf_text  # only the SavedModel text functions need it

        self.translator = Translator(model, beam_size=beam_size, alpha=alpha, max_length=max_length)
        # TFLite gets the searches in one pass: in two passes, LiteRT 1 in ~5 processes gave other
        # beam tokens for a batch than in the others (same file, same input; not seen in one pass).
        self.one_pass = Translator(model, beam_size=beam_size, alpha=alpha, max_length=max_length, two_passes=False)
        self.config = model.config
        self.tokenizer = tf_text.FastSentencepieceTokenizer(tokenizer_proto)
        self.greedy_ids = self.translator.greedy
        self.beam_ids = self.translator.beam
        self.greedy_text = tf.function(lambda text: self._text(self.translator.greedy, text),
                                       input_signature=[TEXT_SPEC])
        self.beam_text = tf.function(lambda text: self._text(self.translator.beam, text), input_signature=[TEXT_SPEC])

    def _text(self, search, text):
        c = self.config
        ids = self.tokenizer.tokenize(text)  # ragged (B, None)
        ids = ids[:, : c.max_source_length]  # over-long input is truncated (the Python runners also warn)
        source = ids.to_tensor(default_value=c.pad_id, shape=[None, None])
        source = tf.cast(source, tf.int32)
        tokens = search(source)["tokens"]
        if tokens.shape.rank == 3:
            tokens = tokens[:, 0]  # best beam
        # Keep the tokens before the first EOS, without padding.
        before_eos = tf.equal(tf.cumsum(tf.cast(tf.equal(tokens, c.eos_id), tf.int32), axis=1), 0)
        kept = tf.ragged.boolean_mask(tokens, before_eos & tf.not_equal(tokens, c.pad_id))
        return {"translation": self.tokenizer.detokenize(kept)}

    def frozen(self, search, fixed_shape=False, one_pass=False):
        """The ids function of `search` with variables folded into constants: what TFLite and
        tf2onnx need (an unfrozen loop converts, then fails at invoke with READ_VARIABLE).
        fixed_shape: input (1, max_source_length) instead of (batch, length), for runtimes that
        cannot resize inputs (LiteRT.js). one_pass: the searches without their second pass (see
        `kformer.search._in_two_passes`), for TFLite."""
        fn = getattr(self.one_pass if one_pass else self.translator, search)
        if fixed_shape:
            spec = tf.TensorSpec([1, self.config.max_source_length], tf.int32, name="source_ids")
            fn = tf.function(lambda source_ids, search=fn: search(source_ids), input_signature=[spec])
        return convert_variables_to_constants_v2(fn.get_concrete_function())

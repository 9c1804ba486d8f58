"""The exportable translator: one tf.Module whose functions every format is written from."""

import tensorflow as tf
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

from kformer.decode.options import BEAM_SIZE
from kformer.decode.recipe import RECIPES
from kformer.decode.translator import BEAM_SPECS, GREEDY_SPECS, SOURCE_SPEC, Translator

TEXT_SPEC = tf.TensorSpec([None], tf.string, name="text")


class ExportModule(tf.Module):
    """Token-id searches of `kformer.decode.translator.Translator` plus text-in/text-out functions with
    the SentencePiece model inside the graph (tensorflow-text's FastSentencepieceTokenizer: one
    tokenizer object, used by both text functions).

    Functions (all batched, dynamic batch and length; options as in Translator, scalar inputs):
        greedy_ids(source_ids, max_length, no_repeat_ngram) / beam_ids(source_ids, alpha,
            max_length, no_repeat_ngram, nbest) -> tokens int32, scores float32.
        greedy_text / beam_text: text string (B,) and the same options -> translation string (B,),
            each row one sentence (splitting a text into sentences is the runner's).
    TFLite and ONNX are written from `frozen(search)`.
    """

    def __init__(self, model, tokenizer_proto, beam_size=BEAM_SIZE):
        super().__init__(name="kformer_translator")
        import tensorflow_text as tf_text  # only the SavedModel text functions need it

        self.translator = Translator(model, beam_size)
        self.config = model.config
        self.tokenizer_proto = tokenizer_proto  # for the formats that carry the tokenizer inside
        self.tokenizer = tf_text.FastSentencepieceTokenizer(tokenizer_proto)
        self.greedy_ids = self.translator.greedy
        self.beam_ids = self.translator.beam
        self.greedy_text = tf.function(
            lambda text, *options: self._text(self.translator.greedy, text, options),
            input_signature=[TEXT_SPEC, *GREEDY_SPECS[1:]],
        )
        self.beam_text = tf.function(
            lambda text, *options: self._text(self.translator.beam, text, options),
            input_signature=[TEXT_SPEC, *BEAM_SPECS[1:]],
        )

    def _text(self, search, text, options):
        c = self.config
        ids = self.tokenizer.tokenize(text)  # ragged (B, None); `search` keeps the first max_source_length
        source = ids.to_tensor(default_value=c.pad_id, shape=[None, None])
        source = tf.cast(source, tf.int32)
        tokens = search(source, *options)["tokens"]
        if tokens.shape.rank == 3:
            tokens = tokens[:, 0]  # best beam
        # Keep the tokens before the first EOS, without padding.
        before_eos = tf.equal(tf.cumsum(tf.cast(tf.equal(tokens, c.eos_id), tf.int32), axis=1), 0)
        kept = tf.ragged.boolean_mask(tokens, before_eos & tf.not_equal(tokens, c.pad_id))
        return {"translation": self.tokenizer.detokenize(kept)}

    def frozen(self, search, recipe, fixed_shape=False):
        """The ids function of `search` ("greedy" or "beam"), built as the recipe of that name
        (kformer.decode.recipe.RECIPES) says, with variables folded into constants: what
        TFLite and tf2onnx need (an unfrozen loop converts, then fails at invoke with
        READ_VARIABLE). fixed_shape: input (1, max_source_length) instead of (batch, length), for
        runtimes that cannot resize inputs (LiteRT.js)."""
        # A translator of its own (not an attribute: the SavedModel keeps the module's searches
        # only), whose functions are traced here with this recipe, not found already traced by
        # the SavedModel's export.
        translator = Translator(self.translator.model, self.translator.beam_size, RECIPES[recipe])
        fn = getattr(translator, search)
        if fixed_shape:
            spec = tf.TensorSpec([1, self.config.max_source_length], tf.int32, name=SOURCE_SPEC.name)
            specs = [spec, *fn.input_signature[1:]]
            fn = tf.function(
                lambda source_ids, *options, search=fn: search(source_ids, *options), input_signature=specs
            )
        return convert_variables_to_constants_v2(fn.get_concrete_function())

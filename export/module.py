"""The exportable translator: one tf.Module whose functions every format is written from."""

import tensorflow as tf
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

from kformer.data.vocabulary import LANGUAGE_CODE_PATTERN
from kformer.decode import sentences
from kformer.decode.options import BEAM_SIZE
from kformer.decode.recipe import RECIPES
from kformer.decode.translator import BEAM_SPECS, GREEDY_SPECS, SOURCE_SPEC, Translator
from kformer.export import detokenize

TEXT_SPEC = tf.TensorSpec([None], tf.string, name="text")
# The text graph's input: UTF-8 bytes, a text a row, and each text's length in bytes.
TEXT_BYTES_SPECS = [
    tf.TensorSpec([None, None], tf.uint8, name="text"),
    tf.TensorSpec([None], tf.int32, name="lengths"),
]


class ExportModule(tf.Module):
    """Token-id searches of `kformer.decode.translator.Translator` plus text-in/text-out functions with
    the SentencePiece models inside the graph (tensorflow-text's FastSentencepieceTokenizer), and
    for a vocabulary tokenizer (kformer.data.vocabulary) its id tables.

    Functions (all batched, dynamic batch and length; options as in Translator, scalar inputs):
        greedy_ids(source_ids, max_length, no_repeat_ngram) / beam_ids(source_ids, alpha,
            max_length, no_repeat_ngram, nbest) -> tokens int32, scores float32.
        greedy_text / beam_text: text string (B,) and the same options -> translation string (B,),
            each row one sentence (splitting a text into sentences is the runner's).
    TFLite and ONNX are written from `frozen(search)`.
    """

    def __init__(self, model, tokenizer, beam_size=BEAM_SIZE, language=None):
        super().__init__(name="kformer_translator")
        self.joiner = sentences.joiner(language)  # between a text's translated sentences
        self._text_tables = None  # kformer.export.text_graph's tables of the tokenizer, once asked for
        import tensorflow_text as tf_text  # only the SavedModel text functions need it

        from kformer.data.vocabulary import graph_tables

        self.translator = Translator(model, beam_size)
        self.config = model.config
        self.tokenizer = tokenizer  # the Python one, for the formats that carry the tokenizer inside
        tables = graph_tables(tokenizer)
        self.append_eos = tables.append_eos
        self.source_tokenizer = tf_text.FastSentencepieceTokenizer(tables.source)
        same = tables.target is tables.source  # kformer's joint model: one copy in the SavedModel
        self.target_tokenizer = (
            self.source_tokenizer if same else tf_text.FastSentencepieceTokenizer(tables.target)
        )
        self.source_map = None if tables.source_map is None else tf.constant(tables.source_map, tf.int32)
        self.target_map = None if tables.target_map is None else tf.constant(tables.target_map, tf.int32)
        self.codes = None if tables.codes is None else _CodeTable(tables.codes, tables.unk_id)
        self.leading_spaces = detokenize.LeadingSpaces.of(tables.target)
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

    def _source_ids(self, text):
        """(B,) text -> (B, S) int32 source ids, pad after: SentencePiece's ids, looked up in the
        model's vocabulary and ended with EOS where the tokenizer does so."""
        c = self.config
        if self.codes is not None:  # a leading >>xxx<< is one piece, split off as the tokenizer does
            has_code = tf.strings.regex_full_match(text, LANGUAGE_CODE_PATTERN + ".*")
            code = tf.strings.regex_replace(text, LANGUAGE_CODE_PATTERN + ".*", r"\1", replace_global=False)
            text = tf.strings.regex_replace(text, LANGUAGE_CODE_PATTERN, "", replace_global=False)
            found = tf.boolean_mask(self.codes.lookup(code), has_code)
            codes = tf.RaggedTensor.from_row_lengths(found, tf.cast(has_code, tf.int64))  # (B, 0 or 1)
        ids = tf.cast(self.source_tokenizer.tokenize(text), tf.int32)  # ragged (B, None)
        ids = ids.with_row_splits_dtype(tf.int64)
        if self.source_map is not None:
            ids = tf.ragged.map_flat_values(tf.gather, self.source_map, ids)
        if self.codes is not None:
            ids = tf.concat([codes, ids], axis=1)
        if self.append_eos:
            ids = tf.concat([ids, tf.fill([tf.shape(text)[0], 1], c.eos_id)], axis=1)
        return ids.to_tensor(default_value=c.pad_id, shape=[None, None])

    def _text(self, search, text, options):
        c = self.config
        tokens = search(self._source_ids(text), *options)["tokens"]  # `search` keeps max_source_length
        if tokens.shape.rank == 3:
            tokens = tokens[:, 0]  # best beam
        # Keep the tokens before the first EOS, without padding.
        before_eos = tf.equal(tf.cumsum(tf.cast(tf.equal(tokens, c.eos_id), tf.int32), axis=1), 0)
        keep = before_eos & tf.not_equal(tokens, c.pad_id)  # (B, T)
        if self.target_map is not None:  # the target SentencePiece's ids, special tokens (-1) left out
            tokens = tf.gather(self.target_map, tokens)
            keep &= tokens >= 0
        if self.leading_spaces.needed:  # TF Text's decoder begins a text otherwise
            tokens, keep = detokenize.as_sentencepiece_decodes(tokens, keep, self.leading_spaces)
        return {"translation": self.target_tokenizer.detokenize(tf.ragged.boolean_mask(tokens, keep))}

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

    def frozen_text(self, search, recipe, fixed_shape=False):
        """`search` with the text around it in graph operations (kformer.export.text_graph):
        UTF-8 bytes in and out, frozen as `frozen`'s. fixed_shape: one text of at most
        FIXED_TEXT_BYTES a call, outputs of static shapes (translate.with_fixed_shapes), for runtimes
        that plan every input and output once (LiteRT.js)."""
        from kformer.export.text_graph import sentencepiece, translate

        translator = Translator(self.translator.model, self.translator.beam_size, RECIPES[recipe])
        fn = getattr(translator, search)
        if self._text_tables is None:  # built once for all the text files of an export
            self._text_tables = sentencepiece.Tables(self.tokenizer)
        text_fn = translate.text_search(
            fn, self._text_tables, self.config, self.joiner, beam=search == "beam"
        )
        specs = [*TEXT_BYTES_SPECS, *fn.input_signature[1:]]
        if fixed_shape:
            specs[:2] = [
                tf.TensorSpec([1, translate.FIXED_TEXT_BYTES], tf.uint8, name="text"),
                tf.TensorSpec([1], tf.int32, name="lengths"),
            ]
            text_fn = translate.with_fixed_shapes(
                text_fn, self.translator.beam_size if search == "beam" else 1
            )
        traced = tf.function(text_fn, input_signature=specs).get_concrete_function()
        frozen, names = convert_variables_to_constants_v2(traced), sorted(traced.structured_outputs)
        # Called from a function of its own, the frozen graph gets its outputs' names back (frozen,
        # they are a list in the order of their names): the file's signature then names them.
        named = tf.function(lambda *inputs: dict(zip(names, frozen(*inputs))), input_signature=specs)
        return named.get_concrete_function()


class _CodeTable(tf.Module):
    """{code: model id} as a lookup; a code none of them (or any, for a vocabulary without
    language tokens) is <unk>."""

    def __init__(self, codes, unk_id):
        super().__init__()
        self.unk_id = unk_id
        self.table = None
        if codes:
            keys, values = tf.constant(list(codes), tf.string), tf.constant(list(codes.values()), tf.int32)
            initializer = tf.lookup.KeyValueTensorInitializer(keys, values)
            self.table = tf.lookup.StaticHashTable(initializer, default_value=unk_id)

    def lookup(self, code):
        return tf.fill(tf.shape(code), self.unk_id) if self.table is None else self.table.lookup(code)

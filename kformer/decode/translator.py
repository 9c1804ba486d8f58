"""The graph-mode translator: a tf.Module whose searches are traced once per input signature,
and the Keras runner around it.

`Translator` is the one object exported to SavedModel, TFLite and ONNX; `KerasRunner` tokenizes,
batches and detokenizes around its graphs as every runner does (kformer.decode.runner).
"""

import tensorflow as tf

from kformer.decode import options as options_lib
from kformer.decode import recipe as recipe_lib
from kformer.decode import search
from kformer.decode.options import BEAM_SIZE, SearchOptions
from kformer.decode.recipe import RECIPES
from kformer.decode.runner import Runner, RunnerSettings

# Two-pass searches run first with buffers of source length + this, then only the rows not done
# by then, in buffers of the full length: most outputs end within a few tokens of their source's
# length (kformer.decode.search.loops.TwoPasses).
FIRST_PASS_EXTRA_TOKENS = 8

SOURCE_SPEC = tf.TensorSpec([None, None], tf.int32, name="source_ids")
# The searches' run-time options (kformer.decode.options): scalars, inputs of every exported graph.
OPTION_SPECS = {
    name: tf.TensorSpec([], tf.as_dtype(dtype), name=name) for name, dtype in options_lib.INPUTS.items()
}
GREEDY_SPECS = [SOURCE_SPEC, *(OPTION_SPECS[name] for name in options_lib.GREEDY_INPUTS)]
BEAM_SPECS = [SOURCE_SPEC, *OPTION_SPECS.values()]


class Translator(tf.Module):
    """Greedy and beam search over a model's `decode_step`, as graph functions: what every export
    format is written from, and what the Keras runner calls.

    Args:
        model: a `kformer.model.transformer.Transformer`.
        beam_size: K of the `beam` graph (its buffers are shaped by it).
        recipe: how the searches are built for the runtime that runs them (a
            kformer.decode.recipe.DecodeRecipe: the cache's mode, the loop strategy, whole-row
            top 1, XLA).

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

    def __init__(self, model, beam_size=BEAM_SIZE, recipe=RECIPES["tensorflow"]):
        super().__init__(name="translator")
        self.model, self.config, self.beam_size, self.recipe = model, model.config, beam_size, recipe
        self.greedy = tf.function(self._greedy, input_signature=GREEDY_SPECS, jit_compile=recipe.jit)
        self.beam = tf.function(self._beam, input_signature=BEAM_SPECS, jit_compile=recipe.jit)

    def search_inputs(self, source_ids, max_length, loop=None):
        """(B, S) source ids and the max_length option -> (search.Lengths, decoder cache, loop) for
        a search; loop: how done rows stop stepping (kformer.decode.search.loops), the recipe's
        unless given (a recipe loop name). Ids beyond the positional table would be out of range
        (an error in TF and ONNX, an unchecked read in TFLite): the graph keeps the first
        max_source_length, in every runtime."""
        c, loop = self.config, loop or self.recipe.loop
        source_ids = source_ids[:, : c.max_source_length]
        cap = tf.clip_by_value(max_length, 1, c.max_target_length)
        # Buffers as long as the model's longest output whatever max_length is: their shapes then
        # follow from the input's shape alone, as XLA and LiteRT.js (the fixed file) need; a lower
        # max_length stops the loop earlier, in buffers a little longer than needed.
        lengths = search.output_limits(source_ids, c.pad_id, cap, buffer_cap=c.max_target_length)
        mode = self.recipe.cache
        if loop == recipe_lib.DROP_DONE:
            return lengths, self.model.init_cache(source_ids, mode), search.DROP_DONE
        if loop == recipe_lib.ONE_PASS:
            return lengths, self.model.init_cache(source_ids, mode, lengths.buffer), search.ONE_PASS
        first_length = tf.minimum(lengths.buffer, tf.shape(source_ids)[1] + FIRST_PASS_EXTRA_TOKENS)
        two_passes = search.TwoPasses(first_length, self.model.grow_cache)
        return lengths, self.model.init_cache(source_ids, mode, first_length), two_passes

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
                step,
                cache,
                lengths,
                ids,
                loop,
                no_repeat_ngram=no_repeat_ngram,
                whole_top_1=self.recipe.whole_top_1,
            )
        return {"tokens": tokens, "scores": scores}

    def trace(self, batch, options):
        """Beam search of (B, S) source ids with checked `options`, in one pass that keeps the
        alive hypotheses of every step, for pictures (kformer.plots): {"tokens": (B, T, K, T),
        "log_probs": (B, T, K), "steps": ()}. Eager; not part of any export."""
        source_ids = tf.constant(batch, tf.int32)
        lengths, cache, _ = self.search_inputs(source_ids, options.max_length, loop=recipe_lib.ONE_PASS)
        c = self.config
        ids = search.TokenIds(c.bos_id, c.eos_id, c.pad_id)
        step, loop = self.model.decode_step, search.OnePass(trace=True)
        beam_options = search.BeamOptions(options.alpha)
        return search.beam_search(step, cache, lengths, ids, self.beam_size, beam_options, loop)[2]

    def run(self, batch, options):
        """(B, S) int32 source ids and checked options -> the graph's {"tokens", "scores"} (tensors)."""
        if options.beam_size not in (1, self.beam_size):
            raise ValueError(
                f"this Translator's beam graph has beam size {self.beam_size}, not {options.beam_size}"
            )
        graph = self.greedy if options.search == "greedy" else self.beam
        return graph(tf.constant(batch, tf.int32), **options.inputs())


class KerasRunner(Runner):
    """A Keras model behind the runners' interface: the reference runtime. `options` (a
    SearchOptions over DEFAULTS) set its beam graph's width and its defaults; `recipe`: how its
    searches are built (kformer.decode.recipe)."""

    def __init__(self, model, tokenizer, options=None, settings=None, language=None):
        super().__init__(
            model.config, tokenizer, options or SearchOptions(), settings or RunnerSettings(), language
        )
        self.translator = Translator(model, self.options.beam_size)

    @classmethod
    def open(cls, run_dir, weights="best", options=None, settings=None):
        """The runner of a training directory's model, with the weights `weights` picks
        (kformer.run_folder.weights_file)."""
        from kformer import run_folder

        run = run_folder.load(run_dir, weights)
        return cls(run.model, run.tokenizer, options, settings, run.language)

    def _search(self, options, batch):
        if options.beam_size not in (1, self.translator.beam_size):  # another width: another graph
            self.translator = Translator(self.translator.model, options.beam_size)
        result = self.translator.run(batch, options)
        return result["tokens"].numpy(), result["scores"].numpy()

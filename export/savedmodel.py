"""Runners that need TensorFlow: the exported SavedModel, and the Keras model of a training folder."""

import numpy as np
import tensorflow as tf

from export.runtime import Runner, find_artifact, verified_path
from kformer.config import BEAM_SIZE, LENGTH_PENALTY


class SavedModelRunner(Runner):
    def __init__(self, artifact_dir, beam_size=None, batch_size=32):
        super().__init__(artifact_dir, beam_size, batch_size)
        import tensorflow_text  # noqa: F401  (registers the SentencePiece ops of the text signatures)

        entry = find_artifact(self.manifest, "savedmodel", "all", "fp32")
        self.loaded = tf.saved_model.load(verified_path(artifact_dir, self.manifest, entry))

    def _search(self, search, batch):
        result = self.loaded.signatures[f"{search}_ids"](source_ids=tf.constant(batch))
        return result["tokens"].numpy(), result["scores"].numpy()

    def translate_text(self, texts):
        """The text-in/text-out signature: SentencePiece inside the graph."""
        fn = self.loaded.signatures[f"{self.search_name}_text"]
        return [t.decode("utf-8") for t in fn(text=tf.constant(texts, tf.string))["translation"].numpy()]


class KerasRunner:
    """The training folder's Keras model behind the same interface (the reference runtime)."""

    def __init__(self, model_dir, beam_size=BEAM_SIZE, alpha=LENGTH_PENALTY, max_length=None, batch_size=32):
        from kformer import checkpoint
        from kformer.translate import Translator

        model, self.config, self.tokenizer, _ = checkpoint.load(model_dir)
        self.translator = Translator(
            model,
            self.tokenizer,
            beam_size=max(1, beam_size),
            alpha=alpha,
            max_length=max_length,
            batch_size=batch_size,
        )

    def search(self, batch):
        return self.translator.search(np.asarray(batch, np.int32))

    def translate_ids(self, ids):
        return self.translator.translate_ids(ids)

    def translate(self, texts):
        return self.translator.translate(texts)

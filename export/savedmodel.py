"""SavedModel: the TensorFlow format, with text-in/text-out signatures (tensorflow-text inside).

Signatures greedy_ids / beam_ids (source_ids -> tokens, scores) and greedy_text / beam_text
(text -> translation), one folder, the weights once."""

from kformer.export.artifact_format import Format
from kformer.export.runner import ArtifactRunner


class SavedModel(Format):
    name = "savedmodel"

    def file(self, variant):
        return "savedmodel"  # one folder, fp32 only

    def write(self, module, path, variant="fp32"):
        import tensorflow as tf

        signatures = {
            f"{search}_{kind}": getattr(module, f"{search}_{kind}").get_concrete_function()
            for search in ("greedy", "beam")
            for kind in ("ids", "text")
        }
        tf.saved_model.save(module, path, signatures=signatures)

    def runner_class(self, variant):
        return SavedModelRunner


class SavedModelRunner(ArtifactRunner):
    """The SavedModel in TensorFlow (`threads` is TensorFlow's business)."""

    fmt = SavedModel.name

    def __init__(self, artifact_dir, variant="fp32", settings=None, options=None):
        super().__init__(artifact_dir, variant, settings, options)
        import tensorflow as tf
        import tensorflow_text  # noqa: F401  (registers the SentencePiece ops of the text signatures)

        self.loaded = tf.saved_model.load(self.path)

    def _search(self, options, batch):
        import tensorflow as tf

        inputs = {name: tf.constant(value) for name, value in options.inputs().items()}
        result = self.loaded.signatures[f"{options.search}_ids"](source_ids=tf.constant(batch), **inputs)
        return result["tokens"].numpy(), result["scores"].numpy()

    def translate_text(self, texts, options=None):
        """The text-in/text-out signature (SentencePiece inside the graph), one sentence per text."""
        import tensorflow as tf

        options = self.checked(options)
        inputs = {name: tf.constant(value) for name, value in options.inputs().items()}
        fn = self.loaded.signatures[f"{options.search}_text"]
        translations = fn(text=tf.constant(texts, tf.string), **inputs)["translation"].numpy()
        return [t.decode("utf-8") for t in translations]


FORMAT = SavedModel()

"""Run an exported ONNX translator with onnxruntime: numpy, sentencepiece, onnxruntime only."""

import os

import numpy as np
import onnxruntime as ort

from export.runtime import Runner, find_artifact, verified_path
from kformer import batching


def beam_switch(search):
    """The ONNX files' `beam` input: which of their two searches runs."""
    return np.array(search == "beam")


class OnnxRunner(Runner):
    """Args: artifact_dir (from `kformer export`), beam_size (1 or the exported K),
    variant ("fp32" or "int8"), threads (intra-op threads; default: all cores)."""

    def __init__(self, artifact_dir, beam_size=None, variant="fp32", threads=None, batch_size=32):
        super().__init__(artifact_dir, beam_size, batch_size)
        entry = find_artifact(self.manifest, "onnx", self.search_name, variant)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads or os.cpu_count() or 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(
            verified_path(artifact_dir, self.manifest, entry), options, providers=["CPUExecutionProvider"]
        )

    def _search(self, search, batch):
        # The file holds both searches: tokens (B, N, T), scores (B, N), N = 1 for greedy.
        tokens, scores = self.session.run(
            ["tokens", "scores"], {"source_ids": batch, "beam": beam_switch(search)}
        )
        return (tokens, scores) if search == "beam" else (tokens[:, 0], scores[:, 0])


class OnnxTextRunner(Runner):
    """The text-in/text-out ONNX file (SentencePiece inside the graph): needs onnxruntime and
    onnxruntime-extensions only. Over-long inputs are truncated silently inside the graph.
    Use it in a process without TensorFlow: the extensions library crashes next to TensorFlow
    and tensorflow-text, which bundle their own SentencePiece and protobuf."""

    def __init__(self, artifact_dir, beam_size=None, threads=None, batch_size=32):
        from onnxruntime_extensions import get_library_path

        super().__init__(artifact_dir, beam_size, batch_size)
        entry = find_artifact(self.manifest, "onnx", self.search_name, "text")
        options = ort.SessionOptions()
        options.register_custom_ops_library(get_library_path())
        options.intra_op_num_threads = threads or os.cpu_count() or 1
        self.session = ort.InferenceSession(
            verified_path(artifact_dir, self.manifest, entry), options, providers=["CPUExecutionProvider"]
        )

    def translate(self, texts):
        _, untranslated = batching.encode_texts(self.tokenizer, texts, self.config["max_source_length"])
        outputs = []
        for start in range(0, len(texts), self.batch_size):
            batch = np.array(texts[start : start + self.batch_size], dtype=object)
            feed = {"text": batch, "beam": beam_switch(self.search_name)}
            outputs += [str(t) for t in self.session.run(["translation"], feed)[0]]
        return [untranslated.get(i, output) for i, output in enumerate(outputs)]

    def _search(self, search, batch):
        raise TypeError("the text ONNX file takes text; use OnnxRunner for token ids")

"""Run an exported TFLite translator with LiteRT: numpy, sentencepiece, ai-edge-litert only."""

import os

import numpy as np
from ai_edge_litert.interpreter import Interpreter

from export.runtime import Runner, find_artifact, verified_path


class TfliteRunner(Runner):
    """Args: artifact_dir (from `kformer export`), beam_size (1 or the exported K),
    variant ("fp32", "fp16", "int8", or "fixed": fp32 with input shape (1, max_source_length),
    the web page's file, run here one padded row at a time), threads."""

    def __init__(self, artifact_dir, beam_size=None, variant="fp32", threads=None, batch_size=32):
        super().__init__(artifact_dir, beam_size, batch_size)
        entry = find_artifact(self.manifest, "tflite", self.search_name, variant)
        # Delegate clustering off: with LiteRT 2.3.0's default, an interpreter made after another of
        # the same file was freed now and then gave other scores or tokens on its first call (2 to 6
        # of 39 fresh interpreters on the tiny test model's file as exported at 11164ea). Tensors
        # are no longer kept apart (experimental_preserve_all_tensors, 1.17-1.2x the time): with
        # the decoding graphs of 2026-11-25 no fresh interpreter differed without it (README: Design).
        interpreter = Interpreter(
            model_path=verified_path(artifact_dir, self.manifest, entry),
            num_threads=threads or os.cpu_count() or 1,
            experimental_disable_delegate_clustering=True,
        )
        # A file of both searches has the signatures "greedy" and "beam"; a one-search file has one.
        signatures = interpreter.get_signature_list()
        self.signature = interpreter.get_signature_runner(
            self.search_name if self.search_name in signatures else next(iter(signatures))
        )
        ((self.input_name, self.input),) = self.signature.get_input_details().items()
        # Outputs by dtype: tokens are the int32 output, scores the float32 one.
        outputs = {np.dtype(d["dtype"]): name for name, d in self.signature.get_output_details().items()}
        self.outputs = outputs[np.dtype(np.int32)], outputs[np.dtype(np.float32)]

    def _search(self, search, batch):
        _, length = self.input["shape_signature"]
        if length != -1:  # the "fixed" file: rows cut or padded to the fixed length, run one at a time
            batch = np.pad(batch[:, :length], [(0, 0), (0, length - min(batch.shape[1], length))])
            rows = [self._invoke(batch[row : row + 1]) for row in range(len(batch))]
            return tuple(np.concatenate(parts) for parts in zip(*rows))
        return self._invoke(batch)

    def _invoke(self, batch):
        results = self.signature(
            **{self.input_name: batch}
        )  # resizes to the batch's shape (dynamic batch, length)
        return tuple(results[name] for name in self.outputs)

"""The one interface of every translator, whatever runs it; no runtime is imported here.

A runner needs this file, kformer/batching.py, numpy, sentencepiece and its own runtime."""

import os

import numpy as np

from kformer import batching
from kformer.export import manifest as manifest_lib


class Runner:
    """`translate(list[str]) -> list[str]`, `translate_ids(list[list[int]]) -> (ids, scores)` and
    `search((B, S) int32) -> (tokens, scores)` of one search (greedy for beam size 1, else beam).

    Subclasses implement `_search(search, batch) -> (tokens, scores)` for an int32 (B, S) batch,
    search "greedy" or "beam". `config` is the model's config as a dict.
    """

    def __init__(self, config, tokenizer, beam_size, batch_size=32):
        self.config, self.tokenizer = config, tokenizer
        self.beam_size, self.batch_size = beam_size, batch_size
        self.search_name = "beam" if beam_size > 1 else "greedy"

    def search(self, batch):
        """(B, S) int32 source ids (pad 0) -> (tokens, scores) of the chosen search."""
        batch = np.asarray(batch)
        if batch.dtype != np.int32 or batch.ndim != 2:
            raise TypeError(
                f"source_ids must be an int32 array of shape (batch, length), "
                f"got {batch.dtype} with shape {batch.shape}"
            )
        return self._search(self.search_name, batch)

    def _search(self, search, batch):
        raise NotImplementedError

    def translate_ids(self, ids):
        return batching.translate_ids(
            self.search, ids, self.batch_size, self.config["eos_id"], self.config["pad_id"]
        )

    def translate(self, texts):
        return batching.translate_texts(
            self.tokenizer, texts, self.config["max_source_length"], self.translate_ids
        )


class ArtifactRunner(Runner):
    """A runner of one file of a `kformer export` folder: the manifest and the tokenizer are read
    and verified first; `path` is the verified file of `fmt`'s `variant`.

    Args: artifact_dir, beam_size (1 or the exported K; default K), variant, threads (intra-op
    threads; default: all cores), batch_size (sentences per call in `translate`)."""

    fmt = None  # the format's name in the manifest

    def __init__(self, artifact_dir, beam_size=None, variant="fp32", threads=None, batch_size=32):
        self.artifact_dir = artifact_dir
        self.manifest = manifest_lib.load(artifact_dir)
        tokenizer = manifest_lib.load_tokenizer(artifact_dir, self.manifest)
        exported = self.manifest["beam_size"]
        beam_size = exported if beam_size is None else beam_size
        if beam_size not in (1, exported):
            raise manifest_lib.ArtifactError(
                f"this export has greedy search and beam size {exported}, not {beam_size}; "
                f"re-export with --beam {beam_size}"
            )
        super().__init__(self.manifest["config"], tokenizer, beam_size, batch_size)
        self.variant, self.threads = variant, threads or os.cpu_count() or 1
        entry = manifest_lib.find_artifact(self.manifest, self.fmt, variant)
        self.path = manifest_lib.verified_path(artifact_dir, self.manifest, entry)

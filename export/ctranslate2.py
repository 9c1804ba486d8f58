"""Run a CTranslate2 export of a kformer model: numpy, sentencepiece, ctranslate2 only.

CTranslate2 decodes token strings; this runner maps ids to SentencePiece pieces and back, and
applies kformer's output-length rule (source length + 50, at most the exported max length) per row.
Its greedy tokens and scores (sum of log-probabilities) equal Keras'. Its beam search divides the
log-probability by length^alpha (not GNMT's ((5 + length) / 6)^alpha), so beam outputs and scores
may differ."""

import os

import ctranslate2
import numpy as np

from export.runtime import Runner, find_artifact, verified_path
from kformer.config import EXTRA_OUTPUT_TOKENS


class Ctranslate2Runner(Runner):
    """Args: artifact_dir (from `kformer export --formats ctranslate2`), beam_size (1 or the
    exported K), variant ("fp32" or "int8"), threads."""

    def __init__(self, artifact_dir, beam_size=None, variant="fp32", threads=None, batch_size=32):
        super().__init__(artifact_dir, beam_size, batch_size)
        entry = find_artifact(self.manifest, "ctranslate2", "all", variant)
        self.translator = ctranslate2.Translator(
            verified_path(artifact_dir, self.manifest, entry),
            device="cpu",
            intra_threads=threads or os.cpu_count() or 1,
        )

    def _search(self, search, batch):
        c, cap = self.config, self.manifest["max_length"]
        rows = [
            [self.tokenizer.id_to_piece(int(t)) for t in row if t != c["pad_id"]]
            for row in batch[:, : c["max_source_length"]]
        ]
        limits = [min(len(row) + EXTRA_OUTPUT_TOKENS, cap) if row else 0 for row in rows]
        tokens = np.full((len(rows), min(batch.shape[1] + EXTRA_OUTPUT_TOKENS, cap)), c["pad_id"], np.int32)
        scores = np.zeros(len(rows), np.float32)
        for limit in sorted(set(limits) - {0}):  # one call per output limit: CTranslate2 takes one per batch
            chosen = [i for i, row_limit in enumerate(limits) if row_limit == limit]
            results = self.translator.translate_batch(
                [rows[i] for i in chosen],
                beam_size=self.beam_size,
                length_penalty=self.manifest["alpha"]
                if self.beam_size > 1
                else 0.0,  # greedy: sum of log-probs
                max_decoding_length=limit,
                return_scores=True,
                return_end_token=True,
            )
            for i, result in zip(chosen, results):
                ids = [self.tokenizer.piece_to_id(piece) for piece in result.hypotheses[0]]
                tokens[i, : len(ids)] = ids
                scores[i] = result.scores[0]
        return tokens, scores

"""The runner of TFLite's text files (variants `text` and `int8-text`): UTF-8 in, UTF-8 out, the
sentences, SentencePiece and joining inside the file (kformer.export.text_graph), so an app's
whole code is packing bytes. Needs numpy and ai-edge-litert only."""

import numpy as np

from kformer.decode.options import SearchOptions
from kformer.decode.text_batches import Hypothesis, Translation
from kformer.export import memory
from kformer.export.tflite import _ONE_CALL_AT_A_TIME, TfliteRunner


def utf8_batch(texts):
    """texts -> (text (B, N) uint8 UTF-8, a row each, zeros after; lengths (B,) int32 in bytes).
    A lone surrogate (no UTF-8 of its own) becomes "?"; the file itself reads bad bytes as
    U+FFFD."""
    data = [t.encode("utf-8", errors="replace") for t in texts]
    batch = np.zeros((len(data), max([1, *map(len, data)])), np.uint8)
    for row, encoded in enumerate(data):
        batch[row, : len(encoded)] = np.frombuffer(encoded, np.uint8)
    return batch, np.array([len(d) for d in data], np.int32)


def _text(data, size):
    return bytes(data[:size]).decode("utf-8")


def call_text_signature(signature, options, text, lengths):
    """One call of a text file's signature: (UTF-8 (B, N) uint8, lengths (B,)) and checked
    options -> a text_batches.Translation a text (alternatives: beam search's, else the one)."""
    out = signature(text=text, lengths=lengths, **options.inputs())
    translations = []
    for row, size in enumerate(out["lengths"]):
        best = Hypothesis(_text(out["translation"][row], size), float(out["scores"][row]))
        alternatives = (best,)
        if "alternatives" in out:
            alternatives = tuple(
                Hypothesis(
                    _text(out["alternatives"][row, k], out["alternative_lengths"][row, k]), float(score)
                )
                for k, score in enumerate(out["alternative_scores"][row, : out["alternative_counts"][row]])
            )
        translations.append(Translation(best.text, best.score, alternatives))
    return translations


class TfliteTextRunner(TfliteRunner):
    """A text variant in LiteRT: each call takes a batch of texts; a text's sentences are found,
    translated and joined inside the file, its alternatives too."""

    def signature(self, search):
        """LiteRT's runner of a search's text signature, opened, and its weights packed by a first
        call on one short text (as TfliteRunner._pack, for the same reasons)."""
        if search not in self.signatures:
            runner = self.opened(search).get_signature_runner(search)
            self.signatures[search] = runner, -1
            options = self.checked(
                SearchOptions(beam_size=1 if search == "greedy" else self.manifest.beam_size)
            )
            call_text_signature(runner, options, *utf8_batch(["."]))
            memory.drop_file_pages(self.file_of(search))
        return self.signatures[search]

    def translations(self, texts, options=None):
        """Texts -> text_batches.Translations, `batch_size` texts a call, texts of similar sizes
        together (less padding, as the ids runners' length-sorted batches)."""
        options = self.checked(options)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        translations = [None] * len(texts)
        with _ONE_CALL_AT_A_TIME:
            signature, _ = self.signature(options.search)
            for start in range(0, len(texts), self.batch_size):
                chunk = order[start : start + self.batch_size]
                found = call_text_signature(signature, options, *utf8_batch([texts[i] for i in chunk]))
                for i, translation in zip(chunk, found):
                    translations[i] = translation
        return translations

    def _search(self, options, batch):
        raise TypeError("the text TFLite file takes text; use --variant fp32 for token ids")

"""Text <-> id batching around a translation graph. Pure Python + numpy (no TensorFlow), so the
device runners of `export/` share it with `kformer.translate`."""

import logging

import numpy as np

log = logging.getLogger("kformer")


def _quoted(text, width=24):
    return repr(text if len(text) <= width else text[: width - 1] + "…")


def encode_texts(tokenizer, texts, max_source_length):
    """SentencePiece ids per text, and the texts to output as they are.

    Returns (ids, untranslated): blank texts get [] (an empty translation). A text none of whose
    characters is in the vocabulary (emoji only, a script the corpus lacks) also gets [], and
    `untranslated[index]` is the text, to be output unchanged with a warning: from <unk> pieces
    alone the model would invent a sentence. A text mostly outside the vocabulary is translated,
    with a warning. Over-long texts are truncated, with a warning.
    """
    ids, untranslated = [], {}
    for index, text in enumerate(texts):
        text = text.strip()
        row = tokenizer.encode(text) if text else []
        # Every character the tokenizer was trained to cover is one of its pieces (unigram models
        # keep them all), so a character that is no piece is one that becomes <unk>.
        characters = "".join(text.split())
        unknown = sum(tokenizer.piece_to_id(c) == tokenizer.unk_id() for c in characters)
        if characters and unknown == len(characters):
            log.warning(
                "input %s: none of its characters is in the model's vocabulary; output untranslated",
                _quoted(text),
            )
            untranslated[index] = text
            row = []
        elif unknown * 2 > len(characters):
            log.warning(
                "input %s: %d of its %d characters are not in the model's vocabulary; "
                "its translation may be invented",
                _quoted(text),
                unknown,
                len(characters),
            )
        if len(row) > max_source_length:
            log.warning(
                "input %s has %d tokens; truncated to the model's maximum source length %d",
                _quoted(text),
                len(row),
                max_source_length,
            )
        ids.append(row[:max_source_length])
    return ids, untranslated


def translate_texts(tokenizer, texts, max_source_length, translate_ids):
    """list[str] -> list[str] through `translate_ids(ids) -> (output ids, scores)`, with the
    defined results of `encode_texts` for blank, unreadable and over-long texts."""
    ids, untranslated = encode_texts(tokenizer, texts, max_source_length)
    outputs, _ = translate_ids(ids)
    return [untranslated.get(i, tokenizer.decode(row)) for i, row in enumerate(outputs)]


def length_sorted_batches(ids, batch_size):
    """Yields (indices, (B, S) int32 padded batch); similar lengths together, every row once."""
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        batch = np.zeros((len(chunk), max(1, max(len(ids[i]) for i in chunk))), np.int32)
        for row, i in enumerate(chunk):
            batch[row, : len(ids[i])] = ids[i]
        yield chunk, batch


def strip_special(tokens, eos_id, pad_id=0):
    """Output ids up to (not including) the first EOS, without padding."""
    tokens = [int(t) for t in tokens]
    if eos_id in tokens:
        tokens = tokens[: tokens.index(eos_id)]
    return [t for t in tokens if t != pad_id]


def translate_ids(search, ids, batch_size, eos_id, pad_id=0):
    """Runs `search((B, S) int32) -> (tokens (B, [K,] T), scores (B, [K]))` over length-sorted
    batches; returns (output ids without EOS/pad, scores) in input order, best beam only."""
    outputs, scores = [None] * len(ids), [0.0] * len(ids)
    for chunk, batch in length_sorted_batches(ids, batch_size):
        tokens, row_scores = search(batch)
        tokens, row_scores = np.asarray(tokens), np.asarray(row_scores)
        if tokens.ndim == 3:  # beam: (B, K, T), best first
            tokens, row_scores = tokens[:, 0], row_scores[:, 0]
        for row, i in enumerate(chunk):
            outputs[i] = strip_special(tokens[row], eos_id, pad_id)
            scores[i] = float(row_scores[row])
    return outputs, scores

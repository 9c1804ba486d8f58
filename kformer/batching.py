"""Text <-> id batching around a translation graph. Pure Python + numpy (no TensorFlow), so the
device runners of `export/` share it with `kformer.translate`."""

import logging

import numpy as np

log = logging.getLogger("kformer")


def encode_texts(tokenizer, texts, max_source_length):
    """SentencePiece ids per text; blank texts give []; over-long ones are truncated with a warning."""
    ids = []
    for number, text in enumerate(texts, start=1):
        row = tokenizer.encode(text.strip()) if text.strip() else []
        if len(row) > max_source_length:
            log.warning("input %d has %d tokens; truncated to the model's maximum source length %d",
                        number, len(row), max_source_length)
        ids.append(row[:max_source_length])
    return ids


def length_sorted_batches(ids, batch_size):
    """Yields (indices, (B, S) int32 padded batch); similar lengths together, every row once."""
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    for start in range(0, len(order), batch_size):
        chunk = order[start: start + batch_size]
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

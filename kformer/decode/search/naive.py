"""The reference the cached search loop is tested and benchmarked against: a step that re-runs
the model over the whole prefix."""

import tensorflow as tf

from kformer.model import portable


def naive_step(forward):
    """A step function with no cache: it re-runs `forward(source_ids, target_ids) -> logits`
    over the whole prefix at every step. The reference the cached loop is tested and
    benchmarked against; it works with both searches (its "cache" is the source and prefix).
    Use with `naive_cache`."""

    def step(last, cache, index):
        prefix = cache["state"]  # (B, T): BOS + tokens so far
        prefix = portable.write_slot(prefix, tf.equal(tf.range(tf.shape(prefix)[1]), index), last)
        logits = forward(cache["static"], prefix[:, : index + 1])
        return logits[:, -1], {"static": cache["static"], "state": prefix}

    return step


def naive_cache(source_ids, buffer_length, pad_id=0):
    return {"static": source_ids, "state": tf.fill([tf.shape(source_ids)[0], buffer_length], pad_id)}

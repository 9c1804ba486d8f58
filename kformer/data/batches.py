"""Training batches with tf.data: pairs of token ids bucketed by length into
({"source_ids", "target_ids"}, labels) batches."""

import collections
import dataclasses

import numpy as np

from kformer.data import vocabulary
from kformer.data.tokenizer import SPECIAL_IDS


@dataclasses.dataclass(frozen=True)
class Batching:
    """How pairs become training batches: the longest source and target that fit (a target with
    BOS or EOS shorter than max_target_length), the tokens of a batch and side (padding
    included), and the ids a target is framed with."""

    max_source_length: int
    max_target_length: int
    batch_tokens: int
    bos_id: int = SPECIAL_IDS["bos_id"]
    eos_id: int = SPECIAL_IDS["eos_id"]

    @classmethod
    def of(cls, config, batch_tokens):
        """The batching of a model of `config` (a ModelConfig) at `batch_tokens` a batch."""
        return cls(
            config.max_source_length, config.max_target_length, batch_tokens, config.bos_id, config.eos_id
        )


@dataclasses.dataclass
class EncodedPairs:
    """Token ids of a split, without BOS/EOS; over-long pairs already removed (and counted)."""

    source: list
    target: list
    dropped_too_long: int = 0

    def __len__(self):
        return len(self.source)

    def lengths(self):
        return np.array([len(s) for s in self.source]), np.array([len(t) for t in self.target])

    def ragged(self):
        """(source, target) as int32 RaggedTensors, one row a pair."""
        source_lengths, target_lengths = self.lengths()
        return (
            _ragged(np.concatenate([np.asarray(r, np.int32) for r in self.source]), source_lengths),
            _ragged(np.concatenate([np.asarray(r, np.int32) for r in self.target]), target_lengths),
        )


@dataclasses.dataclass
class ArrayPairs:
    """Token ids of many pairs in four flat arrays (no Python object per pair or token): the
    ids of all sources one after the other and each one's length, the same for the targets."""

    source: np.ndarray
    source_lengths: np.ndarray
    target: np.ndarray
    target_lengths: np.ndarray
    dropped_too_long: int = 0

    def __len__(self):
        return len(self.source_lengths)

    def lengths(self):
        return self.source_lengths, self.target_lengths

    def ragged(self):
        return _ragged(self.source, self.source_lengths), _ragged(self.target, self.target_lengths)


def _ragged(values, lengths):
    import tensorflow as tf

    return tf.RaggedTensor.from_row_lengths(tf.cast(values, tf.int32), np.asarray(lengths, np.int64))


def encode_pairs(tokenizer, pairs, batching):
    """Tokenizes pairs; drops pairs whose source exceeds max_source_length or whose target
    plus BOS/EOS exceeds max_target_length."""
    source = tokenizer.encode([p[0] for p in pairs])
    target = vocabulary.encode_targets(tokenizer, [p[1] for p in pairs])
    kept = [
        (s, t)
        for s, t in zip(source, target)
        if 0 < len(s) <= batching.max_source_length and 0 < len(t) < batching.max_target_length
    ]
    return EncodedPairs([s for s, _ in kept], [t for _, t in kept], dropped_too_long=len(pairs) - len(kept))


# How much longer each bucket is than the one before. Without XLA, buckets only set batch sizes
# (rows are padded to the batch's longest row), so they can be fine. With XLA every bucket is a
# batch shape that is compiled (for training, and again for validation): 85-103 s a shape for
# `base` and `big` on an H200, as long as ~2,500 of base's steps there. 1.5 makes 8 shapes up to
# 128 tokens instead of 14, at 28% padding instead of 22% (Tatoeba zh-en, `base`).
BUCKET_GROWTH = 1.25
XLA_BUCKET_GROWTH = 1.5


def bucket_plan(batching, pad_to_bucket):
    """(boundaries, batch_sizes): pairs whose longer side is shorter than boundaries[i] are batched
    `batch_sizes[i]` at a time (`batch_tokens` per side when padded to boundaries[i] - 1).
    Buckets grow by BUCKET_GROWTH, so pairs in one batch have similar lengths and padding stays
    small; pad_to_bucket (the batch shapes are the buckets, for XLA): by XLA_BUCKET_GROWTH."""
    growth = XLA_BUCKET_GROWTH if pad_to_bucket else BUCKET_GROWTH
    longest = max(batching.max_source_length, batching.max_target_length)
    boundaries, length = [], 8
    while length < longest:
        boundaries.append(length + 1)
        length = max(length + 2, round(length * growth))
    boundaries.append(longest + 1)
    sizes = [max(1, batching.batch_tokens // (b - 1)) for b in boundaries]
    return boundaries, sizes


def length_groups(batching):
    """Edges for grouping rows by length without XLA: every length up to 16 apart, then groups
    ~12% wide. Rows batched together share the group of their source and of their target."""
    edges, length = [], 2
    while length <= max(batching.max_source_length, batching.max_target_length):
        edges.append(length)
        length = length + 1 if length < 17 else round(length * 1.125)
    return edges


def _batch_keys(source_lengths, target_lengths, batching, pad_to_bucket):
    """Per pair, (bucket of the longer side, source group, target group): pairs that share it are
    batched together, `bucket_plan`'s size for that bucket at a time. pad_to_bucket: the bucket
    alone, so batch shapes are the buckets. The decoder's sequences carry BOS/EOS, hence + 1."""
    source, target = np.asarray(source_lengths), np.asarray(target_lengths) + 1
    bucket = np.searchsorted(
        bucket_plan(batching, pad_to_bucket)[0], np.maximum(source, target), side="right"
    )
    if pad_to_bucket:
        return [(b, 0, 0) for b in bucket.tolist()]
    groups = length_groups(batching)
    return list(
        zip(
            bucket.tolist(),
            np.searchsorted(groups, source, side="right").tolist(),
            np.searchsorted(groups, target, side="right").tolist(),
        )
    )


def steps_per_epoch_of(source_lengths, target_lengths, counts, batching, pad_to_bucket=True):
    """Batches per pass over pairs given by their lengths (`counts`: how many pairs have each pair
    of lengths; None: one each; e.g. a prepared corpus' length histogram) in the endless training
    stream: the pairs of each batch key over its batch size, summed (a key's partial batch fills
    in the next pass, so this is the mean; counting full batches of one pass would undercount the
    grouped batches)."""
    sizes = bucket_plan(batching, pad_to_bucket)[1]
    counts = np.ones(len(source_lengths), np.int64) if counts is None else counts
    totals = collections.Counter()
    for key, n in zip(_batch_keys(source_lengths, target_lengths, batching, pad_to_bucket), counts):
        totals[key] += int(n)
    return round(sum(n / sizes[key[0]] for key, n in totals.items()))


def _endless_passes(source, target, seed):
    """The pairs (ragged rows `source`, `target`) without end, each pass in a new random order:
    pass p's order is a stateless function of (seed, p), so a saved iterator position
    (kformer.callbacks.InputPosition) is the pass and the place in it, not a buffer of what is
    still to come, as a shuffle buffer over the whole corpus would be."""
    import tensorflow as tf

    count = tf.shape(source.row_lengths())[0]

    def one_pass(number):
        order = tf.random.experimental.stateless_shuffle(
            tf.range(count), tf.stack([tf.cast(seed, tf.int64), number])
        )
        return tf.data.Dataset.from_tensor_slices((tf.gather(source, order), tf.gather(target, order)))

    return tf.data.Dataset.counter().flat_map(one_pass)


def make_dataset(encoded, batching, training=True, seed=0, num_shards=1, shard_index=0, pad_to_bucket=True):
    """tf.data of ({"source_ids": (B, S), "target_ids": (B, T)}, labels (B, T)), int32, pad 0.

    target_ids = BOS + target (the decoder input, shifted right); labels = target + EOS.
    training=True: repeated forever, each pass in a new seeded order, full batches only;
    False: one pass in order, a bucket's last batch partial (filled up with empty rows when padded
    to the bucket, so that XLA meets no shape that training did not).
    A batch holds `bucket_plan`'s number of pairs for the bucket of its longer side.
    pad_to_bucket=True: rows grouped by that bucket and padded to its length, so the batch shapes
    are exactly the buckets (this bounds XLA compilations); False: rows grouped also by the
    `length_groups` of each side and padded only to the batch's longest row: hardly any padding
    (Tatoeba zh-en, small preset: 28% of the tokens are padding with XLA's buckets, 0.3% this way;
    for training without XLA).
    `num_shards`/`shard_index` split the examples between input workers.
    """
    import tensorflow as tf

    if not len(encoded):
        raise ValueError("no sentence pairs to batch (all were empty or too long?)")

    if training:
        return batched(endless_pairs(encoded, seed, num_shards, shard_index), batching, True, pad_to_bucket)
    ds = tf.data.Dataset.from_tensor_slices(encoded.ragged())
    if num_shards > 1:
        ds = ds.shard(num_shards, shard_index)
    return batched(ds, batching, False, pad_to_bucket)


def endless_pairs(encoded, seed=0, num_shards=1, shard_index=0):
    """tf.data of (source, target) id rows of `encoded` without end, each pass in a new seeded
    order (`_endless_passes`); this input worker's every `num_shards`-th pair."""
    if not len(encoded):
        raise ValueError("no sentence pairs to batch (all were empty or too long?)")
    ds = _endless_passes(*encoded.ragged(), seed)
    return ds.shard(num_shards, shard_index) if num_shards > 1 else ds


def batched(ds, batching, training, pad_to_bucket):
    """(source, target) id rows -> the batches of `make_dataset`."""
    import tensorflow as tf

    bos, eos = tf.constant([batching.bos_id]), tf.constant([batching.eos_id])

    def to_example(source, target):
        return {
            "source_ids": source,
            "target_ids": tf.concat([bos, target], 0),
            "labels": tf.concat([target, eos], 0),
        }

    boundaries, sizes = bucket_plan(batching, pad_to_bucket)
    groups = length_groups(batching)
    radix = len(groups) + 1
    groups, boundaries, sizes = (tf.constant(v, tf.int64) for v in (groups, boundaries, sizes))

    def index(length, edges):  # np.searchsorted(edges, length, side="right")
        return tf.reduce_sum(tf.cast(tf.cast(length, tf.int64) >= edges, tf.int64))

    def key(e):  # _batch_keys as one number
        source, target = tf.size(e["source_ids"]), tf.size(e["target_ids"])
        bucket = index(tf.maximum(source, target), boundaries)
        if pad_to_bucket:
            return bucket
        return (bucket * radix + index(source, groups)) * radix + index(target, groups)

    def batch_size(key):
        return sizes[key if pad_to_bucket else key // radix**2]

    def batch(key, rows):
        shape = tf.reshape(boundaries[key] - 1, [1]) if pad_to_bucket else [None]
        batches = rows.padded_batch(
            batch_size(key),
            padded_shapes={name: shape for name in rows.element_spec},
            drop_remainder=training,
        )
        if pad_to_bucket and not training:  # a bucket's last batch, filled with empty rows: no new shape
            batches = batches.map(lambda e: _with_rows(e, batch_size(key)))
        return batches

    ds = ds.map(to_example)
    ds = ds.group_by_window(key, batch, window_size_func=batch_size)
    ds = ds.map(lambda e: ({"source_ids": e["source_ids"], "target_ids": e["target_ids"]}, e["labels"]))
    options = tf.data.Options()
    options.deterministic = True
    # No autotuning: its background thread models every window `group_by_window` opens, and with
    # Keras' validation (the dev iterator is dropped each epoch and waits for that thread) it stalled
    # `fit` for 12-48 s in some epochs (a third of an epoch of `small` on 2 cores). This
    # pipeline needs no tuning: ~150 batches/s on one core from memory, and its parallel reads
    # from shards (`prepared_dataset`) have fixed widths.
    options.autotune.enabled = False
    return ds.with_options(options).prefetch(2)


def _with_rows(batch, rows):
    """A {name: (B, L)} batch with all-pad rows appended up to `rows`: they add nothing to the
    loss or the metrics (pad labels), and an all-pad source row attends uniformly, without NaN."""
    import tensorflow as tf

    missing = tf.cast(rows, tf.int32) - tf.shape(batch["labels"])[0]
    return {name: tf.pad(ids, [[0, missing], [0, 0]]) for name, ids in batch.items()}


def random_batch(config, shape, rng=None):
    """One (x, y) training batch of random token ids, no padding: `shape` is (rows, source length,
    target length). For timing a step on a shape of one's choosing (the precision probe, benches)."""
    rows, source_length, target_length = shape
    rng = rng or np.random.default_rng(0)
    first = max(config.pad_id, config.unk_id, config.bos_id, config.eos_id) + 1
    source = rng.integers(first, config.vocab_size, (rows, source_length), np.int32)
    target = rng.integers(first, config.vocab_size, (rows, target_length), np.int32)
    return {"source_ids": source, "target_ids": target}, target

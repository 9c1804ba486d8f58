"""A prepared corpus' train split as shards of TFRecords: the record format (written by
`kformer.data.prepare`, read here), read into memory or streamed.

A record is one pair: [source length, source ids..., target ids...] in the shard's id dtype.
"""

import numpy as np

from kformer.data.batches import ArrayPairs


def id_dtype(tokenizer):
    """The dtype of a shard's ids: the smallest that holds every id of `tokenizer`."""
    return np.uint16 if tokenizer.get_piece_size() <= 1 << 16 else np.uint32


def encode_record(source, target, dtype):
    """One pair as a record's bytes."""
    return np.array([len(source), *source, *target], dtype).tobytes()


IN_MEMORY_TOKENS = 16_000_000  # a train split of at most this many ids (~300k pairs) is read into memory
SHUFFLE_PAIRS = 20_000  # the shuffle buffer of a streamed train split


def prepared_lengths(manifest, batching):
    """(source lengths, target lengths, pairs of each) of a prepared train split, the pairs too
    long for `batching` left out; and how many those are."""
    counts = np.array(manifest.lengths.counts, np.int64).reshape(-1, 3)
    source, target, n = counts.T
    kept = (
        (source > 0)
        & (source <= batching.max_source_length)
        & (target > 0)
        & (target < batching.max_target_length)
    )
    return source[kept], target[kept], n[kept], int(n[~kept].sum())


def read_prepared(paths, dtype, batching):
    """The pairs of a prepared train split's shards, in memory as `ArrayPairs` (over-long ones
    dropped). Each record is [source length, source ids..., target ids...]; records are decoded a
    batch at a time with array operations, never one Python object per pair."""
    import tensorflow as tf

    parts, dropped = [], 0
    for records in tf.data.TFRecordDataset(paths).batch(1 << 16):
        records = records.numpy()
        ids = np.frombuffer(b"".join(records), dtype)
        sizes = np.array([len(r) for r in records]) // ids.itemsize  # ids a record
        starts = np.cumsum(sizes) - sizes
        source_lengths = ids[starts].astype(np.int64)
        target_lengths = sizes - 1 - source_lengths
        keep = (source_lengths > 0) & (source_lengths <= batching.max_source_length)
        keep &= (target_lengths > 0) & (target_lengths < batching.max_target_length)
        dropped += int((~keep).sum())
        # Each id's part of its record: 0 the length, 1 the source, 2 the target.
        part = np.full(len(ids), 2, np.int8)
        part[starts] = 0
        in_source = np.zeros(len(ids) + 1, np.int64)
        np.add.at(in_source, starts + 1, 1)
        np.add.at(in_source, starts + 1 + source_lengths, -1)
        part[np.cumsum(in_source[:-1]) > 0] = 1
        kept = np.repeat(keep, sizes)
        parts.append(
            (ids[kept & (part == 1)], source_lengths[keep], ids[kept & (part == 2)], target_lengths[keep])
        )
    if not parts or not sum(len(p[1]) for p in parts):
        raise ValueError("no sentence pairs to batch (all were empty or too long?)")
    source, source_lengths, target, target_lengths = (np.concatenate(column) for column in zip(*parts))
    return ArrayPairs(source, source_lengths, target, target_lengths, dropped)


def worker_part(paths, workers=1, rank=0):
    """(shard files, pair shards, pair shard index) that input worker `rank` of `workers` reads of a
    prepared train split: every `workers`-th shard file from `rank`, so that no two workers read
    the same file; with fewer files than workers, all files and every `workers`-th pair."""
    if workers <= 1:
        return list(paths), 1, 0
    if len(paths) < workers:
        return list(paths), workers, rank
    return list(paths[rank::workers]), 1, 0


def stream_pairs(paths, dtype, batching, seed=0, num_shards=1, shard_index=0):
    """The endless (source, target) id rows of a prepared train split read from its shards as a
    stream: each pass takes the shards in a new seeded order, reads a few at once (interleaved),
    and shuffles pairs in a buffer of SHUFFLE_PAIRS; memory does not grow with the corpus.
    `num_shards`/`shard_index`: this input worker keeps every `num_shards`-th pair."""
    import tensorflow as tf

    files = tf.constant(paths)

    def one_pass(number):
        return tf.data.Dataset.from_tensor_slices(
            tf.random.experimental.stateless_shuffle(files, tf.stack([tf.cast(seed, tf.int64), number]))
        )

    def decode(record):
        ids = tf.cast(tf.io.decode_raw(record, tf.dtypes.as_dtype(dtype)), tf.int32)
        return ids[1 : 1 + ids[0]], ids[1 + ids[0] :]

    def fits(source, target):
        return (0 < tf.size(source) <= batching.max_source_length) & (
            0 < tf.size(target) < batching.max_target_length
        )

    ds = tf.data.Dataset.counter().flat_map(one_pass)
    ds = ds.interleave(
        tf.data.TFRecordDataset, cycle_length=min(len(paths), 4), num_parallel_calls=2, deterministic=True
    )
    if num_shards > 1:
        ds = ds.shard(num_shards, shard_index)
    ds = ds.map(decode, num_parallel_calls=2, deterministic=True).filter(fits)
    return ds.shuffle(SHUFFLE_PAIRS, seed=seed)

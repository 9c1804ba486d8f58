"""Rows of different lengths as padded (B, N) tensors with their lengths: the few operations the
text graph needs, in TFLite builtins (no RaggedTensor, no searchsorted, no scatter).

Letters: B rows, N elements a row, Q queries a row, K kept elements a row."""

import tensorflow as tf


def count_at_most(sorted_rows, queries):
    """sorted_rows (B, N) int32, ascending; queries (B, Q) int32 -> (B, Q) int32: how many elements
    of each row are <= each query (tf.searchsorted's "right", which TFLite has no builtin for), by
    halving [low, high] until every query's is one place."""
    width = tf.shape(sorted_rows)[1]

    def halve(low, high):
        middle = (low + high) // 2  # < high wherever low < high
        value = tf.gather(sorted_rows, tf.minimum(middle, tf.maximum(width - 1, 0)), batch_dims=1)
        right = (value <= queries) & (low < high)
        return tf.where(right, middle + 1, low), tf.where(right | (low >= high), high, middle)

    low, high = tf.zeros_like(queries), tf.zeros_like(queries) + width
    low, _ = tf.while_loop(lambda low, high: tf.reduce_any(low < high), halve, [low, high])
    return low


def compact(values, keep):
    """values (B, N), keep bool (B, N) -> (kept (B, K): each row's kept values in order, zeros
    after; counts (B,) int32). K is the largest count."""
    ranks = tf.cumsum(tf.cast(keep, tf.int32), axis=1)  # (B, N) how many are kept up to each
    counts = tf.reduce_sum(tf.cast(keep, tf.int32), axis=1)  # (B,)
    width = tf.reduce_max(tf.concat([counts, [0]], 0))
    wanted = tf.range(width)[tf.newaxis, :] + tf.zeros_like(counts)[:, tf.newaxis]  # (B, K)
    # The k-th kept element is the one after all those ranked <= k.
    index = count_at_most(ranks, wanted)
    gathered = tf.gather(values, tf.minimum(index, tf.maximum(tf.shape(values)[1] - 1, 0)), batch_dims=1)
    return tf.where(wanted < counts[:, tf.newaxis], gathered, tf.zeros_like(gathered)), counts


def last_index_where(mask):
    """mask bool (B, N) -> (B, N) int32: for each position, the last position at or before it
    where mask holds, -1 where none does."""
    where_true, _ = compact(tf.range(tf.shape(mask)[1]) + tf.zeros_like(tf.cast(mask, tf.int32)), mask)
    # A column more: where the mask holds nowhere in the batch (an empty text alone), (B, 0) would
    # leave the gather nothing to read.
    where_true = tf.pad(where_true, [[0, 0], [0, 1]])
    ranks = tf.cumsum(tf.cast(mask, tf.int32), axis=1)  # (B, N)
    found = tf.gather(where_true, tf.maximum(ranks - 1, 0), batch_dims=1)
    return tf.where(ranks > 0, found, -1)


def join_parts(table, rows, starts, lengths):
    """Rows made of parts of a table's rows: table (R, W); rows, starts, lengths (B, J) int32,
    part j of output row b being table[rows[b, j], starts[b, j] : starts[b, j] + lengths[b, j]]
    (a length of 0 adds nothing) -> (joined (B, M) zeros after each row's end, totals (B,))."""
    ends = tf.cumsum(lengths, axis=1)  # (B, J)
    totals = tf.reduce_sum(lengths, axis=1)  # (B,)
    width = tf.reduce_max(tf.concat([totals, [0]], 0))
    at = tf.range(width)[tf.newaxis, :] + tf.zeros_like(totals)[:, tf.newaxis]  # (B, M)
    part = tf.minimum(count_at_most(ends, at), tf.maximum(tf.shape(lengths)[1] - 1, 0))  # (B, M)
    offset = at - tf.gather(ends - lengths, part, batch_dims=1)
    column = tf.gather(starts, part, batch_dims=1) + offset
    row = tf.gather(rows, part, batch_dims=1)
    inside = at < totals[:, tf.newaxis]
    index = tf.stack([tf.where(inside, row, 0), tf.where(inside, column, 0)], axis=-1)  # (B, M, 2)
    joined = tf.gather_nd(table, index)
    return tf.where(inside, joined, tf.zeros_like(joined)), totals

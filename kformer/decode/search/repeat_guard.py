"""The n-gram repeat guard: no output of a search holds the same n-gram twice."""

import tensorflow as tf

from kformer.decode.search.common import NEG_INF
from kformer.model import portable


class RepeatGuard:
    """The n-gram repeat guard of one search loop (`no_repeat_ngram_size` of CTranslate2 and
    fairseq: no n-gram of `ngram` tokens occurs twice in an output; ngram <= 0: off), over R
    hypothesis rows with output buffers of T (`positions` (T,)). What its steps read is computed
    here, once, before the loop: a search step runs node by node in TFLite and onnxruntime.

    The state it keeps per hypothesis is `runs` (R, T) int32: runs[r, j] (j <= the step index)
    is the length of the longest common suffix of the output's first j tokens and of all its
    tokens. Token j is banned when the ngram - 1 tokens before it are the last ngram - 1 tokens,
    i.e. runs[r, j] >= ngram - 1. NEG_INF is added to the banned tokens' logits, so the search's
    log-probabilities are those of the tokens left (logits minus their log-sum-exp).

    The loop runs its nodes whatever the option: off, no run reaches `least_run`. A second loop
    without them, for the option off, would double the loop bodies that each runtime compiles and
    packs the weights for, raising every peak for a small saving at batch 1 in LiteRT alone."""

    def __init__(self, ngram, rows, positions):
        """rows: R, or None when R changes from step to step (`loops.DropDone`): then the steps count
        their rows."""
        self.positions = positions  # (T,)
        # A run no output reaches when the guard is off: the same graph either way.
        self.least_run = tf.where(ngram > 0, ngram - 1, tf.int32.max)
        self.rows = None if rows is None else tf.expand_dims(tf.range(rows), 1)  # (R, 1)
        self.zeros = None if rows is None else tf.zeros([rows, 1], tf.int32)

    def written(self, index):
        """(T,) bool: the positions of the output so far, before step `index`."""
        return self.positions < index

    def ban(self, logits, tokens, runs, written):
        """logits (R, V) with NEG_INF (or a multiple) added to the tokens that would repeat an
        n-gram; tokens, runs (R, T). A scatter of NEG_INF at the banned tokens, and of 0 at a row's
        token 0 for the positions not banned, into (R * V,) penalties (duplicates are summed, in
        TensorFlow and TFLite alike), then one add of equal shapes: fixed shapes (the number banned
        varies by row and step), a pass over (R, V) rather than a one-hot of (R, T, V), and no
        update in place. ONNX: onnx_rewrite's _scatter_adds scatters into the logits themselves."""
        vocab = logits.shape[-1]
        vocab = tf.shape(logits)[1] if vocab is None else vocab
        banned = (runs >= self.least_run) & written  # (R, T)
        rows = tf.expand_dims(tf.range(tf.shape(runs)[0]), 1) if self.rows is None else self.rows
        flat = rows * vocab + tf.where(banned, tokens, 0)  # (R, T) into (R * V,)
        penalties = tf.scatter_nd(
            tf.reshape(flat, [-1, 1]),
            tf.reshape(tf.where(banned, NEG_INF, 0.0), [-1]),
            portable.shape_in_loop(tf.reshape(logits, [-1])),  # (R * V,)
        )  # (R * V,)
        return logits + tf.cast(tf.reshape(penalties, [-1, vocab]), logits.dtype)

    def grown(self, runs, tokens, token, written):
        """The runs after `token` (R,) is written at the step's position of `tokens` (R, T)
        (whose `written` positions are read): the run at j + 1 grows by one where tokens[j] ==
        token, else it is 0. One shift a step, whatever the n-gram size (a run-time input)."""
        grown = tf.where(tf.equal(tokens, tf.expand_dims(token, 1)) & written, runs + 1, 0)  # runs at j + 1
        zeros = tf.zeros_like(runs[:, :1]) if self.zeros is None else self.zeros
        return tf.concat([zeros, grown[:, :-1]], axis=1)

"""Multi-head scaled dot-product attention: one layer for all three uses in the Transformer."""

import math

import keras
import tensorflow as tf
from keras import ops

from kformer.model import portable

# Letters used in shape comments: B batch, Tq query length, Tk key length, T buffer length,
# H heads, D head size, M model width (d_model).


@keras.saving.register_keras_serializable(package="kformer")
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head attention (Vaswani et al. 2017, section 3.2.2).

    Queries, keys and values are projected by `query`, `key`, `value` (M -> H heads of D),
    combined by softmax(Q K^T / sqrt(D)) V under a boolean mask, and the heads are projected
    back together by `output_projection` (H x D -> M). Weight layout as in
    `keras.layers.MultiHeadAttention`. The same class serves encoder
    self-attention, masked decoder self-attention and encoder-decoder attention.

    Args:
        num_heads: number of heads H.
        head_size: size D of each head (d_model / H in the paper).

    Call args:
        query: (B, Tq, M) queries, or (B, M): the one query of a decoding step (output (B, M)).
        value: (B, Tk, M) sequence to attend to (keys and values are both projected from it);
            None for self-attention (the query sequence itself). Ignored when a static `cache`
            of precomputed keys/values is given.
        attention_mask: boolean, broadcastable to (B, Tq, Tk); True = may attend.
        cache: optional `(key, value)` pair, each (B, H, T, D). With `write` (decoder
            self-attention, one new token at a time): the buffers the new token's key/value is
            written into, and the updated cache is returned. Without (encoder-decoder attention):
            precomputed keys/values of the encoder output, used as they are.
        write: `(buffer (B, H, T, D), new (B, H, 1, D)) -> buffer`, the cache mode's
            (kformer.model.cache: appended, or added into the step's slot).

    Returns `(output, {"cache": (key, value), "weights": weights})`, always this structure:
    output (B, Tq, M); the keys/values attended to, each (B, H, Tk, D) (with `write`, the
    updated cache); the (B, H, Tq, Tk) attention weights ((B, H, Tk) for a step's (B, M) query).
    Unused parts cost nothing in a graph.

    Example:
    >>> layer = MultiHeadAttention(num_heads=2, head_size=4)
    >>> x = keras.random.normal((1, 3, 8))
    >>> layer(x, x).shape
    (1, 3, 8)
    """

    def __init__(self, num_heads, head_size, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.head_size = head_size
        # Weights in keras.layers.MultiHeadAttention's layout: kernels (M, H, D), biases (H, D), held
        # by EinsumDense sublayers (so saved models and the reference test's weight copy line up).
        heads = dict(output_shape=(None, num_heads, head_size), bias_axes="de", dtype=self.dtype_policy)
        self.query = keras.layers.EinsumDense("abc,cde->abde", name="query", **heads)
        self.key = keras.layers.EinsumDense("abc,cde->abde", name="key", **heads)
        self.value = keras.layers.EinsumDense("abc,cde->abde", name="value", **heads)
        self.output_projection = None  # (H, D, M): built once the model width M is known

    def build(self, query_shape, value_shape=None, *args, **kwargs):
        value_shape = query_shape if value_shape is None else value_shape
        self.query.build(query_shape)
        self.key.build(value_shape)
        self.value.build(value_shape)
        self.output_projection = keras.layers.EinsumDense(
            "abcd,cde->abe",
            output_shape=(None, query_shape[-1]),
            bias_axes="e",
            dtype=self.dtype_policy,
            name="output_projection",
        )
        self.output_projection.build((*query_shape[:-1], self.num_heads, self.head_size))

    def _project(self, x, *projections):
        """(B, L, M) through one or more of `query`/`key`/`value` at once -> one (B, H, L, D) each.

        One matrix product for all of them (their kernels side by side) and one transpose. Through
        `portable.contract`, not the sublayers' einsum: TensorFlow differentiates this einsum with a batched
        matmul and a sum over the batch, which made training ~10% slower on CPU (same forward).
        """
        # The queries carry the scores' 1/sqrt(D) in their weights: a frozen decoding step folds
        # it into its constants instead of multiplying every step's scores (one node less each).
        scale = 1 / math.sqrt(self.head_size)
        kernels, biases = zip(
            *[
                (p.kernel * scale, p.bias * scale) if p is self.query else (p.kernel, p.bias)
                for p in projections
            ]
        )
        kernel = ops.concatenate(kernels, axis=-1)  # (M, H, n*D)
        bias = ops.concatenate(biases, axis=-1)  # (H, n*D)
        if len(x.shape) == 2:  # one decoding step (B, M): the kernel as (M, H, 1, n*D), one reshape
            heads = portable.contract(x, ops.expand_dims(kernel, 2), bias=bias)  # (B, H, 1, n*D)
        else:
            heads = ops.transpose(portable.contract(x, kernel, bias=bias), (0, 2, 1, 3))  # (B, H, L, n*D)
        return ops.split(heads, len(projections), axis=-1)

    def key_value(self, value):
        """(B, Tk, M) -> (key, value), each (B, H, Tk, D): precompute once per source sentence."""
        return tuple(self._project(value, self.key, self.value))

    def call(self, query, value=None, attention_mask=None, cache=None, write=None):
        if cache is not None and write is None:  # encoder-decoder attention, precomputed
            (q,) = self._project(query, self.query)
            k, v = cache
        elif value is None:  # self-attention: queries, keys and values in one product
            q, k, v = self._project(query, self.query, self.key, self.value)  # (B, H, Tq, D)
        else:
            (q,) = self._project(query, self.query)
            k, v = self.key_value(value)  # (B, H, Tk, D)
        if write is not None:  # the new token's key/value (B, H, 1, D) into the cache
            k, v = write(cache[0], k), write(cache[1], v)  # (B, H, T, D)

        # A decoding step's one query (B, M) keeps no query axis: scores and weights (B, H, Tk),
        # against which its mask (B or 1, 1, Tk) broadcasts as it is (fewer nodes in the exported step).
        step = len(query.shape) == 2
        if step:
            scores = portable.one_query_scores(q, k)  # (B, H, Tk)
        else:
            scores = ops.einsum("bhqd,bhkd->bhqk", q, k)
        if attention_mask is not None:
            # Same mask for every head: (B, 1, Tq, Tk), or for a step (B, 1, Tk) as given.
            mask = attention_mask if step else ops.expand_dims(attention_mask, axis=1)
            # A large finite negative (not -inf) keeps a fully masked row finite.
            large_negative = -1e9 if keras.backend.standardize_dtype(scores.dtype) == "float32" else -6e4
            scores = ops.where(mask, scores, ops.cast(large_negative, scores.dtype))
        # Softmax in float32 (for fp16). tf.nn.softmax rather than ops.softmax: the latter warns
        # when a source has a single token, which is a valid input here.
        weights = tf.nn.softmax(ops.cast(scores, "float32"), axis=-1)
        weights = ops.cast(weights, q.dtype)
        if step:
            context = portable.one_query_context(weights, v)  # (B, H, D)
        else:
            context = ops.einsum("bhqk,bhkd->bhqd", weights, v)
        if not step:
            context = ops.transpose(context, (0, 2, 1, 3))  # (B, Tq, H, D)
        output = portable.contract(
            context, self.output_projection.kernel, 2, self.output_projection.bias
        )  # (B, [Tq,] M)
        return output, {"cache": (k, v), "weights": weights}

    def get_config(self):
        config = super().get_config()
        config.update(num_heads=self.num_heads, head_size=self.head_size)
        return config

"""Embeddings, positional encoding, feed-forward and the encoder/decoder blocks."""

import math

import keras
import numpy as np
from keras import ops

from kformer.model import portable
from kformer.model.attention import MultiHeadAttention

# Shape letters: B batch, S source length, T target length, M model width (d_model), V vocabulary.


def sinusoidal_table(length, d_model, layout="interleaved"):
    """(length, d_model) positional encoding of angles pos / 10000^(2i/d_model): "interleaved" as
    the paper writes it, PE(pos, 2i) = sin, PE(pos, 2i+1) = cos; "halves", the sines of every
    angle then the cosines (Marian, fairseq); "timescales", the sines then the cosines of angles
    (pos + 1) / 10000^(i/(d_model/2 - 1)) (OpenNMT-tf's, positions counted from 1: the table
    CTranslate2 computes where a model stores none)."""
    positions = np.arange(length, dtype=np.float64)[:, None]
    if layout == "timescales":
        rates = np.power(10000.0, -np.arange(d_model // 2, dtype=np.float64) / max(1, d_model // 2 - 1))
        angles = (positions + 1) * rates
        return np.concatenate([np.sin(angles), np.cos(angles)], axis=1).astype(np.float32)
    rates = 1.0 / np.power(10000.0, np.arange(0, d_model, 2, dtype=np.float64) / d_model)
    angles = positions * rates  # (length, ceil(d_model/2))
    sines, cosines = np.sin(angles), np.cos(angles[:, : d_model // 2])
    if layout == "halves":
        return np.concatenate([sines, cosines], axis=1).astype(np.float32)
    table = np.zeros((length, d_model), dtype=np.float64)
    table[:, 0::2], table[:, 1::2] = sines, cosines
    return table.astype(np.float32)


@keras.saving.register_keras_serializable(package="kformer")
class TokenEmbedding(keras.layers.Layer):
    """Token embedding scaled by sqrt(d_model); with `reverse=True`, the tied output projection.

    The same matrix E (V, M) embeds source and target tokens and, transposed, maps decoder
    states to vocabulary logits (section 3.4: shared weights, embeddings times sqrt(d_model)).

    Args:
        vocab_size: V.
        d_model: M, the model width.
        scale: multiply embeddings by sqrt(M) (the paper; False: as they are).
        output_bias: a (V,) bias added to the logits of `reverse=True` (Marian's final_logits_bias).

    Call args:
        inputs: int ids (B, L) -> (B, L, M); or with `reverse=True`, states (B, L, M) -> logits (B, L, V).
    """

    def __init__(self, vocab_size, d_model, scale=True, output_bias=False, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.scale = scale
        self.output_bias = output_bias

    def build(self, input_shape=None):
        # N(0, M^-0.5) so that E * sqrt(M) starts at unit scale and E^T gives unit-scale logits.
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.vocab_size, self.d_model),
            initializer=keras.initializers.RandomNormal(stddev=self.d_model**-0.5),
        )
        self.logits_bias = (
            self.add_weight(name="logits_bias", shape=(self.vocab_size,), initializer="zeros")
            if self.output_bias
            else None
        )

    def call(self, inputs, reverse=False):
        if reverse:
            bias = None if self.logits_bias is None else ops.cast(self.logits_bias, inputs.dtype)
            return portable.contract(
                inputs, ops.transpose(ops.cast(self.embeddings, inputs.dtype)), bias=bias
            )
        embedded = portable.lookup(self.embeddings, inputs)
        return embedded * ops.cast(math.sqrt(self.d_model), self.compute_dtype) if self.scale else embedded

    def get_config(self):
        config = super().get_config()
        config.update(
            vocab_size=self.vocab_size, d_model=self.d_model, scale=self.scale, output_bias=self.output_bias
        )
        return config


@keras.saving.register_keras_serializable(package="kformer")
class PositionalEncoding(keras.layers.Layer):
    """Adds the sinusoidal positional encoding to (B, L, M) embeddings, then dropout.

    Args:
        max_length: longest position that can be encoded.
        dropout: rate applied to the sum (section 5.4).
        layout: the table's, "interleaved" (the paper), "halves" or "timescales" (`sinusoidal_table`).

    Call args:
        inputs: (B, L, M) embeddings, or (B, M): one decoding step's, at position `start_index`.
        start_index: position of the first row; a cached decode step passes its step index.
    """

    def __init__(self, max_length, dropout=0.0, layout="interleaved", **kwargs):
        super().__init__(**kwargs)
        self.max_length = max_length
        self.dropout = dropout
        self.layout = layout
        self.dropout_layer = keras.layers.Dropout(dropout, dtype=self.dtype_policy, name="dropout")

    def build(self, input_shape):
        self.table = ops.convert_to_tensor(sinusoidal_table(self.max_length, input_shape[-1], self.layout))

    def call(self, inputs, start_index=0, training=None):
        if len(inputs.shape) == 2:  # one decoding step's rows (B, M), at position start_index
            positions = start_index
        else:
            positions = ops.arange(ops.shape(inputs)[1]) + start_index
        encoding = portable.lookup(self.table, positions)  # (M,) or (L, M)
        return self.dropout_layer(inputs + ops.cast(encoding, inputs.dtype), training=training)  # broadcast

    def get_config(self):
        config = super().get_config()
        config.update(max_length=self.max_length, dropout=self.dropout, layout=self.layout)
        return config


@keras.saving.register_keras_serializable(package="kformer")
class FeedForward(keras.layers.Layer):
    """Position-wise feed-forward network: Dense(d_ff, activation) then Dense(d_model).

    Args:
        d_model: output size M.
        d_ff: inner size.
        activation: "relu" (the paper), "gelu" or "swish" (SiLU).
    """

    def __init__(self, d_model, d_ff, activation="relu", **kwargs):
        super().__init__(**kwargs)
        self.d_model = d_model
        self.d_ff = d_ff
        self.activation = activation
        self.inner = keras.layers.Dense(d_ff, dtype=self.dtype_policy, name="inner")
        self.outer = keras.layers.Dense(d_model, dtype=self.dtype_policy, name="outer")

    def build(self, input_shape):
        self.inner.build(input_shape)
        self.outer.build((*input_shape[:-1], self.d_ff))

    def call(self, inputs):
        # The Dense layers' weights through `portable.contract`: what Dense does, in fewer exported ops.
        hidden = portable.activation(
            self.activation, portable.contract(inputs, self.inner.kernel, bias=self.inner.bias)
        )
        return portable.contract(hidden, self.outer.kernel, bias=self.outer.bias)

    def get_config(self):
        config = super().get_config()
        config.update(d_model=self.d_model, d_ff=self.d_ff, activation=self.activation)
        return config


class _ResidualBlock(keras.layers.Layer):
    """Shared constructor and residual wiring of the encoder and decoder blocks.

    post-LN (the paper): x = LayerNorm(x + Dropout(sublayer(x))).
    pre-LN:              x = x + Dropout(sublayer(LayerNorm(x))).
    """

    def __init__(
        self,
        d_model,
        num_heads,
        d_ff,
        dropout=0.1,
        activation="relu",
        norm_position="post",
        epsilon=1e-6,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.epsilon = epsilon
        self.d_model = d_model
        self.num_heads = num_heads
        self.d_ff = d_ff
        self.dropout = dropout
        self.activation = activation
        self.norm_position = norm_position
        self.feed_forward = FeedForward(
            d_model, d_ff, activation, dtype=self.dtype_policy, name="feed_forward"
        )
        self.sublayer_dropout = keras.layers.Dropout(
            dropout, dtype=self.dtype_policy, name="sublayer_dropout"
        )

    def _attention(self, name):
        return MultiHeadAttention(
            self.num_heads, self.d_model // self.num_heads, dtype=self.dtype_policy, name=name
        )

    def _norm(self, name):
        return keras.layers.LayerNormalization(epsilon=self.epsilon, dtype=self.dtype_policy, name=name)

    def _residual(self, x, norm, sublayer, training):
        """Applies `sublayer(x) -> (output, extras)` with its residual connection and norm;
        returns (x, extras)."""
        output, extras = sublayer(norm(x) if self.norm_position == "pre" else x)
        x = x + self.sublayer_dropout(output, training=training)
        if self.norm_position == "post":
            x = norm(x)
        return x, extras

    def _feed_forward(self, x, training):
        return self._residual(x, self.feed_forward_norm, lambda h: (self.feed_forward(h), None), training)[0]

    def get_config(self):
        config = super().get_config()
        config.update(
            d_model=self.d_model,
            num_heads=self.num_heads,
            d_ff=self.d_ff,
            dropout=self.dropout,
            activation=self.activation,
            norm_position=self.norm_position,
            epsilon=self.epsilon,
        )
        return config


@keras.saving.register_keras_serializable(package="kformer")
class EncoderBlock(_ResidualBlock):
    """One encoder layer: self-attention, then feed-forward, each with residual + LayerNorm.

    Args:
        d_model, num_heads, d_ff: as the config. dropout: residual dropout.
        activation: feed-forward activation. norm_position: "post" (paper) or "pre".

    Call args:
        x: (B, S, M) source states.
        attention_mask: boolean (B, 1, S) or (B, S, S), True = may attend (source padding).

    Returns (x (B, S, M), the (B, H, S, S) self-attention weights).
    """

    def __init__(self, d_model, num_heads, d_ff, **kwargs):
        super().__init__(d_model, num_heads, d_ff, **kwargs)
        self.self_attention = self._attention("self_attention")
        self.self_attention_norm = self._norm("self_attention_norm")
        self.feed_forward_norm = self._norm("feed_forward_norm")

    def build(self, input_shape):
        self.self_attention.build(input_shape)
        self.self_attention_norm.build(input_shape)
        self.feed_forward.build(input_shape)
        self.feed_forward_norm.build(input_shape)

    def call(self, x, attention_mask=None, training=None):
        x, attention = self._residual(
            x,
            self.self_attention_norm,
            lambda h: self.self_attention(h, attention_mask=attention_mask),
            training,
        )
        return self._feed_forward(x, training), attention["weights"]


@keras.saving.register_keras_serializable(package="kformer")
class DecoderBlock(_ResidualBlock):
    """One decoder layer: masked self-attention, encoder-decoder attention, feed-forward.

    Args: as `EncoderBlock`.

    Call args:
        x: (B, T, M) target states.
        encoder_output: (B, S, M) top encoder states (keys/values of the cross-attention).
        self_mask: boolean broadcastable to (B, T, T): causal and target padding.
        cross_mask: boolean broadcastable to (B, T, S): the *source* padding mask.
        cache: optional dict with "self" = (key, value) buffers (B, H, Tmax, D) and "cross" =
            precomputed encoder (key, value) (B, H, S, D); then x is one step (B, M), whose
            self-attention key/value `write` puts into the buffers (kformer.model.cache).

    Returns (x (B, T, M), {"self": ..., "cross": ...}), each the attention's {"cache", "weights"}:
    "self" "cache" is the updated buffers when decoding step by step.
    """

    def __init__(self, d_model, num_heads, d_ff, **kwargs):
        super().__init__(d_model, num_heads, d_ff, **kwargs)
        self.self_attention = self._attention("self_attention")
        self.self_attention_norm = self._norm("self_attention_norm")
        self.cross_attention = self._attention("cross_attention")
        self.cross_attention_norm = self._norm("cross_attention_norm")
        self.feed_forward_norm = self._norm("feed_forward_norm")

    def build(self, x_shape, encoder_output_shape=None):
        encoder_output_shape = x_shape if encoder_output_shape is None else encoder_output_shape
        self.self_attention.build(x_shape)
        self.self_attention_norm.build(x_shape)
        self.cross_attention.build(x_shape, encoder_output_shape)
        self.cross_attention_norm.build(x_shape)
        self.feed_forward.build(x_shape)
        self.feed_forward_norm.build(x_shape)

    def call(
        self,
        x,
        encoder_output=None,
        self_mask=None,
        cross_mask=None,
        cache=None,
        write=None,
        training=None,
    ):
        self_cache = None if cache is None else cache["self"]
        cross_cache = None if cache is None else cache["cross"]
        x, self_attention = self._residual(
            x,
            self.self_attention_norm,
            lambda h: self.self_attention(h, attention_mask=self_mask, cache=self_cache, write=write),
            training,
        )
        x, cross_attention = self._residual(
            x,
            self.cross_attention_norm,
            lambda h: self.cross_attention(h, encoder_output, attention_mask=cross_mask, cache=cross_cache),
            training,
        )
        return self._feed_forward(x, training), {"self": self_attention, "cross": cross_attention}

"""The Transformer as a functional Keras model, plus the step-wise decoder that reuses its layers.

Shape letters: B batch, S source length, T target length, Tmax decode buffer length, M d_model,
H heads, D head size, V vocabulary, L layers.
"""

import keras
from keras import ops

from kformer.model import cache as cache_lib
from kformer.model import masks
from kformer.model.config import ModelConfig
from kformer.model.layers import DecoderBlock, EncoderBlock, PositionalEncoding, TokenEmbedding


@keras.saving.register_keras_serializable(package="kformer")
class AttentionMasks(keras.layers.Layer):
    """Builds every attention mask once, from token ids (the one convention: True = may attend).

    Args:
        pad_id: the padding token's id.
        starts_with_pad: the decoder's first token is the pad token (Marian's start): the first
            target position is a key to attend to, not padding.

    Call args:
        source_ids: (B, S) int. target_ids: (B, T) int.

    Returns {"encoder": (B, 1, S), "decoder": (B, T, T) causal and target padding,
    "cross": (B, 1, S) the *source* padding mask}.
    """

    def __init__(self, pad_id=0, starts_with_pad=False, **kwargs):
        super().__init__(**kwargs)
        self.pad_id = pad_id
        self.starts_with_pad = starts_with_pad

    def call(self, source_ids, target_ids):
        source = masks.padding_mask(source_ids, self.pad_id)
        target = masks.padding_mask(target_ids, self.pad_id)  # (B, 1, T)
        if self.starts_with_pad:
            target = ops.logical_or(target, ops.equal(ops.arange(ops.shape(target_ids)[1]), 0))
        decoder = masks.combine(masks.causal_mask(ops.shape(target_ids)[1]), target)
        return {"encoder": source, "decoder": decoder, "cross": source}

    def get_config(self):
        config = super().get_config()
        config.update(pad_id=self.pad_id, starts_with_pad=self.starts_with_pad)
        return config


@keras.saving.register_keras_serializable(package="kformer")
class Transformer(keras.Model):
    """Encoder-decoder Transformer (Vaswani et al. 2017) as a functional model.

    Inputs: {"source_ids": (B, S) int32, "target_ids": (B, T) int32} with pad id 0; the
    target is the decoder input (BOS + target tokens). Output: (B, T, V) float32 logits.

    Args:
        config: a `ModelConfig` (or its dict).

    Beyond the functional call, the same layers serve step-wise decoding:
    `init_cache(source_ids)` encodes once and starts the key/value caches,
    `decode_step(tokens, cache, index)` feeds one token per row and returns (logits, cache),
    and `attention_weights(source_ids, target_ids)` returns every layer's attention per head.

    Example:
    >>> model = Transformer(kformer.model.config.preset("tiny", vocab_size=100))
    >>> model({"source_ids": ops.ones((2, 5), "int32"), "target_ids": ops.ones((2, 4), "int32")}).shape
    (2, 4, 100)
    """

    def __init__(self, config, **kwargs):
        if isinstance(config, dict):
            config = ModelConfig.from_dict(config)
        c = config
        dtype = kwargs.pop("dtype", None)

        self._make_layers(c, dtype)

        # === Functional model ===
        inputs = {
            "source_ids": keras.Input((None,), dtype="int32", name="source_ids"),
            "target_ids": keras.Input((None,), dtype="int32", name="target_ids"),
        }
        attention_masks = self.masks(inputs["source_ids"], inputs["target_ids"])
        encoded = self._encode(inputs["source_ids"], attention_masks["encoder"])[0]
        logits = self._decode(inputs["target_ids"], encoded, attention_masks)[0]
        super().__init__(inputs=inputs, outputs=logits, dtype=dtype, **kwargs)
        self.config = c

    def _make_layers(self, c, dtype):
        """The model's layers, as attributes (before the functional graph is built from them)."""
        self.masks = AttentionMasks(c.pad_id, c.starts_with_pad, dtype=dtype, name="attention_masks")
        embedding = dict(scale=c.scale_embedding, dtype=dtype)
        self.source_embedding = TokenEmbedding(
            c.vocab_size,
            c.d_model,
            output_bias=c.output_bias and c.tie_embeddings,
            name="shared_embedding" if c.tie_embeddings else "source_embedding",
            **embedding,
        )
        self.target_embedding = (
            self.source_embedding
            if c.tie_embeddings
            else TokenEmbedding(c.vocab_size, c.d_model, name="target_embedding", **embedding)
        )
        self.source_positions = PositionalEncoding(
            c.max_source_length, c.dropout, c.positions, dtype=dtype, name="source_positions"
        )
        self.target_positions = PositionalEncoding(
            c.max_target_length, c.dropout, c.positions, dtype=dtype, name="target_positions"
        )
        block_args = dict(
            d_model=c.d_model,
            num_heads=c.num_heads,
            d_ff=c.d_ff,
            dropout=c.dropout,
            activation=c.activation,
            norm_position=c.norm_position,
            epsilon=c.layer_norm_epsilon,
            dtype=dtype,
        )
        self.encoder_blocks = [
            EncoderBlock(**block_args, name=f"encoder_block_{i}") for i in range(c.num_encoder_layers)
        ]
        self.decoder_blocks = [
            DecoderBlock(**block_args, name=f"decoder_block_{i}") for i in range(c.num_decoder_layers)
        ]
        # Pre-LN needs a final norm on each stack; post-LN (the paper) already ends normalized.
        pre = c.norm_position == "pre"
        norm = dict(epsilon=c.layer_norm_epsilon, dtype=dtype)
        self.encoder_norm = keras.layers.LayerNormalization(**norm, name="encoder_norm") if pre else None
        self.decoder_norm = keras.layers.LayerNormalization(**norm, name="decoder_norm") if pre else None
        self.output_projection = (
            None
            if c.tie_embeddings
            else keras.layers.Dense(c.vocab_size, dtype=dtype, name="output_projection")
        )
        self.logits_float32 = keras.layers.Activation("linear", dtype="float32", name="logits")

    # --- full-sequence passes (the functional graph and `attention_weights` share these) ---

    def _encode(self, source_ids, mask, training=None):
        """-> ((B, S, M) encoder output, per layer the (B, H, S, S) self-attention weights)."""
        x = self.source_positions(self.source_embedding(source_ids), training=training)  # (B, S, M)
        weights = []
        for block in self.encoder_blocks:
            x, layer_weights = block(x, attention_mask=mask, training=training)
            weights.append(layer_weights)
        if self.encoder_norm is not None:
            x = self.encoder_norm(x)
        return x, weights

    def _decode(self, target_ids, encoded, attention_masks, training=None):
        """-> ((B, T, V) logits, per layer {"self": (B, H, T, T), "cross": (B, H, T, S)} weights)."""
        x = self.target_positions(self.target_embedding(target_ids), training=training)  # (B, T, M)
        weights = []
        for block in self.decoder_blocks:
            x, attention = block(
                x,
                encoded,
                self_mask=attention_masks["decoder"],
                cross_mask=attention_masks["cross"],
                training=training,
            )
            weights.append({"self": attention["self"]["weights"], "cross": attention["cross"]["weights"]})
        return self._logits(x), weights

    def _logits(self, x):
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        logits = (
            self.target_embedding(x, reverse=True)
            if self.output_projection is None
            else self.output_projection(x)
        )
        return self.logits_float32(logits)  # (B, T, V) float32 even under mixed precision

    def attention_weights(self, source_ids, target_ids):
        """Every layer's attention weights per head, for pictures (eager; nothing is stored on layers).

        Returns {"encoder": [L x (B, H, S, S)], "decoder": [L x (B, H, T, T)], "cross": [L x (B, H, T, S)]}.
        """
        source_ids = ops.convert_to_tensor(source_ids, "int32")
        target_ids = ops.convert_to_tensor(target_ids, "int32")
        attention_masks = self.masks(source_ids, target_ids)
        encoded, encoder_weights = self._encode(source_ids, attention_masks["encoder"], training=False)
        _, decoder_weights = self._decode(target_ids, encoded, attention_masks, training=False)
        return {
            "encoder": encoder_weights,
            "decoder": [w["self"] for w in decoder_weights],
            "cross": [w["cross"] for w in decoder_weights],
        }

    # --- step-wise decoding with a key/value cache ---

    def init_cache(self, source_ids, mode=cache_lib.Growing, buffer_length=None):
        """Encodes (B, S) source ids once; returns the decoder cache, split as the searches expect
        (`kformer.decode.search`): what stays fixed for a source sentence, and what each hypothesis
        extends.

        {"static": {"source_mask": (B, 1, S) bool,
                    "cross": L x (key, value) each (B, H, S, D), computed once per sentence},
         "state":  a `mode` (kformer.model.cache): Growing, L x (key, value) each (B, H, 0, D)
                   to which each step appends its token's; or FixedBuffers, L x (key, value)
                   each (B, H, buffer_length, D) of zeros, written one slot a step}.
        """
        source_ids = ops.convert_to_tensor(source_ids, "int32")
        source_mask = masks.padding_mask(source_ids, self.config.pad_id)
        encoded, _ = self._encode(source_ids, source_mask, training=False)
        c = self.config
        return {
            "static": {
                "source_mask": source_mask,
                "cross": [block.cross_attention.key_value(encoded) for block in self.decoder_blocks],
            },
            "state": mode.empty(
                source_ids, c.num_decoder_layers, c.num_heads, c.head_size, encoded.dtype, buffer_length
            ),
        }

    def grow_cache(self, state, buffer_length):
        """The "state" part of a cache (`init_cache`) with its key/value buffers extended with zeros
        to `buffer_length` steps (the second pass of a two-pass search); growing buffers, which
        are as long as the output so far, as they are."""
        return state.grown(buffer_length, self.config.num_heads, self.config.head_size)

    def decode_step(self, tokens, cache, index):
        """Feeds (B,) tokens at position `index`; returns ((B, V) float32 logits, updated cache)."""
        static, state = cache["static"], cache["state"]
        x = self.target_embedding(tokens)  # (B, M): the step runs on rows, no length axis
        x = self.target_positions(x, start_index=index, training=False)
        self_mask, write = state.step(index)  # the same for every layer
        new_self = []
        for block, self_kv, cross_kv in zip(self.decoder_blocks, state.layers, static["cross"]):
            x, attention = block(
                x,
                self_mask=self_mask,
                cross_mask=static["source_mask"],
                cache={"self": self_kv, "cross": cross_kv},
                write=write,
                training=False,
            )
            new_self.append(attention["self"]["cache"])
        logits = self._logits(x)  # (B, V)
        return logits, {"static": static, "state": type(state)(new_self)}

    def get_config(self):
        return {"config": self.config.to_dict(), "name": self.name, "trainable": self.trainable}

    @classmethod
    def from_config(cls, config):
        return cls(**config)

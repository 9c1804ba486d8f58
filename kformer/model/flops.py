"""Analytic floating-point operations of the Transformer's training step, for model FLOPs
utilization (MFU): the products of the forward pass counted as 2 operations per multiply-add,
times 3 for training (the backward pass computes two products per forward product). Element-wise
work, softmax, LayerNorm and the optimizer are left out, as in the usual MFU definition (PaLM,
appendix B): they are the overhead MFU measures.

Counted per row on its real lengths (source S, decoder input T = target + BOS), so padding is
work the hardware does but the model does not need. Shape letters as in kformer.model.transformer.
"""

import numpy as np

TRAINING_FACTOR = 3  # forward + backward (gradients of the inputs and of the weights)


def forward_flops(config, source_lengths, target_lengths):
    """Forward FLOPs of each row, (N,) float64, from the rows' source and target lengths."""
    s = np.asarray(source_lengths, np.float64)
    t = np.asarray(target_lengths, np.float64)
    d, f, v = config.d_model, config.d_ff, config.vocab_size
    linear = 2 * d * d  # one d x d projection, per token
    ffn = 2 * 2 * d * f  # the two feed-forward products, per token
    encoder = s * (4 * linear + ffn) + 2 * 2 * s * s * d  # Q, K, V, O; scores and context
    decoder = (
        t * (4 * linear + ffn)
        + 2 * 2 * t * t * d  # self-attention and feed-forward
        + t * 2 * linear
        + s * 2 * linear  # cross-attention: Q, O on the target; K, V on the source
        + 2 * 2 * t * s * d  # cross-attention scores and context
    )
    output = t * 2 * d * v  # the (tied) output projection
    return config.num_encoder_layers * encoder + config.num_decoder_layers * decoder + output


def batch_training_flops(config, source_ids, target_ids):
    """Training FLOPs of one batch of token ids (pad = config.pad_id): (B, S), (B, T) arrays."""
    s = (np.asarray(source_ids) != config.pad_id).sum(axis=1)
    t = (np.asarray(target_ids) != config.pad_id).sum(axis=1)
    return float(TRAINING_FACTOR * forward_flops(config, s, t).sum())


def product_shapes(config, tokens):
    """The (M, K, N) matrix products a training step of `tokens` tokens a side is made of, with
    how many of each a forward pass runs: the shapes whose speed bounds the model's."""
    d, f, v = config.d_model, config.d_ff, config.vocab_size
    layers = config.num_encoder_layers + config.num_decoder_layers
    return [
        ((tokens, d, d), 4 * layers + 4 * config.num_decoder_layers),  # attention projections
        ((tokens, d, f), layers),  # feed-forward in
        ((tokens, f, d), layers),  # feed-forward out
        ((tokens, d, v), 1),  # output projection
    ]

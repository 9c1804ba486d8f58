"""CTranslate2 (optional extra `ctranslate2`): the same weights as a CTranslate2 TransformerSpec.

CTranslate2 decodes token strings; the runner maps ids to SentencePiece pieces and back, and
applies kformer's output-length rule (source length + 50, at most the exported max length) per
row. Its greedy tokens and scores (sum of log-probabilities) equal Keras'. Its beam search
divides the log-probability by length^alpha (not GNMT's ((5 + length) / 6)^alpha), so beam
outputs and scores may differ. The runner needs numpy, sentencepiece and ctranslate2 only."""

import os

import numpy as np

from kformer.decode.options import EXTRA_OUTPUT_TOKENS
from kformer.decode.text_batches import NEG_INF_SCORE
from kformer.export.artifact_format import Format
from kformer.export.runner import ArtifactRunner, refused_as_artifact

NEG_INF = 2 * NEG_INF_SCORE  # a hypothesis slot CTranslate2 did not fill


class Ctranslate2(Format):
    name = "ctranslate2"
    variants = ("fp32", "int8")  # int8: CTranslate2's own weight quantization

    def write(self, module, path, variant="fp32", positions=None, source_eos=False):
        """Set explicitly where CTranslate2's defaults differ from the config: its sinusoid table
        (interleaved or halves), LayerNorm epsilon, activation, embedding scale, logits bias, the
        tied output projection, the tokenizer's pieces as vocabulary. `positions`: rows of the
        sinusoid tables where a caller decodes past the model's max lengths (CTranslate2 refuses
        a position its table lacks); default: as trained. `source_eos`: CTranslate2 appends EOS
        to each source (add_source_eos), for callers that pass SentencePiece's pieces alone, as
        Argos does; kformer's runner passes the tokenizer's ids, EOS included where it appends it."""
        from ctranslate2.specs import common_spec, transformer_spec

        model, c = module.translator.model, module.config
        activation = {"relu": "RELU", "gelu": "GELU", "swish": "SWISH"}[c.activation]
        activation = getattr(common_spec.Activation, activation)
        spec = transformer_spec.TransformerSpec.from_config(
            (c.num_encoder_layers, c.num_decoder_layers),
            c.num_heads,
            pre_norm=c.norm_position == "pre",
            activation=activation,
        )
        _fill_spec(spec, model, positions)
        tokenizer = module.tokenizer
        pieces = [tokenizer.id_to_piece(i) for i in range(c.vocab_size)]
        spec.register_source_vocabulary(pieces)
        spec.register_target_vocabulary(pieces)
        for name in ("unk", "bos", "eos"):  # spec.config.unk_token = the piece of config.unk_id, ...
            setattr(spec.config, f"{name}_token", tokenizer.id_to_piece(getattr(c, f"{name}_id")))
        spec.config.decoder_start_token = spec.config.bos_token
        spec.config.add_source_eos = source_eos
        spec.config.layer_norm_epsilon = c.layer_norm_epsilon
        spec.encoder.scale_embeddings = spec.decoder.scale_embeddings = c.scale_embedding
        spec.validate()
        spec.optimize(quantization=None if variant == "fp32" else "int8")
        os.makedirs(path)
        spec.save(path)

    def runner_class(self, variant):
        return Ctranslate2Runner


def _weights(layer):
    return [np.asarray(w) for w in layer.get_weights()]


def _linear(spec, kernel, bias):
    """kernel (inputs..., outputs) -> CTranslate2's (outputs, inputs)."""
    spec.weight = kernel.reshape(-1, kernel.shape[-1]).T.copy()
    spec.bias = bias


def _fused(spec, layers):
    """Projections of one input, kernels (M, H, D), stacked as CTranslate2 stores them."""
    pairs = [_weights(layer) for layer in layers]
    spec.weight = np.concatenate([k.reshape(k.shape[0], -1).T for k, _ in pairs])
    spec.bias = np.concatenate([b.reshape(-1) for _, b in pairs])


def _attention(spec, layer, norm, self_attention):
    projections = [layer.query, layer.key, layer.value]
    if self_attention:
        _fused(spec.linear[0], projections)
    else:
        _fused(spec.linear[0], projections[:1])
        _fused(spec.linear[1], projections[1:])
    _linear(spec.linear[-1], *_weights(layer.output_projection))
    spec.layer_norm.gamma, spec.layer_norm.beta = _weights(norm)


def _feed_forward(spec, block):
    _linear(spec.linear_0, *_weights(block.feed_forward.inner))
    _linear(spec.linear_1, *_weights(block.feed_forward.outer))
    spec.layer_norm.gamma, spec.layer_norm.beta = _weights(block.feed_forward_norm)


def _fill_spec(spec, model, positions=None):
    """Copies a kformer Transformer's weights into a TransformerSpec of the same shape, with
    sinusoid tables of `positions` rows where given (the same function: the first rows equal)."""
    from kformer.model.layers import sinusoidal_table  # here: the runner needs no TensorFlow

    source_embedding = _weights(model.source_embedding)[0]
    target_embedding = _weights(model.target_embedding)[0]
    spec.encoder.embeddings[0].weight = source_embedding
    spec.decoder.embeddings.weight = target_embedding
    for stack, layer in ((spec.encoder, model.source_positions), (spec.decoder, model.target_positions)):
        table = np.asarray(layer.table)
        stack.position_encodings.encodings = (
            table if positions is None else sinusoidal_table(positions, table.shape[1], layer.layout)
        )
    if model.output_projection is None:
        spec.decoder.projection.weight = target_embedding  # tied: logits = x E^T
        if model.target_embedding.logits_bias is not None:
            spec.decoder.projection.bias = np.asarray(model.target_embedding.logits_bias)
    else:
        _linear(spec.decoder.projection, *_weights(model.output_projection))
    for stack, norm in ((spec.encoder, model.encoder_norm), (spec.decoder, model.decoder_norm)):
        if norm is not None:
            stack.layer_norm.gamma, stack.layer_norm.beta = _weights(norm)
    for layer_spec, block in zip(spec.encoder.layer, model.encoder_blocks):
        _attention(layer_spec.self_attention, block.self_attention, block.self_attention_norm, True)
        _feed_forward(layer_spec.ffn, block)
    for layer_spec, block in zip(spec.decoder.layer, model.decoder_blocks):
        _attention(layer_spec.self_attention, block.self_attention, block.self_attention_norm, True)
        _attention(layer_spec.attention, block.cross_attention, block.cross_attention_norm, False)
        _feed_forward(layer_spec.ffn, block)


class Ctranslate2Runner(ArtifactRunner):
    """A CTranslate2 model folder (fp32 or int8) on the CPU."""

    fmt = Ctranslate2.name
    concurrent_searches = True  # translate_batch calls run at once on its inter_threads replicas

    def __init__(self, artifact_dir, variant="fp32", settings=None, options=None):
        import ctranslate2

        super().__init__(artifact_dir, variant, settings, options)
        self.translator = refused_as_artifact(
            lambda path: ctranslate2.Translator(
                path, device="cpu", intra_threads=self.threads, inter_threads=self.parallel
            ),
            self.path,
            self.fmt,
        )

    def _search(self, options, batch):
        c, cap, k = self.config, options.max_length, options.beam_size
        rows = [
            [self.tokenizer.id_to_piece(int(t)) for t in row if t != c.pad_id]
            for row in batch[:, : c.max_source_length]
        ]
        limits = [min(len(row) + EXTRA_OUTPUT_TOKENS, cap) if row else 0 for row in rows]
        width = min(batch.shape[1] + EXTRA_OUTPUT_TOKENS, c.max_target_length)  # as the graphs' buffers
        tokens = np.full((len(rows), k, width), c.pad_id, np.int32)
        scores = np.full((len(rows), k), NEG_INF, np.float32)
        scores[:, 0] = 0.0  # an empty source: one empty hypothesis
        # CTranslate2 takes one length limit per call: the rows left go in one call at their longest
        # limit, and a row whose output reached its own (shorter) limit is translated again with it,
        # so that each row stops where the graphs stop it. In a length-sorted batch that is one call,
        # and a second for the rare row that runs on.
        pending = [i for i, limit in enumerate(limits) if limit]
        while pending:
            limit = max(limits[i] for i in pending)
            results = self.translator.translate_batch(
                [rows[i] for i in pending],
                beam_size=k,
                num_hypotheses=options.nbest,  # the graphs' stop rule: nbest finished (<= k)
                length_penalty=options.alpha if k > 1 else 0.0,  # greedy: sum
                no_repeat_ngram_size=max(0, options.no_repeat_ngram),
                max_decoding_length=limit,
                min_decoding_length=0,  # the graphs' rule: EOS may come first (CTranslate2's default bans it)
                return_scores=True,
                return_end_token=True,
            )
            again = []
            for i, result in zip(pending, results):
                if limits[i] < limit and max(map(len, result.hypotheses)) >= limits[i]:
                    again.append(i)
                    continue
                for n, (hypothesis, score) in enumerate(zip(result.hypotheses, result.scores)):
                    ids = [self.tokenizer.piece_to_id(piece) for piece in hypothesis]
                    tokens[i, n, : len(ids)] = ids
                    scores[i, n] = score
            pending = again
        return (tokens, scores) if k > 1 else (tokens[:, 0], scores[:, 0])


FORMAT = Ctranslate2()

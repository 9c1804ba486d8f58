"""Hugging Face Marian folders (OPUS-MT, Tatoeba-Challenge): config.json, model.safetensors (or
pytorch_model.bin, read through torch where it is installed), source.spm, target.spm, vocab.json,
and generation_config.json where present.

Marian is the paper's post-LN Transformer with a SiLU (swish) feed-forward, [sin | cos] position
tables, LayerNorm epsilon 1e-5, one vocabulary for both sides whose embedding is also the output
projection, a bias on the logits, and a decoder that starts from the pad token and never emits it.
kformer's pad must be id 0, so the vocabulary is reordered: pad first, then every other id in
Marian's order (the tokenizer maps pieces through the reordered vocabulary); the pad token is
banned from the output by its logit bias, as Marian's generation config bans it."""

import dataclasses
import os

import numpy as np

from kformer.contracts.json_records import read_json
from kformer.contracts.pair import LanguagePair
from kformer.importers.run import Origin, Weights, attention_values, read_licence, write_run, write_vocabulary

ACTIVATIONS = {"swish": "swish", "silu": "swish", "relu": "relu", "gelu": "gelu"}
BANNED = -1e9  # the logit bias of a token the model must never output (as the searches' NEG_INF)
LICENCES = ("LICENSE", "LICENSE.txt", "README.md")  # what a folder may hold its licence in
REQUIRED = (  # integer fields of config.json kformer reads
    "d_model",
    "encoder_layers",
    "decoder_layers",
    "encoder_attention_heads",
    "encoder_ffn_dim",
    "max_position_embeddings",
    "vocab_size",
    "pad_token_id",
    "eos_token_id",
)
EXTRA_NORMS = ("normalize_before", "normalize_embedding", "add_final_layer_norm")  # not Marian's post-LN
SAME = {  # fields kformer holds once for both stacks: Marian's encoder one must equal the decoder one
    "encoder_attention_heads": "decoder_attention_heads",
    "encoder_ffn_dim": "decoder_ffn_dim",
}


@dataclasses.dataclass(frozen=True)
class Marian:
    """A Marian folder read and validated: its folder, config, weights (name -> array), the
    pieces of its vocabulary by Marian id, its SentencePiece models' bytes, its language pair
    and its weights file."""

    folder: str
    config: dict[str, int | float | str | bool | list | None]
    weights: dict[str, np.ndarray]
    pieces: list[str]
    source_spm: bytes
    target_spm: bytes
    pair: LanguagePair
    weights_file: str

    def describe(self):
        c = self.config
        return (
            f"Marian {c['encoder_layers']}+{c['decoder_layers']} layers, d_model {c['d_model']}, "
            f"vocabulary {c['vocab_size']:,}, {self.pair}"
        )

    @property
    def order(self):
        """kformer id -> Marian id: the pad token first, then every other id in Marian's order."""
        pad = self.config["pad_token_id"]
        return np.array([pad] + [i for i in range(len(self.pieces)) if i != pad])


def load(folder, direction=None):
    """The Marian model at `folder`, checked: a one-line ValueError naming the file and field of
    anything kformer cannot represent or read."""
    config = read_json(os.path.join(folder, "config.json"))
    _validate(config, os.path.join(folder, "config.json"))
    pieces = _vocabulary(folder, config)
    weights_file, weights = _weights(folder)
    spms = [_read(os.path.join(folder, name)) for name in ("source.spm", "target.spm")]
    return Marian(folder, config, weights, pieces, *spms, _pair(folder, direction), weights_file)


def _validate(config, where):
    """Refuses what kformer's model cannot represent, naming the field and its value."""

    def refuse(field, why):
        raise ValueError(f"{where}: {field} {config.get(field)!r}: {why}")

    for field in REQUIRED:
        if type(config.get(field)) is not int or config[field] < 0:
            refuse(field, "a Marian config.json gives it as a whole number")
    if config.get("activation_function") not in ACTIVATIONS:
        refuse("activation_function", f"kformer runs {sorted(ACTIVATIONS)}")
    for encoder, decoder in SAME.items():
        if config.get(encoder) != config.get(decoder):
            refuse(encoder, f"differs from {decoder} {config.get(decoder)!r}; kformer's stacks share it")
    for field in EXTRA_NORMS:
        if config.get(field):
            refuse(field, "Marian folders kformer imports are post-LN without extra norms")
    if not config.get("share_encoder_decoder_embeddings", True):
        refuse(
            "share_encoder_decoder_embeddings",
            "separate source and target vocabularies are not supported yet",
        )
    if config.get("decoder_vocab_size") not in (None, config.get("vocab_size")):
        refuse(
            "decoder_vocab_size", f"differs from vocab_size {config.get('vocab_size')!r}: a vocabulary a side"
        )
    if not config.get("tie_word_embeddings", True):
        refuse("tie_word_embeddings", "kformer ties the output projection to the shared embedding")
    if config.get("decoder_start_token_id", config.get("pad_token_id")) != config.get("pad_token_id"):
        refuse("decoder_start_token_id", "Marian's decoder starts from its pad token")


def _read(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ValueError(f"{path}: cannot read ({e.strerror}); a Marian folder has it") from None


def _vocabulary(folder, config):
    """The pieces of vocab.json by id: every id from 0 to vocab_size - 1 once, the special pieces in."""
    path = os.path.join(folder, "vocab.json")
    try:
        vocab = read_json(path)
    except OSError as e:
        raise ValueError(f"{path}: cannot read ({e.strerror}); a Marian folder has it") from None
    size = config["vocab_size"]
    ids = list(vocab.values()) if isinstance(vocab, dict) else None
    if ids is None or any(type(i) is not int for i in ids) or sorted(ids) != list(range(size)):
        raise ValueError(
            f"{path}: {len(vocab):,} pieces do not number 0..{size - 1} (config.json's vocab_size {size:,})"
            if isinstance(vocab, dict)
            else f"{path}: not a JSON object of pieces and their ids"
        )
    pieces = [None] * size
    for piece, i in vocab.items():
        pieces[i] = piece
    for name in ("pad", "eos"):
        if not 0 <= config[f"{name}_token_id"] < size:
            raise ValueError(
                f"{path}: config.json's {name}_token_id {config[f'{name}_token_id']} is not in it"
            )
    if "<unk>" not in vocab:
        raise ValueError(f"{path}: no <unk> piece")
    return pieces


def _weights(folder):
    """(the weights file, {name: float32 array}): model.safetensors without torch; else
    pytorch_model.bin through torch, where it is installed."""
    safetensors_path, torch_path = (
        os.path.join(folder, n) for n in ("model.safetensors", "pytorch_model.bin")
    )
    if os.path.exists(safetensors_path):
        from safetensors.numpy import load_file

        try:
            return safetensors_path, {k: v.astype(np.float32) for k, v in load_file(safetensors_path).items()}
        except Exception as e:  # a truncated or corrupt file: safetensors raises its own errors
            raise ValueError(f"{safetensors_path}: cannot read the weights ({e})") from None
    if not os.path.exists(torch_path):
        raise ValueError(f"{folder}: no model.safetensors or pytorch_model.bin")
    try:
        import torch
    except ModuleNotFoundError:
        raise ValueError(
            f"{torch_path}: reading it needs torch (pip install torch), or give the folder's model.safetensors"
        ) from None
    try:
        state = torch.load(torch_path, map_location="cpu", weights_only=True)
        return torch_path, {k: v.float().numpy() for k, v in state.items()}
    except Exception as e:  # a truncated or corrupt file: torch raises its own errors (pickle's, zip's)
        raise ValueError(f"{torch_path}: cannot read the weights ({e})") from None


def _pair(folder, direction):
    """The language pair: `direction` if given, else tokenizer_config.json's source and target
    languages, else the folder's name (opus-mt-zh-en)."""
    if direction:
        return LanguagePair.parse(direction)
    path = os.path.join(folder, "tokenizer_config.json")
    settings = read_json(path) if os.path.exists(path) else {}
    if settings.get("source_lang") and settings.get("target_lang"):
        try:
            return LanguagePair.parse(f"{settings['source_lang']}-{settings['target_lang']}")
        except ValueError as e:
            raise ValueError(f"{path}: {e}; give --direction SOURCE-TARGET") from None
    name = os.path.basename(os.path.normpath(folder)).split("-")
    if len(name) >= 2 and all(len(code) in (2, 3) and code.isalpha() for code in name[-2:]):
        return LanguagePair(*name[-2:])
    raise ValueError(f"{folder}: its language pair is not recorded; give --direction SOURCE-TARGET")


def model_config(marian, tokenizer_sha256=""):
    """The ModelConfig of a Marian model, its ids those of the reordered vocabulary."""
    from kformer.model.config import ModelConfig

    c, position = marian.config, {m: k for k, m in enumerate(marian.order)}
    return ModelConfig(
        vocab_size=c["vocab_size"],
        d_model=c["d_model"],
        num_heads=c["encoder_attention_heads"],
        d_ff=c["encoder_ffn_dim"],
        num_encoder_layers=c["encoder_layers"],
        num_decoder_layers=c["decoder_layers"],
        dropout=float(c.get("dropout", 0.1)),
        max_source_length=c["max_position_embeddings"],
        max_target_length=c["max_position_embeddings"],
        activation=ACTIVATIONS[c["activation_function"]],
        layer_norm_epsilon=1e-5,
        positions="halves",
        scale_embedding=bool(c.get("scale_embedding", False)),
        output_bias=True,
        pad_id=0,
        unk_id=position[marian.pieces.index("<unk>")],
        bos_id=0,  # Marian's decoder starts from its pad token
        eos_id=position[c["eos_token_id"]],
        tokenizer_sha256=tokenizer_sha256,
    )


def _linear(w, name):
    """A torch Linear's (out, in) weight and its bias -> kformer's (in, out) kernel and bias."""
    return w.take(f"{name}.weight").T, w.take(f"{name}.bias")


def _attention(values, w, source, target, heads):
    """q, k, v, out projections (M, M) -> kformer's attention layer `target`."""
    names = ("q_proj", "k_proj", "v_proj", "out_proj")
    attention_values(values, target, heads, [_linear(w, f"{source}.{name}") for name in names])


def _norm(values, w, source, target):
    values[f"{target}/gamma"], values[f"{target}/beta"] = w.take(f"{source}.weight"), w.take(f"{source}.bias")


def _block(values, w, source, target, heads, cross):
    """One encoder (cross False) or decoder layer's weights."""
    _attention(values, w, f"{source}.self_attn", f"{target}/self_attention", heads)
    _norm(values, w, f"{source}.self_attn_layer_norm", f"{target}/self_attention_norm")
    if cross:
        _attention(values, w, f"{source}.encoder_attn", f"{target}/cross_attention", heads)
        _norm(values, w, f"{source}.encoder_attn_layer_norm", f"{target}/cross_attention_norm")
    for marian_name, kformer_name in (("fc1", "inner"), ("fc2", "outer")):
        (
            values[f"{target}/feed_forward/{kformer_name}/kernel"],
            values[f"{target}/feed_forward/{kformer_name}/bias"],
        ) = _linear(w, f"{source}.{marian_name}")
    _norm(values, w, f"{source}.final_layer_norm", f"{target}/feed_forward_norm")


def _shared(marian, w):
    """(the shared embedding, the logits' bias), by Marian id, taken out of `w` with the copies of
    the embedding that older checkpoints store beside it (tied: the same values) and the position
    tables they store (the sinusoid kformer computes); anything else left is the caller's to refuse."""
    from kformer.model.layers import sinusoidal_table

    names = ["model.shared.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"]
    found = [w.pop(name) for name in [*names, "lm_head.weight"] if name in w]
    if not found or any(not np.array_equal(found[0], other) for other in found[1:]):
        raise ValueError(f"{marian.weights_file}: no shared embedding, or copies of it that differ (untied)")
    table = sinusoidal_table(marian.config["max_position_embeddings"], marian.config["d_model"], "halves")
    for name in ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight"):
        if name in w and not np.allclose(w.pop(name), table, atol=1e-4):
            raise ValueError(f"{marian.weights_file}: {name} is not Marian's sinusoid (learned positions)")
    return found[0], w.take("final_logits_bias").reshape(-1)


def kformer_weights(marian):
    """{kformer variable path: array} of a Marian model's weights, the vocabulary reordered."""
    w, c, order = Weights(marian.weights, marian.weights_file), marian.config, marian.order
    embedding, bias = _shared(marian, w)
    bias = bias[order].copy()
    bias[0] = BANNED  # the pad token: the decoder's first input, never an output
    values = {"shared_embedding/embeddings": embedding[order], "shared_embedding/logits_bias": bias}
    heads = c["encoder_attention_heads"]
    for stack in ("encoder", "decoder"):
        for i in range(c[f"{stack}_layers"]):
            _block(values, w, f"model.{stack}.layers.{i}", f"{stack}_block_{i}", heads, stack == "decoder")
    w.refuse_leftovers()
    return values


def save(marian, folder):
    """Writes the run folder of `marian` into `folder`: its vocabulary tokenizer, then what every
    imported run has (kformer.importers.run). Returns the ImportRecord."""
    config = model_config(marian)
    spms = marian.source_spm, marian.target_spm
    tokenizer = write_vocabulary(folder, config, spms, marian.pieces, marian.order)
    origin = Origin(
        "marian", marian.folder, marian.weights_file, marian.pair, read_licence(marian.folder, LICENCES)
    )
    return write_run(folder, config, kformer_weights(marian), origin, tokenizer)

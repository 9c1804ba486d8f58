"""CTranslate2 model folders holding a TransformerSpec (OpenNMT-py models, the models inside Argos
packages, kformer's own `--formats ctranslate2`): model.bin (float, float16 or int8 weights, read
by kformer.importers.model_bin), config.json, the vocabulary (shared_vocabulary.json or .txt, or
source_ and target_ ones that are equal) and the SentencePiece model the pieces come from
(sentencepiece.model beside the folder or in it, as Argos packages have it).

Pre- or post-LayerNorm with the stacks' final norms, ReLU, GELU or SiLU, tied or separate
embeddings and projection, a bias on the logits, stored sinusoid tables (interleaved or halves)
and embedding scaling are read from the spec's own variables. kformer's pad must be id 0: the
vocabulary is reordered with the pad token (<blank> in OpenNMT-py, <pad> elsewhere) first. Where
the vocabulary is the SentencePiece model's own pieces in its order (a kformer export's), the run
keeps that model as its one tokenizer, and every export format takes it."""

import dataclasses
import json
import os
import pathlib
import re

import numpy as np

from kformer.contracts.json_records import read_json
from kformer.importers.model_bin import ModelBin
from kformer.importers.run import Origin, Weights, attention_values, read_licence, write_run, write_vocabulary

ACTIVATIONS = {0: "relu", 2: "swish", 3: "gelu"}  # CTranslate2's Activation enum: what kformer runs
PADS = ("<blank>", "<pad>")  # OpenNMT-py's pad token, then everyone else's
# The SentencePiece models of the pieces, in the folder or its parent: one a side, or one for both
# (Argos'). A kformer package of an import holds both kinds: its two are the tokenizer as it was.
TOKENIZERS = (("source.spm", "target.spm"), ("sentencepiece.model", "sentencepiece.model"))
LICENCES = ("LICENSE", "LICENSE.txt", "README.md")
DEFAULT_TOKENS = {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"}  # CTranslate2's
MAX_LENGTH = 256  # tokens an import reads and writes at most (a stored table may hold fewer): Argos' own
# Settings of the spec that must hold for kformer's model to be the same network.
FIXED = {
    "encoder/multi_query_attention": 0,
    "decoder/alibi": 0,
    "decoder/start_from_zero_embedding": 0,
}
# Settings that change nothing kformer computes: the embeddings' merge (one embedding), the
# alignment heads (CTranslate2's attention output) and ALiBi's settings (ALiBi is off: FIXED).
IGNORED = (
    "encoder/embeddings_merge",
    "decoder/alignment_layer",
    "decoder/alignment_heads",
    "decoder/alibi_use_positive_positions",
    "decoder/scale_alibi",
)


@dataclasses.dataclass(frozen=True)
class Ctranslate2Model:
    """A CTranslate2 TransformerSpec read and checked: its settings (config.json), weights, the
    vocabulary's pieces by CTranslate2 id, the SentencePiece model's bytes and where it came from."""

    settings: dict
    weights: Weights
    pieces: list[str]
    spms: tuple[bytes, bytes]  # the source's and the target's SentencePiece models
    origin: Origin

    def describe(self):
        w = self.weights
        layers = _count(w, "encoder"), _count(w, "decoder")
        return (
            f"CTranslate2 TransformerSpec {layers[0]}+{layers[1]} layers, d_model {self.d_model}, "
            f"vocabulary {len(self.pieces):,}, {self.origin.pair}"
        )

    @property
    def d_model(self):
        return self.weights["decoder/embeddings/weight"].shape[1]

    @property
    def pad(self):
        return next(piece for piece in PADS if piece in self.pieces)

    @property
    def order(self):
        """kformer id -> CTranslate2 id: the pad token first, then every other id in order."""
        pad = self.pieces.index(self.pad)
        return np.array([pad] + [i for i in range(len(self.pieces)) if i != pad])


def _count(weights, stack):
    return len({name.split("/")[1] for name in weights if re.match(rf"{stack}/layer_\d+/", name)})


def is_model_folder(folder):
    return os.path.isfile(os.path.join(folder, "model.bin"))


def load(folder, pair, kind="ctranslate2", source=None, sha256=None):
    """The TransformerSpec in `folder` (model.bin, config.json, its vocabulary), translating `pair`
    (a LanguagePair); `kind`, `source` and `sha256`: what import.json records of a package that
    holds it. A one-line ValueError names the file and setting kformer cannot represent."""
    model_bin = ModelBin(os.path.join(folder, "model.bin"))
    if model_bin.spec != "TransformerSpec":
        raise ValueError(f"{model_bin.path}: a {model_bin.spec}; kformer imports TransformerSpec models")
    config_path = os.path.join(folder, "config.json")  # older conversions have none: the defaults
    settings = {**DEFAULT_TOKENS, **(read_json(config_path) if os.path.exists(config_path) else {})}
    weights = Weights(model_bin.variables, model_bin.path)
    _check_settings(weights, settings, config_path)
    pieces = _vocabulary(folder)
    spms = _tokenizers(folder)
    parent = os.path.dirname(os.path.normpath(folder))
    licence = read_licence(folder, LICENCES) or read_licence(parent, LICENCES)
    origin = Origin(kind, source or folder, model_bin.path, pair, licence, sha256)
    model = Ctranslate2Model(settings, weights, pieces, spms, origin)
    missing = [
        settings[key] for key in ("unk_token", "bos_token", "eos_token") if settings[key] not in pieces
    ]
    if missing or not any(piece in pieces for piece in PADS):
        raise ValueError(f"{folder}: its vocabulary lacks {missing or ' or '.join(PADS)}")
    return model


def _check_settings(weights, settings, where):
    """Refuses what kformer's model cannot represent, naming the setting and its value."""
    for name, value in FIXED.items():
        if weights.get(name, value) != value:
            raise ValueError(f"{weights.file}: {name} is {weights[name]}; kformer's model has it {value}")
    for stack in ("encoder", "decoder"):
        activation = weights.get(f"{stack}/activation", 0)
        if activation not in ACTIVATIONS:
            raise ValueError(
                f"{weights.file}: {stack}/activation {activation}: kformer runs ReLU, GELU and SiLU"
            )
    for name in ("pre_norm", "activation", "num_heads", "scale_embeddings"):
        if weights.get(f"encoder/{name}") != weights.get(f"decoder/{name}"):
            raise ValueError(
                f"{weights.file}: encoder/{name} differs from decoder/{name}; kformer's stacks share it"
            )
    if "encoder/embeddings_1/weight" in weights:
        raise ValueError(
            f"{weights.file}: source features (encoder/embeddings_1): kformer reads one source embedding"
        )
    for key, allowed in (("add_source_bos", False), ("decoder_start_token", settings.get("bos_token"))):
        if settings.get(key, allowed) != allowed:
            raise ValueError(f"{where}: {key} {settings[key]!r}: kformer's model takes {allowed!r}")
    if settings.get("layer_norm_epsilon") is not None and not 0 < settings["layer_norm_epsilon"] < 1:
        raise ValueError(f"{where}: layer_norm_epsilon {settings['layer_norm_epsilon']!r}")


def _vocabulary(folder):
    """The pieces by id: shared_vocabulary.json/.txt, or source_ and target_ ones that are equal."""
    sides = {}
    for side in ("shared", "source", "target"):
        for extension in ("json", "txt"):
            path = os.path.join(folder, f"{side}_vocabulary.{extension}")
            if os.path.exists(path):
                with open(path, encoding="utf-8") as f:
                    sides[side] = json.load(f) if extension == "json" else f.read().split("\n")[:-1]
    if "shared" in sides:
        return sides["shared"]
    if "source" not in sides or "target" not in sides:
        raise ValueError(f"{folder}: no shared_vocabulary.json (or .txt), nor source_ and target_ ones")
    if sides["source"] != sides["target"]:
        raise ValueError(
            f"{folder}: source_vocabulary and target_vocabulary differ; kformer's model has one vocabulary"
        )
    return sides["source"]


def _tokenizers(folder):
    """(source, target) SentencePiece models' bytes, from the folder or its parent (TOKENIZERS)."""
    parent = os.path.dirname(os.path.normpath(folder))
    for where in (folder, parent):
        for names in TOKENIZERS:
            paths = [os.path.join(where, name) for name in names]
            if all(os.path.isfile(path) for path in paths):
                return tuple(pathlib.Path(path).read_bytes() for path in paths)
    wanted = " or ".join("/".join(dict.fromkeys(names)) for names in TOKENIZERS)
    raise ValueError(
        f"{folder}: no SentencePiece model ({wanted}) in it or beside it; put the one its "
        "vocabulary was made with there"
    )


def _layout(model):
    """(positions layout, table rows) of the spec's sinusoid tables: those it stores (compared
    with each layout kformer computes; learned ones are a one-line ValueError), else CTranslate2's
    own, OpenNMT-tf's "timescales", as long as Argos decodes."""
    from kformer.model.config import POSITIONS
    from kformer.model.layers import sinusoidal_table

    w = model.weights
    tables = [w.get(f"{stack}/position_encodings/encodings") for stack in ("encoder", "decoder")]
    if all(table is None for table in tables):
        return "timescales", MAX_LENGTH
    if any(table is None for table in tables):
        raise ValueError(f"{w.file}: a position table for one stack only; kformer's stacks share one")
    for layout in POSITIONS:  # float32 tables of long sequences differ from float64 in the 4th digit
        if all(np.allclose(t, sinusoidal_table(*t.shape, layout), atol=1e-3) for t in tables):
            return layout, min(len(t) for t in tables)
    raise ValueError(f"{w.file}: position tables that are not a sinusoid (learned): kformer computes them")


def _scales_embeddings(weights):
    """Whether embeddings are multiplied by sqrt(d_model): the spec's scale_embeddings, or the
    embeddings' multiply_by_sqrt_depth of older revisions (default: as the paper)."""
    for name in ("encoder/scale_embeddings", "encoder/embeddings_0/multiply_by_sqrt_depth"):
        if name in weights:
            return bool(weights[name])
    return True


def _tied(weights):
    """Whether the source and target embeddings and the output projection are one matrix."""
    names = ("encoder/embeddings_0/weight", "decoder/embeddings/weight", "decoder/projection/weight")
    first, *others = (weights[name] for name in names)
    return all(np.array_equal(first, other) for other in others)


def model_config(model):
    """The ModelConfig of the spec, its ids those of the reordered vocabulary."""
    from kformer.model.config import ModelConfig

    w, s = model.weights, model.settings
    layout, rows = _layout(model)
    position = {c: k for k, c in enumerate(model.order)}
    ids = {name: position[model.pieces.index(s[f"{name}_token"])] for name in ("unk", "bos", "eos")}
    tied = _tied(w)
    return ModelConfig(
        vocab_size=len(model.pieces),
        d_model=model.d_model,
        num_heads=int(w["encoder/num_heads"]),
        d_ff=w["encoder/layer_0/ffn/linear_0/weight"].shape[0],
        num_encoder_layers=_count(w, "encoder"),
        num_decoder_layers=_count(w, "decoder"),
        dropout=0.1,  # what fine-tuning starts from: a spec keeps no training settings
        max_source_length=min(rows, MAX_LENGTH),
        max_target_length=min(rows, MAX_LENGTH),
        activation=ACTIVATIONS[w.get("encoder/activation", 0)],
        norm_position="pre" if w.get("encoder/pre_norm", 1) else "post",
        layer_norm_epsilon=s.get("layer_norm_epsilon") or 1e-6,  # CTranslate2's default
        positions=layout,
        scale_embedding=_scales_embeddings(w),
        tie_embeddings=tied,
        output_bias=tied and "decoder/projection/bias" in w,
        pad_id=0,
        unk_id=ids["unk"],
        bos_id=ids["bos"],
        eos_id=ids["eos"],
    )


def _linear(w, name):
    """CTranslate2's (out, in) weight and its bias (zeros where it has none) -> (in, out), (out,)."""
    weight = w.take(f"{name}/weight")
    bias = w.pop(f"{name}/bias", None)
    return weight.T, np.zeros(weight.shape[0], np.float32) if bias is None else bias


def _split(w, name, count):
    """A fused projection (CTranslate2 stacks q, k and v as rows) as `count` (kernel, bias) pairs."""
    kernel, bias = _linear(w, name)
    return list(zip(np.split(kernel, count, axis=1), np.split(bias, count)))


def _norm(values, w, source, target):
    values[f"{target}/gamma"], values[f"{target}/beta"] = w.take(f"{source}/gamma"), w.take(f"{source}/beta")


def _attention(values, w, source, target, heads, cross):
    """Self-attention (linear_0: q, k, v; linear_1: out) or cross-attention (linear_0: q; linear_1:
    k, v; linear_2: out) -> kformer's attention layer `target` and its norm."""
    qkv = [*_split(w, f"{source}/linear_0", 1), *_split(w, f"{source}/linear_1", 2)] if cross else None
    output = _linear(w, f"{source}/linear_{2 if cross else 1}")
    attention_values(values, target, heads, [*(qkv or _split(w, f"{source}/linear_0", 3)), output])
    _norm(values, w, f"{source}/layer_norm", f"{target}_norm")


def _block(values, w, source, target, heads, cross):
    _attention(values, w, f"{source}/self_attention", f"{target}/self_attention", heads, False)
    if cross:
        _attention(values, w, f"{source}/attention", f"{target}/cross_attention", heads, True)
    for ctranslate2_name, kformer_name in (("linear_0", "inner"), ("linear_1", "outer")):
        kernel, bias = _linear(w, f"{source}/ffn/{ctranslate2_name}")
        values[f"{target}/feed_forward/{kformer_name}/kernel"] = kernel
        values[f"{target}/feed_forward/{kformer_name}/bias"] = bias
    _norm(values, w, f"{source}/ffn/layer_norm", f"{target}/feed_forward_norm")


def _embeddings(values, w, order, tied):
    """The embeddings and the output projection, rows in kformer's id order."""
    source, target = w.take("encoder/embeddings_0/weight"), w.take("decoder/embeddings/weight")
    projection, bias = _linear(w, "decoder/projection")
    if tied:
        values["shared_embedding/embeddings"] = target[order]
        values["shared_embedding/logits_bias"] = bias[order]
        return
    values["source_embedding/embeddings"], values["target_embedding/embeddings"] = (
        source[order],
        target[order],
    )
    values["output_projection/kernel"], values["output_projection/bias"] = projection[:, order], bias[order]


def kformer_weights(model, config):
    """{kformer variable path: array} of the spec's weights; settings and tables taken out."""
    w = Weights(model.weights, model.weights.file)
    for name in (*FIXED, *IGNORED, "encoder/embeddings_0/multiply_by_sqrt_depth"):
        w.pop(name, None)
    values = {}
    _embeddings(values, w, model.order, config.tie_embeddings)
    for stack in ("encoder", "decoder"):
        for name in (
            "num_heads",
            "pre_norm",
            "activation",
            "scale_embeddings",
            "position_encodings/encodings",
        ):
            w.pop(f"{stack}/{name}", None)
        for i in range(getattr(config, f"num_{stack}_layers")):
            _block(
                values, w, f"{stack}/layer_{i}", f"{stack}_block_{i}", config.num_heads, stack == "decoder"
            )
        if config.norm_position == "pre":
            _norm(values, w, f"{stack}/layer_norm", f"{stack}_norm")
    w.refuse_leftovers()
    return values


def _own_pieces(model, config, tokenizer):
    """Whether the vocabulary is `tokenizer`'s own pieces and ids, with no source EOS added: then
    that SentencePiece model is the run's one tokenizer."""
    same_model = model.spms[0] == model.spms[1]
    pieces = [tokenizer.id_to_piece(i) for i in range(tokenizer.get_piece_size())]
    special = (tokenizer.pad_id(), tokenizer.unk_id(), tokenizer.bos_id(), tokenizer.eos_id())
    ids = (config.pad_id, config.unk_id, config.bos_id, config.eos_id)
    return (
        same_model and pieces == model.pieces and special == ids and not model.settings.get("add_source_eos")
    )


def save(model, folder):
    """Writes the run folder of `model` into `folder`: its tokenizer (the SentencePiece model
    itself where the vocabulary is its pieces, else a vocabulary tokenizer over it), then what
    every imported run has (kformer.importers.run). Returns the ImportRecord."""
    import sentencepiece as spm

    from kformer.contracts import TOKENIZER_FILE

    config = model_config(model)
    values = kformer_weights(model, config)
    tokenizer = spm.SentencePieceProcessor(model_proto=model.spms[0])
    if _own_pieces(model, config, tokenizer):
        pathlib.Path(folder, TOKENIZER_FILE).write_bytes(model.spms[0])
    else:
        append_eos = bool(model.settings.get("add_source_eos"))
        tokenizer = write_vocabulary(folder, config, model.spms, model.pieces, model.order, append_eos)
    return write_run(folder, config, values, model.origin, tokenizer)

"""ModelConfig: what builds the network, the one home of its defaults, and its presets.

Presets: `tiny` (tests), `small` (CPU demo), `base` and `big` (Vaswani et al. 2017, Table 3); how
each is trained is its recipe's (kformer.train.recipe). The config is saved as config.json beside
the weights and the model is rebuilt from it.
"""

import dataclasses

from kformer.contracts.digests import tokenizer_digest
from kformer.contracts.json_records import Record
from kformer.data.tokenizer import SPECIAL_IDS, VOCAB_SIZE

DEFAULT_PRESET = "small"
NORM_POSITIONS = ("post", "pre")
ACTIVATIONS = ("relu", "gelu", "swish")  # the paper's; BERT's and OpenNMT's; Marian's (SiLU)
# The sinusoid's layout: the paper's sin and cos interleaved, Marian's and fairseq's [sin | cos], or
# OpenNMT-tf's [sin | cos] of other timescales (kformer.model.layers.sinusoidal_table).
POSITIONS = ("interleaved", "halves", "timescales")
# The training recipe's fields, which config.json held before the recipe had its own file
# (recipe.json): read from such a file, they are left to kformer.train.recipe.
LEGACY_RECIPE_KEYS = frozenset(
    {
        "label_smoothing", "schedule", "learning_rate", "warmup_steps", "warmup_fraction",
        "decay_fraction", "ema_momentum", "batch_tokens", "accumulate_steps",
    }
)  # fmt: skip
POSITIVE = (
    "vocab_size", "d_model", "num_heads", "d_ff", "num_encoder_layers", "num_decoder_layers",
    "max_source_length", "max_target_length",
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class ModelConfig(Record):
    """The encoder-decoder Transformer's shape: sizes, dropout, the longest source and output,
    the activation, where LayerNorm goes ("post" is the paper's LayerNorm(x + Sublayer(x))) and
    its epsilon, the positions' layout, whether embeddings are scaled by sqrt(d_model), shared
    embeddings, a bias on the logits, the special ids (bos_id, the decoder's first token, may be
    the pad id, as Marian starts), and the sha256 of the SentencePiece model it reads ("" = not
    bound to one: another run's tokenizer of the same size would translate garbage).

    The defaults are the paper's; imported models (kformer.importers) set what their family does."""

    vocab_size: int = VOCAB_SIZE
    d_model: int = 512
    num_heads: int = 8
    d_ff: int = 2048
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    dropout: float = 0.1
    max_source_length: int = 128
    max_target_length: int = 128
    activation: str = "relu"
    norm_position: str = "post"
    layer_norm_epsilon: float = 1e-6
    positions: str = "interleaved"
    scale_embedding: bool = True
    tie_embeddings: bool = True  # shared source/target embedding and output projection
    output_bias: bool = False
    pad_id: int = SPECIAL_IDS["pad_id"]
    unk_id: int = SPECIAL_IDS["unk_id"]
    bos_id: int = SPECIAL_IDS["bos_id"]
    eos_id: int = SPECIAL_IDS["eos_id"]
    tokenizer_sha256: str = ""

    def __post_init__(self):
        self.check_types()
        errors = [
            f"{name} must be >= 1, got {getattr(self, name)}" for name in POSITIVE if getattr(self, name) < 1
        ]
        if self.d_model % max(1, self.num_heads):
            errors.append(f"d_model ({self.d_model}) must be divisible by num_heads ({self.num_heads})")
        if not 0.0 <= self.dropout < 1.0:
            errors.append(f"dropout must be in [0, 1), got {self.dropout}")
        if self.activation not in ACTIVATIONS:
            errors.append(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        if self.norm_position not in NORM_POSITIONS:
            errors.append(f"norm_position must be one of {NORM_POSITIONS}, got {self.norm_position!r}")
        if self.positions not in POSITIONS:
            errors.append(f"positions must be one of {POSITIONS}, got {self.positions!r}")
        if not 0.0 < self.layer_norm_epsilon < 1.0:
            errors.append(f"layer_norm_epsilon must be in (0, 1), got {self.layer_norm_epsilon}")
        errors += self._special_id_errors()
        if errors:
            raise ValueError("Invalid ModelConfig: " + "; ".join(errors))

    def _special_id_errors(self):
        """pad 0 (the mask convention relies on it); pad, unk and eos distinct; bos distinct from
        unk and eos (it may be pad: the decoder's first token); all below vocab_size."""
        special = [self.pad_id, self.unk_id, self.bos_id, self.eos_id]
        errors = (
            []
            if self.pad_id == 0
            else [f"pad_id must be 0 (the mask convention relies on it), got {self.pad_id}"]
        )
        distinct = len({self.pad_id, self.unk_id, self.eos_id}) == 3 and self.bos_id not in (
            self.unk_id,
            self.eos_id,
        )
        if not distinct or not all(0 <= i < self.vocab_size for i in special):
            errors.append(f"special ids {special} must be distinct and below vocab_size {self.vocab_size}")
        return errors

    @property
    def starts_with_pad(self):
        """Whether the decoder's first token is the pad token (Marian's decoder_start_token_id)."""
        return self.bos_id == self.pad_id

    def check_tokenizer(self, tokenizer, path="tokenizer"):
        """The tokenizer must be the model's: same vocabulary, special ids and, when bound, digest."""
        expected = (self.vocab_size, self.pad_id, self.unk_id, self.bos_id, self.eos_id)
        found = (
            tokenizer.get_piece_size(),
            tokenizer.pad_id(),
            tokenizer.unk_id(),
            tokenizer.bos_id(),
            tokenizer.eos_id(),
        )
        if found != expected:
            raise ValueError(
                f"{path} does not match the model: (vocabulary, pad, unk, bos, eos) {found} vs {expected}"
            )
        if self.tokenizer_sha256 and tokenizer_digest(tokenizer) != self.tokenizer_sha256:
            raise ValueError(
                f"{path} is not the tokenizer this model was trained with (its sha256 differs from "
                "the one in the model's config); use the run's own tokenizer.model"
            )

    @property
    def head_size(self):
        return self.d_model // self.num_heads

    @classmethod
    def from_dict(cls, values, where="config"):
        """The config of a config.json's (or a manifest's "config") object: unknown keys refused,
        the recipe's fields of a file written before recipe.json left out."""
        unknown = sorted(set(values) - {f.name for f in dataclasses.fields(cls)} - LEGACY_RECIPE_KEYS)
        if unknown:
            raise ValueError(f"{where}: unknown ModelConfig keys {unknown}")
        try:
            return super().from_dict(values, where)  # a Record reads its own fields only
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None


PRESETS = {
    # Tests: a few thousand parameters, trains in seconds.
    "tiny": ModelConfig(
        d_model=16,
        num_heads=2,
        d_ff=32,
        num_encoder_layers=1,
        num_decoder_layers=1,
        dropout=0.0,
        max_source_length=32,
        max_target_length=32,
    ),
    # CPU demo: trains to a usable translator on 2 cores in ~20 minutes. A budget this short is
    # compute-bound, so the model is sized to it: 2+2 layers and d_ff 512 take more steps a second
    # than 3+3 layers and d_ff 1024 and learn more in the same minutes. Dropout 0.1 since bfloat16
    # steps made 20 minutes ~12 epochs: without it the model overfit (token accuracy 0.86 on
    # train, 0.61 on dev).
    "small": ModelConfig(
        d_model=256,
        num_heads=4,
        d_ff=512,
        num_encoder_layers=2,
        num_decoder_layers=2,
        dropout=0.1,
        max_source_length=64,
        max_target_length=64,
    ),
    # The paper's Table 3.
    "base": ModelConfig(d_model=512, num_heads=8, d_ff=2048, num_encoder_layers=6, num_decoder_layers=6),
    "big": ModelConfig(
        d_model=1024, num_heads=16, d_ff=4096, num_encoder_layers=6, num_decoder_layers=6, dropout=0.3
    ),
}


def preset(name, **changes):
    if name not in PRESETS:
        raise ValueError(f"unknown config preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[name].replace(**changes)

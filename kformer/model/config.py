"""TransformerConfig: the one home of model and training defaults.

Presets: `tiny` (tests), `small` (CPU demo), `base` and `big` (Vaswani et al. 2017, Table 3).
The config is saved as JSON beside the weights and the model is rebuilt from it.
"""

import dataclasses
import hashlib
import json
import os

# Defaults that every entry point (Python API, CLI, export) shares.
DEFAULT_PRESET = "small"
DEFAULT_CORPUS = "default"  # Tatoeba zh-en, packaged
DEFAULT_DIRECTION = "zh-en"
BEAM_SIZE = 4  # the paper's beam width
LENGTH_PENALTY = 0.6  # the paper's α (GNMT length penalty)
# The n-gram repeat guard's size (0 = off). 4: on the demo model's test split, BLEU unchanged
# (+0.05 greedy, +0.08 beam) and no output repeats a token 4-gram (41 and 22 of 1,069 did); 2 and
# 3 also ban short repeats that translations need (README, "The n-gram repeat guard").
NO_REPEAT_NGRAM = 4
EXTRA_OUTPUT_TOKENS = 50  # maximum output length = source length + 50 (the paper's rule)
MAX_INPUT_CHARS = 100_000  # `kformer translate` refuses a longer input line (--max-chars)
# How long `kformer translate` waits for more lines of a pipe after the first (kformer.decode.gather): a
# file's lines then fill the first batch too; a search call takes tens of ms at batch 1.
GATHER_WINDOW_SECONDS = 0.005
# Searches run first with buffers of source length + 8, then only the rows not done by then, in
# buffers of the full length. On Tatoeba zh-en, 90% of training targets are within 6 tokens of their
# source's length, 99% within 12; +8 was faster than +16 in ONNX and TFLite.
FIRST_PASS_EXTRA_TOKENS = 8

# Keeping the best weights (kformer.train.keep_best): a dev sample of this many sources, translated greedily
# (~2-4 s for `small` on 2 cores) every this many minutes of training.
EVAL_SENTENCES = 500
EVAL_MINUTES = 5.0

# Compute precision of training -> Keras dtype policy (weights stay float32); "auto" picks (kformer.train.fit).
PRECISIONS = {"float32": None, "bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}

NORM_POSITIONS = ("post", "pre")
ACTIVATIONS = ("relu", "gelu")
SCHEDULES = ("budget", "noam")


def search_label(beam_size):
    """How results name a search: "greedy" for beam size 1, else "beam" and its size ("beam4")."""
    return "greedy" if beam_size == 1 else f"beam{beam_size}"


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    vocab_size: int = 8000
    d_model: int = 512
    num_heads: int = 8
    d_ff: int = 2048
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    dropout: float = 0.1
    max_source_length: int = 128
    max_target_length: int = 128
    activation: str = "relu"
    norm_position: str = "post"  # "post" is the paper's LayerNorm(x + Sublayer(x))
    tie_embeddings: bool = True  # shared source/target embedding and output projection
    pad_id: int = 0
    unk_id: int = 1
    bos_id: int = 2
    eos_id: int = 3
    # Training settings travel with the model so a resumed run trains the same way.
    label_smoothing: float = 0.1
    # "noam": the paper's d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), right for long runs.
    # "budget": linear warm-up to `learning_rate`, hold it, then decay linearly to 0 over the last
    # `decay_fraction` of the steps the budget (--minutes, --steps or --epochs) allows; warm-up is
    # `warmup_fraction` of those steps, at most `warmup_steps`.
    schedule: str = "noam"
    learning_rate: float = 5e-4  # peak of the budget schedule
    warmup_steps: int = 4000
    warmup_fraction: float = 0.06
    decay_fraction: float = 1.0
    ema_momentum: float = 0.0  # > 0: translate with an exponential moving average of the weights
    batch_tokens: int = 4096  # tokens per optimizer update and side, padding included
    # > 1: each update averages the gradients of this many batches of batch_tokens / accumulate_steps
    # tokens (Keras' gradient_accumulation_steps): the paper's 25,000-token updates in less memory.
    accumulate_steps: int = 1
    # sha256 of the SentencePiece model this model was trained with ("" = not bound to one): a
    # tokenizer from another run with the same vocabulary size would otherwise translate garbage.
    tokenizer_sha256: str = ""

    def __post_init__(self):
        errors = []
        for field in dataclasses.fields(self):
            value, kind = getattr(self, field.name), type(field.default)
            allowed = (int, float) if kind is float else kind  # 1 is a fine learning rate, True is not
            if isinstance(value, bool) != (kind is bool) or not isinstance(value, allowed):
                raise ValueError(
                    f"Invalid TransformerConfig: {field.name} must be of type {kind.__name__}, got {value!r}"
                )
        if self.d_model % self.num_heads:
            errors.append(f"d_model ({self.d_model}) must be divisible by num_heads ({self.num_heads})")
        for name in (
            "vocab_size",
            "d_model",
            "num_heads",
            "d_ff",
            "num_encoder_layers",
            "num_decoder_layers",
            "max_source_length",
            "max_target_length",
            "warmup_steps",
            "batch_tokens",
            "accumulate_steps",
        ):
            if int(getattr(self, name)) < 1:
                errors.append(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.dropout < 1.0:
            errors.append(f"dropout must be in [0, 1), got {self.dropout}")
        if not 0.0 <= self.ema_momentum < 1.0:
            errors.append(f"ema_momentum must be in [0, 1), got {self.ema_momentum}")
        if not (
            0.0 < self.warmup_fraction < 1.0
            and 0.0 < self.decay_fraction <= 1.0
            and 0.0 < self.learning_rate < 1.0
        ):
            errors.append(
                f"warmup_fraction, decay_fraction and learning_rate must be in (0, 1), got "
                f"{self.warmup_fraction}, {self.decay_fraction} and {self.learning_rate}"
            )
        if self.schedule not in SCHEDULES:
            errors.append(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if not 0.0 <= self.label_smoothing < 1.0:
            errors.append(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.activation not in ACTIVATIONS:
            errors.append(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        if self.norm_position not in NORM_POSITIONS:
            errors.append(f"norm_position must be one of {NORM_POSITIONS}, got {self.norm_position!r}")
        special = [self.pad_id, self.unk_id, self.bos_id, self.eos_id]
        if self.pad_id != 0:
            errors.append(f"pad_id must be 0 (the mask convention relies on it), got {self.pad_id}")
        if len(set(special)) != 4 or not all(0 <= i < self.vocab_size for i in special):
            errors.append(f"special ids {special} must be distinct and below vocab_size {self.vocab_size}")
        if errors:
            raise ValueError("Invalid TransformerConfig: " + "; ".join(errors))

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

    def micro_batches(self):
        """The config whose batch_tokens is one accumulated batch's (the whole update's without
        accumulation): what the input pipeline batches by."""
        return self.replace(batch_tokens=max(1, self.batch_tokens // self.accumulate_steps))

    @property
    def head_size(self):
        return self.d_model // self.num_heads

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values, source="config"):
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"{source}: unknown TransformerConfig keys {unknown}")
        try:
            return cls(**values)
        except ValueError as e:
            raise ValueError(f"{source}: {e}") from None

    def save(self, path):
        write_json(path, self.to_dict())

    @classmethod
    def load(cls, path):
        return cls.from_dict(read_json(path), source=path)


def tokenizer_digest(tokenizer):
    """sha256 of a SentencePiece model: what binds a model to its tokenizer."""
    return hashlib.sha256(tokenizer.serialized_model_proto()).hexdigest()


def write_json(path, value):
    """Writes `value` as JSON atomically (temp file, then rename): never a half-written file."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def read_json(path, error=ValueError):
    """The JSON value in `path`; `error` (a ValueError) naming the file if it is not valid JSON."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise error(f"{path}: not valid JSON ({e})") from None


PRESETS = {
    # Tests: a few thousand parameters, trains in seconds.
    "tiny": TransformerConfig(
        d_model=16,
        num_heads=2,
        d_ff=32,
        num_encoder_layers=1,
        num_decoder_layers=1,
        dropout=0.0,
        max_source_length=32,
        max_target_length=32,
        warmup_steps=100,
        batch_tokens=512,
    ),
    # CPU demo: trains to a usable translator on 2 cores in ~20 minutes. A budget this short is
    # compute-bound, so the model is sized to it: 2+2 layers and d_ff 512 take more steps a second
    # than 3+3 layers and d_ff 1024 and learn more in the same minutes. ~90 pairs a batch, a
    # schedule sized to the time budget (kformer.train.schedules.BudgetSchedule), translation with
    # the moving average of the weights.
    # Dropout 0.1 since bfloat16 steps made 20 minutes ~12 epochs: without it the model overfit
    # (token accuracy 0.86 on train, 0.61 on dev).
    "small": TransformerConfig(
        d_model=256,
        num_heads=4,
        d_ff=512,
        num_encoder_layers=2,
        num_decoder_layers=2,
        dropout=0.1,
        max_source_length=64,
        max_target_length=64,
        schedule="budget",
        learning_rate=1e-3,
        decay_fraction=0.3,
        warmup_steps=1000,
        ema_momentum=0.995,
        batch_tokens=1024,
    ),
    # The paper's Table 3.
    "base": TransformerConfig(
        d_model=512,
        num_heads=8,
        d_ff=2048,
        num_encoder_layers=6,
        num_decoder_layers=6,
        dropout=0.1,
        warmup_steps=4000,
        batch_tokens=25000,
    ),
    "big": TransformerConfig(
        d_model=1024,
        num_heads=16,
        d_ff=4096,
        num_encoder_layers=6,
        num_decoder_layers=6,
        dropout=0.3,
        warmup_steps=4000,
        batch_tokens=25000,
    ),
}


def preset(name, **changes):
    if name not in PRESETS:
        raise ValueError(f"unknown config preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[name].replace(**changes)

"""Starting a new run from a trained one (kformer train --init-from RUN): fine-tuning on new data.

The new run keeps RUN's tokenizer, direction and model sizes, starts from the weights RUN
translates with (best.weights.h5 where it kept one, else model.keras: averaged where it averages),
and trains with a fine-tuning recipe (`FINE_TUNE`) over its own budget. RUN is only read. The new
run records where it started in init.json.
"""

import dataclasses
import logging
import os

from kformer import run_folder
from kformer.data import corpus as corpus_lib
from kformer.data import prepare as prepare_lib
from kformer.data import tokenizer as tokenizer_lib
from kformer.model.config import PRESETS, TransformerConfig, read_json, tokenizer_digest, write_json

log = logging.getLogger("kformer")

INIT_FILE = "init.json"  # in the new run: the run it started from, and the weights' file and digest
# The recipe's overrides of RUN's config. A budget schedule over the new run's --minutes/--steps
# (the pretraining schedule ended at a learning rate near 0; restarting the paper's schedule would
# warm up again to a rate meant for random weights): a short warm-up to a lower peak, linear decay.
FINE_TUNE = dict(
    schedule="budget", learning_rate=2e-4, warmup_steps=100, warmup_fraction=0.05, decay_fraction=1.0
)
# The fields that fix the weights' shapes and meaning: a fine-tuned run cannot change them.
MODEL_FIELDS = (
    "vocab_size",
    "d_model",
    "num_heads",
    "d_ff",
    "num_encoder_layers",
    "num_decoder_layers",
    "activation",
    "norm_position",
    "tie_embeddings",
    "pad_id",
    "unk_id",
    "bos_id",
    "eos_id",
    "tokenizer_sha256",
)
SIZE_FIELDS = MODEL_FIELDS[1:6]  # what a preset sets of them (d_model ... num_decoder_layers)
# The share of a fine-tuning run's pairs drawn from RUN's own train split: without it the model
# forgets its general translation as fast as it learns the new domain (`kformer train --help`).
MIX_ORIGINAL = 0.5
UNKNOWN_WARNING = 0.005  # share of <unk> pieces in the new corpus past which a warning is printed


@dataclasses.dataclass(frozen=True)
class Source:
    """A trained run to start from: its folder, config, tokenizer file (and digest), direction
    and weights file."""

    run_dir: str
    config: TransformerConfig
    tokenizer_path: str
    tokenizer_sha256: str
    direction: str
    weights_path: str


def open_source(run_dir):
    """The run at `run_dir`, checked: a one-line error for anything that is not a trained run."""
    if not os.path.isdir(run_dir):
        raise ValueError(f"--init-from {run_dir}: no such folder")
    if os.path.exists(os.path.join(run_dir, "manifest.json")):
        raise ValueError(
            f"--init-from {run_dir} is a `kformer export` folder; give the training directory it was exported from"
        )
    for name in (
        run_folder.CONFIG_FILE,
        run_folder.TOKENIZER_FILE,
        run_folder.MODEL_FILE,
        run_folder.CORPUS_FILE,
    ):
        if not os.path.exists(run_folder.path(run_dir, name)):
            raise ValueError(f"--init-from {run_dir} is not a kformer training directory: {name} not found")
    config = TransformerConfig.load(run_folder.path(run_dir, run_folder.CONFIG_FILE))
    tokenizer_path = run_folder.path(run_dir, run_folder.TOKENIZER_FILE)
    tokenizer = tokenizer_lib.load_tokenizer(tokenizer_path)
    config.check_tokenizer(tokenizer, tokenizer_path)
    direction = run_folder.read_corpus(run_dir)["direction"]
    weights = run_folder.weights_file(run_dir)
    return Source(run_dir, config, tokenizer_path, tokenizer_digest(tokenizer), direction, weights)


def fine_tune_config(source, config_name=None, overrides=None):
    """RUN's config with the fine-tuning recipe and `overrides`; a preset named (`config_name`) or
    an override that would change the model's shapes is refused, naming what differs."""
    overrides = dict(overrides or {})
    changed = {k: v for k, v in overrides.items() if k in MODEL_FIELDS and v != getattr(source.config, k)}
    if config_name is not None:
        named = PRESETS[config_name] if config_name in PRESETS else None
        if named is None:
            raise ValueError(f"unknown config preset {config_name!r}; choose one of {sorted(PRESETS)}")
        changed.update(
            {k: getattr(named, k) for k in SIZE_FIELDS if getattr(named, k) != getattr(source.config, k)}
        )
    if changed:
        differences = ", ".join(f"{k} {getattr(source.config, k)} -> {v}" for k, v in sorted(changed.items()))
        raise ValueError(
            f"--init-from {source.run_dir}: the requested config changes the model ({differences}); "
            "a fine-tuned run keeps its model's sizes (leave out --config)"
        )
    return source.config.replace(**{**FINE_TUNE, **overrides})


def original_corpus(source, share=None):
    """(RUN's prepared corpus, the share of the new run's pairs to draw from it; its dev split is
    scored beside the new one's at any share); (None, 0.0), with a warning, where RUN's corpus is
    no longer there."""
    share = MIX_ORIGINAL if share is None else share
    if isinstance(share, bool) or not isinstance(share, int | float) or not 0 <= share < 1:
        raise ValueError(f"--mix-original must be a share in [0, 1), got {share!r}")
    folder = run_folder.prepared_folder(source.run_dir)
    if not prepare_lib.is_prepared(folder):
        log.warning(
            "--init-from %s: its prepared corpus (%s) is gone, so no original pairs are mixed in "
            "(--mix-original %g) and its dev split is not scored: the run trains on the new corpus "
            "alone and forgets more",
            source.run_dir,
            folder,
            share,
        )
        return None, 0.0
    return folder, float(share)


def check_direction(source, direction):
    if direction is not None and direction != source.direction:
        raise ValueError(
            f"--init-from {source.run_dir} translates {source.direction}; --direction {direction} "
            "would train it the other way (a new run trains another direction from scratch)"
        )


def report_coverage(manifest, source):
    """Logs the share of the new corpus's train pieces that RUN's tokenizer does not know."""
    unknown = manifest.get("unknown_pieces") or {"unk": 0, "pieces": 0}
    share = unknown["unk"] / max(1, unknown["pieces"])
    message = "coverage: %.2f%% of the new corpus's %s pieces are <unk> under %s's tokenizer"
    args = (100 * share, f"{unknown['pieces']:,}", source.run_dir)
    if share > UNKNOWN_WARNING:
        log.warning(
            message + ": the model cannot read or write those characters; a new run with its own "
            "tokenizer (without --init-from) may serve this corpus better",
            *args,
        )
    else:
        log.info(message, *args)
    return share


def record(run_dir, source, share):
    """Writes the new run's init.json (once): where it started, and the share of RUN's pairs it mixes in."""
    if os.path.exists(os.path.join(run_dir, INIT_FILE)):
        return
    os.makedirs(run_dir, exist_ok=True)
    write_json(
        os.path.join(run_dir, INIT_FILE),
        {
            "run": os.path.abspath(source.run_dir),
            "weights": run_folder.describe_weights(source.run_dir, source.weights_path),
            "sha256": corpus_lib.files_sha256([source.weights_path]),
            "mix_original": share,
        },
    )


def check_share(run_dir, share):
    """A resumed run mixes in the share of RUN's pairs it started with (its batch stream's saved
    position belongs to that mix); runs recorded before the share was, are not checked."""
    recorded = os.path.join(run_dir, INIT_FILE)
    started = read_json(recorded).get("mix_original") if os.path.exists(recorded) else None
    if started is not None and started != share:
        raise ValueError(
            f"{run_dir} started mixing in {started:g} of RUN's pairs, not {share:g}: resume it with "
            f"--mix-original {started:g} (with RUN's prepared corpus in place), or use a new --out directory"
        )


def check_recorded(run_dir, source):
    """A resumed run is given the --init-from it started with (none for one that started from scratch)."""
    recorded = os.path.join(run_dir, INIT_FILE)
    started = read_json(recorded)["run"] if os.path.exists(recorded) else None
    given = None if source is None else os.path.abspath(source.run_dir)
    if started != given:
        raise ValueError(
            f"{run_dir} started from {started or 'random weights'}, not from "
            f"{'--init-from ' + source.run_dir if source else 'random weights'}; resume it with "
            f"{'--init-from ' + started if started else 'no --init-from'}, or use a new --out directory"
        )


def trained_weights(source):
    """{variable path: value} of the weights RUN translates with, read before the new run writes
    anything (a corrupted file is then an error that leaves no new folder)."""
    import keras

    trained = run_folder.load(source.run_dir).model
    return {v.path: keras.ops.convert_to_numpy(v.value) for v in trained.weights}


def assign(model, weights, source):
    """Sets the new run's model (any precision, in its strategy's scope) to `trained_weights`."""
    run_folder.assign_weights(model, weights)
    log.info("started from %s", run_folder.describe_weights(source.run_dir, source.weights_path))

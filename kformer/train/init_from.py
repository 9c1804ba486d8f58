"""Starting a new run from a trained one (kformer train --init-from RUN): fine-tuning on new data.
RUN may be an imported one (kformer import), its tokenizer one SentencePiece model or a family's
source and target models over a vocabulary: it has no corpus to mix in and no recipe (its preset's,
or the defaults); --pull-to-start holds it instead.

The new run keeps RUN's tokenizer, direction and model sizes, starts from the weights RUN
translates with (best.weights.h5 where it kept one, else model.keras: averaged where it averages),
and trains with a fine-tuning recipe (`FINE_TUNE`) over its own budget. RUN is only read. The new
run records where it started in init.json.
"""

import dataclasses
import logging
import os

from kformer import run_folder
from kformer.contracts.digests import tokenizer_digest
from kformer.contracts.pair import LanguagePair
from kformer.contracts.prepared import is_prepared
from kformer.contracts.run import (
    CONFIG_FILE,
    CORPUS_FILE,
    IMPORT_FILE,
    INIT_FILE,
    MODEL_FILE,
    ImportRecord,
    InitRecord,
)
from kformer.data import corpus as corpus_lib
from kformer.data import vocabulary
from kformer.model.config import PRESETS, ModelConfig
from kformer.train.recipe import FINE_TUNE, RECIPES, TrainingRecipe

log = logging.getLogger("kformer")

# The share of a fine-tuning run's pairs drawn from RUN's own train split: without it the model
# forgets its general translation as fast as it learns the new domain (`kformer train --help`).
# Three quarters: in the measurements of docs/benchmarks.md it kept RUN's test within a BLEU of
# where it was in every run, where half did not in one, and still gained the most on the domain.
MIX_ORIGINAL = 0.75
UNKNOWN_WARNING = 0.005  # share of <unk> pieces in the new corpus past which a warning is printed
SIZE_FIELDS = ("d_model", "num_heads", "d_ff", "num_encoder_layers", "num_decoder_layers")  # a preset's sizes


@dataclasses.dataclass(frozen=True)
class Source:
    """A trained or imported run to start from: its folder, config, recipe, tokenizer file (and
    digest), language pair and weights file."""

    run_dir: str
    config: ModelConfig
    recipe: TrainingRecipe
    tokenizer_path: str
    tokenizer_sha256: str
    direction: LanguagePair
    weights_path: str
    imported: bool = False  # by `kformer import`: no corpus, no recipe of its own


def open_source(run_dir):
    """The run at `run_dir`, checked: a one-line error for anything that is not a trained run."""
    if not os.path.isdir(run_dir):
        raise ValueError(f"--init-from {run_dir}: no such folder")
    if os.path.exists(os.path.join(run_dir, "manifest.json")):
        raise ValueError(
            f"--init-from {run_dir} is a `kformer export` folder; give the training directory it was exported from"
        )
    imported = os.path.exists(os.path.join(run_dir, IMPORT_FILE))
    tokenizer_name = vocabulary.tokenizer_file(run_dir)
    for name in (CONFIG_FILE, tokenizer_name, MODEL_FILE, *([] if imported else [CORPUS_FILE])):
        if not os.path.exists(os.path.join(run_dir, name)):
            raise ValueError(f"--init-from {run_dir} is not a kformer training directory: {name} not found")
    tokenizer_path = os.path.join(run_dir, tokenizer_name)
    config = ModelConfig.load(os.path.join(run_dir, CONFIG_FILE))
    tokenizer = vocabulary.open_tokenizer(run_dir)
    config.check_tokenizer(tokenizer, tokenizer_path)
    if imported:
        direction = ImportRecord.load(os.path.join(run_dir, IMPORT_FILE)).direction
        recipe = imported_recipe(config)
    else:
        direction, recipe = run_folder.read_corpus(run_dir).direction, TrainingRecipe.of_run(run_dir)
    weights = run_folder.weights_file(run_dir)
    return Source(
        run_dir, config, recipe, tokenizer_path, tokenizer_digest(tokenizer), direction, weights, imported
    )


def imported_recipe(config):
    """An imported model has a network but no recipe: that of the preset of its sizes, else the
    defaults (fine-tuning replaces the schedule and rate either way: FINE_TUNE)."""
    for name, preset in PRESETS.items():
        if all(getattr(preset, k) == getattr(config, k) for k in SIZE_FIELDS) and name in RECIPES:
            return RECIPES[name]
    return TrainingRecipe()


def fine_tune(source, config_name=None, changes=None):
    """(RUN's config, its recipe with the fine-tuning recipe and `changes`); a preset named
    (`config_name`) whose sizes differ from RUN's is refused, naming what differs."""
    if config_name is not None:
        if config_name not in PRESETS:
            raise ValueError(f"unknown config preset {config_name!r}; choose one of {sorted(PRESETS)}")
        named = PRESETS[config_name]
        changed = {
            k: getattr(named, k) for k in SIZE_FIELDS if getattr(named, k) != getattr(source.config, k)
        }
        if changed:
            differences = ", ".join(
                f"{k} {getattr(source.config, k)} -> {v}" for k, v in sorted(changed.items())
            )
            raise ValueError(
                f"--init-from {source.run_dir}: the requested config changes the model ({differences}); "
                "a fine-tuned run keeps its model's sizes (leave out --config)"
            )
    return source.config, source.recipe.replace(**{**FINE_TUNE, **(changes or {})})


def original_corpus(source, share=None):
    """(RUN's prepared corpus, the share of the new run's pairs to draw from it; its dev split is
    scored beside the new one's at any share); (None, 0.0), with a warning, where RUN's corpus is
    no longer there."""
    if source.imported:
        if share:
            raise ValueError(
                f"--mix-original {share:g}: --init-from {source.run_dir} was imported and has no corpus "
                "of its own to mix in (--pull-to-start is the lever against forgetting without one)"
            )
        log.info("--init-from %s was imported: no corpus of its own to mix in", source.run_dir)
        return None, 0.0
    share = MIX_ORIGINAL if share is None else share
    if isinstance(share, bool) or not isinstance(share, int | float) or not 0 <= share < 1:
        raise ValueError(f"--mix-original must be a share in [0, 1), got {share!r}")
    folder = run_folder.prepared_folder(source.run_dir)
    if not is_prepared(folder):
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
    if direction is not None and corpus_lib.parse_pair(direction) != source.direction:
        raise ValueError(
            f"--init-from {source.run_dir} translates {source.direction}; --direction {direction} "
            "would train it the other way (a new run trains another direction from scratch)"
        )


def report_coverage(manifest, source):
    """Logs the share of the new corpus's train pieces that RUN's tokenizer does not know."""
    unknown = manifest.unknown_pieces
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
    InitRecord(
        os.path.abspath(source.run_dir),
        run_folder.describe_weights(source.run_dir, source.weights_path),
        corpus_lib.files_sha256([source.weights_path]),
        share,
    ).save(os.path.join(run_dir, INIT_FILE))


def _recorded(run_dir):
    """The run's InitRecord, or None for a run that did not start from another."""
    path = os.path.join(run_dir, INIT_FILE)
    return InitRecord.load(path) if os.path.exists(path) else None


def check_share(run_dir, share):
    """A resumed run mixes in the share of RUN's pairs it started with (its batch stream's saved
    position belongs to that mix); runs recorded before the share was, are not checked."""
    started = getattr(_recorded(run_dir), "mix_original", None)
    if started is not None and started != share:
        raise ValueError(
            f"{run_dir} started mixing in {started:g} of RUN's pairs, not {share:g}: resume it with "
            f"--mix-original {started:g} (with RUN's prepared corpus in place), or use a new --out directory"
        )


def check_recorded(run_dir, source):
    """A resumed run is given the --init-from it started with (none for one that started from scratch)."""
    started = getattr(_recorded(run_dir), "run", None)
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

"""`kformer import`: pretrained translators into kformer run folders, each family a module that
reads like a converter (load the source's files, validate what kformer can represent, map each
block's weights, save the run atomically): marian.py, Hugging Face Marian folders (OPUS-MT).

A run folder made here has the model's config.json, its weights in model.keras, its tokenizer
(tokenizer.json over the family's own SentencePiece models and vocabulary), import.json (where it
came from, its weights' sha256, its language pair) and the source's licence where it has one.
Every command then takes it as a trained run's folder."""

import os

from kformer import folders

WORK_PREFIX = ".kformer-import-"  # the temporary sibling a run is imported into (kformer.folders)


def kind_of(source):
    """The family of the model at `source` (a folder): "marian", or a one-line ValueError."""
    from kformer.contracts.json_records import read_json

    config = os.path.join(source, "config.json")
    if not os.path.isdir(source):
        raise ValueError(f"{source}: no such folder (import takes a local folder; nothing is downloaded)")
    if not os.path.exists(config):
        raise ValueError(f"{source}: no config.json; kformer imports Hugging Face Marian folders (OPUS-MT)")
    model_type = read_json(config).get("model_type")
    if model_type != "marian":
        raise ValueError(f"{config}: model_type {model_type!r} is not one kformer imports (marian)")
    return "marian"


def import_model(source, out_dir, direction=None, progress=print):
    """Imports the pretrained model at `source` into the new run folder `out_dir`; `direction`:
    the language pair ("en-de"), where the source does not record it. Returns the ImportRecord.
    A failed import leaves no folder behind."""
    from kformer.importers import marian

    if os.path.exists(out_dir) and (not os.path.isdir(out_dir) or os.listdir(out_dir)):
        raise ValueError(f"--out {out_dir} exists and is not an empty folder; choose a new --out")
    kind = kind_of(source)
    progress(f"reading the {kind} model at {source} ...")
    model = marian.load(source, direction)
    with folders.work_folder(out_dir, WORK_PREFIX) as work:
        record = marian.save(model, work)
    progress(f"wrote {out_dir}: {model.describe()}")
    return record

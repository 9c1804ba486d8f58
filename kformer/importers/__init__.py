"""`kformer import`: pretrained translators into kformer run folders, each family a module that
reads like a converter (load the source's files, validate what kformer can represent, map each
block's weights, save the run atomically): marian.py, Hugging Face Marian folders (OPUS-MT);
ctranslate2.py, CTranslate2 TransformerSpec folders (OpenNMT-py models); argos.py, Argos
packages (a CTranslate2 model, its SentencePiece model and its language pair). run.py holds what
every imported run folder has.

A run folder made here has the model's config.json, its weights in model.keras, its tokenizer
(the family's SentencePiece model as tokenizer.model where the model's ids are its own, else
tokenizer.json over the family's SentencePiece models and vocabulary), import.json (where it came
from, its sha256, its language pair) and the source's licence where it has one. Every command
then takes it as a trained run's folder."""

import contextlib
import os

from kformer import folders

WORK_PREFIX = ".kformer-import-"  # the temporary sibling a run is imported into (kformer.folders)
KINDS = "a Hugging Face Marian folder (OPUS-MT), a CTranslate2 model folder or an Argos package"


def kind_of(source):
    """The family of the model at `source`: "marian", "ctranslate2" or "argos", or a one-line
    ValueError."""
    from kformer.contracts.json_records import read_json
    from kformer.importers import argos, ctranslate2

    if not os.path.exists(source):
        raise ValueError(
            f"{source}: no such file or folder (import takes a local path; nothing is downloaded)"
        )
    if argos.is_package(source):
        return "argos"
    if ctranslate2.is_model_folder(source):
        return "ctranslate2"
    config = os.path.join(source, "config.json")
    if not os.path.exists(config):
        raise ValueError(f"{source}: no config.json or model.bin; kformer imports {KINDS}")
    model_type = read_json(config).get("model_type")
    if model_type != "marian":
        raise ValueError(f"{config}: model_type {model_type!r} is not one kformer imports (marian)")
    return "marian"


def opened(kind, source, direction=None):
    """A context holding the model at `source` read and checked (an Argos package is unzipped
    while it lasts)."""
    from kformer.contracts.pair import LanguagePair
    from kformer.importers import argos, ctranslate2, marian

    if kind == "argos":
        return argos.opened(source, direction)
    if kind == "marian":
        return contextlib.nullcontext(marian.load(source, direction))
    if not direction:
        raise ValueError(
            f"{source}: a CTranslate2 folder records no language pair; give --direction SOURCE-TARGET"
        )
    return contextlib.nullcontext(ctranslate2.load(source, LanguagePair.parse(direction)))


def import_model(source, out_dir, direction=None, progress=print):
    """Imports the pretrained model at `source` into the new run folder `out_dir`; `direction`:
    the language pair ("en-de"), where the source does not record it. Returns the ImportRecord.
    A failed import leaves no folder behind."""
    from kformer.importers import ctranslate2, marian

    if os.path.exists(out_dir) and (not os.path.isdir(out_dir) or os.listdir(out_dir)):
        raise ValueError(f"--out {out_dir} exists and is not an empty folder; choose a new --out")
    kind = kind_of(source)
    progress(f"reading the {kind} model at {source} ...")
    with opened(kind, source, direction) as model:
        with folders.work_folder(out_dir, WORK_PREFIX) as work:
            record = (marian if kind == "marian" else ctranslate2).save(model, work)
        progress(f"wrote {out_dir}: {model.describe()}")
    return record

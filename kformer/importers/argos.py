"""Argos Translate packages (`.argosmodel`, what LibreTranslate installs; or such a package
unzipped): a zip of one folder holding metadata.json (the language pair), model/ (a CTranslate2
TransformerSpec, read by kformer.importers.ctranslate2), sentencepiece.model and a README.

The archive is read into a temporary folder, each entry checked to stay inside it."""

import contextlib
import os
import tempfile
import zipfile

from kformer.contracts.digests import files_sha256
from kformer.contracts.json_records import read_json
from kformer.contracts.pair import LanguagePair
from kformer.importers import ctranslate2


def is_package(path):
    """Whether `path` is an Argos package: a zip file, or a folder with metadata.json and model/."""
    if os.path.isfile(path):
        return zipfile.is_zipfile(path)
    return os.path.isfile(os.path.join(path, "metadata.json")) and os.path.isdir(os.path.join(path, "model"))


@contextlib.contextmanager
def opened(path, direction=None):
    """The package at `path` as a kformer.importers.ctranslate2 model, while the context lasts."""
    if os.path.isdir(path):
        yield _load(path, path, direction)
        return
    with tempfile.TemporaryDirectory(prefix="kformer-argos-") as staging:
        yield _load(_extract(path, staging), path, direction)


def _extract(path, staging):
    """Extracts the package into `staging`; returns its one top folder."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            tops = {name.split("/")[0] for name in names}
            unsafe = [n for n in names if os.path.isabs(n) or ".." in n.split("/")]
            if unsafe or len(tops) != 1:
                raise ValueError(
                    f"{path}: not an Argos package (one top folder, entries inside it): "
                    f"{unsafe[:1] or sorted(tops)[:3]}"
                )
            archive.extractall(staging)
    except zipfile.BadZipFile as e:
        raise ValueError(f"{path}: not a readable .argosmodel ({e})") from None
    return os.path.join(staging, tops.pop())


def _load(root, path, direction):
    metadata_path = os.path.join(root, "metadata.json")
    if not os.path.isfile(metadata_path):
        raise ValueError(f"{path}: no metadata.json: not an Argos package")
    metadata = read_json(metadata_path)
    if metadata.get("type", "translate") != "translate":
        raise ValueError(f"{metadata_path}: type {metadata['type']!r}; kformer imports translate packages")
    try:
        pair = LanguagePair.parse(direction or f"{metadata.get('from_code')}-{metadata.get('to_code')}")
    except ValueError as e:
        raise ValueError(f"{metadata_path}: {e}; give --direction SOURCE-TARGET") from None
    model_dir = os.path.join(root, "model")
    if not ctranslate2.is_model_folder(model_dir):
        raise ValueError(f"{path}: no model/model.bin: not a CTranslate2 Argos package")
    digest = files_sha256([path]) if os.path.isfile(path) else None
    return ctranslate2.load(model_dir, pair, kind="argos", source=path, sha256=digest)

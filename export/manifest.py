"""manifest.json of an export folder: what it holds, written once, read and verified by every runner.

Needs no TensorFlow: a device runner reads it with the standard library, numpy and sentencepiece."""

import hashlib
import json
import os
from importlib import metadata

from kformer.model.config import TransformerConfig, read_json

MANIFEST = "manifest.json"
VERSION = 3  # 2: the searches take alpha, max_length and no_repeat_ngram as inputs; 3: beam, nbest
TOKENIZER = "tokenizer.model"
PACKAGES = (  # versions recorded in the manifest: what wrote and checked the files
    "tensorflow",
    "keras",
    "tensorflow-text",
    "tf2onnx",
    "onnx",
    "onnxruntime",
    "ai-edge-litert",
    "sentencepiece",
    "ctranslate2",
)


class ArtifactError(ValueError):
    """A missing, corrupted or mismatched exported artifact; the message names the file."""


def sha256(path):
    """Hash of a file, or of a folder's files (names and contents, in sorted order)."""
    digest = hashlib.sha256()
    files = (
        [path]
        if os.path.isfile(path)
        else sorted(os.path.join(d, f) for d, _, names in os.walk(path) for f in names)
    )
    for file in files:
        digest.update(os.path.relpath(file, path).encode() if file != path else b"")
        with open(file, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def file_size(path):
    """Bytes of a file, or of all the files of a folder (a SavedModel, a CTranslate2 model)."""
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)
    return os.path.getsize(path)


def describe(config, options, onnx_opset, corpus, trained_in):
    """A new manifest (without artifacts yet): the model, the beam size fixed at export and the
    defaults of the run-time options (checked `kformer.decode.options.SearchOptions`), the tokenizer,
    the inputs and outputs of every format, the versions that wrote it."""
    return {
        "kformer_export": VERSION,
        "config": config.to_dict(),
        "beam_size": options.beam_size,
        "alpha": options.alpha,
        "max_length": options.max_length,
        "no_repeat_ngram": options.no_repeat_ngram,
        "tokenizer": {"file": TOKENIZER, "sha256": None, "vocab_size": config.vocab_size},
        "inputs": {
            "source_ids": {"dtype": "int32", "shape": ["batch", "length"], "pad_id": config.pad_id},
            "alpha": {"dtype": "float32", "shape": [], "default": options.alpha, "searches": ["beam"]},
            "max_length": {
                "dtype": "int32",
                "shape": [],
                "default": options.max_length,
                "clipped_to": [1, config.max_target_length],
            },
            "no_repeat_ngram": {
                "dtype": "int32",
                "shape": [],
                "default": options.no_repeat_ngram,
                "off": "<= 0",
            },
            "nbest": {
                "dtype": "int32",
                "shape": [],
                "default": 1,
                "searches": ["beam"],
                "waits_for": "this many finished hypotheses (at most beam) before a row stops",
            },
        },
        "outputs": {
            "greedy": {"tokens": ["int32", ["batch", "T"]], "scores": ["float32", ["batch"]]},
            "beam": {"tokens": ["int32", ["batch", "beam", "T"]], "scores": ["float32", ["batch", "beam"]]},
        },
        "savedmodel_signatures": {
            "greedy_ids": "source_ids, max_length, no_repeat_ngram -> tokens, scores",
            "beam_ids": "source_ids, alpha, max_length, no_repeat_ngram, nbest -> tokens, scores",
            "greedy_text": "text, max_length, no_repeat_ngram -> translation",
            "beam_text": "text, alpha, max_length, no_repeat_ngram, nbest -> translation",
        },
        "tflite_signatures": {
            "greedy": "source_ids, max_length, no_repeat_ngram -> tokens, scores",
            "beam": "source_ids, alpha, max_length, no_repeat_ngram, nbest -> tokens, scores",
        },
        "onnx_io": {  # a file per search in each variant's folder
            "greedy": "source_ids, max_length, no_repeat_ngram -> tokens, scores",
            "beam": "source_ids, alpha, max_length, no_repeat_ngram, nbest -> tokens, scores",
            "text": "text instead of source_ids -> translation (one sentence per row)",
        },
        "onnx_opset": onnx_opset,
        "artifacts": [],
        "versions": _versions(),
        "trained_in": os.path.abspath(trained_in),
        "corpus": corpus,
    }


def _versions():
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return versions


def write(folder, manifest):
    with open(os.path.join(folder, MANIFEST), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2)


def load(artifact_dir):
    path = os.path.join(artifact_dir, MANIFEST)
    if not os.path.exists(path):
        raise ArtifactError(f"{path} not found: is {artifact_dir} a `kformer export` folder?")
    manifest = read_json(path, ArtifactError)
    if manifest.get("kformer_export") != VERSION:
        raise ArtifactError(
            f"{path}: written by another kformer (export format {manifest.get('kformer_export')}, "
            f"this kformer reads {VERSION}); export the model again"
        )
    return manifest


def _direction(manifest):
    return (manifest.get("corpus") or {}).get("direction") or ""


LANGUAGE_NAMES = {
    "ar": "Arabic", "de": "German", "en": "English", "es": "Spanish", "fr": "French", "hi": "Hindi",
    "it": "Italian", "ja": "Japanese", "ko": "Korean", "nl": "Dutch", "pl": "Polish", "pt": "Portuguese",
    "ru": "Russian", "tr": "Turkish", "uk": "Ukrainian", "vi": "Vietnamese", "zh": "Chinese",
}  # fmt: skip


def language_name(code):
    """The English name of a language code ("zh" -> "Chinese"), or the code where none is known."""
    return LANGUAGE_NAMES.get(code, code)


def source_language(manifest):
    """The language the export translates from ("zh" of "zh-en"), or None if not recorded."""
    return _direction(manifest).split("-")[0] or None


def target_language(manifest):
    """The language the export translates into ("en" of "zh-en"), or None if not recorded."""
    return _direction(manifest).split("-")[-1] or None


def verified_path(artifact_dir, manifest, entry):
    """Absolute path of a manifest entry, after checking that it exists and is intact."""
    path = os.path.join(artifact_dir, entry["file"])
    if not os.path.exists(path):
        raise ArtifactError(f"{path} is missing (listed in {MANIFEST})")
    if sha256(path) != entry["sha256"]:
        raise ArtifactError(f"{path} is corrupted or truncated: its sha256 differs from {MANIFEST}")
    return path


def find_artifact(manifest, fmt, variant="fp32"):
    """The manifest entry of that format and variant: its file or folder serves both searches (a
    folder of a file per search lists each in its "files")."""
    for entry in manifest["artifacts"]:
        if (entry["format"], entry["variant"]) == (fmt, variant):
            return entry
    have = sorted(f"{e['format']}/{e['variant']}" for e in manifest["artifacts"])
    raise ArtifactError(
        f"no {fmt} {variant} artifact for both searches in this export (it has {have}); "
        "re-run `kformer export` with that format or quantization"
    )


def load_tokenizer(artifact_dir, manifest):
    import sentencepiece as spm

    path = verified_path(artifact_dir, manifest, manifest["tokenizer"])
    tokenizer = spm.SentencePieceProcessor(model_file=path)
    try:
        TransformerConfig.from_dict(manifest["config"], source=MANIFEST).check_tokenizer(tokenizer, path)
    except ValueError as e:
        raise ArtifactError(str(e)) from None
    return tokenizer

"""What every runner shares, without TensorFlow: the manifest, its checks, and text in/out.

A runner needs only this file, kformer/batching.py, numpy, sentencepiece and its runtime."""

import hashlib
import json
import os

import numpy as np

from kformer import batching
from kformer.config import BEAM_SIZE, LENGTH_PENALTY, TransformerConfig

MANIFEST = "manifest.json"


class ArtifactError(ValueError):
    """A missing, corrupted or mismatched exported artifact; the message names the file."""


class ExportError(RuntimeError):
    """A conversion that produced something unusable; the message says what and where."""


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


def load_manifest(artifact_dir):
    path = os.path.join(artifact_dir, MANIFEST)
    if not os.path.exists(path):
        raise ArtifactError(f"{path} not found: is {artifact_dir} a `kformer export` folder?")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ArtifactError(f"{path}: not valid JSON ({e})") from None


def verified_path(artifact_dir, manifest, entry):
    """Absolute path of a manifest entry, after checking that it exists and is intact."""
    path = os.path.join(artifact_dir, entry["file"])
    if not os.path.exists(path):
        raise ArtifactError(f"{path} is missing (listed in {MANIFEST})")
    if sha256(path) != entry["sha256"]:
        raise ArtifactError(f"{path} is corrupted or truncated: its sha256 differs from {MANIFEST}")
    return path


def find_artifact(manifest, fmt, search, variant="fp32"):
    """The manifest entry of that format, search and variant; a file of search "all" serves both."""
    for entry in manifest["artifacts"]:
        if (entry["format"], entry["variant"]) == (fmt, variant) and entry["search"] in (search, "all"):
            return entry
    have = sorted({f"{e['format']}/{e['search']}/{e['variant']}" for e in manifest["artifacts"]})
    serving = "both searches" if search == "all" else f"the {search} search"
    raise ArtifactError(
        f"no {fmt} {variant} artifact for {serving} in this export (it has {have}); "
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


FORMATS = ("savedmodel", "tflite", "onnx", "ctranslate2")
DEFAULT_FORMATS = ("savedmodel", "tflite", "onnx")  # ctranslate2 is an optional extra
RUNTIMES = ("keras", *FORMATS)
VARIANTS = {
    "savedmodel": ("fp32",),
    "tflite": ("fp32", "fp16", "int8", "fixed"),
    "onnx": ("fp32", "int8", "text"),
    "ctranslate2": ("fp32", "int8"),
}


def open_runner(
    path,
    runtime="keras",
    variant="fp32",
    beam_size=None,
    batch_size=32,
    threads=None,
    alpha=None,
    max_length=None,
):
    """The one way to get a translator: `path` is a training directory for runtime "keras" (the
    reference; alpha and max_length apply) or a `kformer export` folder for the others (where they
    were fixed at export). Imports only the chosen runtime."""
    if runtime not in RUNTIMES:
        raise ValueError(f"unknown runtime {runtime!r}; choose one of {RUNTIMES}")
    if runtime == "keras":
        if variant != "fp32":
            raise ValueError(f"--variant {variant} needs an exported runtime; the keras runtime is fp32")
        from export.run_tf import KerasRunner

        return KerasRunner(
            path,
            BEAM_SIZE if beam_size is None else beam_size,
            LENGTH_PENALTY if alpha is None else alpha,
            max_length,
            batch_size,
        )
    if variant not in VARIANTS[runtime]:
        raise ValueError(
            f"--variant {variant} does not exist for {runtime}; choose one of {VARIANTS[runtime]}"
        )
    if alpha is not None or max_length is not None:
        raise ValueError("--alpha and --max-len are fixed when exporting; they apply to --runtime keras only")
    if runtime == "savedmodel":
        from export.run_tf import SavedModelRunner

        return SavedModelRunner(path, beam_size, batch_size)
    if runtime == "tflite":
        from export.run_tflite import TfliteRunner

        return TfliteRunner(path, beam_size, variant, threads, batch_size)
    if runtime == "ctranslate2":
        from export.run_ctranslate2 import Ctranslate2Runner

        return Ctranslate2Runner(path, beam_size, variant, threads, batch_size)
    if variant == "text":
        from export.run_onnx import OnnxTextRunner

        return OnnxTextRunner(path, beam_size, threads, batch_size)
    from export.run_onnx import OnnxRunner

    return OnnxRunner(path, beam_size, variant, threads, batch_size)


class Runner:
    """One interface for every runtime:
    `translate(list[str]) -> list[str]` and `translate_ids(list[list[int]]) -> (ids, scores)`.

    Subclasses implement `_search(search, batch) -> (tokens, scores)` for an int32 (B, S) batch.
    """

    def __init__(self, artifact_dir, beam_size=None, batch_size=32):
        self.artifact_dir = artifact_dir
        self.manifest = load_manifest(artifact_dir)
        self.config = self.manifest["config"]
        self.tokenizer = load_tokenizer(artifact_dir, self.manifest)
        exported = self.manifest["beam_size"]
        self.beam_size = exported if beam_size is None else beam_size
        if self.beam_size not in (1, exported):
            raise ArtifactError(
                f"this export has greedy search and beam size {exported}, not {self.beam_size}; "
                f"re-export with --beam {self.beam_size}"
            )
        self.search_name = "beam" if self.beam_size > 1 else "greedy"
        self.batch_size = batch_size

    def search(self, batch):
        """(B, S) int32 source ids (pad 0) -> (tokens, scores) of the chosen search."""
        batch = np.asarray(batch)
        if batch.dtype != np.int32 or batch.ndim != 2:
            raise TypeError(
                f"source_ids must be an int32 array of shape (batch, length), "
                f"got {batch.dtype} with shape {batch.shape}"
            )
        return self._search(self.search_name, batch)

    def translate_ids(self, ids):
        return batching.translate_ids(
            self.search, ids, self.batch_size, self.config["eos_id"], self.config["pad_id"]
        )

    def translate(self, texts):
        return batching.translate_texts(
            self.tokenizer, texts, self.config["max_source_length"], self.translate_ids
        )

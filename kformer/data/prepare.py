"""`kformer prepare`: a corpus of any size, read once as a stream, into a folder that training
reads as a stream, in memory that does not grow with the corpus but for 8 bytes a pair.

A prepared folder holds:
    prepared.json     the manifest: counts, digests, the length histogram, what was dropped and
                      why; written last, so a folder without it is not a finished one
    tokenizer.model   SentencePiece, trained on a bounded random sample of the train split (or
                      one given: a trained model's, to fine-tune it on this corpus)
    dev.tsv, test.tsv the held-out splits as text (source TAB target)
    train-NNNNN-of-NNNNN.tfrecord   the train split as token ids, shuffled, in shards

The steps: (1) read the corpus line by line (TSV or two aligned files, plain or gzip), clean
it, drop duplicate pairs by an 8-byte digest of each, and split it by source sentence as
`kformer.data.corpus.split_pairs` does (a sentence's split is a function of its hash), the held-out
splits bounded in size: a split keeps the sources of smallest hash up to `split_size` pairs and
gives the rest to train, so the same sentence never lands in two splits whatever the corpus
order; or take dev/test from files, whose sources are then kept out of train. The train pairs go
to a temporary file. (2) Train the tokenizer on a reservoir sample of them. (3) Tokenize them
(SentencePiece's threads), each pair to a random shard; then shuffle each shard in memory and
write it as TFRecord: one record per pair, the bytes of an unsigned 16-bit (32 if the vocabulary
needs it) array [source length, source ids..., target ids...]. Progress shows pairs/s and an ETA.
"""

import dataclasses
import hashlib
import heapq
import logging
import math
import os
import random
import shutil
import time

import numpy as np

from kformer import folders, locks
from kformer.data import corpus as corpus_lib
from kformer.data import shards as shards_lib
from kformer.data import tokenizer as tokenizer_lib
from kformer.model.config import DEFAULT_DIRECTION, TransformerConfig, read_json, tokenizer_digest, write_json

log = logging.getLogger("kformer")
MANIFEST = "prepared.json"
TOKENIZER = "tokenizer.model"
HELD_OUT = {"dev": "dev.tsv", "test": "test.tsv"}
FRACTIONS = {  # of source positions (kformer.data.corpus.source_position), as data.split_pairs splits
    "test": (0.0, corpus_lib.TEST_FRACTION),
    "dev": (corpus_lib.TEST_FRACTION, corpus_lib.TEST_FRACTION + corpus_lib.DEV_FRACTION),
}
SPLIT_SIZE = 3000  # pairs at most in each held-out split
SHARD_PAIRS = 100_000  # train pairs a shard holds (the default number of shards follows)
TOKENIZER_SAMPLE = 300_000  # train pairs the tokenizer trains on, at most (its training peaks memory)
LENGTH_CAP = 512  # the histogram counts longer pairs at this length
CHUNK = 50_000  # pairs handled at once: deduplicated, tokenized


class PreparedError(ValueError):
    """A folder that is not a finished prepared corpus, or one that does not fit; names the file."""


@dataclasses.dataclass(frozen=True)
class PrepareOptions:
    """How `prepare` splits and encodes a corpus.

    dev/test: TSV files to use as those splits instead of taking them from the corpus;
    split_size: pairs at most in each split taken from the corpus; shards: train shard files
    (default: one per SHARD_PAIRS); sample: train pairs the tokenizer trains on, at most;
    tokenizer: a SentencePiece model file to encode with instead of training one."""

    direction: str = DEFAULT_DIRECTION
    vocab_size: int = TransformerConfig.vocab_size
    dev: str = None
    test: str = None
    split_size: int = SPLIT_SIZE
    shards: int = None
    sample: int = TOKENIZER_SAMPLE
    seed: int = 0
    tokenizer: str = None


def prepare(
    data, out_dir, direction=DEFAULT_DIRECTION, vocab_size=TransformerConfig.vocab_size, lock=True, **options
):
    """Prepares `data` ("default", a TSV path, or (source path, target path)) into the new folder
    `out_dir` (options: the fields of PrepareOptions). Returns the manifest. A killed or failed
    prepare leaves no `out_dir` behind.
    lock=False: the caller holds a lock that covers `out_dir` (kformer train, for a run's corpus)."""
    options = PrepareOptions(direction, vocab_size, **options)
    if os.path.exists(out_dir) and (not os.path.isdir(out_dir) or os.listdir(out_dir)):
        raise ValueError(f"--out {out_dir} exists and is not an empty folder; choose a new --out")
    start = time.monotonic()
    release = locks.hold(out_dir, "prepare") if lock else locks.nothing
    try:
        with folders.work_folder(out_dir, ".kformer-prepare-") as work:
            manifest = _prepare_in(work, data, options)
            manifest["seconds"] = round(time.monotonic() - start, 1)
            write_json(os.path.join(work, MANIFEST), manifest)
    finally:
        release()
    log.info("prepared %s in %.0f s: %s", out_dir, manifest["seconds"], summary(manifest))
    return manifest


def _prepare_in(work, data, options):
    direction, vocab_size, split_size, seed = (
        options.direction,
        options.vocab_size,
        options.split_size,
        options.seed,
    )
    sample, given_tokenizer = options.sample, options.tokenizer
    report = corpus_lib.ReadReport()
    given = {name: path for name, path in (("dev", options.dev), ("test", options.test)) if path}
    held_out = {name: _held_out_file(path) for name, path in given.items()}
    train_file = os.path.join(work, "train.tmp.tsv")
    with open(train_file, "w", encoding="utf-8") as train:
        splits, counts, corpus = _split(data, direction, report, held_out, split_size, train)
    for name, pairs in {**held_out, **splits}.items():
        _write_tsv(os.path.join(work, HELD_OUT[name]), pairs)
    if given_tokenizer is None:
        log.info(
            "training a joint SentencePiece tokenizer (%d pieces) on a sample of the train split", vocab_size
        )
        sampled = _sample_sentences(train_file, counts["train"], sample, seed)
        tokenizer = tokenizer_lib.train_tokenizer(sampled, vocab_size)
        del sampled
    else:
        tokenizer, sample = tokenizer_lib.load_tokenizer(given_tokenizer), 0
    with open(os.path.join(work, TOKENIZER), "wb") as f:
        f.write(tokenizer.serialized_model_proto())
    shards = options.shards or max(1, math.ceil(counts["train"] / SHARD_PAIRS))
    written, histogram, unknown = _write_shards(train_file, counts["train"], tokenizer, work, shards, seed)
    os.remove(train_file)
    return {
        "kformer_prepared": 1,
        "corpus": corpus,
        "read": report_dict(report),
        "pairs": {"train": counts["train"], **{name: len(p) for name, p in {**held_out, **splits}.items()}},
        "held_out": {
            name: "file " + os.path.abspath(given[name]) if name in given else "hash" for name in HELD_OUT
        },
        "dropped": {"held-out source in train": counts["held_out_sources"]},
        "dedup": {"digest_bytes": 8, "what": "blake2b of the cleaned pair"},
        "tokenizer": {
            "file": TOKENIZER,
            "sha256": tokenizer_digest(tokenizer),
            "vocab_size": tokenizer.get_piece_size(),
            "sample_pairs": min(sample, counts["train"]),
            "given": None if given_tokenizer is None else os.path.abspath(given_tokenizer),
        },
        # <unk> pieces of the train split: the characters the tokenizer does not know (a given one's)
        "unknown_pieces": unknown,
        "train": {"dtype": shards_lib.id_dtype(tokenizer).__name__, "shards": written},
        "lengths": {
            "cap": LENGTH_CAP,
            "counts": [[int(s), int(t), int(n)] for (s, t), n in sorted(histogram.items())],
        },
        "bytes_per_pair": round(sum(s["bytes"] for s in written) / max(1, counts["train"]), 1),
    }


def report_dict(report):
    return {
        "lines": report.lines,
        "pairs": report.pairs,
        "malformed": report.malformed,
        "malformed_examples": report.malformed_examples,
        "empty": report.empty,
        "untranslated copies": report.copies,
        "duplicates": report.duplicates,
    }


def summary(manifest):
    pairs, read = manifest["pairs"], manifest["read"]
    return (
        f"{read['lines']:,} lines -> {read['pairs']:,} pairs (skipped {read['malformed']} malformed, {read['empty']} "
        f"empty, {read['untranslated copies']} untranslated copies, {read['duplicates']} duplicates); "
        f"train {pairs['train']:,}, dev {pairs['dev']:,}, test {pairs['test']:,}; "
        f"{len(manifest['train']['shards'])} shards, {manifest['bytes_per_pair']} bytes a pair"
    )


# --- step 1: read, clean, deduplicate, split ---


def _held_out_file(path):
    """The cleaned pairs of a --dev/--test TSV file."""
    pairs, _ = corpus_lib.read_corpus(path)
    return pairs


class _HeldOutSplit:
    """The pairs of one held-out split: sources whose hash lies in [low, high), those of smallest
    hash first, at most `size` pairs. `offer` returns the pairs it does not keep (for train): the
    pair itself, or the pairs of the source it let go to make room."""

    def __init__(self, low, high, size):
        self.low, self.high, self.cutoff, self.size = low, high, high, size
        self.sources, self.largest, self.count = {}, [], 0  # hash -> [(order, pair)]; a max-heap of hashes
        self.offered = 0  # pairs offered so far: the corpus order, kept in `pairs()`

    def offer(self, u, pair):
        if u >= self.cutoff:
            return [pair]
        if u not in self.sources:
            self.sources[u] = []
            heapq.heappush(self.largest, -u)
        self.sources[u].append((self.offered, pair))
        self.offered += 1
        self.count += 1
        released = []
        while self.count > self.size:
            largest = -heapq.heappop(self.largest)
            evicted = self.sources.pop(largest)
            self.count -= len(evicted)
            released += [pair for _, pair in evicted]
            self.cutoff = largest  # its later pairs, and those of any larger hash, go to train
        return released

    def pairs(self):
        """The kept pairs in corpus order."""
        return [pair for _, pair in sorted(p for pairs in self.sources.values() for p in pairs)]


def _split(data, direction, report, held_out, split_size, train):
    """Step 1: the cleaned, deduplicated pairs of the corpus, the held-out ones kept (bounded),
    the train ones written to `train`. Returns ({split: pairs}, counts, the corpus record)."""
    raw, files = corpus_lib.raw_pairs(data, direction, report)
    taken = {name: _HeldOutSplit(*FRACTIONS[name], split_size) for name in HELD_OUT if name not in held_out}
    excluded = {p[0] for pairs in held_out.values() for p in pairs}  # sources of --dev/--test files
    seen = _Digests()
    counts = {"train": 0, "held_out_sources": 0}
    progress = _Progress("read", files)
    for chunk in _chunks(corpus_lib.clean_pairs(raw, report), CHUNK):
        fresh = seen.add_new(np.array([_digest(p) for p in chunk], np.uint64))
        report.duplicates += len(chunk) - len(fresh)
        for index in fresh:
            pair = chunk[index]
            if pair[0] in excluded:
                counts["held_out_sources"] += 1
                continue
            u = corpus_lib.source_position(pair[0])
            split = next((split for split in taken.values() if split.low <= u < split.high), None)
            to_train = [pair] if split is None else split.offer(u, pair)
            for p in to_train:
                train.write(f"{p[0]}\t{p[1]}\n")
            counts["train"] += len(to_train)
        report.pairs += len(fresh)
        progress.show(report.lines)
    progress.done(report.lines)
    if not report.pairs:
        raise corpus_lib.CorpusError(f"{files[0].path}: no usable sentence pairs ({report.summary()})")
    corpus = corpus_lib.corpus_record(data, direction)
    return {name: split.pairs() for name, split in taken.items()}, counts, corpus


def _digest(pair):
    return int.from_bytes(hashlib.blake2b(f"{pair[0]}\t{pair[1]}".encode(), digest_size=8).digest(), "little")


class _Digests:
    """The 8-byte digests of the pairs kept so far, as sorted numpy arrays: 8 bytes a pair. New
    digests join a small array, merged into the large one when it reaches a quarter of its size,
    so each digest is copied a few times in all, not once per chunk."""

    def __init__(self):
        self.large, self.small = np.zeros(0, np.uint64), np.zeros(0, np.uint64)

    def add_new(self, digests):
        """Adds the digests seen neither before nor earlier in `digests`; returns their indices."""
        _, first = np.unique(digests, return_index=True)
        first.sort()
        new = first[~(_contains(self.large, digests[first]) | _contains(self.small, digests[first]))]
        self.small = np.union1d(self.small, digests[new])
        if len(self.small) > max(1 << 20, len(self.large) // 4):
            self.large, self.small = np.union1d(self.large, self.small), np.zeros(0, np.uint64)
        return new


def _contains(sorted_values, values):
    if not len(sorted_values):
        return np.zeros(len(values), bool)
    position = np.minimum(np.searchsorted(sorted_values, values), len(sorted_values) - 1)
    return sorted_values[position] == values


def _chunks(items, size):
    chunk = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


# --- step 2: the tokenizer ---


def _sample_sentences(train_file, count, sample, seed):
    """Both sides of a uniform random sample of `sample` train pairs (all of them when there are
    fewer), in file order."""
    rng = random.Random(seed)
    chosen = set(range(count)) if count <= sample else set(rng.sample(range(count), sample))
    sentences = []
    with open(train_file, encoding="utf-8") as f:
        for number, line in enumerate(f):
            if number in chosen:
                sentences.extend(line.rstrip("\n").split("\t"))
    return sentences


# --- step 3: the shards ---


def _write_shards(train_file, count, tokenizer, work, shards, seed):
    """Tokenizes the train pairs into `shards` shuffled TFRecord files; returns (their manifest
    entries, the length histogram {(source length, target length): pairs}, {"unk": <unk> pieces,
    "pieces": all pieces})."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    dtype, histogram, unknown = shards_lib.id_dtype(tokenizer), {}, {"unk": 0, "pieces": 0}
    unk = tokenizer.unk_id()
    parts = [open(os.path.join(work, f"part-{i}.bin"), "wb") for i in range(shards)]
    progress, done = _Progress("tokenized", total=count), 0
    with open(train_file, encoding="utf-8") as f:
        for chunk in _chunks((line.rstrip("\n").split("\t") for line in f), CHUNK):
            sources = tokenizer.encode([s for s, _ in chunk], num_threads=os.cpu_count() or 1)
            targets = tokenizer.encode([t for _, t in chunk], num_threads=os.cpu_count() or 1)
            for shard, source, target in zip(rng.integers(shards, size=len(chunk)), sources, targets):
                record = shards_lib.encode_record(source, target, dtype)
                parts[shard].write(len(record).to_bytes(4, "little") + record)
                key = (min(len(source), LENGTH_CAP), min(len(target), LENGTH_CAP))
                histogram[key] = histogram.get(key, 0) + 1
                unknown["unk"] += source.count(unk) + target.count(unk)
                unknown["pieces"] += len(source) + len(target)
            done += len(chunk)
            progress.show(done)
    progress.done(done)
    written = []
    for i, part in enumerate(parts):
        part.close()
        name = f"train-{i:05d}-of-{shards:05d}.tfrecord"
        records = _read_part(part.name)
        order = rng.permutation(len(records))
        with tf.io.TFRecordWriter(os.path.join(work, name)) as writer:
            for index in order:
                writer.write(records[index])
        os.remove(part.name)
        path = os.path.join(work, name)
        written.append(
            {
                "file": name,
                "pairs": len(records),
                "bytes": os.path.getsize(path),
                "sha256": corpus_lib.files_sha256([path]),
            }
        )
    return written, histogram, unknown


def _read_part(path):
    records = []
    with open(path, "rb") as f:
        while size := f.read(4):
            records.append(f.read(int.from_bytes(size, "little")))
    return records


def _write_tsv(path, pairs):
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(f"{s}\t{t}\n" for s, t in pairs)


class _Progress:
    """A line every few seconds: how far, how fast, and when it will be done."""

    def __init__(self, what, files=None, total=None, every=5.0):
        self.what, self.files, self.total, self.every = what, files, total, every
        self.start = self.last = time.monotonic()

    def show(self, count):
        now = time.monotonic()
        if now - self.last < self.every:
            return
        self.last = now
        rate = count / max(now - self.start, 1e-9)
        share = self._share(count)
        eta = f", ETA {_duration((now - self.start) * (1 - share) / share)}" if share else ""
        log.info(
            "%s %s pairs (%s/s)%s%s",
            self.what,
            f"{count:,}",
            f"{rate:,.0f}",
            f", {share:.0%}" if share else "",
            eta,
        )

    def _share(self, count):
        if self.total:
            return min(count / self.total, 1.0)
        if self.files:
            size = sum(f.size for f in self.files)
            return min(sum(f.bytes_read for f in self.files) / size, 1.0) if size else None
        return None

    def done(self, count):
        elapsed = time.monotonic() - self.start
        log.info(
            "%s %s pairs in %s (%s/s)",
            self.what,
            f"{count:,}",
            _duration(elapsed),
            f"{count / max(elapsed, 1e-9):,.0f}",
        )


def _duration(seconds):
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


# --- reading a prepared folder ---


def is_prepared(path):
    return isinstance(path, str) and os.path.isfile(os.path.join(path, MANIFEST))


def load(folder):
    """The manifest of a finished prepared folder, its files checked to be there."""
    path = os.path.join(folder, MANIFEST)
    if not os.path.isfile(path):
        raise PreparedError(f"{path} not found: {folder} is not a finished `kformer prepare` folder")
    manifest = read_json(path, PreparedError)
    for name in [TOKENIZER, *HELD_OUT.values(), *(s["file"] for s in manifest["train"]["shards"])]:
        if not os.path.isfile(os.path.join(folder, name)):
            raise PreparedError(f"{os.path.join(folder, name)} is missing (listed in {path})")
    return manifest


def held_out(folder, split):
    """The (source, target) pairs of a prepared folder's dev or test split ([] for an empty one:
    `kformer prepare --split-size 0`)."""
    path = os.path.join(folder, HELD_OUT[split])
    return corpus_lib.read_corpus(path)[0] if os.path.getsize(path) else []


def shard_paths(folder, manifest):
    return [os.path.join(folder, s["file"]) for s in manifest["train"]["shards"]]


def copy(folder, destination):
    """Copies a finished prepared folder (a run keeps its own, so its splits stay held out)."""
    shutil.copytree(folder, destination)

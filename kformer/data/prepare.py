"""`kformer prepare`: a corpus of any size, read once as a stream, into a folder that training
reads as a stream, in memory that does not grow with the corpus but for 8 bytes a pair.

A prepared folder's files and manifest are kformer.contracts.prepared's. Its tokenizer is trained
on a bounded random sample of the train split, or given (a trained model's, to fine-tune it on
this corpus).

The steps: (1) read the corpus line by line (TSV or two aligned files, plain or gzip), clean
it, drop duplicate pairs by an 8-byte digest of each, and split it by source sentence
(`split_pairs` holds the rule: a sentence's split is a function of its hash), the held-out
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
import itertools
import logging
import math
import os
import random
import time

import numpy as np

from kformer import folders, locks
from kformer.contracts.digests import tokenizer_digest
from kformer.contracts.prepared import (
    HELD_OUT_FILES,
    LengthHistogram,
    PreparedCorpus,
    PreparedTokenizer,
    Shard,
    TrainShards,
)
from kformer.data import corpus as corpus_lib
from kformer.data import shards as shards_lib
from kformer.data import tokenizer as tokenizer_lib
from kformer.data import vocabulary

log = logging.getLogger("kformer")
FRACTIONS = {  # of source positions (kformer.data.corpus.source_position)
    "test": (0.0, corpus_lib.TEST_FRACTION),
    "dev": (corpus_lib.TEST_FRACTION, corpus_lib.TEST_FRACTION + corpus_lib.DEV_FRACTION),
}
SPLIT_SIZE = 3000  # pairs at most in each held-out split
SHARD_PAIRS = 100_000  # train pairs a shard holds (the default number of shards follows)
TOKENIZER_SAMPLE = 300_000  # train pairs the tokenizer trains on, at most (its training peaks memory)
LENGTH_CAP = 512  # the histogram counts longer pairs at this length
CHUNK = 50_000  # pairs handled at once: deduplicated, tokenized


@dataclasses.dataclass(frozen=True)
class PrepareOptions:
    """How `prepare` reads, splits and encodes a corpus.

    direction: the pair the corpus is read as; vocab_size: of a tokenizer trained here;
    dev/test: TSV files to use as those splits instead of taking them from the corpus;
    split_size: pairs at most in each split taken from the corpus; shards: train shard files
    (default: one per SHARD_PAIRS); sample: train pairs the tokenizer trains on, at most;
    tokenizer: a tokenizer file to encode with instead of training one (a SentencePiece model,
    or an imported run's tokenizer.json)."""

    direction: str = corpus_lib.DEFAULT_DIRECTION
    vocab_size: int = tokenizer_lib.VOCAB_SIZE
    dev: str | None = None
    test: str | None = None
    split_size: int = SPLIT_SIZE
    shards: int | None = None
    sample: int = TOKENIZER_SAMPLE
    seed: int = 0
    tokenizer: str | None = None


def prepare(data, out_dir, options=PrepareOptions(), lock=True):
    """Prepares `data` ("default", a TSV path, or (source path, target path)) into the new folder
    `out_dir` as `options` (a PrepareOptions) say. Returns its PreparedCorpus. A killed or failed
    prepare leaves no `out_dir` behind.
    lock=False: the caller holds a lock that covers `out_dir` (kformer train, for a run's corpus)."""
    out_dir = os.path.realpath(out_dir)  # a link to a folder: that folder is checked, and written
    if os.path.exists(out_dir) and (not os.path.isdir(out_dir) or os.listdir(out_dir)):
        raise ValueError(f"--out {out_dir} exists and is not an empty folder; choose a new --out")
    start = time.monotonic()
    release = locks.hold(out_dir, "prepare") if lock else locks.nothing
    try:
        with folders.work_folder(out_dir, ".kformer-prepare-") as work:
            manifest = _prepare_in(work, data, options)
            manifest = dataclasses.replace(manifest, seconds=round(time.monotonic() - start, 1))
            manifest.save(work)
    finally:
        release()
    log.info("prepared %s in %.0f s: %s", out_dir, manifest.seconds, summary(manifest))
    return manifest


def _prepare_in(work, data, options):
    report = corpus_lib.ReadReport()
    given = {name: path for name, path in (("dev", options.dev), ("test", options.test)) if path}
    held_out = {name: corpus_lib.read_corpus(path)[0] for name, path in given.items()}  # cleaned pairs
    train_file = os.path.join(work, "train.tmp.tsv")
    with open(train_file, "w", encoding="utf-8") as train:
        splits, counts, corpus = _split(data, options, report, held_out, train)
    for name, pairs in {**held_out, **splits}.items():
        with open(os.path.join(work, HELD_OUT_FILES[name]), "w", encoding="utf-8") as f:
            f.writelines(f"{s}\t{t}\n" for s, t in pairs)
    tokenizer, sample = _tokenizer(train_file, counts["train"], options)
    vocabulary.save(tokenizer, work)
    shards = options.shards or max(1, math.ceil(counts["train"] / SHARD_PAIRS))
    written, histogram, unknown = _write_shards(
        train_file, counts["train"], tokenizer, work, shards, options.seed
    )
    os.remove(train_file)
    given_tokenizer = None if options.tokenizer is None else os.path.abspath(options.tokenizer)
    return PreparedCorpus(
        corpus=corpus,
        read=report.counts(),
        pairs={"train": counts["train"], **{name: len(p) for name, p in {**held_out, **splits}.items()}},
        held_out={
            name: "file " + os.path.abspath(given[name]) if name in given else "hash"
            for name in HELD_OUT_FILES
        },
        dropped={"held-out source in train": counts["held_out_sources"]},
        dedup={"digest_bytes": 8, "what": "blake2b of the cleaned pair"},
        tokenizer=PreparedTokenizer(
            tokenizer_digest(tokenizer),
            tokenizer.get_piece_size(),
            vocabulary.tokenizer_file(work),
            min(sample, counts["train"]),
            given_tokenizer,
        ),
        # <unk> pieces of the train split: the characters the tokenizer does not know (a given one's)
        unknown_pieces=unknown,
        train=TrainShards(shards_lib.id_dtype(tokenizer).__name__, tuple(written)),
        lengths=LengthHistogram(
            LENGTH_CAP, tuple((int(s), int(t), int(n)) for (s, t), n in sorted(histogram.items()))
        ),
        bytes_per_pair=round(sum(s.bytes for s in written) / max(1, counts["train"]), 1),
    )


def _tokenizer(train_file, pairs, options):
    """(the tokenizer, the train pairs it was trained on): one trained on a sample of the train
    split, or the one given (trained on none here)."""
    if options.tokenizer is not None:
        return vocabulary.open_tokenizer_file(options.tokenizer), 0
    log.info(
        "training a joint SentencePiece tokenizer (%d pieces) on a sample of the train split",
        options.vocab_size,
    )
    sampled = _sample_sentences(train_file, pairs, options.sample, options.seed)
    return tokenizer_lib.train_tokenizer(sampled, options.vocab_size), options.sample


def summary(manifest):
    pairs, read = manifest.pairs, manifest.read
    return (
        f"{read['lines']:,} lines -> {read['pairs']:,} pairs (skipped {read['malformed']} malformed, {read['empty']} "
        f"empty, {read['untranslated copies']} untranslated copies, {read['duplicates']} duplicates); "
        f"train {pairs['train']:,}, dev {pairs['dev']:,}, test {pairs['test']:,}; "
        f"{len(manifest.train.shards)} shards, {manifest.bytes_per_pair} bytes a pair"
    )


# --- step 1: read, clean, deduplicate, split ---


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


class _Splitter:
    """The split rule, for a stream of cleaned pairs: a source's split is a function of its hash
    (`corpus_lib.source_position`), dev and test each bounded to `split_size` pairs; the sources of
    `excluded` (given --dev/--test files) go nowhere."""

    def __init__(self, split_size, taken=tuple(HELD_OUT_FILES), excluded=frozenset()):
        self.splits = {name: _HeldOutSplit(*FRACTIONS[name], split_size) for name in taken}
        self.excluded, self.dropped = excluded, 0

    def offer(self, pair):
        """The pairs that go to train now: `pair`, or none, or those a split let go."""
        if pair[0] in self.excluded:
            self.dropped += 1
            return []
        u = corpus_lib.source_position(pair[0])
        split = next((split for split in self.splits.values() if split.low <= u < split.high), None)
        return [pair] if split is None else split.offer(u, pair)

    def held_out(self):
        return {name: split.pairs() for name, split in self.splits.items()}


def split_pairs(pairs, split_size=SPLIT_SIZE):
    """{"train", "dev", "test": pairs} of cleaned pairs in memory, by the rule `prepare` splits a
    stream by (`_Splitter`)."""
    splitter = _Splitter(split_size)
    train = [kept for pair in pairs for kept in splitter.offer(pair)]
    return {"train": train, **splitter.held_out()}


def _split(data, options, report, held_out, train):
    """Step 1: the cleaned, deduplicated pairs of the corpus, the held-out ones kept (bounded),
    the train ones written to `train`. Returns ({split: pairs}, counts, the CorpusSource)."""
    raw, files = corpus_lib.raw_pairs(data, options.direction, report)
    excluded = {p[0] for pairs in held_out.values() for p in pairs}  # sources of --dev/--test files
    splitter = _Splitter(options.split_size, [n for n in HELD_OUT_FILES if n not in held_out], excluded)
    seen, progress, trained = _Digests(), _Progress("read", files), 0
    for chunk in _chunks(corpus_lib.clean_pairs(raw, report), CHUNK):
        fresh = seen.add_new(np.array([_digest(p) for p in chunk], np.uint64))
        report.duplicates += len(chunk) - len(fresh)
        for index in fresh:
            to_train = splitter.offer(chunk[index])
            train.writelines(f"{p[0]}\t{p[1]}\n" for p in to_train)
            trained += len(to_train)
        report.pairs += len(fresh)
        progress.show(report.lines)
    progress.done(report.lines)
    if not report.pairs:
        raise corpus_lib.CorpusError(f"{files[0].path}: no usable sentence pairs ({report.summary()})")
    counts = {"train": trained, "held_out_sources": splitter.dropped}
    return splitter.held_out(), counts, corpus_lib.corpus_record(data, options.direction)


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
    """Lists of `size` items, the last one shorter (Python 3.12's itertools.batched)."""
    items = iter(items)
    return iter(lambda: list(itertools.islice(items, size)), [])


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
    Shards, the length histogram {(source length, target length): pairs}, {"unk": <unk> pieces,
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
            targets = vocabulary.encode_targets(tokenizer, [t for _, t in chunk])
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
        written.append(Shard(name, len(records), os.path.getsize(path), corpus_lib.files_sha256([path])))
    return written, histogram, unknown


def _read_part(path):
    records = []
    with open(path, "rb") as f:
        while size := f.read(4):
            records.append(f.read(int.from_bytes(size, "little")))
    return records


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


def held_out(folder, split):
    """The (source, target) pairs of a prepared folder's dev or test split ([] for an empty one:
    `kformer prepare --split-size 0`)."""
    path = os.path.join(folder, HELD_OUT_FILES[split])
    return corpus_lib.read_corpus(path)[0] if os.path.getsize(path) else []

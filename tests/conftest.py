import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import sys  # noqa: E402

import pytest  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))

from kformer import data as data_lib  # noqa: E402
from kformer.config import preset  # noqa: E402

PYTHON = sys.executable


@pytest.fixture(scope="session")
def corpus_pairs():
    """A few hundred real Tatoeba zh-en pairs (a fixed slice of the default corpus)."""
    pairs, _ = data_lib.read_corpus()
    return pairs[:: len(pairs) // 400][:400]


@pytest.fixture(scope="session")
def corpus_tsv(tmp_path_factory, corpus_pairs):
    path = tmp_path_factory.mktemp("corpus") / "pairs.tsv"
    path.write_text("".join(f"{s}\t{t}\n" for s, t in corpus_pairs), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="session")
def tokenizer(corpus_pairs):
    return data_lib.train_tokenizer([t for p in corpus_pairs for t in p], vocab_size=1200)


@pytest.fixture()
def tiny_config(tokenizer):
    return preset("tiny", vocab_size=tokenizer.get_piece_size())


@pytest.fixture(scope="session")
def trained_dir(tmp_path_factory, corpus_tsv):
    """A tiny model trained for a few steps by `train` (shared by the slower tests)."""
    from kformer.train import train

    out = str(tmp_path_factory.mktemp("run") / "tiny")
    train(out, "tiny", data=corpus_tsv, direction="zh-en", steps=12, vocab_size=1200, xla=False,
          verbose=0, checkpoint_seconds=10**6)
    return out


def random_ids(rng, batch, length, vocab, pad_tail=0):
    """(batch, length) ids in [4, vocab) with `pad_tail` trailing pads on odd rows."""
    ids = rng.integers(4, vocab, size=(batch, length)).astype("int32")
    if pad_tail:
        ids[1::2, length - pad_tail:] = 0
    return ids


def saved_weights(model_path):
    """{h5 path: array} of every weight in a .keras file, optimizer state included
    ("optimizer/vars/0" is the step)."""
    import zipfile

    import h5py
    with zipfile.ZipFile(model_path) as archive, h5py.File(archive.open("model.weights.h5")) as f:
        found = []
        f.visititems(lambda name, item: found.append((name, item[()])) if isinstance(item, h5py.Dataset) else None)
        return dict(found)

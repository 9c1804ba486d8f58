import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")  # processes share a GPU (tests/test_gpu.py)
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
# `--precision auto` caches what it measured (kformer.train.precision_probe): in a folder of the
# test session's own, not the user's.
os.environ.setdefault("KFORMER_CACHE", __import__("tempfile").mkdtemp(prefix="kformer-test-cache-"))
# First, before keras starts TensorFlow: kformer's import sets the kernels TensorFlow runs
# (kformer/__init__.py), so a model trained here and one trained by a command in a test's
# subprocess compute alike (tests/test_faults.py compares their weights).
import kformer  # noqa: E402, F401

# isort: split
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import typing  # noqa: E402

import keras  # noqa: E402
import pytest  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))

from kformer.data import corpus as corpus_lib
from kformer.data import prepare as prepare_lib
from kformer.data import tokenizer as tokenizer_lib  # noqa: E402
from kformer.decode.options import SearchOptions  # noqa: E402
from kformer.export import page as web  # noqa: E402
from kformer.export.exporter import export  # noqa: E402
from kformer.export.formats import FORMATS  # noqa: E402
from kformer.model.config import preset  # noqa: E402
from kformer.model.transformer import Transformer  # noqa: E402

PYTHON = sys.executable
KFORMER = (PYTHON, "-m", "kformer.cli")  # the command line, as a process of its own runs it
# A process that hangs (a server that started after all, a lock never let go) fails its test
# instead of holding up the session.
TIMEOUT = 1200


class Ran(typing.NamedTuple):
    """What a finished process left: its exit status and its output as text."""

    status: int
    stdout: str
    stderr: str


def run_process(argv, *, stdin=None, env=None, cwd=None, timeout=TIMEOUT):
    """Runs argv to its end (at most `timeout` seconds, or the test fails); its `Ran`."""
    try:
        done = subprocess.run(
            argv, input=stdin, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout
        )
    except subprocess.TimeoutExpired as e:  # its output is bytes, whatever `text` says
        tail = (e.stderr or b"")[-2000:].decode(errors="replace")
        pytest.fail(f"{_shown(argv)} still ran after {timeout} s:\n{tail}")
    return Ran(done.returncode, done.stdout, done.stderr)


def _shown(argv):
    return " ".join(map(str, argv))[:200]


def manifest_edited(folder, edit):
    """Rewrites an export folder's manifest.json with `edit(manifest dict)`."""
    path = os.path.join(folder, "manifest.json")
    with open(path) as f:
        manifest = json.load(f)
    edit(manifest)
    with open(path, "w") as f:
        json.dump(manifest, f)


def run_kformer(*args, **settings):
    """`kformer args...` in a process of its own (`run_process`'s settings); its `Ran`."""
    return run_process([*KFORMER, *args], **settings)


def output(argv, **settings):
    """The stdout of argv (`run_process`'s settings); a failure fails the test with the end of its stderr."""
    ran = run_process(argv, **settings)
    if ran.status:
        pytest.fail(f"{_shown(argv)} exited with {ran.status}:\n{ran.stderr[-2000:]}")
    return ran.stdout


def python_lines(script, *args, python=PYTHON, **settings):
    """The output lines of `python -c script args...` (`output`); `python`: another interpreter
    (a venv of its own)."""
    return output([python, "-c", script, *args], **settings).strip().splitlines()


def need(available, reason):
    """Skips the test for want of a tool, saying why; in CI (CI=true), fails it."""
    if not available:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason} (CI must run this test)")
        pytest.skip(reason)


def venv_python(name):
    """The Python of the venv `make test` installs `name` in, inside the test venv (Makefile)."""
    from kformer.bench.argos import argos_python

    python = argos_python(name)
    need(os.path.exists(python), f"{python} not found: `make test` installs {name} in a venv of its own")
    return python


def need_packages():
    need(
        all(os.path.isdir(folder) for folder in web.ROUTES.values()),
        f"the page's JavaScript packages are missing: run `npm ci --prefix {web.WEB_DIR}`",
    )


def need_browser():
    need(
        os.path.exists(web.CHROMIUM), f"{web.CHROMIUM} not found: install Debian's chromium (make test does)"
    )
    need_packages()


@pytest.fixture(scope="module")
def browser():
    """A headless Chromium (Playwright) for the page's tests."""
    need_browser()
    with web.chromium() as browser:
        yield browser


@pytest.fixture(scope="session")
def corpus_pairs():
    """A few hundred real Tatoeba zh-en pairs (a fixed slice of the default corpus)."""
    pairs, _ = corpus_lib.read_corpus()
    return pairs[:: len(pairs) // 400][:400]


@pytest.fixture(scope="session")
def corpus_tsv(tmp_path_factory, corpus_pairs):
    path = tmp_path_factory.mktemp("corpus") / "pairs.tsv"
    path.write_text("".join(f"{s}\t{t}\n" for s, t in corpus_pairs), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="session")
def tokenizer(corpus_pairs):
    return tokenizer_lib.train_tokenizer([t for p in corpus_pairs for t in p], vocab_size=1200)


@pytest.fixture()
def tiny_config(tokenizer):
    return preset("tiny", vocab_size=tokenizer.get_piece_size())


@pytest.fixture(scope="session")
def trained_dir(tmp_path_factory, corpus_tsv):
    """A tiny model trained for a few steps by `train` (shared by the slower tests)."""
    from kformer.train.fit import train

    out = str(tmp_path_factory.mktemp("run") / "tiny")
    train(
        out,
        "tiny",
        data=corpus_tsv,
        direction="zh-en",
        steps=12,
        vocab_size=1200,
        xla=False,
        verbose=0,
        checkpoint_seconds=10**6,
    )
    return out


@pytest.fixture(scope="session")
def trained_en_zh_dir(tmp_path_factory, corpus_tsv):
    """`trained_dir`'s twin the other way, en-zh (a second language pair for the server)."""
    from kformer.train.fit import train

    out = str(tmp_path_factory.mktemp("run") / "tiny-en-zh")
    train(out, "tiny", data=corpus_tsv, direction="en-zh", steps=12, vocab_size=1200, xla=False, verbose=0)
    return out


BEAM = 3  # the exported beam size of `artifacts`
EOS_SCALE = 6.0  # write_random_model's
MAX_LENGTH = 12


def write_random_model(out, tokenizer, direction="zh-en", seed=3, max_source_length=16):
    """A random (untrained) tiny model in the folder `out`, as a training run leaves it, with the
    default corpus's held-out splits in `direction`."""
    tokenizer_path = out / "tokenizer.model"
    tokenizer_path.write_bytes(tokenizer.serialized_model_proto())
    size = tokenizer.get_piece_size()
    config = preset("tiny", vocab_size=size, max_source_length=max_source_length, max_target_length=20)
    keras.utils.set_random_seed(seed)
    model = Transformer(config)
    # EOS's row of the tied embedding, scaled: its logit varies more than the others', so that
    # hypotheses end at varied steps (unscaled, none ends before the limit, and a beam row's wait
    # for nbest finished hypotheses would go untested) while many still run to the limit.
    embedding = model.get_layer("shared_embedding").embeddings
    rows = embedding.numpy()
    rows[config.eos_id] *= EOS_SCALE
    embedding.assign(rows)
    model.save(str(out / "model.keras"))
    config.save(str(out / "config.json"))
    (out / "corpus.json").write_text(
        json.dumps({"data": "default", "direction": direction, "prepared": "data"})
    )
    splits = prepare_lib.split_pairs(
        corpus_lib.read_corpus()[0]
    )  # the held-out splits, as prepare writes them
    (out / "data").mkdir()
    for name in ("dev", "test"):
        pairs = splits[name] if direction == "zh-en" else [(t, s) for s, t in splits[name]]
        (out / "data" / f"{name}.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    return str(out)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory, tokenizer):
    """A random (untrained) tiny model: its outputs are long and varied, so token equality across
    runtimes means something."""
    return write_random_model(tmp_path_factory.mktemp("random_model"), tokenizer)


@pytest.fixture(scope="session")
def artifacts(model_dir, tmp_path_factory):
    """Every format and variant of `model_dir`, exported once for the export, bench and web tests."""
    out = str(tmp_path_factory.mktemp("export") / "art")
    options = SearchOptions(beam_size=BEAM, max_length=MAX_LENGTH)
    export(model_dir, out, tuple(FORMATS), ("fp16", "int8"), options, progress=lambda *a, **k: None)
    return out


def random_ids(rng, batch, length, vocab, pad_tail=0):
    """(batch, length) ids in [4, vocab) with `pad_tail` trailing pads on odd rows."""
    ids = rng.integers(4, vocab, size=(batch, length)).astype("int32")
    if pad_tail:
        ids[1::2, length - pad_tail :] = 0
    return ids


def saved_weights(model_path):
    """{h5 path: array} of every weight in a .keras file, optimizer state included
    ("optimizer/vars/0" is the step)."""
    import zipfile

    import h5py

    with zipfile.ZipFile(model_path) as archive, h5py.File(archive.open("model.weights.h5")) as f:
        found = []
        f.visititems(
            lambda name, item: found.append((name, item[()])) if isinstance(item, h5py.Dataset) else None
        )
        return dict(found)


def ctranslate2_beam_differences(translator, sources, ours, limits):
    """Beam 4 of `translator` (a ctranslate2.Translator) on `sources` (lists of pieces), ranking
    hypotheses by their log-probability alone (length penalty 0), each at its length limit, against
    `ours` ((pieces, score) a source: kformer's beam 4 with alpha 0). Returns how many lines differ.
    The rule for a differing line, asserted: kformer's output scores higher under CTranslate2's own
    scoring (score_batch), by as much as kformer's score says, so CTranslate2's search let a better
    hypothesis go on the same model."""
    differing = 0
    for source, (mine, our_score), limit in zip(sources, ours, limits):
        (theirs,) = translator.translate_batch(
            [source], beam_size=4, length_penalty=0.0, max_decoding_length=limit, min_decoding_length=0
        )
        if mine == theirs.hypotheses[0]:
            continue
        differing += 1
        scored = translator.score_batch([source, source], [mine, theirs.hypotheses[0]])
        mine_scored, theirs_scored = (sum(result.log_probs) for result in scored)
        assert mine_scored > theirs_scored and abs(mine_scored - float(our_score)) < 1e-3, (mine, theirs)
    return differing

"""A run's data before it trains: its config and recipe (the preset's, or the saved ones when
resuming), its corpus prepared (kformer.data.prepare) and its tokenizer, checked against what the
run folder recorded."""

import dataclasses
import logging
import os
import shutil
import typing

from kformer import folders, run_folder
from kformer.contracts.digests import files_sha256, tokenizer_digest
from kformer.contracts.prepared import MANIFEST_FILE, PreparedCorpus, is_prepared
from kformer.contracts.run import CONFIG_FILE, DATA_DIR, CorpusRecord, is_run
from kformer.data import corpus as corpus_lib
from kformer.data import prepare as prepare_lib
from kformer.data import vocabulary
from kformer.model.config import DEFAULT_PRESET, ModelConfig, preset
from kformer.train import init_from as init_from_lib
from kformer.train.recipe import TrainingRecipe, recipe

log = logging.getLogger("kformer")

DATA_PREFIX = ".kformer-data-"  # a new run's corpus, prepared beside its folder until training starts


class RunData(typing.NamedTuple):
    """What a run trains: its model config and recipe, tokenizer, prepared corpus (folder) and
    the record of that corpus."""

    config: ModelConfig
    recipe: TrainingRecipe
    tokenizer: "sentencepiece.SentencePieceProcessor"  # noqa: F821
    folder: str
    corpus: CorpusRecord


def _config(options, source, vocab_size, tokenizer_sha256):
    """A run's config and recipe: the preset's (default: DEFAULT_PRESET) with the options'
    changes, bound to its tokenizer; or, starting from a trained run (`source`), that run's with
    the fine-tuning recipe."""
    changes = options.recipe_overrides()
    if source is not None:
        return init_from_lib.fine_tune(source, options.config_name, changes)
    name = options.config_name or DEFAULT_PRESET
    return preset(name, vocab_size=vocab_size, tokenizer_sha256=tokenizer_sha256), recipe(name, **changes)


def _requested_config(out_dir, options, source):
    """The saved config and recipe when resuming (those asked for must agree), or None for a new run."""
    if not is_run(out_dir):
        return None
    init_from_lib.check_recorded(out_dir, source)
    saved = ModelConfig.load(run_folder.path(out_dir, CONFIG_FILE)), TrainingRecipe.of_run(out_dir)
    requested = _config(options, source, saved[0].vocab_size, saved[0].tokenizer_sha256)
    diff = {
        k: (v, dataclasses.asdict(new)[k])
        for old, new in zip(saved, requested)
        for k, v in dataclasses.asdict(old).items()
        if dataclasses.asdict(new)[k] != v
    }
    if diff:
        raise ValueError(
            f"{out_dir} holds a run with another config (saved vs requested: {diff}); "
            "use a new --out directory. Nothing was overwritten."
        )
    return saved


def run_data(out_dir, options):
    """The run's RunData. A new run's corpus is prepared into a temporary sibling of `out_dir`,
    which `run_folder.create` moves in once training starts (so a failed start leaves no folder
    behind); a resumed run's is the one it recorded, after checking it is the corpus asked for; a
    prepared folder given as `data` is read where it is (its direction is the one it was prepared
    in). Writes nothing in `out_dir`. `options`: a TrainOptions. init_from: its tokenizer encodes
    the corpus, its direction and model sizes are kept (a config or direction that differs is
    refused)."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ValueError(f"--out {out_dir} is a file, not a folder; choose a folder name")
    source = init_from_lib.open_source(options.init_from) if options.init_from else None
    if source is not None:
        init_from_lib.check_direction(source, options.direction)
    direction = str(source.direction) if source else options.direction or corpus_lib.DEFAULT_DIRECTION
    saved = _requested_config(out_dir, options, source)
    folder, corpus = _corpus(out_dir, options, direction, saved is not None, source)
    manifest = PreparedCorpus.load(folder)
    log.info("corpus: %s", prepare_lib.summary(manifest))
    tokenizer_folder = folder if saved is None else out_dir
    tokenizer_path = os.path.join(tokenizer_folder, vocabulary.tokenizer_file(tokenizer_folder))
    tokenizer = vocabulary.open_tokenizer(tokenizer_folder)
    if saved is None:
        if source is not None and tokenizer_digest(tokenizer) != source.tokenizer_sha256:
            raise ValueError(
                f"{folder} was prepared with another tokenizer than --init-from {source.run_dir}'s; "
                f"give the corpus as a file, or prepare it with `kformer prepare --tokenizer {source.tokenizer_path}`"
            )
        saved = _config(options, source, tokenizer.get_piece_size(), tokenizer_digest(tokenizer))
        if source is not None:
            init_from_lib.report_coverage(manifest, source)
    saved[0].check_tokenizer(tokenizer, tokenizer_path)
    if tokenizer_digest(tokenizer) != manifest.tokenizer.sha256:
        raise ValueError(f"{folder} was prepared with another tokenizer than {tokenizer_path}'s")
    return RunData(*saved, tokenizer, folder, corpus)


def _corpus(out_dir, options, direction, resumed, source):
    """(prepared folder, CorpusRecord) of the run: the one it recorded when resumed, a prepared
    folder given, or the corpus prepared beside `out_dir` (with RUN's tokenizer when fine-tuning)."""
    if resumed:
        return _recorded_corpus(out_dir, options.data, direction)
    if is_prepared(options.data):
        return os.path.abspath(options.data), _prepared_record(options.data)
    given = None if source is None else source.tokenizer_path
    folder = _prepare_beside(out_dir, options.data, direction, options.vocab_size, given)
    corpus = PreparedCorpus.load(folder).corpus
    return folder, CorpusRecord(corpus.data, corpus.direction, corpus.sha256, DATA_DIR)


def _prepared_record(folder):
    """What a run records of a prepared folder it trains on: the folder and its manifest's digest."""
    digest = files_sha256([os.path.join(folder, MANIFEST_FILE)])
    source = PreparedCorpus.load(folder).corpus
    return CorpusRecord(os.path.abspath(folder), source.direction, digest, os.path.abspath(folder))


def _recorded_corpus(out_dir, data, direction):
    """(prepared folder, corpus record) of a resumed run, if `data` is the corpus it was trained on."""
    saved = run_folder.read_corpus(out_dir)
    requested = _prepared_record(data) if is_prepared(data) else corpus_lib.corpus_record(data, direction)
    if (saved.sha256, saved.direction) != (requested.sha256, requested.direction):
        raise ValueError(
            f"{out_dir} was trained on {saved.data} ({saved.direction}), not on {data} "
            f"({direction}) as it is now; use a new --out directory."
        )
    return saved.prepared_folder(out_dir), saved


def _prepare_beside(out_dir, data, direction, vocab_size, tokenizer=None):
    """A new run's corpus prepared into a temporary sibling of `out_dir` (one of a killed start is
    removed first), encoded with `tokenizer` (a file) if given."""
    parent = os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    folders.remove_abandoned(parent, DATA_PREFIX)
    folder = os.path.join(parent, f"{DATA_PREFIX}{os.getpid()}-{os.path.basename(os.path.abspath(out_dir))}")
    shutil.rmtree(folder, ignore_errors=True)
    options = prepare_lib.PrepareOptions(direction, vocab_size, tokenizer=tokenizer)
    prepare_lib.prepare(data, folder, options, lock=False)  # under the run's lock
    folders.claim(folder)  # a killed start's is then removed by the next (run_folder.create releases it)
    return folder

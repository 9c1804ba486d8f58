"""A run's data before it trains: its config (the preset's, or the saved one when resuming), its
corpus prepared (kformer.data.prepare) and its tokenizer, checked against what the run folder
recorded."""

import logging
import os
import shutil

from kformer import folders, run_folder
from kformer.data import corpus as corpus_lib
from kformer.data import prepare as prepare_lib
from kformer.data import tokenizer as tokenizer_lib
from kformer.model.config import (
    DEFAULT_DIRECTION,
    DEFAULT_PRESET,
    TransformerConfig,
    preset,
    tokenizer_digest,
)
from kformer.train import init_from as init_from_lib

log = logging.getLogger("kformer")


def _config(config_name, overrides, source, vocab_size, tokenizer_sha256):
    """A run's config: the preset's (default: DEFAULT_PRESET) with `overrides`, bound to its
    tokenizer; or, starting from a trained run (`source`), that run's with the fine-tuning recipe."""
    if source is not None:
        return init_from_lib.fine_tune_config(source, config_name, overrides)
    return preset(
        config_name or DEFAULT_PRESET, vocab_size=vocab_size, tokenizer_sha256=tokenizer_sha256, **overrides
    )


def _requested_config(out_dir, config_name, overrides, source):
    """The saved config when resuming (the one asked for must agree), or None for a new run."""
    saved_path = run_folder.path(out_dir, run_folder.CONFIG_FILE)
    if not os.path.exists(saved_path):
        return None
    init_from_lib.check_recorded(out_dir, source)
    saved = TransformerConfig.load(saved_path)
    requested = _config(config_name, overrides, source, saved.vocab_size, saved.tokenizer_sha256)
    if requested != saved:
        diff = {
            k: (v, requested.to_dict()[k]) for k, v in saved.to_dict().items() if requested.to_dict()[k] != v
        }
        raise ValueError(
            f"{out_dir} holds a run with another config (saved vs requested: {diff}); "
            "use a new --out directory. Nothing was overwritten."
        )
    return saved


DATA_PREFIX = ".kformer-data-"  # a new run's corpus, prepared beside its folder until training starts


def run_data(out_dir, options):
    """The run's corpus, prepared (kformer.data.prepare), and its tokenizer and config. A new run's
    corpus is prepared into a temporary sibling of `out_dir`, which `run_folder.create` moves in
    once training starts (so a failed start leaves no folder behind); a resumed run's is the one it
    recorded, after checking it is the corpus asked for; a prepared folder given as `data` is read
    where it is (its direction is the one it was prepared in). Writes nothing in `out_dir`.
    options: a TrainOptions; its config_name, data, direction, vocab_size, overrides (batch_tokens,
    accumulate) and init_from count here. init_from: its tokenizer encodes the corpus, its
    direction and model sizes are kept (a config or direction that differs is refused).
    Returns (config, tokenizer, prepared folder, corpus record)."""
    config_name, data, vocab_size = options.config_name, options.data, options.vocab_size
    overrides, init_from, direction = options.config_overrides(), options.init_from, options.direction
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ValueError(f"--out {out_dir} is a file, not a folder; choose a folder name")
    source = init_from_lib.open_source(init_from) if init_from else None
    if source is not None:
        init_from_lib.check_direction(source, direction)
    direction = source.direction if source else direction or DEFAULT_DIRECTION
    config = _requested_config(out_dir, config_name, overrides, source)
    if config is not None:
        folder, corpus = _recorded_corpus(out_dir, data, direction)
    elif prepare_lib.is_prepared(data):
        folder, corpus = os.path.abspath(data), _prepared_record(data)
    else:
        given = None if source is None else source.tokenizer_path
        folder = _prepare_beside(out_dir, data, direction, vocab_size, given)
        corpus = {**prepare_lib.load(folder)["corpus"], "prepared": run_folder.DATA_DIR}
    manifest = prepare_lib.load(folder)
    log.info("corpus: %s", prepare_lib.summary(manifest))
    tokenizer_path = (
        os.path.join(folder, prepare_lib.TOKENIZER)
        if config is None
        else run_folder.path(out_dir, run_folder.TOKENIZER_FILE)
    )
    tokenizer = tokenizer_lib.load_tokenizer(tokenizer_path)
    if config is None:
        if source is not None and tokenizer_digest(tokenizer) != source.tokenizer_sha256:
            raise ValueError(
                f"{folder} was prepared with another tokenizer than --init-from {source.run_dir}'s; "
                "give the corpus as a file, or prepare it with `kformer prepare --tokenizer RUN/tokenizer.model`"
            )
        config = _config(
            config_name, overrides, source, tokenizer.get_piece_size(), tokenizer_digest(tokenizer)
        )
        if source is not None:
            init_from_lib.report_coverage(manifest, source)
    config.check_tokenizer(tokenizer, tokenizer_path)
    if tokenizer_digest(tokenizer) != manifest["tokenizer"]["sha256"]:
        raise ValueError(f"{folder} was prepared with another tokenizer than {tokenizer_path}'s")
    return config, tokenizer, folder, corpus


def _prepared_record(folder):
    """What a run records of a prepared folder it trains on: the folder and its manifest's digest."""
    digest = corpus_lib.files_sha256([os.path.join(folder, prepare_lib.MANIFEST)])
    source = prepare_lib.load(folder)["corpus"]
    return {
        "data": os.path.abspath(folder),
        "direction": source["direction"],
        "sha256": digest,
        "prepared": os.path.abspath(folder),
    }


def _recorded_corpus(out_dir, data, direction):
    """(prepared folder, corpus record) of a resumed run, if `data` is the corpus it was trained on."""
    saved = run_folder.read_corpus(out_dir)
    requested = (
        _prepared_record(data) if prepare_lib.is_prepared(data) else corpus_lib.corpus_record(data, direction)
    )
    if (saved.get("sha256"), saved["direction"]) != (requested["sha256"], requested["direction"]):
        raise ValueError(
            f"{out_dir} was trained on {saved['data']} ({saved['direction']}), not on {data} "
            f"({direction}) as it is now; use a new --out directory."
        )
    return run_folder.prepared_folder(out_dir), saved


def _prepare_beside(out_dir, data, direction, vocab_size, tokenizer=None):
    """A new run's corpus prepared into a temporary sibling of `out_dir` (one of a killed start is
    removed first), encoded with `tokenizer` (a file) if given."""
    parent = os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    folders.remove_abandoned(parent, DATA_PREFIX)
    folder = os.path.join(parent, f"{DATA_PREFIX}{os.getpid()}-{os.path.basename(os.path.abspath(out_dir))}")
    shutil.rmtree(folder, ignore_errors=True)
    prepare_lib.prepare(data, folder, direction, vocab_size, lock=False, tokenizer=tokenizer)  # run's lock
    return folder

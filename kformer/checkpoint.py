"""The run directory: its file names, saving and loading, and the checks that keep its files together.

A run directory holds:
    config.json      the TransformerConfig (model sizes and the training recipe)
    tokenizer.model  the joint SentencePiece model
    corpus.json      which corpus and direction the splits come from
    model.keras      weights to translate with + optimizer state, written atomically
    training.json    where training stands: steps, seconds spent of the budget, the schedule in force
    logs/            TensorBoard events and history.csv

With weight averaging on, model.keras stores the *averaged* weights as the model's weights, so
every reader (translate, evaluate, export) gets them with a plain `load_weights`; the raw training
weights sit in the optimizer's average slots, and `restore` swaps them back to resume training.
"""

import collections
import os

from kformer import data as data_lib
from kformer.config import TransformerConfig, read_json, write_json

CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.model"
CORPUS_FILE = "corpus.json"
MODEL_FILE = "model.keras"
STATE_FILE = "training.json"
LOGS_DIR = "logs"

Run = collections.namedtuple("Run", "model config tokenizer corpus")


def path(run_dir, name):
    return os.path.join(run_dir, name)


def _averages(model):
    """(model variables, their moving averages) when the optimizer averages weights, else None."""
    optimizer = getattr(model, "optimizer", None)
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)  # under a LossScaleOptimizer
    if optimizer is None or not getattr(optimizer, "use_ema", False) or not optimizer.built:
        return None
    return model.trainable_variables, optimizer._model_variables_moving_average  # Keras keeps them private


def swap_average(model):
    """Exchanges the model's weights with their moving averages (no-op without averaging)."""
    pairs = _averages(model)
    if pairs is None:
        return
    from keras import ops

    for variable, average in zip(*pairs):
        value = ops.convert_to_numpy(variable.value)  # a copy: `.value` may be a live reference
        variable.assign(average.value)
        average.assign(value)


def save(model, model_path, state=None):
    """Writes model.keras (averaged weights as the model's, see the module doc) atomically,
    then training.json with `state`."""
    tmp = model_path[: -len(".keras")] + ".tmp.keras"
    swap_average(model)
    try:
        model.save(tmp)
    finally:
        swap_average(model)
    os.replace(tmp, model_path)
    if state is not None:
        write_json(path(os.path.dirname(model_path), STATE_FILE), state)


def restore(model, model_path):
    """Loads weights (and optimizer state, if compiled and built) from a .keras file with a clear error;
    a model being trained gets its raw weights back (the averages return to the optimizer)."""
    try:
        model.load_weights(model_path)
    except Exception as e:  # h5py/zip/shape errors all mean the same to a user
        raise ValueError(f"{model_path}: cannot restore the model from this checkpoint ({type(e).__name__}: {e}). "
                         "It is corrupted or belongs to another config; nothing was overwritten.") from None
    swap_average(model)


def read_state(run_dir):
    """training.json of a run, or {} for a new run."""
    file_path = path(run_dir, STATE_FILE)
    return read_json(file_path) if os.path.exists(file_path) else {}


def read_corpus(run_dir):
    """corpus.json as {"data": "default" | path | (source path, target path), "direction": "zh-en"}."""
    corpus = read_json(path(run_dir, CORPUS_FILE))
    if not isinstance(corpus["data"], str):
        corpus["data"] = tuple(corpus["data"])
    return corpus


def load(run_dir):
    """Loads a trained run for translation: Run(model, config, tokenizer, corpus). Safe mode is on;
    the config, tokenizer and weights are checked against each other."""
    from kformer.model import Transformer

    for name in (CONFIG_FILE, MODEL_FILE):
        if not os.path.exists(path(run_dir, name)):
            raise FileNotFoundError(f"{path(run_dir, name)} not found: is {run_dir} a kformer training directory?")
    config = TransformerConfig.load(path(run_dir, CONFIG_FILE))
    tokenizer = data_lib.load_tokenizer(path(run_dir, TOKENIZER_FILE))
    data_lib.check_tokenizer(tokenizer, config, path(run_dir, TOKENIZER_FILE))
    model = Transformer(config)
    restore(model, path(run_dir, MODEL_FILE))
    corpus = read_corpus(run_dir) if os.path.exists(path(run_dir, CORPUS_FILE)) else None
    return Run(model, config, tokenizer, corpus)

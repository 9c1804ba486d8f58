"""A run folder's weights and the checks that keep its files together: creating a run, saving
and restoring model.keras with its training state, and loading a trained run for translation. The
folder's files and records are kformer.contracts.run's.

With weight averaging on, model.keras stores the *averaged* weights as the model's weights, so
every reader (translate, evaluate, export) gets them with a plain `load_weights`; the raw training
weights sit in the optimizer's average slots, and `restore` swaps them back to resume training.
Readers take best.weights.h5 where a run has one, model.keras otherwise or when asked ("last").
"""

import dataclasses
import logging
import os
import shutil

from kformer import folders
from kformer.contracts.pair import LanguagePair
from kformer.contracts.run import (
    BEST_FILE,
    BEST_WEIGHTS_FILE,
    CONFIG_FILE,
    CORPUS_FILE,
    DATA_DIR,
    IMPORT_FILE,
    INIT_FILE,
    INPUT_PREFIX,
    MODEL_FILE,
    PENDING_STATE_FILE,
    RECIPE_FILE,
    STATE_FILE,
    WEIGHTS,
    BestRecord,
    CorpusRecord,
    ImportRecord,
    RunError,
    TrainingState,
    is_run,
)
from kformer.data import vocabulary
from kformer.model.config import ModelConfig

log = logging.getLogger("kformer")


@dataclasses.dataclass(frozen=True)
class Run:
    """A trained run loaded for translation."""

    model: "keras.Model"  # noqa: F821  (kformer.model.transformer.Transformer; Keras loads lazily)
    config: ModelConfig
    tokenizer: "sentencepiece.SentencePieceProcessor"  # noqa: F821
    corpus: CorpusRecord | None
    pair: LanguagePair | None = None  # what it translates: its corpus's, or what it was imported as

    @property
    def language(self):
        """The language it translates into, or None where it is not recorded."""
        return None if self.pair is None else self.pair.target


def path(run_dir, name):
    return os.path.join(run_dir, name)


def create(run_dir, config, recipe, tokenizer, corpus, prepared=None):
    """Writes a new run's config.json, recipe.json, tokenizer (vocabulary.save) and corpus.json (a
    CorpusRecord; nothing for an existing run), moves a corpus prepared for it (`prepared`, a
    folder outside the run) to data/, and removes the temporary file a save killed midway leaves."""
    os.makedirs(run_dir, exist_ok=True)
    stale = _temporary(path(run_dir, MODEL_FILE))
    if os.path.exists(stale):
        os.remove(stale)
    if is_run(run_dir):
        return
    if prepared is not None and corpus.prepared == DATA_DIR:
        folders.release(prepared)
        os.replace(prepared, path(run_dir, DATA_DIR))
    vocabulary.save(tokenizer, run_dir)
    corpus.save(path(run_dir, CORPUS_FILE))
    recipe.save(path(run_dir, RECIPE_FILE))
    config.save(path(run_dir, CONFIG_FILE))  # last: its presence marks a run


def _temporary(model_path):
    return model_path[: -len(".keras")] + ".tmp.keras"


def _averages(model):
    """(model variables, their moving averages) when the optimizer averages weights, else None."""
    optimizer = getattr(model, "optimizer", None)
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)  # under a LossScaleOptimizer
    if optimizer is None or not getattr(optimizer, "use_ema", False) or not optimizer.built:
        return None
    return model.trainable_variables, optimizer._model_variables_moving_average  # Keras keeps them private


def assign_weights(model, values):
    """Sets each of `model`'s weights to values[its path]: the weights of another model of the
    same config, in any compute precision (cast to the variable's dtype)."""
    from keras import ops

    for variable in model.weights:
        variable.assign(ops.cast(values[variable.path], variable.dtype))


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


def save(model, model_path, state=None, input_iterator=None):
    """Writes model.keras (averaged weights as the model's, see the module doc) atomically, and
    training.json with `state` (a TrainingState, its steps the optimizer's). Two files cannot be
    replaced at once: the state is written first as training.pending.json, so a kill between the
    two renames leaves the state that belongs to the new model.keras for `read_state` to find.
    With `input_iterator` (the iterator `fit` reads), its position is saved too, named in the
    state (`input`), and the positions of earlier saves are removed once the new state is in place."""
    run_dir = os.path.dirname(model_path)
    if input_iterator is not None:
        import tensorflow as tf

        name = f"{INPUT_PREFIX}{state.steps}"
        tf.train.Checkpoint(iterator=input_iterator).write(path(run_dir, name))
        state = dataclasses.replace(state, input=name)
    tmp = _temporary(model_path)
    swap_average(model)
    try:
        model.save(tmp)
    finally:
        swap_average(model)
    if state is not None:
        state.save(path(run_dir, PENDING_STATE_FILE))
    os.replace(tmp, model_path)
    if state is not None:
        os.replace(path(run_dir, PENDING_STATE_FILE), path(run_dir, STATE_FILE))
    if input_iterator is not None:
        _remove_inputs(run_dir, keep=state.input)


def _remove_inputs(run_dir, keep):
    """Removes the input positions (`input-STEPS.*`) other than `keep`: those of earlier saves, and
    the partial files of a save that was killed (TensorFlow's `input-STEPS_temp/` folder among them)."""
    for name in os.listdir(run_dir):
        if name.startswith(INPUT_PREFIX) and name.split(".")[0] != keep:
            found = path(run_dir, name)
            shutil.rmtree(found) if os.path.isdir(found) else os.remove(found)


def saved_input(run_dir, state):
    """The path of the input position saved with the checkpoint whose `state` is given, or None:
    none was saved, or it cannot be read (cut short, corrupted; a warning names it). The
    checkpoint's weights do not depend on it: without it, the run rebuilds its batch stream."""
    name = state.input
    if not name or not os.path.exists(path(run_dir, name + ".index")):
        return None
    problem = _unreadable(path(run_dir, name))
    if problem is not None:
        log.warning(
            "%s cannot be read (%s); resuming from %s without it", path(run_dir, name), problem, MODEL_FILE
        )
        return None
    return path(run_dir, name)


def _unreadable(checkpoint):
    """What keeps a tf.train checkpoint (its path prefix) from being read whole, or None: every
    tensor is read, so that a file cut short fails here, not inside model.fit."""
    import tensorflow as tf

    try:
        dtypes = tf.train.load_checkpoint(checkpoint).get_variable_to_dtype_map()
        names = sorted(dtypes)
        tf.raw_ops.RestoreV2(
            prefix=checkpoint,
            tensor_names=names,
            shape_and_slices=[""] * len(names),
            dtypes=[dtypes[n] for n in names],
        )
    except (tf.errors.OpError, ValueError, IndexError) as e:
        return f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else 'unreadable'}"
    return None


def restore_input(iterator, input_path):
    """Sets `iterator` (a fresh iterator over the same seeded dataset) to a saved position."""
    import tensorflow as tf

    tf.train.Checkpoint(iterator=iterator).read(input_path).assert_consumed()


def restore(model, model_path):
    """Loads weights (and optimizer state, if compiled and built) from a .keras file with a clear error;
    a model being trained gets its raw weights back (the averages return to the optimizer)."""
    try:
        model.load_weights(model_path)
    except Exception as e:  # h5py/zip/shape errors all mean the same to a user
        raise ValueError(
            f"{model_path}: cannot restore the model from this checkpoint ({type(e).__name__}: {e}). "
            "It is corrupted or belongs to another config; nothing was overwritten."
        ) from None
    swap_average(model)


def read_state(run_dir, steps=None):
    """training.json of a run, or an empty TrainingState for a new run. Given `steps` (the
    optimizer step restored from model.keras), the state of a save killed between its two renames
    is used if it is the one that belongs to those steps."""
    file_path, pending = path(run_dir, STATE_FILE), path(run_dir, PENDING_STATE_FILE)
    try:
        state = TrainingState.load(file_path) if os.path.exists(file_path) else TrainingState()
    except RunError as e:
        raise RunError(
            f"{e}; it records where training stands: remove it to resume from {MODEL_FILE}'s step "
            "(the batch stream is then rebuilt, and the time spent so far not counted)"
        ) from None
    if steps is not None and state.steps != steps and os.path.exists(pending):
        try:
            candidate = TrainingState.load(pending)
        except RunError as e:  # a save killed while writing it: the state in place stands
            log.warning("%s; resuming from %s", e, file_path)
            return state
        if candidate.steps == steps:
            return candidate
    return state


def read_corpus(run_dir):
    """The run's CorpusRecord (corpus.json), or a RunError naming what is not a run."""
    corpus_path = path(run_dir, CORPUS_FILE)
    if not os.path.exists(corpus_path):
        raise RunError(f"{corpus_path} not found: is {run_dir} a kformer training directory?")
    return CorpusRecord.load(corpus_path)


def prepared_folder(run_dir):
    """The prepared corpus a run trains on (kformer.data.prepare): its data/ or the folder it was given."""
    return read_corpus(run_dir).prepared_folder(run_dir)


def weights_file(run_dir, weights="best"):
    """The weights a reader translates with: best.weights.h5 where training kept one and `weights`
    is "best", else model.keras (the last saved)."""
    if weights not in WEIGHTS:
        raise ValueError(f"weights must be one of {WEIGHTS}, got {weights!r}")
    best = path(run_dir, BEST_WEIGHTS_FILE)
    return best if weights == "best" and os.path.exists(best) else path(run_dir, MODEL_FILE)


def describe_weights(run_dir, file_path):
    """What a user reads about the weights in use: the file, its step and, for the best, its score."""
    if os.path.basename(file_path) == BEST_WEIGHTS_FILE and os.path.exists(path(run_dir, BEST_FILE)):
        best = BestRecord.load(path(run_dir, BEST_FILE))
        start = best.step == 0 and os.path.exists(path(run_dir, INIT_FILE))
        return (
            f"{BEST_WEIGHTS_FILE} (step {best.step}, kept by its {best.describe()}"
            f"{': the weights this fine-tune started from' if start else ''}; "
            f"--weights last for {MODEL_FILE})"
        )
    imported = path(run_dir, IMPORT_FILE)
    if os.path.exists(imported) and not os.path.exists(path(run_dir, STATE_FILE)):
        record = ImportRecord.load(imported)
        return f"{MODEL_FILE} (imported from {record.kind} {record.source})"
    return f"{MODEL_FILE} (the last saved, step {read_state(run_dir).steps})"


def load(run_dir, weights="best"):
    """Loads a trained run for translation: Run(model, config, tokenizer, corpus), with the weights
    `weights_file` picks (logged). Safe mode is on; the config, tokenizer and weights are checked
    against each other."""
    from kformer.model.transformer import Transformer

    for name in (CONFIG_FILE, MODEL_FILE):
        if not os.path.exists(path(run_dir, name)):
            raise FileNotFoundError(
                f"{path(run_dir, name)} not found: is {run_dir} a kformer training directory?"
            )
    config = ModelConfig.load(path(run_dir, CONFIG_FILE))
    tokenizer = vocabulary.open_tokenizer(run_dir)
    config.check_tokenizer(tokenizer, run_dir)
    model = Transformer(config)
    chosen = weights_file(run_dir, weights)
    restore(model, chosen)
    log.info("weights: %s", describe_weights(run_dir, chosen))
    corpus = read_corpus(run_dir) if os.path.exists(path(run_dir, CORPUS_FILE)) else None
    imported = path(run_dir, IMPORT_FILE)
    pair = (
        corpus.direction
        if corpus
        else ImportRecord.load(imported).direction
        if os.path.exists(imported)
        else None
    )
    return Run(model, config, tokenizer, corpus, pair)

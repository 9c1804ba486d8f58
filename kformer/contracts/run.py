"""A training run's folder: its file names and the JSON records it keeps (kformer.run_folder
writes and reads the weights).

    config.json      the model's config (kformer.model.config.ModelConfig)
    recipe.json      how it is trained (kformer.train.recipe.TrainingRecipe); runs written before
                     it existed hold the recipe's fields in config.json
    tokenizer.model  the SentencePiece model
    corpus.json      `CorpusRecord`: the corpus, its language pair and where it was prepared
    data/            the corpus as `kformer prepare` writes it (contracts.prepared)
    model.keras      the weights to translate with and the optimizer state, written atomically
    training.json    `TrainingState`: where training stands, and the name of the input position
                     (`input-STEPS.*`) saved with model.keras
    best.weights.h5  the weights that scored best on the dev sample, with best.json (`BestRecord`)
    init.json        `InitRecord`: the run a fine-tuning run started from
    import.json      `ImportRecord`: what `kformer import` made the run from (such a run has no
                     corpus.json, recipe.json or training.json; its tokenizer may be tokenizer.json's)
    logs/            TensorBoard events, history.csv, evaluations.csv
"""

import dataclasses
import os

from kformer.contracts.json_records import Record
from kformer.contracts.pair import LanguagePair
from kformer.contracts.prepared import CorpusSource

CONFIG_FILE = "config.json"
RECIPE_FILE = "recipe.json"
CORPUS_FILE = "corpus.json"
MODEL_FILE = "model.keras"
STATE_FILE = "training.json"
PENDING_STATE_FILE = "training.pending.json"  # kformer.run_folder.save: written before model.keras
LOGS_DIR = "logs"
DATA_DIR = "data"  # the run's prepared corpus, unless it trains on a prepared folder given
INPUT_PREFIX = "input-"  # + steps: a tf.data iterator checkpoint (.index and .data-* files)
BEST_WEIGHTS_FILE = "best.weights.h5"
BEST_FILE = "best.json"
INIT_FILE = "init.json"
IMPORT_FILE = "import.json"
WEIGHTS = ("best", "last")  # which weights a reader takes: the best kept (where kept), or model.keras


class RunError(ValueError):
    """A run folder that is not one, or a file of it that is malformed; names the file."""


class RunRecord(Record):
    """A JSON file of a run folder: a malformed one is a RunError."""

    ERROR = RunError


def is_run(run_dir):
    """Whether the run has started: config.json is written last when it does."""
    return os.path.exists(os.path.join(run_dir, CONFIG_FILE))


@dataclasses.dataclass(frozen=True)
class CorpusRecord(CorpusSource):
    """corpus.json: the corpus the run trains on (a prepared folder's path as `data` when it was
    given one) and where it was prepared: "data" (the run's data/) or that folder's path."""

    ERROR = RunError

    prepared: str = DATA_DIR

    def prepared_folder(self, run_dir):
        return os.path.join(run_dir, DATA_DIR) if self.prepared == DATA_DIR else self.prepared


@dataclasses.dataclass(frozen=True)
class TrainingState(RunRecord):
    """training.json: optimizer steps, seconds of the budget spent, the schedule in force, the
    replicas that trained, the input position saved with model.keras."""

    steps: int = 0
    seconds: float = 0.0
    schedule: dict[str, float] | None = None
    replicas: int = 1
    input: str | None = None


BLEU, LOSS = "bleu", "loss"  # what a run keeps its best weights by (kformer.train.judge)
JUDGES = (BLEU, LOSS)


def describe_score(judge, bleu, loss):
    """Dev scores in words, the one `judge` ranks by first."""
    if judge == LOSS:
        return f"dev loss {loss:.4f} (dev sample BLEU {bleu:.2f})"
    return f"dev sample BLEU {bleu:.2f}"


@dataclasses.dataclass(frozen=True)
class BestRecord(RunRecord):
    """best.json: the step and dev sample scores of best.weights.h5, what they were kept by
    (`judge`: "bleu", or "loss" of the whole dev split: kformer.train.judge), and how many
    evaluations since have not beaten it."""

    step: int
    bleu: float
    chrf: float
    evaluations_since: int = 0
    sentences: int = 0
    loss: float | None = None
    judge: str = BLEU

    def describe(self):
        return describe_score(self.judge, self.bleu, self.loss)


@dataclasses.dataclass(frozen=True)
class InitRecord(RunRecord):
    """init.json: the run a fine-tuning run started from, its weights (described, and their
    sha256), and the share of that run's pairs mixed into each batch."""

    run: str
    weights: str
    sha256: str
    mix_original: float | None = None


@dataclasses.dataclass(frozen=True)
class ImportRecord(RunRecord):
    """import.json: the kind of model imported ("marian"), the folder or file it came from, the
    sha256 of its weights, the language pair it translates, and the licence file copied beside
    it (None: the source had none)."""

    kind: str
    source: str
    sha256: str
    direction: LanguagePair
    licence: str | None = None

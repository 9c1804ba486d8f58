"""BLEU and chrF (sacrebleu) of any runner (kformer.decode.runner.Runner: the Keras model or an
exported file) on a held-out split or on user files."""

import collections
import logging
import os

import sacrebleu

from kformer import run_folder
from kformer.contracts.export import MANIFEST_FILE, ExportManifest
from kformer.contracts.run import IMPORT_FILE
from kformer.data import corpus as corpus_lib
from kformer.data import prepare as prepare_lib

log = logging.getLogger("kformer")


def split_references(model_dir, split="test"):
    """(sources, references) of a held-out split of the corpus a model was trained on, as it was
    prepared (kformer.data.prepare): `group_references` of its pairs. `model_dir`: a training
    directory, or an export folder (the run it was exported from). An empty split is refused."""
    if os.path.exists(os.path.join(model_dir, MANIFEST_FILE)):
        trained_in = ExportManifest.load(model_dir).trained_in
        if trained_in is None:
            raise ValueError(
                f"{os.path.join(model_dir, MANIFEST_FILE)} records no training folder (trained_in) to "
                "take the split from; give --source and --reference"
            )
        model_dir = trained_in
    if os.path.exists(os.path.join(model_dir, IMPORT_FILE)):
        raise ValueError(
            f"{model_dir} was imported ({IMPORT_FILE}) and has no corpus to take the {split} split "
            "from (kformer evaluate: give --source and --reference)"
        )
    pairs = prepare_lib.held_out(run_folder.prepared_folder(model_dir), split)
    if not pairs:  # a corpus of a few hundred pairs holds none out
        raise ValueError(
            f"{model_dir}'s {split} split is empty: its corpus was too small to hold pairs out "
            "(kformer evaluate: give --source and --reference)"
        )
    return group_references(pairs)


def file_references(source_file, reference_file):
    """(sources, references) of a source file and its reference file, one sentence a line."""
    sources = corpus_lib.read_text_file(source_file)
    references = [[r] for r in corpus_lib.read_text_file(reference_file)]
    if len(sources) != len(references):
        raise ValueError(f"{source_file} has {len(sources)} lines but {reference_file} has {len(references)}")
    return sources, references


def group_references(pairs):
    """(distinct sources in order, their references): all translations of one source sentence
    become its references (Tatoeba often has several)."""
    grouped = collections.OrderedDict()
    for source, target in pairs:
        grouped.setdefault(source, []).append(target)
    return list(grouped), list(grouped.values())


def score(hypotheses, references, language="en"):
    """Corpus BLEU and chrF; references is one list of strings per hypothesis (any number).
    Chinese targets use sacrebleu's `zh` tokenizer."""
    width = max(len(r) for r in references)
    streams = [[r[i] if i < len(r) else None for r in references] for i in range(width)]
    # force: the hypotheses are detokenized text (early, poor ones can look tokenized to sacrebleu)
    bleu = sacrebleu.BLEU(tokenize="zh" if language == "zh" else "13a", force=True)
    chrf = sacrebleu.CHRF()
    bleu_score, chrf_score = bleu.corpus_score(hypotheses, streams), chrf.corpus_score(hypotheses, streams)
    return {
        "bleu": bleu_score.score,
        "chrf": chrf_score.score,
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
        "sentences": len(hypotheses),
        "bleu_detail": str(bleu_score),
    }


def check_writable(file_path):
    """A one-line error, before any translation work, for an output file that cannot be written."""
    folder = os.path.dirname(os.path.abspath(file_path))
    if os.path.isdir(file_path):
        raise ValueError(f"--output {file_path} is a folder; give a file name")
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise ValueError(f"--output {file_path}: cannot write in {folder} (missing or not writable)")


def evaluate(runner, sources, references, output=None):
    """Translates `sources` with `runner` (its own search options) and scores the translations
    against `references` (a list of strings per source) in the runner's target language; writes
    them, one per line, to `output` if given. Returns `score`'s dict with "beam_size",
    "hypotheses_file" and "examples" (source, references, hypothesis)."""
    if not sources:
        raise ValueError("nothing to evaluate: no sentences")
    if output is not None:
        check_writable(output)  # before the translation work, which a bad path would otherwise lose
    log.info("translating %d sentences (beam %d)", len(sources), runner.options.beam_size)
    hypotheses = runner.translate(sources)
    if output is not None:
        with open(output, "w", encoding="utf-8") as f:
            f.writelines(h + "\n" for h in hypotheses)
    return score(hypotheses, references, runner.language) | {
        "hypotheses_file": output,
        "beam_size": runner.options.beam_size,
        "examples": list(zip(sources, references, hypotheses)),
    }


def print_scores(result):
    """The lines a user reads of an `evaluate` result: scores, sacrebleu's signatures, where the output went."""
    print(
        f"BLEU {result['bleu']:.2f}  chrF {result['chrf']:.2f}  ({result['sentences']} sentences, "
        f"beam {result['beam_size']})"
    )
    print(f"  {result['bleu_detail']}")
    print(f"  BLEU signature: {result['bleu_signature']}")
    print(f"  chrF signature: {result['chrf_signature']}")
    if result["hypotheses_file"]:
        print(f"  hypotheses: {result['hypotheses_file']}")

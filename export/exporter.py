"""`kformer export`: build the translator once, write every format from it, verify each."""

import functools
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import metadata

import numpy as np

from export import writers
from export.module import ExportModule
from export.runtime import DEFAULT_FORMATS, FORMATS, MANIFEST, VARIANTS, sha256
from kformer import extras
from kformer.config import BEAM_SIZE, LENGTH_PENALTY

QUANTIZATIONS = ("fp16", "int8")  # variants written only when asked for (--quantize)
log = logging.getLogger("kformer")
PACKAGES = (
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


def _plan(formats, quantize, tokenizer_proto, config):
    """(file, format, variant, writer) for every artifact to write. Each file serves both searches:
    TFLite's as two signatures, ONNX's behind an input, the others as they are."""

    def variants(fmt):  # those that are not quantizations, and the quantizations asked for
        return [v for v in VARIANTS[fmt] if v not in QUANTIZATIONS or v in quantize]

    def beside(path, name):  # a file written before, in the same folder
        return os.path.join(os.path.dirname(path), name)

    onnx_writers = {
        "fp32": writers.write_onnx,
        "int8": lambda m, p: writers.quantize_onnx(beside(p, "fp32.onnx"), p),
        "text": lambda m, p: writers.write_onnx_text(
            beside(p, "fp32.onnx"), tokenizer_proto, config.to_dict(), p
        ),
    }
    steps = (
        [("savedmodel", "savedmodel", "fp32", writers.write_savedmodel)] if "savedmodel" in formats else []
    )
    if "tflite" in formats:
        steps += [
            (f"tflite/{v}.tflite", "tflite", v, functools.partial(writers.write_tflite, variant=v))
            for v in variants("tflite")
        ]
    if "onnx" in formats:  # fp32 first: the others are made from it
        steps += [
            (f"onnx/{v}.onnx", "onnx", v, onnx_writers[v])
            for v in ("fp32", "text", "int8")
            if v in variants("onnx")
        ]
    if "ctranslate2" in formats:
        steps += [
            (
                f"ctranslate2/{v}",
                "ctranslate2",
                v,
                functools.partial(writers.write_ctranslate2, tokenizer_proto=tokenizer_proto, variant=v),
            )
            for v in variants("ctranslate2")
        ]
    return steps


def export(
    model_dir,
    out_dir,
    formats=DEFAULT_FORMATS,
    quantize=(),
    beam_size=BEAM_SIZE,
    alpha=LENGTH_PENALTY,
    max_length=None,
    progress=print,
):
    """Writes the chosen formats of the model in `model_dir` to `out_dir` (which must not exist)
    with the tokenizer and a manifest, then checks every artifact against Keras (`verify`).
    Returns the manifest: its "artifacts" carry each one's "check" figures."""
    from kformer import checkpoint

    unknown = sorted(set(formats) - set(FORMATS)) + sorted(set(quantize) - set(QUANTIZATIONS))
    if unknown:
        raise ValueError(
            f"unknown formats/quantizations {unknown}; formats: {FORMATS}, quantize: {QUANTIZATIONS}"
        )
    if "ctranslate2" in formats:
        extras.require("ctranslate2", "--formats ctranslate2")
    if os.path.exists(out_dir) and (not os.path.isdir(out_dir) or os.listdir(out_dir)):
        raise ValueError(
            f"--out {out_dir} exists and is not an empty folder; choose a new --out (nothing was written)"
        )
    parent = os.path.dirname(os.path.abspath(out_dir))
    if os.path.isdir(parent) and not os.access(parent, os.W_OK):
        raise ValueError(f"--out {out_dir}: cannot write in {parent}")
    model, config, tokenizer, corpus = checkpoint.load(model_dir)
    with open(checkpoint.path(model_dir, checkpoint.TOKENIZER_FILE), "rb") as f:
        tokenizer_proto = f.read()
    module = ExportModule(model, tokenizer_proto, beam_size=beam_size, alpha=alpha, max_length=max_length)

    # Write into a temporary sibling and rename at the end: a failed export leaves nothing half-done.
    os.makedirs(parent, exist_ok=True)
    _remove_abandoned_work(parent)
    work = tempfile.mkdtemp(prefix=f"{WORK_PREFIX}{os.getpid()}-", dir=parent)
    try:
        shutil.copy(
            checkpoint.path(model_dir, checkpoint.TOKENIZER_FILE), os.path.join(work, "tokenizer.model")
        )
        artifacts, steps = [], _plan(formats, quantize, tokenizer_proto, config)
        for number, (file, fmt, variant, write) in enumerate(steps, start=1):
            progress(f"[{number}/{len(steps)}] {fmt} {variant} -> {file} ...", end=" ", flush=True)
            start = time.perf_counter()
            path = os.path.join(work, file)
            os.makedirs(os.path.dirname(path) or work, exist_ok=True)
            write(module, path)
            seconds = time.perf_counter() - start
            artifacts.append(
                {
                    "file": file,
                    "format": fmt,
                    "search": "all",  # both searches (older exports had a file for each)
                    "variant": variant,
                    "bytes": writers.file_size(path),
                    "seconds": round(seconds, 2),
                    "sha256": sha256(path),
                }
            )
            progress(f"{artifacts[-1]['bytes'] / 1e6:.1f} MB, {seconds:.1f}s")
        manifest = {
            "kformer_export": 1,
            "config": config.to_dict(),
            "beam_size": beam_size,
            "alpha": alpha,
            "max_length": module.translator.max_length,
            "tokenizer": {
                "file": "tokenizer.model",
                "sha256": sha256(os.path.join(work, "tokenizer.model")),
                "vocab_size": config.vocab_size,
            },
            "inputs": {
                "source_ids": {"dtype": "int32", "shape": ["batch", "length"], "pad_id": config.pad_id}
            },
            "outputs": {
                "greedy": {"tokens": ["int32", ["batch", "T"]], "scores": ["float32", ["batch"]]},
                "beam": {
                    "tokens": ["int32", ["batch", "beam", "T"]],
                    "scores": ["float32", ["batch", "beam"]],
                },
            },
            "savedmodel_signatures": {
                "greedy_ids": "source_ids -> tokens, scores",
                "beam_ids": "source_ids -> tokens, scores",
                "greedy_text": "text -> translation",
                "beam_text": "text -> translation",
            },
            "onnx_io": {
                "ids": "source_ids, beam -> tokens (batch, N, T), scores (batch, N)",
                "text": "text, beam -> translation",
                "beam": "bool scalar: true = beam search (N = beam_size), false = greedy (N = 1)",
            },
            "onnx_opset": writers.ONNX_OPSET,
            "artifacts": artifacts,
            "versions": _versions(),
            "trained_in": os.path.abspath(model_dir),
            "corpus": corpus,
        }
        _write_manifest(work, manifest)  # the runners read it during the check
        sources, references, checked_on = check_sentences(model_dir)
        progress(
            f"verifying on {checked_on}: fp32 must match Keras token for token; fp16/int8 report agreement"
        )
        results = verify(
            work, model, config, tokenizer, sources, references, corpus["direction"].split("-")[-1]
        )
        for entry in artifacts:
            entry["check"] = results[entry["file"]]
        manifest["checked_on"] = checked_on
        _write_manifest(work, manifest)
        if os.path.exists(out_dir):
            os.rmdir(out_dir)  # empty, checked above
        os.replace(work, out_dir)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return manifest


def print_summary(manifest, out_dir):
    """The table `kformer export` prints: each file's size, time to write and check figures."""
    print(f"checked on {manifest['checked_on']}: translations the same as Keras', and BLEU minus Keras' BLEU")
    print(f"{'file':28} {'MB':>7} {'seconds':>8} {'search':>7} {'same':>6} {'BLEU Δ':>7}")
    for a in manifest["artifacts"]:
        for search, check in a["check"].items():
            delta = "-" if check["bleu_delta"] is None else f"{check['bleu_delta']:+.2f}"
            print(
                f"{a['file']:28} {a['bytes'] / 1e6:7.2f} {a['seconds']:8.1f} {search:>7} "
                f"{check['agreement']:6.0%} {delta:>7}"
            )
    print(f"wrote {out_dir} (manifest.json, tokenizer.model and the files above)")


def _write_manifest(folder, manifest):
    with open(os.path.join(folder, MANIFEST), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2)


WORK_PREFIX = ".kformer-export-"


def _remove_abandoned_work(parent):
    """Removes the temporary folders of exports that were killed (their process no longer runs)."""
    for name in os.listdir(parent):
        pid = name[len(WORK_PREFIX) :].split("-")[0] if name.startswith(WORK_PREFIX) else ""
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}") and os.path.exists("/proc/self"):
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


def _versions():
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return versions


def probe_batches(config, rng_seed=0):
    """Source batches for the parity check: mixed lengths with padding, and a batch of one."""
    rng = np.random.default_rng(rng_seed)
    mixed = np.zeros((3, 9), np.int32)
    for row, length in enumerate((9, 4, 1)):
        mixed[row, :length] = rng.integers(4, config.vocab_size, size=length)
    return [mixed, mixed[1:2, :4]]


CHECK_SENTENCES = 100
PROBE_TEXTS = ["我們試試看！", "", "Tom is here.", "   ", "他很高興，因為他的朋友們都來參加了他的生日聚會。"]


def check_sentences(model_dir):
    """(sources, references, name): the first CHECK_SENTENCES dev sentences of the model's corpus,
    on which every artifact is compared with Keras; a few probe texts when the corpus is gone."""
    from kformer.evaluate import split_references

    try:
        sources, references = split_references(model_dir, "dev")
    except ValueError as e:
        log.warning("checking exports on %d probe texts, without BLEU: %s", len(PROBE_TEXTS), e)
        return PROBE_TEXTS, None, "probe texts"
    sources, references = sources[:CHECK_SENTENCES], references[:CHECK_SENTENCES]
    return sources, references, f"{len(sources)} dev sentences"


def _text_translations(artifact_dir, beam, texts):
    """`texts` through the text ONNX file, in a process without TensorFlow: loading the
    onnxruntime-extensions library next to TensorFlow/tensorflow-text crashes (both bundle
    SentencePiece and protobuf), and a device has no TensorFlow anyway."""
    code = (
        "import json, sys; from export.run_onnx import OnnxTextRunner; "
        "print(json.dumps(OnnxTextRunner(sys.argv[1], int(sys.argv[2])).translate(json.load(sys.stdin))))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, artifact_dir, str(beam)],
        input=json.dumps(texts),
        capture_output=True,
        text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    if result.returncode:
        raise writers.ExportError(f"the text ONNX file failed to run: {result.stderr[-1500:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def verify(artifact_dir, model, config, tokenizer, sources, references=None, language="en"):
    """Runs every artifact and compares it with the Keras model it came from.

    fp32 artifacts must give the Keras tokens on the probe batches (odd shapes), and every
    artifact, quantized or not, translates `sources`: fp32 and text files must give
    Keras' translations (else ExportError); quantized ones, and CTranslate2's beam search (another
    length normalization), report how many they translate as Keras does. Returns {file: {search:
    {"agreement": share of `sources` translated as Keras does,
    "bleu_delta": its BLEU minus Keras' against `references` (None without references)}}}.
    """
    from export.runtime import open_runner
    from kformer.evaluate import score
    from kformer.translate import Translator

    with open(os.path.join(artifact_dir, MANIFEST), encoding="utf-8") as f:
        manifest = json.load(f)
    beams = {"greedy": 1, "beam": manifest["beam_size"]}
    keras = {
        search: Translator(
            model, tokenizer, beam_size=beam, alpha=manifest["alpha"], max_length=manifest["max_length"]
        )
        for search, beam in beams.items()
    }
    expected = {search: translator.translate(sources) for search, translator in keras.items()}
    bleu = {
        search: score(outputs, references, language)["bleu"] if references else None
        for search, outputs in expected.items()
    }
    results = {}
    for entry in manifest["artifacts"]:
        searches = tuple(beams) if entry["search"] == "all" else (entry["search"],)
        for search in searches:
            where = f"{entry['file']} ({search})"
            exact = entry["variant"] in ("fp32", "text") and (entry["format"], search) != (
                "ctranslate2",
                "beam",
            )
            if entry["variant"] == "text":
                outputs = _text_translations(artifact_dir, beams[search], sources)
            else:
                runner = open_runner(artifact_dir, entry["format"], entry["variant"], beams[search])
                outputs = runner.translate(sources)
                if exact and entry["variant"] == "fp32":
                    _check_tokens(runner, keras[search], search, config, where)
            same = sum(a == b for a, b in zip(outputs, expected[search]))
            if exact and same != len(sources):
                raise writers.ExportError(
                    f"{where} translates {len(sources) - same} of {len(sources)} "
                    "check sentences differently from Keras"
                )
            delta = (
                None if bleu[search] is None else score(outputs, references, language)["bleu"] - bleu[search]
            )
            results.setdefault(entry["file"], {})[search] = {
                "agreement": same / len(sources),
                "bleu_delta": delta,
            }
    return results


def _check_tokens(runner, translator, search, config, where):
    for batch in probe_batches(config):
        expected = getattr(translator, search)(batch)["tokens"].numpy()
        tokens, _ = runner.search(batch)
        if not np.array_equal(tokens, expected):
            raise writers.ExportError(
                f"{where} gives tokens different from Keras on a probe batch {batch.shape}"
            )

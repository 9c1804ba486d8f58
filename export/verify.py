"""The export's check: every artifact is run and compared with the Keras model it came from.

A converter that succeeds proves nothing. fp32 files must give Keras' tokens on probe batches of
odd shapes and Keras' translations of the check sentences; quantized files, and CTranslate2's beam
search (another length normalization), report how many they translate as Keras does."""

import json
import logging

import numpy as np

from kformer.export.format import ExportError

log = logging.getLogger("kformer")
CHECK_SENTENCES = 100
PROBE_TEXTS = ["我們試試看！", "", "Tom is here.", "   ", "他很高興，因為他的朋友們都來參加了他的生日聚會。"]


def verify_export(artifact_dir, manifest, model_dir, model, config, tokenizer, progress=print):
    """Checks every artifact of `manifest` (written in `artifact_dir`) on the check sentences of
    the model's corpus; adds each entry's "check" and the manifest's "checked_on"."""
    sources, references, checked_on = check_sentences(model_dir)
    progress(f"verifying on {checked_on}: fp32 must match Keras token for token; fp16/int8 report agreement")
    language = manifest["corpus"]["direction"].split("-")[-1]
    results = verify(artifact_dir, model, config, tokenizer, sources, references, language)
    for entry in manifest["artifacts"]:
        entry["check"] = results[entry["file"]]
    manifest["checked_on"] = checked_on


def probe_batches(config, rng_seed=0):
    """Source batches for the parity check: mixed lengths with padding, and a batch of one."""
    rng = np.random.default_rng(rng_seed)
    mixed = np.zeros((3, 9), np.int32)
    for row, length in enumerate((9, 4, 1)):
        mixed[row, :length] = rng.integers(4, config.vocab_size, size=length)
    return [mixed, mixed[1:2, :4]]


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


TEXT_RUNNER = (
    "import json, sys; from kformer.export.onnx import OnnxTextRunner; "
    "print(json.dumps(OnnxTextRunner(sys.argv[1], int(sys.argv[2])).translate(json.load(sys.stdin))))"
)


def _text_translations(artifact_dir, beam, texts):
    """`texts` through the text ONNX file, in a process without TensorFlow: loading the
    onnxruntime-extensions library next to TensorFlow/tensorflow-text crashes (both bundle
    SentencePiece and protobuf), and a device has no TensorFlow anyway."""
    from kformer import subprocesses

    try:
        output = subprocesses.run_python(TEXT_RUNNER, artifact_dir, str(beam), stdin=json.dumps(texts))
    except subprocesses.Failed as e:
        raise ExportError(f"the text ONNX file failed to run: {e}") from None
    return json.loads(output.strip().splitlines()[-1])


def verify(artifact_dir, model, config, tokenizer, sources, references=None, language="en"):
    """Runs every artifact of the manifest in `artifact_dir` on `sources` and compares it with
    Keras (ExportError where an fp32 or text file differs). Returns {file: {search: {"agreement":
    share of `sources` translated as Keras does, "bleu_delta": its BLEU minus Keras' against
    `references` (None without references)}}}."""
    from kformer.decode.translator import Translator
    from kformer.evaluate import score
    from kformer.export import manifest as manifest_lib
    from kformer.export.formats import open_listed

    manifest = manifest_lib.load(artifact_dir)
    beams = {"greedy": 1, "beam": manifest["beam_size"]}
    keras = {
        search: Translator(
            model,
            tokenizer,
            beam_size=beam,
            alpha=manifest["alpha"],
            max_length=manifest["max_length"],
            no_repeat_ngram=manifest["no_repeat_ngram"],
        )
        for search, beam in beams.items()
    }
    language = manifest_lib.target_language(manifest)
    expected = {search: translator.translate(sources, language) for search, translator in keras.items()}
    bleu = {
        search: score(outputs, references, language)["bleu"] if references else None
        for search, outputs in expected.items()
    }
    results = {}
    for entry in manifest["artifacts"]:
        for search in beams:
            where = f"{entry['file']} ({search})"
            if entry["variant"] == "text":
                outputs = _text_translations(artifact_dir, beams[search], sources)
            else:
                runner = open_listed(artifact_dir, entry["format"], entry["variant"], beam_size=beams[search])
                outputs = runner.translate(sources)
                if must_match(entry, search) and entry["variant"] == "fp32":
                    _check_tokens(runner, keras[search], search, config, where)
            same = sum(a == b for a, b in zip(outputs, expected[search]))
            if must_match(entry, search) and same != len(sources):
                raise ExportError(
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


def must_match(entry, search):
    """Whether the file must translate as Keras does: fp32 and text files, except CTranslate2's
    beam search (its own length normalization)."""
    return entry["variant"] in ("fp32", "text") and (entry["format"], search) != ("ctranslate2", "beam")


def _check_tokens(runner, translator, search, config, where):
    for batch in probe_batches(config):
        expected, _ = translator.search(batch)
        tokens, _ = runner.search(batch)
        if not np.array_equal(tokens, expected):
            raise ExportError(f"{where} gives tokens different from Keras on a probe batch {batch.shape}")

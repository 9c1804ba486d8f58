"""The export's check: every artifact is run and compared with the Keras model it came from.

A converter that succeeds proves nothing. fp32 files must give Keras' tokens on probe batches of
odd shapes and Keras' translations of the check sentences; quantized files, and CTranslate2's beam
search (another length normalization), report how many they translate as Keras does."""

import dataclasses
import json
import logging

import numpy as np

from kformer.contracts.export import ExportManifest, SearchCheck
from kformer.decode.options import SearchOptions
from kformer.export.artifact_format import ExportError

log = logging.getLogger("kformer")
CHECK_SENTENCES = 100
PROBE_TEXTS = ["我們試試看！", "", "Tom is here.", "   ", "他很高興，因為他的朋友們都來參加了他的生日聚會。"]


def verify_export(artifact_dir, manifest, model_dir, run, progress=print):
    """Checks every artifact of `manifest` (written in `artifact_dir`) against `run`'s model (a
    kformer.run_folder.Run) on the check sentences of its corpus; returns the manifest with each
    artifact's check and what it was checked on."""
    sources, references, checked_on = check_sentences(model_dir)
    progress(f"verifying on {checked_on}: fp32 must match Keras token for token; fp16/int8 report agreement")
    results = verify(artifact_dir, run, sources, references)
    artifacts = tuple(dataclasses.replace(entry, check=results[entry.file]) for entry in manifest.artifacts)
    return manifest.replace(artifacts=artifacts, checked_on=checked_on)


def probe_batches(config, rng_seed=0):
    """Source batches for the parity check: mixed lengths with padding, and a batch of one."""
    rng = np.random.default_rng(rng_seed)
    mixed = np.zeros((3, 9), np.int32)
    for row, length in enumerate((9, 4, 1)):
        mixed[row, :length] = rng.integers(4, config.vocab_size, size=length)
    return [mixed, mixed[1:2, :4]]


def check_sentences(model_dir):
    """(sources, references, name): the first CHECK_SENTENCES dev sentences of the model's corpus,
    on which every artifact is compared with Keras; a few probe texts when the corpus is gone or
    its dev split is empty (a corpus of a few hundred pairs)."""
    from kformer.evaluate import split_references

    try:
        sources, references = split_references(model_dir, "dev")
    except ValueError as e:
        log.warning("checking exports on %d probe texts, without BLEU: %s", len(PROBE_TEXTS), e)
        return PROBE_TEXTS, None, "probe texts"
    sources, references = sources[:CHECK_SENTENCES], references[:CHECK_SENTENCES]
    return sources, references, f"{len(sources)} dev sentences"


TEXT_RUNNER = (
    "import json, sys; from kformer.decode.options import SearchOptions; "
    "from kformer.export.onnx import OnnxTextRunner; "
    "runner = OnnxTextRunner(sys.argv[1], options=SearchOptions(beam_size=int(sys.argv[2]))); "
    "print(json.dumps(runner.translate(json.load(sys.stdin))))"
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


def verify(artifact_dir, run, sources, references=None):
    """Runs every artifact of the manifest in `artifact_dir` on `sources` and compares it with
    `run`'s Keras model (ExportError where an fp32 or text file differs). Returns {file: {search:
    SearchCheck}}: the share of `sources` translated as Keras does, and its BLEU minus Keras'
    against `references` (None without references)."""
    from kformer.decode.translator import KerasRunner

    manifest = ExportManifest.load(artifact_dir)
    beams = {"greedy": 1, "beam": manifest.beam_size}
    defaults = SearchOptions(None, manifest.alpha, manifest.max_length, manifest.no_repeat_ngram)
    language = None if manifest.pair is None else manifest.pair.target
    keras = {
        search: KerasRunner(
            run.model, run.tokenizer, SearchOptions(beam_size=beam).over(defaults), language=language
        )
        for search, beam in beams.items()
    }
    expected = {search: runner.translate(sources) for search, runner in keras.items()}
    bleu = {search: _bleu(outputs, references, language) for search, outputs in expected.items()}
    results = {}
    for entry in manifest.artifacts:
        checked = _checked_sources(entry, run, sources)
        for search in beams:
            outputs = _artifact_translations(
                artifact_dir, entry, search, beams[search], keras[search], [sources[i] for i in checked]
            )
            same = sum(a == expected[search][i] for a, i in zip(outputs, checked))
            if must_match(entry, search) and same != len(checked):
                raise ExportError(
                    f"{entry.file} ({search}) translates {len(checked) - same} of {len(checked)} "
                    "check sentences differently from Keras"
                )
            delta = None
            if references is not None and len(checked) == len(sources):
                delta = _bleu(outputs, references, language) - bleu[search]
            results.setdefault(entry.file, {})[search] = SearchCheck(same / max(len(checked), 1), delta)
    return results


def _checked_sources(entry, run, sources):
    """The indices of `sources` an artifact is checked on: all, but for a TFLite text file those
    it translates as kformer.decode.text_batches does (kformer.export.text_graph.translate's
    stated difference: an over-long sentence is cut at its token limit, not at its clauses)."""
    from kformer.export.formats import FORMATS

    if entry.variant not in FORMATS[entry.format].text_graph_only:
        return list(range(len(sources)))
    from kformer.export.text_graph.translate import translated_alike

    limit = run.config.max_source_length
    return [i for i, text in enumerate(sources) if translated_alike(run.tokenizer, text, limit)]


def _bleu(outputs, references, language):
    """BLEU of `outputs` against `references`, None without references."""
    from kformer.evaluate import score

    return None if references is None else score(outputs, references, language)["bleu"]


def _artifact_translations(artifact_dir, entry, search, beam, keras, sources):
    """The translations of `sources` by the artifact `entry` with `search`; an fp32 file's tokens
    are also checked against Keras' (`keras`: the KerasRunner of that search) on probe batches."""
    from kformer.export.formats import open_listed

    if (entry.format, entry.variant) == ("onnx", "text"):
        return _text_translations(artifact_dir, beam, sources)
    runner = open_listed(artifact_dir, entry.format, entry.variant, options=SearchOptions(beam_size=beam))
    if must_match(entry, search) and entry.variant == "fp32":
        _check_tokens(runner, keras, f"{entry.file} ({search})")
    return runner.translate(sources)


def must_match(entry, search):
    """Whether the file must translate as Keras does: fp32 and text files, except CTranslate2's
    beam search (its own length normalization)."""
    return entry.variant in ("fp32", "text") and (entry.format, search) != ("ctranslate2", "beam")


def _check_tokens(runner, keras, where):
    for batch in probe_batches(keras.config):
        expected, _ = keras.search(batch)
        tokens, _ = runner.search(batch)
        if not np.array_equal(tokens, expected):
            raise ExportError(f"{where} gives tokens different from Keras on a probe batch {batch.shape}")

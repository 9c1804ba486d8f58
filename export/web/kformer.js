// The translator in the page: the exported search graphs (greedy and beam, the whole loop in each)
// run by onnxruntime-web (ONNX files) or LiteRT.js (the fixed-shape TFLite files), both WASM. With
// the ids files, tokenization is in JavaScript and text in and out follows
// kformer/decode/text_batches.py line for line, so the page translates as `kformer translate
// --runtime onnx` (or `--runtime tflite --variant fixed`); LiteRT.js's fixed-text file does it all
// inside the file (as `--runtime tflite --variant fixed-text`).
//
// URL parameters: runtime=onnx|litert (default onnx), variant=fp32|int8 (onnx; default fp32) or
// fixed-text|fixed|int8-fixed|fp16-fixed (litert; default fixed-text where the export has it),
// threads=N (default: all cores when the page is cross-origin isolated, else 1), model=URL of the
// export folder (default /model/: under `kformer serve`, the first pair's; each pair's is at
// /models/<source>-<target>/, and the page offers them all).
// For automation: window.kformer.ready (a Promise of the info below) and
// window.kformer.translate(lines, {beam}) -> Promise<string[]>.

import * as ort from "/ort/ort.wasm.min.mjs";
import { SentencePiece } from "./sentencepiece.js";
import { VocabularyTokenizer } from "./vocabulary.js";
import { joiner, splitClauses, splitSentences, strip } from "./sentences.js";

const BATCH_SIZE = 32; // as the Python runners' default; beam search takes BATCH_SIZE / K sentences a call,
// uncapped, for either file: the page was not measured with the Python runners' larger beam calls
// of short sentences (Runner.beam_shares_batch, Runner.beam_capped)
const NEG_INF_SCORE = -65504.0; // text_batches.NEG_INF_SCORE: a beam slot without a hypothesis
const TOKENS_PER_SENTENCE = 16; // text_batches.TOKENS_PER_SENTENCE: a greedy call of long sentences takes fewer
// Python's str.strip()/split() whitespace, which JavaScript's trim() does not match exactly.
const WHITESPACE = "\\t\\n\\v\\f\\r\\x1c-\\x20\\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000";
const SPACES = new RegExp(`[${WHITESPACE}]+`, "g");
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/g;

const params = new URLSearchParams(location.search);
const runtime = params.get("runtime") || "onnx";
const LITERT_VARIANTS = ["fixed-text", "fixed", "int8-fixed", "fp16-fixed"]; // page.PAGE_RUNTIMES' litert, in order
const QUANTIZED = ["fp16", "int8"]; // written only with `kformer export --quantize` (artifact_format.QUANTIZATIONS)
// LiteRT.js: the first of LITERT_VARIANTS the export has (load()).
let variant = params.get("variant") || (runtime === "litert" ? null : "fp32");
const modelUrl = params.get("model") || "/model/";
const threads = Number(params.get("threads")) || (crossOriginIsolated ? navigator.hardwareConcurrency : 1);

class ArtifactError extends Error {}

async function sha256(bytes) {
  const digest = await crypto.subtle.digest("SHA-256", bytes);
  return [...new Uint8Array(digest)].map((b) => b.toString(16).padStart(2, "0")).join("");
}

/** The bytes of an entry of manifest.json (or of `listing`, the file naming it), after checking
 *  its sha256 (as export/runner.verified_path). */
async function verifiedBytes(entry, listing = "manifest.json") {
  const url = modelUrl + entry.file;
  const response = await fetch(url);
  if (!response.ok) throw new ArtifactError(`${url} is missing (HTTP ${response.status}; listed in ${listing})`);
  const bytes = new Uint8Array(await response.arrayBuffer());
  if ((await sha256(bytes)) !== entry.sha256) {
    throw new ArtifactError(`${url} is corrupted or truncated: its sha256 differs from ${listing}`);
  }
  return bytes;
}

/** The manifest entry of that format and the page's variant (both searches: one file, or a file each). */
function findArtifact(manifest, format) {
  const entry = manifest.artifacts.find((a) => a.format === format && a.variant === variant);
  const precision = variant.split("-")[0]; // as kformer's quantization(): int8-fixed is int8
  if (!entry) {
    const have = manifest.artifacts.filter((a) => a.format === format).map((a) => `${a.format}/${a.variant}`);
    throw new ArtifactError(`no ${format} ${variant} file in this export (it has ${have.join(", ") || "none"});` +
                            ` re-export with --formats ${format}` + (QUANTIZED.includes(precision) ? ` --quantize ${precision}` : ""));
  }
  return entry;
}

// Each runtime: load(entry) -> run, entry: the manifest's entry of its file; run(batch Int32Array,
// rows, width, inputs) -> {tokens, scores}, each {data, dims}: tokens (B, N, T) or (B, T) (greedy),
// scores (B, N) or (B,). inputs: the search options of the graphs ({beam, alpha, max_length,
// no_repeat_ngram, nbest}; alpha and nbest are beam search's).
const RUNTIMES = {
  onnx: {
    format: "onnx",
    async start() {
      ort.env.wasm.numThreads = threads;
      ort.env.wasm.wasmPaths = "/ort/";
      return `onnxruntime-web ${ort.env.versions.web} (WASM)`;
    },
    async load(entry) {
      // A folder of a file per search and the weights both read (entry.files, each with its
      // sha256): the weights and the default search's file are fetched now, the other search's
      // file when that search first runs.
      if (!entry.files) throw new ArtifactError(`${entry.file} is one file of both searches, as kformer wrote ONNX before its files per search; export the model again`);
      const weights = verifiedBytes(entry.files.weights);
      const externalData = [{ path: entry.files.weights.file.split("/").at(-1), data: await weights }];
      const sessions = {};
      const session = (search) => (sessions[search] ??= verifiedBytes(entry.files[search]).then((bytes) =>
        ort.InferenceSession.create(bytes, { executionProviders: ["wasm"], graphOptimizationLevel: "all", externalData })));
      await session(entry.defaultSearch);
      return async (batch, rows, width, inputs) => {
        const search = inputs.beam ? "beam" : "greedy";
        const feed = {
          source_ids: new ort.Tensor("int32", batch, [rows, width]),
          max_length: new ort.Tensor("int32", [inputs.max_length], []),
          no_repeat_ngram: new ort.Tensor("int32", [inputs.no_repeat_ngram], []),
        };
        if (inputs.beam) { // greedy has neither
          feed.alpha = new ort.Tensor("float32", [inputs.alpha], []);
          feed.nbest = new ort.Tensor("int32", [inputs.nbest], []);
        }
        const result = await (await session(search)).run(feed);
        return { tokens: result.tokens, scores: result.scores };
      };
    },
  },
  litert: {
    format: "tflite",
    async start() {
      this.lrt = await import("/litert/dist/index.js");
      await this.lrt.loadLiteRt("/litert/wasm/", { threads: threads > 1 });
      return "LiteRT.js 2.5.3 (WASM, XNNPack)";
    },
    async load(entry) {
      const { lrt } = this;
      const model = await lrt.loadAndCompile(await verifiedBytes(entry), { accelerator: "wasm", cpuOptions: { numThreads: threads } });
      // The file's fixed (1, max_source_length) input: the one input of rank 2 (the options are scalars).
      const length = model.getInputDetails().find((input) => input.shape.length === 2).shape[1];
      // LiteRT.js cannot resize inputs: one row at a time, padded to the fixed length (as
      // export/tflite.py does for this file). One file, both searches: the signatures "greedy"
      // and "beam" (greedy has no alpha or nbest input).
      return async (batch, rows, width, inputs) => {
        const tokens = [], scores = [];
        let dims;
        for (let row = 0; row < rows; row++) {
          const padded = new Int32Array(length);
          padded.set(batch.subarray(row * width, (row + 1) * width));
          const feed = { source_ids: new lrt.Tensor(padded, [1, length]), ...optionTensors(lrt, inputs) };
          const outputs = Object.values(await model.run(inputs.beam ? "beam" : "greedy", feed));
          Object.values(feed).forEach((t) => t.delete());
          const tokenTensor = outputs.find((t) => t.type.dtype === "int32"); // the other output is the scores
          dims = Array.from(tokenTensor.type.layout.dimensions);
          tokens.push(tokenTensor.toTypedArray().slice());
          scores.push(outputs.find((t) => t.type.dtype === "float32").toTypedArray().slice());
          outputs.forEach((t) => t.delete());
        }
        const n = dims.length === 3 ? dims[1] : 1;
        return { tokens: { data: concat(tokens, Int32Array), dims: [rows, n, dims.at(-1)] },
                 scores: { data: concat(scores, Float32Array), dims: [rows, n] } };
      };
    },
  },
};

// A LiteRT.js search's scalar options as tensors (greedy has no alpha or nbest).
function optionTensors(lrt, inputs) {
  const tensors = {
    max_length: new lrt.Tensor(new Int32Array([inputs.max_length]), []),
    no_repeat_ngram: new lrt.Tensor(new Int32Array([inputs.no_repeat_ngram]), []),
  };
  if (inputs.beam) {
    tensors.alpha = new lrt.Tensor(new Float32Array([inputs.alpha]), []);
    tensors.nbest = new lrt.Tensor(new Int32Array([inputs.nbest]), []);
  }
  return tensors;
}

// The fixed-text file in LiteRT.js: UTF-8 in and out, its sentences, SentencePiece and joining
// inside it (kformer/export/text_graph), both searches as its signatures, one text a call of at
// most its width in bytes. loadText(entry) -> (text, inputs) -> {translation, score, alternatives}.
async function loadText(lrt, entry) {
  const model = await lrt.loadAndCompile(await verifiedBytes(entry), { accelerator: "wasm", cpuOptions: { numThreads: threads } });
  const width = model.getInputDetails().find((input) => input.shape.length === 2).shape[1];
  const decoder = new TextDecoder("utf-8", { fatal: true });
  return async (text, inputs) => {
    // A lone surrogate has no UTF-8: "?" as the Python runner's encoding gives (export/tflite.utf8_batch).
    const bytes = new TextEncoder().encode(text.replace(LONE_SURROGATE, "?"));
    if (bytes.length > width) throw new RangeError(`a text of ${bytes.length} bytes; the fixed-text file takes at most ${width} a call`);
    const padded = new Uint8Array(width);
    padded.set(bytes);
    const feed = {
      text: new lrt.Tensor(padded, [1, width]),
      lengths: new lrt.Tensor(new Int32Array([bytes.length]), [1]),
      ...optionTensors(lrt, inputs),
    };
    const outputs = await model.run(inputs.beam ? "beam" : "greedy", feed);
    Object.values(feed).forEach((t) => t.delete());
    const read = Object.fromEntries(Object.entries(outputs).map(([name, t]) => [name, t.toTypedArray().slice()]));
    Object.values(outputs).forEach((t) => t.delete());
    const utf8 = (data, offset, size, room) => { // translations are cut at the file's room for them
      if (size > room) throw new RangeError(`a translation of ${size} bytes; the fixed-text file holds ${room}`);
      return decoder.decode(data.subarray(offset, offset + size));
    };
    const translation = utf8(read.translation, 0, read.lengths[0], read.translation.length);
    if (!inputs.beam) return { translation, score: read.scores[0], alternatives: [{ translation, score: read.scores[0] }] };
    const room = read.alternatives.length / read.alternative_lengths.length; // bytes an alternative
    const alternatives = Array.from(read.alternative_scores.subarray(0, read.alternative_counts[0]), (score, k) =>
      ({ translation: utf8(read.alternatives, k * room, read.alternative_lengths[k], room), score }));
    return { translation, score: read.scores[0], alternatives };
  };
}

function concat(parts, Type) {
  const data = new Type(parts.reduce((n, p) => n + p.length, 0));
  parts.reduce((offset, p) => (data.set(p, offset), offset + p.length), 0);
  return data;
}

/** The export's tokenizer: its SentencePiece model, or an imported model's tokenizer.json with the
 *  source and target models and the vocabulary it names (each checked against its sha256). */
async function loadTokenizer(entry) {
  const bytes = await verifiedBytes(entry);
  if (entry.file !== "tokenizer.json") return new SentencePiece(bytes); // export/page.py's test too
  const text = (b) => new TextDecoder().decode(b);
  const record = JSON.parse(text(bytes));
  const [source, target, vocabulary] = await Promise.all(
    ["source", "target", "vocabulary"].map((name) => verifiedBytes(record[name], entry.file)));
  return new VocabularyTokenizer(record, new SentencePiece(source), new SentencePiece(target),
                                 JSON.parse(text(vocabulary)));
}

async function load() {
  const started = performance.now();
  const response = await fetch(modelUrl + "manifest.json");
  if (!response.ok) throw new ArtifactError(`${modelUrl}manifest.json not found: is it a \`kformer export\` folder?`);
  let manifest;
  try {
    manifest = await response.json();
  } catch (e) {
    throw new ArtifactError(`${modelUrl}manifest.json: not valid JSON (${e.message})`);
  }
  const tokenizer = await loadTokenizer(manifest.tokenizer);
  if (tokenizer.size !== manifest.config.vocab_size) {
    throw new ArtifactError(`${manifest.tokenizer.file} has ${tokenizer.size} pieces, the model ${manifest.config.vocab_size}`);
  }
  const backend = RUNTIMES[runtime];
  if (!backend) throw new Error(`unknown runtime ${JSON.stringify(runtime)}; choose onnx or litert`);
  const name = await backend.start();
  if (variant === null) { // LiteRT.js: the first of its files the export has, as page.default_variant
    const present = new Set(manifest.artifacts.filter((a) => a.format === backend.format).map((a) => a.variant));
    variant = LITERT_VARIANTS.find((v) => present.has(v)) || LITERT_VARIANTS[0];
  }
  const entry = findArtifact(manifest, backend.format);
  if (variant === "fixed-text") {
    return { manifest, tokenizer, runText: await loadText(backend.lrt, entry), name, loadMs: performance.now() - started };
  }
  const run = await backend.load({ ...entry, defaultSearch: manifest.beam_size > 1 ? "beam" : "greedy" });
  return { manifest, tokenizer, run, name, loadMs: performance.now() - started };
}

const quoted = (text) => JSON.stringify(text.length <= 24 ? text : text.slice(0, 23) + "…");

/** As text_batches._readable: false when none of the sentence's characters is in the vocabulary. */
function readable(tokenizer, sentence) {
  const characters = [...sentence.replace(SPACES, "")];
  const unknown = characters.filter((c) => tokenizer.pieceToId(c) === tokenizer.unkId).length;
  if (unknown === characters.length) {
    console.warn(`input ${quoted(sentence)}: none of its characters is in the model's vocabulary; untranslated`);
    return false;
  }
  if (unknown * 2 > characters.length) console.warn(`input ${quoted(sentence)}: mostly outside the vocabulary`);
  return true;
}

/** As text_batches._fitted: a sentence as units {text, ids} of at most maxLength tokens. */
function fitted(tokenizer, sentence, maxLength) {
  const ids = tokenizer.encode(sentence);
  if (ids.length <= maxLength) return [{ text: sentence, ids }];
  const packed = [];
  let current = "", count = 0;
  for (const clause of splitClauses(sentence)) {
    const size = tokenizer.encode(strip(clause)).length;
    if (current && count + size > maxLength) {
      packed.push(current);
      current = "";
      count = 0;
    }
    current += clause;
    count += size;
  }
  packed.push(current);
  const pieces = [];
  for (let text of packed) {
    text = strip(text);
    const ids = tokenizer.encode(text);
    if (ids.length <= maxLength) {
      pieces.push({ text, ids });
      continue;
    }
    console.warn(`input ${quoted(text)} has ${ids.length} tokens and no clause break; cut into pieces of ${maxLength}`);
    pieces.push(...cut(tokenizer, text, maxLength));
  }
  return pieces;
}

/** As text_batches._cut: each piece the longest run of characters (code points, as Python's) that
 *  encodes to at most maxLength tokens, by bisection among at most 8 characters a token. */
function cut(tokenizer, text, maxLength) {
  const units = [];
  let characters = Array.from(text);
  while (characters.length) {
    let fits = 1, over = Math.min(characters.length, 8 * maxLength) + 1;
    while (over - fits > 1) {
      const middle = Math.floor((fits + over) / 2);
      if (tokenizer.encode(strip(characters.slice(0, middle).join(""))).length <= maxLength) fits = middle;
      else over = middle;
    }
    const piece = strip(characters.slice(0, fits).join(""));
    if (piece) units.push({ text: piece, ids: tokenizer.encode(piece).slice(0, maxLength) });
    characters = characters.slice(fits);
  }
  return units;
}

/** As text_batches.segment_texts: {units, layouts}; a layout is lines of unit indices or strings. */
function segmentTexts(tokenizer, texts, maxLength) {
  const units = [], layouts = [];
  for (const text of texts) {
    layouts.push(strip(text.replace(LONE_SURROGATE, "?")).split("\n").map((line) => { // as Python's
      const line_units = [];
      for (const sentence of splitSentences(line)) {
        if (!readable(tokenizer, sentence)) {
          line_units.push(sentence);
          continue;
        }
        for (const unit of fitted(tokenizer, sentence, maxLength)) {
          line_units.push(units.length);
          units.push(unit);
        }
      }
      return line_units;
    }));
  }
  return { units, layouts };
}

/** As text_batches.length_sorted_batches: chunks of indices by length, `size` rows and at most `maxTokens` rows x longest. */
function lengthSortedBatches(ids, size, maxTokens) {
  const order = ids.map((_, i) => i).sort((a, b) => ids[a].length - ids[b].length); // stable, as Python's
  const chunks = [];
  let chunk = [];
  for (const i of order) { // the row added is the longest
    const overBudget = maxTokens !== null && (chunk.length + 1) * ids[i].length > maxTokens;
    if (chunk.length && (chunk.length === size || overBudget)) {
      chunks.push(chunk);
      chunk = [];
    }
    chunk.push(i);
  }
  if (chunk.length) chunks.push(chunk);
  return chunks;
}

/** As text_batches.search_units: per row of ids, its best `nbest` [ids, score], best first; `size` rows a call. */
async function searchUnits(run, ids, inputs, nbest, eosId, padId, size, maxTokens) {
  const results = new Array(ids.length);
  for (const chunk of lengthSortedBatches(ids, size, maxTokens)) {
    const width = Math.max(1, ...chunk.map((i) => ids[i].length));
    const batch = new Int32Array(chunk.length * width).fill(padId);
    chunk.forEach((i, row) => batch.set(ids[i], row * width));
    const { tokens, scores } = await run(batch, chunk.length, width, inputs);
    const [, n, length] = tokens.dims.length === 3 ? tokens.dims : [0, 1, tokens.dims[1]];
    chunk.forEach((i, row) => {
      results[i] = [];
      for (let k = 0; k < Math.min(nbest, n); k++) {
        const score = scores.data[row * n + k];
        if (k > 0 && !(score > NEG_INF_SCORE)) continue;
        const offset = (row * n + k) * length;
        const output = Array.from(tokens.data.subarray(offset, offset + length));
        const end = output.indexOf(eosId);
        results[i].push([(end === -1 ? output : output.slice(0, end)).filter((t) => t !== padId), score]);
      }
    });
  }
  return results;
}

/** As text_batches.join_translations: {translation, score, alternatives: [{translation, score}]}. */
function joinTranslations(layout, hypotheses, glue, nbest) {
  const version = (i) => {
    let score = 0;
    const lines = layout.map((units) => units.map((unit) => {
      if (typeof unit === "string") return unit;
      const [text, unitScore] = hypotheses[unit][Math.min(i, hypotheses[unit].length - 1)];
      score += unitScore;
      return text;
    }).join(glue));
    return { translation: lines.join("\n"), score };
  };
  const alternatives = [], seen = new Set();
  for (let i = 0; i < nbest; i++) {
    const hypothesis = version(i);
    if (!seen.has(hypothesis.translation)) {
      seen.add(hypothesis.translation);
      alternatives.push(hypothesis);
    }
  }
  return { ...alternatives[0], alternatives };
}

/** As kformer.decode.options.SearchOptions.checked, with the export's defaults. */
function checkedOptions(manifest, { beam = manifest.beam_size, alpha = manifest.alpha, maxLength = manifest.max_length,
                                    noRepeatNgram = manifest.no_repeat_ngram, nbest = 1 } = {}) {
  const whole = (name, value, least) => {
    if (!Number.isInteger(value) || value < least) throw new Error(`${name} must be a whole number >= ${least}, got ${value}`);
  };
  if (beam !== 1 && beam !== manifest.beam_size) {
    throw new Error(`this export has greedy search and beam size ${manifest.beam_size}, not ${beam}`);
  }
  whole("nbest", nbest, 1);
  if (nbest > beam) throw new Error(`nbest ${nbest} is more than the beam size ${beam}`);
  if (!Number.isFinite(alpha) || alpha < 0) throw new Error(`alpha must be a finite number >= 0, got ${alpha}`);
  whole("max length", maxLength, 1);
  if (maxLength > manifest.config.max_target_length) {
    throw new Error(`max length must be in [1, ${manifest.config.max_target_length}] for this model, got ${maxLength}`);
  }
  whole("no_repeat_ngram", noRepeatNgram, 0);
  return { inputs: { beam: beam > 1, alpha, max_length: maxLength, no_repeat_ngram: noRepeatNgram, nbest }, nbest };
}

const ready = load();

/** The language pair, "zh-en" (an imported model's manifest has no corpus), or "". */
const direction = (manifest) => manifest.direction || manifest.corpus?.direction || "";

/** The tokenizer for a multilingual model's target language ("fra": each source starts with
 *  >>fra<<, as `--target-language`); without one, sources go as typed. */
function forTarget(tokenizer, language) {
  if (!language) return tokenizer;
  if (!tokenizer.forTarget) throw new RangeError(`target language ${language}: this model has no target languages`);
  return tokenizer.forTarget(language);
}

/** Texts -> [{translation, score, alternatives}], as a runner's `translations`. Options: beam (1
 *  or the export's), alpha, maxLength, noRepeatNgram, nbest, targetLanguage (a multilingual
 *  model's; default: the page's ?target=); defaults: the manifest's. */
async function translations(texts, options = {}) {
  const { manifest, tokenizer: typed, run, runText } = await ready;
  const tokenizer = forTarget(typed, options.targetLanguage ?? params.get("target"));
  const { inputs, nbest } = checkedOptions(manifest, options);
  if (runText) { // the text file does the rest, a text a call
    const found = [];
    for (const text of texts) found.push(await runText(text, inputs));
    return found;
  }
  const { eos_id: eosId, pad_id: padId, max_source_length: maxSourceLength } = manifest.config;
  const { units, layouts } = segmentTexts(tokenizer, texts, maxSourceLength);
  const size = inputs.beam ? Math.max(1, Math.floor(BATCH_SIZE / manifest.beam_size)) : BATCH_SIZE;
  const maxTokens = inputs.beam ? null : size * TOKENS_PER_SENTENCE; // text_batches.tokens_per_call
  const found = await searchUnits(run, units.map((u) => u.ids), inputs, nbest, eosId, padId, size, maxTokens);
  const hypotheses = found.map((unit) => unit.map(([ids, score]) => [tokenizer.decode(ids), score]));
  const glue = joiner(direction(manifest).split("-").at(-1));
  return layouts.map((layout) => joinTranslations(layout, hypotheses, glue, nbest));
}

async function translate(texts, options = {}) {
  return (await translations(texts, options)).map((t) => t.translation);
}

window.kformer = {
  ready: ready.then(({ manifest, tokenizer, name, loadMs }) => ({
    runtime: name, variant, threads, loadMs, beamSize: manifest.beam_size, direction: direction(manifest),
    languages: tokenizer.languages?.() ?? [],
    defaults: { alpha: manifest.alpha, maxLength: manifest.max_length, noRepeatNgram: manifest.no_repeat_ngram } })),
  translate,
  translations,
};

// The page around it: the whole text box is one text (its line breaks kept, its sentences split).
const $ = (id) => document.getElementById(id);
window.kformer.ready.then((info) => {
  $("status").textContent = `ready in ${(info.loadMs / 1000).toFixed(1)} s`;
  $("runtime").textContent = `${info.runtime}, ${info.variant}, ${info.threads} thread(s)`;
  $("direction").textContent = info.direction || "";
  const source = (info.direction || "").split("-")[0];
  if (source) $("source").placeholder = `Text in ${languageName(source)}`;
  if (source && source !== "zh") $("source").value = ""; // the page's example is Chinese
  $("beam").options[1].textContent = `beam ${info.beamSize}`;
  $("beam").options[1].value = info.beamSize;
  $("alpha").value = info.defaults.alpha;
  $("max-length").value = info.defaults.maxLength;
  $("no-repeat-ngram").value = info.defaults.noRepeatNgram;
  if (info.languages.length) { // a multilingual model: the target language's token starts each source
    const select = $("target-language");
    select.replaceChildren(new Option("as typed (>>xxx<<)", ""), ...info.languages.map((code) => new Option(code, code)));
    select.value = params.get("target") || "";
    select.hidden = false;
  }
  const target = params.get("target");
  if (target && !info.languages.includes(target)) { // what translate() would throw, said at once
    $("status").textContent = `error: ?target=${target}: the model has no >>${target}<< token`;
    $("status").className = "error";
  }
  $("translate").disabled = false;
}, (error) => {
  $("status").textContent = `error: ${error.message}`;
  $("status").className = "error";
});

/** "English" for "en" (the browser's names; the code where it has none). */
function languageName(code) {
  try {
    return new Intl.DisplayNames(["en"], { type: "language", fallback: "code" }).of(code);
  } catch {
    return code;
  }
}

/** Under `kformer serve` with several language pairs: [{url, label}] of each pair's export, from
 *  LibreTranslate's /languages (the page served alone has no API: none). */
async function servedPairs() {
  const response = await fetch("/languages").catch(() => null);
  if (!response?.ok) return [];
  const languages = await response.json();
  const names = Object.fromEntries(languages.map((l) => [l.code, l.name]));
  const name = (code) => names[code] || languageName(code);
  return languages.flatMap((l) => l.targets.map((t) => ({ url: `/models/${l.code}-${t}/`, label: `${l.name} → ${name(t)}` })));
}
servedPairs().then((pairs) => {
  if (pairs.length < 2) return;
  const select = $("pair");
  select.replaceChildren(...pairs.map(({ url, label }) => new Option(label, url)));
  select.value = params.has("model") ? modelUrl : pairs[0].url;
  select.hidden = false;
  $("direction").hidden = true;
  select.addEventListener("change", () => { // the page runs one export: choosing another loads it
    params.set("model", select.value);
    location.search = params.toString();
  });
});
$("translate").addEventListener("click", async () => {
  const text = $("source").value;
  $("translate").disabled = true;
  try {
    const started = performance.now();
    const options = { beam: Number($("beam").value), alpha: Number($("alpha").value),
                      maxLength: Number($("max-length").value), noRepeatNgram: Number($("no-repeat-ngram").value),
                      nbest: Number($("nbest").value), targetLanguage: $("target-language").value };
    const [result] = await translations([text], options);
    $("output").textContent = result.translation;
    $("alternatives").replaceChildren(...result.alternatives.map((a) => {
      const item = document.createElement("li");
      item.textContent = `${a.translation}  (${a.score.toFixed(3)})`;
      return item;
    }));
    $("timing").textContent = `${((performance.now() - started) / 1000).toFixed(2)} s`;
    $("status").className = "";
  } catch (error) {
    $("status").textContent = `error: ${error.message}`;
    $("status").className = "error";
  } finally {
    $("translate").disabled = false;
  }
});

// The translator in the page: the exported ONNX search graph (greedy and beam, one Loop each) run
// by onnxruntime-web (WASM), with tokenization in JavaScript. Text in and out follows
// kformer/batching.py line for line, so the page translates as `kformer translate --runtime onnx`.
//
// URL parameters: variant=fp32|int8 (default fp32), threads=N (default: all cores when the page is
// cross-origin isolated, else 1), model=URL of the export folder (default /model/).
// For automation: window.kformer.ready (a Promise of the info below) and
// window.kformer.translate(lines, {beam}) -> Promise<string[]>.

import * as ort from "/ort/ort.wasm.min.mjs";
import { SentencePiece } from "./sentencepiece.js";

const BATCH_SIZE = 32; // as the Python runners' default
// Python's str.strip()/split() whitespace, which JavaScript's trim() does not match exactly.
const WHITESPACE = "\\t\\n\\v\\f\\r\\x1c-\\x20\\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000";
const STRIP = new RegExp(`^[${WHITESPACE}]+|[${WHITESPACE}]+$`, "g");
const SPACES = new RegExp(`[${WHITESPACE}]+`, "g");

const params = new URLSearchParams(location.search);
const variant = params.get("variant") || "fp32";
const modelUrl = params.get("model") || "/model/";

class ArtifactError extends Error {}

async function sha256(bytes) {
  const digest = await crypto.subtle.digest("SHA-256", bytes);
  return [...new Uint8Array(digest)].map((b) => b.toString(16).padStart(2, "0")).join("");
}

/** The bytes of a manifest entry, after checking its sha256 (as export/runtime.verified_path). */
async function verifiedBytes(entry) {
  const url = modelUrl + entry.file;
  const response = await fetch(url);
  if (!response.ok) throw new ArtifactError(`${url} is missing (HTTP ${response.status}; listed in manifest.json)`);
  const bytes = new Uint8Array(await response.arrayBuffer());
  if ((await sha256(bytes)) !== entry.sha256) {
    throw new ArtifactError(`${url} is corrupted or truncated: its sha256 differs from manifest.json`);
  }
  return bytes;
}

function findArtifact(manifest, search) {
  const entry = manifest.artifacts.find((a) => a.format === "onnx" && a.search === search && a.variant === variant);
  if (!entry) {
    const have = manifest.artifacts.filter((a) => a.format === "onnx").map((a) => `${a.search}/${a.variant}`);
    throw new ArtifactError(`no ONNX ${search} ${variant} file in this export (it has ${have.join(", ")}); ` +
                            "re-export with --formats onnx (and --quantize int8 for int8)");
  }
  return entry;
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
  const tokenizer = new SentencePiece(await verifiedBytes(manifest.tokenizer));
  if (tokenizer.size !== manifest.config.vocab_size) {
    throw new ArtifactError(`tokenizer.model has ${tokenizer.size} pieces, the model ${manifest.config.vocab_size}`);
  }
  const threads = Number(params.get("threads")) || (crossOriginIsolated ? navigator.hardwareConcurrency : 1);
  ort.env.wasm.numThreads = threads;
  ort.env.wasm.wasmPaths = "/ort/";
  const sessions = {};
  for (const search of ["greedy", "beam"]) {
    const bytes = await verifiedBytes(findArtifact(manifest, search));
    sessions[search] = await ort.InferenceSession.create(bytes, {
      executionProviders: ["wasm"], graphOptimizationLevel: "all" });
  }
  return { manifest, tokenizer, sessions, threads, loadMs: performance.now() - started };
}

/** As batching.encode_texts: ids per text, and texts to output unchanged (none of their
 *  characters is in the vocabulary), over-long texts truncated. */
function encodeTexts(tokenizer, texts, maxSourceLength) {
  const ids = [], untranslated = new Map();
  texts.forEach((text, index) => {
    text = text.replace(STRIP, "");
    let row = text ? tokenizer.encode(text) : [];
    const characters = [...text.replace(SPACES, "")];
    const unknown = characters.filter((c) => tokenizer.pieceToId(c) === tokenizer.unkId).length;
    if (characters.length && unknown === characters.length) {
      console.warn(`input ${JSON.stringify(text)}: none of its characters is in the model's vocabulary; untranslated`);
      untranslated.set(index, text);
      row = [];
    }
    if (row.length > maxSourceLength) console.warn(`input ${JSON.stringify(text)} truncated to ${maxSourceLength} tokens`);
    ids.push(row.slice(0, maxSourceLength));
  });
  return { ids, untranslated };
}

/** As batching.translate_ids: length-sorted batches of BATCH_SIZE, padded with pad_id. */
async function translateIds(session, ids, eosId, padId) {
  const order = ids.map((_, i) => i).sort((a, b) => ids[a].length - ids[b].length); // stable, as Python's
  const outputs = new Array(ids.length);
  for (let start = 0; start < order.length; start += BATCH_SIZE) {
    const chunk = order.slice(start, start + BATCH_SIZE);
    const width = Math.max(1, ...chunk.map((i) => ids[i].length));
    const batch = new Int32Array(chunk.length * width).fill(padId);
    chunk.forEach((i, row) => batch.set(ids[i], row * width));
    const result = await session.run({ source_ids: new ort.Tensor("int32", batch, [chunk.length, width]) });
    const { data, dims } = result.tokens; // greedy (B, T); beam (B, K, T), best first
    const length = dims.at(-1), stride = dims.length === 3 ? dims[1] * length : length;
    chunk.forEach((i, row) => {
      const tokens = Array.from(data.subarray(row * stride, row * stride + length));
      const end = tokens.indexOf(eosId);
      outputs[i] = (end === -1 ? tokens : tokens.slice(0, end)).filter((t) => t !== padId);
    });
  }
  return outputs;
}

const ready = load();

async function translate(lines, { beam = 1 } = {}) {
  const { manifest, tokenizer, sessions } = await ready;
  if (beam !== 1 && beam !== manifest.beam_size) {
    throw new Error(`this export has greedy search and beam size ${manifest.beam_size}, not ${beam}`);
  }
  const { eos_id: eosId, pad_id: padId, max_source_length: maxSourceLength } = manifest.config;
  const { ids, untranslated } = encodeTexts(tokenizer, lines, maxSourceLength);
  const outputs = await translateIds(sessions[beam === 1 ? "greedy" : "beam"], ids, eosId, padId);
  return outputs.map((row, i) => untranslated.get(i) ?? tokenizer.decode(row));
}

window.kformer = {
  ready: ready.then(({ manifest, threads, loadMs }) => ({
    runtime: `onnxruntime-web ${ort.env.versions.web} (WASM)`, variant, threads, loadMs,
    beamSize: manifest.beam_size, direction: manifest.corpus?.direction })),
  translate,
};

// The page around it.
const $ = (id) => document.getElementById(id);
window.kformer.ready.then((info) => {
  $("status").textContent = `ready in ${(info.loadMs / 1000).toFixed(1)} s`;
  $("runtime").textContent = `${info.runtime}, ${info.variant}, ${info.threads} thread(s)`;
  $("direction").textContent = info.direction || "";
  $("beam").options[1].textContent = `beam ${info.beamSize}`;
  $("beam").options[1].value = info.beamSize;
  $("translate").disabled = false;
}, (error) => {
  $("status").textContent = `error: ${error.message}`;
  $("status").className = "error";
});
$("translate").addEventListener("click", async () => {
  const lines = $("source").value.split("\n").filter((line) => line.trim());
  $("translate").disabled = true;
  try {
    const started = performance.now();
    const outputs = await translate(lines, { beam: Number($("beam").value) });
    const ms = (performance.now() - started) / Math.max(1, lines.length);
    $("output").textContent = outputs.join("\n");
    $("timing").textContent = `${lines.length} sentence(s), ${ms.toFixed(0)} ms per sentence`;
  } catch (error) {
    $("status").textContent = `error: ${error.message}`;
    $("status").className = "error";
  } finally {
    $("translate").disabled = false;
  }
});

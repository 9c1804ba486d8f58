// The translator in the page: the exported search graphs (greedy and beam, the whole loop in each)
// run by onnxruntime-web (ONNX files) or LiteRT.js (the fixed-shape TFLite file), both WASM, with
// tokenization in JavaScript. Text in and out follows kformer/batching.py line for line, so the
// page translates as `kformer translate --runtime onnx` (or `--runtime tflite --variant fixed`).
//
// URL parameters: runtime=onnx|litert (default onnx), variant=fp32|int8 (onnx; default fp32),
// threads=N (default: all cores when the page is cross-origin isolated, else 1), model=URL of the
// export folder (default /model/).
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
const runtime = params.get("runtime") || "onnx";
const variant = runtime === "litert" ? "fixed" : params.get("variant") || "fp32";
const modelUrl = params.get("model") || "/model/";
const threads = Number(params.get("threads")) || (crossOriginIsolated ? navigator.hardwareConcurrency : 1);

class ArtifactError extends Error {}

async function sha256(bytes) {
  const digest = await crypto.subtle.digest("SHA-256", bytes);
  return [...new Uint8Array(digest)].map((b) => b.toString(16).padStart(2, "0")).join("");
}

/** The bytes of a manifest entry, after checking its sha256 (as export/manifest.verified_path). */
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

/** The file of that format and the page's variant: one file holds both searches. */
function findArtifact(manifest, format) {
  const entry = manifest.artifacts.find((a) => a.format === format && a.variant === variant);
  if (!entry) {
    const have = manifest.artifacts.filter((a) => a.format === format).map((a) => `${a.format}/${a.variant}`);
    throw new ArtifactError(`no ${format} ${variant} file in this export (it has ${have.join(", ") || "none"});` +
                            ` re-export with --formats ${format}` + (variant === "int8" ? " --quantize int8" : ""));
  }
  return entry;
}

// Each runtime: load(bytes) -> run; run(batch Int32Array, rows, width, beam) -> tokens {data, dims}.
const RUNTIMES = {
  onnx: {
    format: "onnx",
    async start() {
      ort.env.wasm.numThreads = threads;
      ort.env.wasm.wasmPaths = "/ort/";
      return `onnxruntime-web ${ort.env.versions.web} (WASM)`;
    },
    async load(bytes) {
      const session = await ort.InferenceSession.create(bytes, {
        executionProviders: ["wasm"], graphOptimizationLevel: "all" });
      // One file, both searches: its bool input `beam` picks one; tokens (B, N, T), best first, N = 1 for greedy.
      return async (batch, rows, width, beam) => {
        const result = await session.run({ source_ids: new ort.Tensor("int32", batch, [rows, width]),
                                           beam: new ort.Tensor("bool", [beam], []) });
        return result.tokens;
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
    async load(bytes) {
      const { lrt } = this;
      const model = await lrt.loadAndCompile(bytes, { accelerator: "wasm", cpuOptions: { numThreads: threads } });
      const length = model.getInputDetails()[0].shape[1]; // the file's fixed (1, max_source_length) input
      // LiteRT.js cannot resize inputs: one row at a time, padded to the fixed length (as
      // export/tflite.py does for this file).
      // One file, both searches: the signatures "greedy" and "beam".
      return async (batch, rows, width, beam) => {
        const parts = [];
        let dims;
        for (let row = 0; row < rows; row++) {
          const padded = new Int32Array(length);
          padded.set(batch.subarray(row * width, (row + 1) * width));
          const input = new lrt.Tensor(padded, [1, length]);
          const outputs = await model.run(beam ? "beam" : "greedy", [input]);
          input.delete();
          const tokens = outputs.find((t) => t.type.dtype === "int32"); // the other output is the scores
          dims = Array.from(tokens.type.layout.dimensions);
          parts.push(tokens.toTypedArray().slice());
          outputs.forEach((t) => t.delete());
        }
        const data = new Int32Array(parts.reduce((n, p) => n + p.length, 0));
        parts.reduce((offset, p) => (data.set(p, offset), offset + p.length), 0);
        return { data, dims: [rows, ...dims.slice(1)] };
      };
    },
  },
};

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
  const backend = RUNTIMES[runtime];
  if (!backend) throw new Error(`unknown runtime ${JSON.stringify(runtime)}; choose onnx or litert`);
  const name = await backend.start();
  const run = await backend.load(await verifiedBytes(findArtifact(manifest, backend.format)));
  const searches = { greedy: (...batch) => run(...batch, false), beam: (...batch) => run(...batch, true) };
  return { manifest, tokenizer, searches, name, loadMs: performance.now() - started };
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
async function translateIds(search, ids, eosId, padId) {
  const order = ids.map((_, i) => i).sort((a, b) => ids[a].length - ids[b].length); // stable, as Python's
  const outputs = new Array(ids.length);
  for (let start = 0; start < order.length; start += BATCH_SIZE) {
    const chunk = order.slice(start, start + BATCH_SIZE);
    const width = Math.max(1, ...chunk.map((i) => ids[i].length));
    const batch = new Int32Array(chunk.length * width).fill(padId);
    chunk.forEach((i, row) => batch.set(ids[i], row * width));
    const { data, dims } = await search(batch, chunk.length, width); // (B, T) or (B, N, T), best first
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
  const { manifest, tokenizer, searches } = await ready;
  if (beam !== 1 && beam !== manifest.beam_size) {
    throw new Error(`this export has greedy search and beam size ${manifest.beam_size}, not ${beam}`);
  }
  const { eos_id: eosId, pad_id: padId, max_source_length: maxSourceLength } = manifest.config;
  const { ids, untranslated } = encodeTexts(tokenizer, lines, maxSourceLength);
  const outputs = await translateIds(searches[beam === 1 ? "greedy" : "beam"], ids, eosId, padId);
  return outputs.map((row, i) => untranslated.get(i) ?? tokenizer.decode(row));
}

window.kformer = {
  ready: ready.then(({ manifest, name, loadMs }) => ({
    runtime: name, variant, threads, loadMs,
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

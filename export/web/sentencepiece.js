// SentencePiece unigram tokenization for the page: reads the exported tokenizer.model (a protobuf)
// and encodes/decodes exactly as Python's sentencepiece does for the models kformer trains
// (unigram, identity normalization, no byte fallback). Checked id for id against sentencepiece on
// every test-split sentence by tests/test_web.py. An ES module with no dependencies: the page and
// Node (for that test) both import it.

const NORMAL = 1, UNKNOWN = 2, CONTROL = 3, USER_DEFINED = 4, BYTE = 6, UNUSED = 5;
const UNK_PENALTY = 10; // sentencepiece's kUnkPenalty: an unknown character costs min score - 10
const SPACE = "\u2581"; // "▁", SentencePiece's visible space

// The protobuf wire format, just enough for sentencepiece_model.proto.
function* fields(bytes, start = 0, end = bytes.length) {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  let pos = start;
  const varint = () => {
    let value = 0, shift = 0, byte;
    do {
      byte = bytes[pos++];
      value += (byte & 0x7f) * 2 ** shift;
      shift += 7;
    } while (byte & 0x80);
    return value;
  };
  while (pos < end) {
    const key = varint(), number = Math.floor(key / 8), wire = key & 7;
    if (wire === 0) yield { number, value: varint() };
    else if (wire === 1) { yield { number, start: pos, end: pos + 8 }; pos += 8; }
    else if (wire === 2) { const length = varint(); yield { number, start: pos, end: pos + length }; pos += length; }
    else if (wire === 5) { yield { number, value: view.getFloat32(pos, true) }; pos += 4; }
    else throw new Error(`tokenizer.model: unsupported protobuf wire type ${wire} at byte ${pos}`);
  }
}

const utf8 = new TextDecoder("utf-8", { fatal: false });

export class SentencePiece {
  /** @param {Uint8Array} proto the bytes of a SentencePiece .model file */
  constructor(proto) {
    this.pieces = []; // {piece, score, type}
    this.normalizer = { name: "", charsmap: 0, addDummyPrefix: true, removeExtraWhitespaces: true,
                        escapeWhitespaces: true };
    let modelType = 1, byteFallback = false;
    this.unkSurface = " \u2047 ";
    for (const f of fields(proto)) {
      if (f.number === 1) { // SentencePiece
        const piece = { piece: "", score: 0, type: NORMAL };
        for (const g of fields(proto, f.start, f.end)) {
          if (g.number === 1) piece.piece = utf8.decode(proto.subarray(g.start, g.end));
          else if (g.number === 2) piece.score = g.value;
          else if (g.number === 3) piece.type = g.value;
        }
        this.pieces.push(piece);
      } else if (f.number === 2) { // TrainerSpec
        for (const g of fields(proto, f.start, f.end)) {
          if (g.number === 3) modelType = g.value;
          else if (g.number === 35) byteFallback = g.value !== 0;
          else if (g.number === 44) this.unkSurface = utf8.decode(proto.subarray(g.start, g.end));
        }
      } else if (f.number === 3) { // NormalizerSpec
        for (const g of fields(proto, f.start, f.end)) {
          if (g.number === 1) this.normalizer.name = utf8.decode(proto.subarray(g.start, g.end));
          else if (g.number === 2) this.normalizer.charsmap = g.end - g.start;
          else if (g.number === 3) this.normalizer.addDummyPrefix = g.value !== 0;
          else if (g.number === 4) this.normalizer.removeExtraWhitespaces = g.value !== 0;
          else if (g.number === 5) this.normalizer.escapeWhitespaces = g.value !== 0;
        }
      }
    }
    // What kformer's trainer writes; anything else would need code this file does not have.
    if (modelType !== 1) throw new Error(`tokenizer.model: model type ${modelType} is not unigram (1)`);
    if (byteFallback) throw new Error("tokenizer.model: byte fallback is not supported");
    if (this.normalizer.charsmap) {
      throw new Error(`tokenizer.model: normalization "${this.normalizer.name}" is not supported (identity only)`);
    }
    this.ids = new Map();
    this.unkId = -1;
    this.minScore = Infinity;
    this.pieces.forEach(({ piece, score, type }, id) => {
      if (type === UNKNOWN) this.unkId = id;
      if (type === NORMAL || type === USER_DEFINED || type === UNUSED) this.ids.set(piece, id);
      if (type === NORMAL) this.minScore = Math.min(this.minScore, score);
      if (type === USER_DEFINED || type === BYTE) {
        throw new Error(`tokenizer.model: piece ${id} ${JSON.stringify(piece)} has type ${type}, not supported`);
      }
    });
    this.maxPieceLength = Math.max(...[...this.ids.keys()].map((p) => [...p].length));
  }

  get size() { return this.pieces.length; }

  pieceToId(piece) { return this.ids.get(piece) ?? this.unkId; }

  /** The identity normalizer: spaces collapsed and trimmed, a leading "▁", spaces as "▁". */
  normalize(text) {
    if (this.normalizer.removeExtraWhitespaces) text = text.replace(/ +/g, " ").replace(/^ | $/g, "");
    if (!text) return "";
    if (this.normalizer.addDummyPrefix) text = " " + text;
    return this.normalizer.escapeWhitespaces ? text.replaceAll(" ", SPACE) : text;
  }

  /** Viterbi over the pieces, as sentencepiece's unigram EncodeOptimized: scores added in
   *  float32, an unknown character costs min score - 10, a run of them is one <unk>. Returns ids. */
  encode(text) {
    const chars = [...this.normalize(text)]; // code points
    const n = chars.length;
    const unkScore = Math.fround(this.minScore - UNK_PENALTY);
    const best = Array.from({ length: n + 1 }, () => ({ score: 0, start: -1, id: -1 }));
    const offer = (end, start, id, score) => {
      const total = Math.fround(best[start].score + score);
      if (best[end].start === -1 || total > best[end].score) Object.assign(best[end], { score: total, start, id });
    };
    for (let start = 0; start < n; start++) {
      let piece = "", single = false;
      for (let end = start + 1; end <= Math.min(n, start + this.maxPieceLength); end++) {
        piece += chars[end - 1];
        const id = this.ids.get(piece);
        if (id === undefined || this.pieces[id].type === UNUSED) continue;
        offer(end, start, id, this.pieces[id].score);
        if (end === start + 1) single = true;
      }
      if (!single) offer(start + 1, start, this.unkId, unkScore);
    }
    const ids = [];
    for (let end = n; end > 0; end = best[end].start) {
      // Like sentencepiece, a run of unknown characters is one <unk>.
      if (!(best[end].id === this.unkId && ids.at(-1) === this.unkId)) ids.push(best[end].id);
    }
    return ids.reverse();
  }

  /** ids -> text, as sentencepiece's DecodeIds: control pieces vanish, unknowns read " ⁇ ". */
  decode(ids) {
    let text = "";
    for (const id of ids) {
      if (id < 0 || id >= this.pieces.length) throw new RangeError(`token id ${id} is outside the vocabulary`);
      const { piece, type } = this.pieces[id];
      if (type === CONTROL) continue;
      let surface = type === UNKNOWN ? this.unkSurface : piece.replaceAll(SPACE, " ");
      if (!text && this.normalizer.addDummyPrefix && surface.startsWith(" ") && type !== UNKNOWN) {
        surface = surface.slice(1);
      }
      text += surface;
    }
    return text;
  }
}

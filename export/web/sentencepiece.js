// SentencePiece unigram tokenization for the page: reads a SentencePiece .model file (a protobuf)
// and encodes/decodes exactly as Python's sentencepiece does for unigram models without byte
// fallback: kformer's own (identity normalization) and imported ones (OPUS-MT's nmt_nfkc, a
// precompiled character map). Checked id for id against sentencepiece by tests/test_web.py. An ES
// module with no dependencies: the page and Node (for that test) both import it.

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
const encoder = new TextEncoder();
const MAX_RULES = 32; // sentencepiece's Normalizer::kMaxTrieResultsSize: the longest of the first 32 matches wins

// A character map (NormalizerSpec.precompiled_charsmap): <trie size, uint32 LE><darts-clone double
// array over UTF-8 bytes><NUL-terminated replacements>; a rule's value is its replacement's offset.
class CharsMap {
  constructor(blob) {
    const view = new DataView(blob.buffer, blob.byteOffset, blob.byteLength);
    const trieSize = blob.length > 4 ? view.getUint32(0, true) : blob.length;
    if (trieSize >= blob.length) throw new Error("tokenizer.model: its normalization's character map is broken");
    this.units = Uint32Array.from({ length: trieSize >>> 2 }, (_, i) => view.getUint32(4 + 4 * i, true));
    this.replacements = blob.subarray(4 + trieSize);
    this.texts = new Map(); // offset -> replacement text
  }

  /** [replacement text, bytes it replaces] of the longest rule matching bytes at `start`, or null. */
  longest(bytes, start) {
    // A unit: offset to its children in bits 10-31 (shifted 8 more when bit 9 is set), a leaf
    // below it when bit 8 is set, its label in bits 0-7 and 31; a leaf's value in bits 0-30.
    const offset = (unit) => (unit >>> 10) * (unit & 0x200 ? 256 : 1);
    let node = offset(this.units[0]), length = 0, value = 0, found = 0;
    for (let i = start; i < bytes.length; i++) {
      node ^= bytes[i];
      const unit = this.units[node];
      if (unit === undefined || (unit & 0x800000ff) >>> 0 !== bytes[i]) break;
      node ^= offset(unit);
      if (unit & 0x100 && found++ < MAX_RULES) [length, value] = [i + 1 - start, this.units[node] & 0x7fffffff];
    }
    return length ? [this.text(value), length] : null;
  }

  text(offset) {
    if (!this.texts.has(offset)) {
      const end = this.replacements.indexOf(0, offset);
      this.texts.set(offset, utf8.decode(this.replacements.subarray(offset, end === -1 ? undefined : end)));
    }
    return this.texts.get(offset);
  }
}

/** The byte length of the UTF-8 character that starts with `lead` (the input is valid UTF-8). */
const charLength = (lead) => (lead < 0x80 ? 1 : lead < 0xe0 ? 2 : lead < 0xf0 ? 3 : 4);

export class SentencePiece {
  /** @param {Uint8Array} proto the bytes of a SentencePiece .model file */
  constructor(proto) {
    this.pieces = []; // {piece, score, type}
    this.normalizer = { name: "", charsmap: null, addDummyPrefix: true, removeExtraWhitespaces: true,
                        escapeWhitespaces: true };
    let modelType = 1, byteFallback = false, suffix = false, denormalizer = false;
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
          else if (g.number === 24) suffix = g.value !== 0;
          else if (g.number === 44) this.unkSurface = utf8.decode(proto.subarray(g.start, g.end));
        }
      } else if (f.number === 3) { // NormalizerSpec
        for (const g of fields(proto, f.start, f.end)) {
          if (g.number === 1) this.normalizer.name = utf8.decode(proto.subarray(g.start, g.end));
          else if (g.number === 2 && g.end > g.start) {
            this.normalizer.charsmap = new CharsMap(proto.subarray(g.start, g.end));
          }
          else if (g.number === 3) this.normalizer.addDummyPrefix = g.value !== 0;
          else if (g.number === 4) this.normalizer.removeExtraWhitespaces = g.value !== 0;
          else if (g.number === 5) this.normalizer.escapeWhitespaces = g.value !== 0;
        }
      } else if (f.number === 5) { // a denormalizer's NormalizerSpec
        for (const g of fields(proto, f.start, f.end)) if (g.number === 2 && g.end > g.start) denormalizer = true;
      }
    }
    // What kformer's trainer and OPUS-MT write; anything else would need code this file does not have.
    if (modelType !== 1) throw new Error(`tokenizer.model: model type ${modelType} is not unigram (1)`);
    if (byteFallback) throw new Error("tokenizer.model: byte fallback is not supported");
    if (suffix) throw new Error("tokenizer.model: whitespace as a suffix is not supported");
    if (denormalizer) throw new Error("tokenizer.model: a denormalization rule is not supported");
    this.ids = new Map(); // every piece, as sentencepiece's PieceToId
    this.unkId = -1;
    this.minScore = Infinity;
    this.pieces.forEach(({ piece, score, type }, id) => {
      if (type === UNKNOWN) this.unkId = id;
      if (!this.ids.has(piece)) this.ids.set(piece, id);
      if (type === NORMAL) this.minScore = Math.min(this.minScore, score);
      if (type === USER_DEFINED || type === BYTE) {
        throw new Error(`tokenizer.model: piece ${id} ${JSON.stringify(piece)} has type ${type}, not supported`);
      }
    });
    this.maxPieceLength = Math.max(...[...this.ids.keys()].map((p) => [...p].length));
  }

  get size() { return this.pieces.length; }

  /** This model with each of `pieces` it lacks as an UNUSED piece, never segmented into and joined as
   *  any piece: the joiner of kformer/data/vocabulary.py, whose added pieces are USER_DEFINED (TF Text
   *  refuses UNUSED ones; this file's constructor refuses USER_DEFINED ones): both join the same. */
  withUnused(pieces) {
    const joiner = Object.assign(Object.create(SentencePiece.prototype), this);
    joiner.pieces = [...this.pieces];
    joiner.ids = new Map(this.ids);
    for (const piece of pieces) {
      if (joiner.ids.has(piece)) continue;
      joiner.ids.set(piece, joiner.pieces.length);
      joiner.pieces.push({ piece, score: 0, type: UNUSED });
    }
    return joiner;
  }

  pieceToId(piece) { return this.ids.get(piece) ?? this.unkId; }

  /** [normalized text, bytes consumed] at bytes[start]: the longest rule of the character map,
   *  else the character as it is (sentencepiece's Normalizer::NormalizePrefix). */
  prefix(bytes, start) {
    const rule = this.normalizer.charsmap?.longest(bytes, start);
    if (rule) return rule;
    const length = charLength(bytes[start]);
    return [utf8.decode(bytes.subarray(start, start + length)), length];
  }

  /** sentencepiece's Normalizer::Normalize: the character map's rules, then spaces collapsed and
   *  trimmed, a leading "▁" (the dummy prefix), spaces as "▁". */
  normalize(text) {
    const { removeExtraWhitespaces: collapse, addDummyPrefix, escapeWhitespaces: escape } = this.normalizer;
    const bytes = encoder.encode(text);
    const space = escape ? SPACE : " ";
    let start = 0;
    for (let rule; collapse && start < bytes.length && (rule = this.prefix(bytes, start))[0] === " ";) {
      start += rule[1];
    }
    if (start === bytes.length) return "";
    let normalized = addDummyPrefix ? space : "", afterSpace = collapse;
    while (start < bytes.length) {
      let [part, consumed] = this.prefix(bytes, start);
      if (afterSpace) part = part.replace(/^ +/, "");
      if (part) {
        normalized += escape ? part.replaceAll(" ", SPACE) : part;
        afterSpace = part.endsWith(" ");
      }
      start += consumed;
      if (!collapse) afterSpace = false;
    }
    while (collapse && normalized.endsWith(space)) normalized = normalized.slice(0, -space.length);
    return normalized;
  }

  /** Viterbi over the pieces, as sentencepiece's unigram EncodeOptimized: scores added in
   *  float32, an unknown character costs min score - 10, a run of them is one <unk>. Returns
   *  [piece, id] of each segment; an unknown segment's piece is its text, as sentencepiece's. */
  segments(text) {
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
        if (id === undefined || this.pieces[id].type !== NORMAL) continue;
        offer(end, start, id, this.pieces[id].score);
        if (end === start + 1) single = true;
      }
      if (!single) offer(start + 1, start, this.unkId, unkScore);
    }
    const found = [];
    for (let end = n; end > 0; end = best[end].start) {
      const { start, id } = best[end], piece = chars.slice(start, end).join("");
      // Like sentencepiece, a run of unknown characters is one <unk>.
      if (id === this.unkId && found.at(-1)?.[1] === this.unkId) found.at(-1)[0] = piece + found.at(-1)[0];
      else found.push([piece, id]);
    }
    return found.reverse();
  }

  /** text -> ids. */
  encode(text) { return this.segments(text).map(([, id]) => id); }

  /** text -> pieces (an unknown run as its text), as sentencepiece's encode(out_type=str). */
  encodePieces(text) { return this.segments(text).map(([piece]) => piece); }

  /** ids -> text, as sentencepiece's DecodeIds. */
  decode(ids) {
    return this.decodePieces(ids.map((id) => {
      if (id < 0 || id >= this.pieces.length) throw new RangeError(`token id ${id} is outside the vocabulary`);
      return this.pieces[id].piece;
    }));
  }

  /** pieces -> text, as sentencepiece's DecodePieces: control pieces vanish, <unk> reads " ⁇ ", a
   *  piece that is none of this model's stays as it is; the first "▁" of the text is dropped. */
  decodePieces(pieces) {
    const { addDummyPrefix, removeExtraWhitespaces } = this.normalizer;
    let text = "", firstSeen = false;
    for (const piece of pieces) {
      const id = this.pieceToId(piece), { type } = this.pieces[id];
      if (type === CONTROL) continue;
      if (type === UNKNOWN) {
        text += piece === this.pieces[id].piece ? this.unkSurface : piece;
        continue;
      }
      // Without collapsing, only the first "▁" piece loses its "▁"; with it, every one before any text.
      const first = !text && !firstSeen && (addDummyPrefix || removeExtraWhitespaces) && piece.startsWith(SPACE);
      firstSeen ||= first && !removeExtraWhitespaces;
      text += (first ? piece.slice(1) : piece).replaceAll(SPACE, " ");
    }
    return text;
  }
}

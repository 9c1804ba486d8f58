// An imported model's tokenizer for the page (kformer/data/vocabulary.py line for line): source text
// segmented by the source SentencePiece model, each piece looked up in the model's vocabulary
// (tokenizer.json's `vocabulary`, pieces in id order), EOS appended where the family trained so;
// output ids looked up back into pieces, which the target SentencePiece model joins into text, with the
// vocabulary's pieces it lacks added (the joiner: every output piece is its text, "▁" a space).
// Checked against the Python tokenizer by tests/test_web.py. An ES module with no dependencies.

const LANGUAGE_CODE = [">>", "<<"]; // a multilingual model's target language token, ">>fra<<", starts a source

export class VocabularyTokenizer {
  /** record: tokenizer.json's fields; source, target: SentencePiece; pieces: the vocabulary in id order. */
  constructor(record, source, target, pieces) {
    this.record = record;
    this.source = source;
    this.target = target;
    this.joiner = target.withUnused(pieces);
    this.pieces = pieces;
    this.index = new Map();
    pieces.forEach((piece, id) => this.index.set(piece, id)); // the last of a repeated piece, as Python's dict
    this.special = new Set([record.pad_id, record.eos_id, record.bos_id]);
    this.prefix = []; // the target language's token, which every source then starts with
    this.targets = new Map();
  }

  /** The target languages a multilingual model's vocabulary has tokens of ("fra" of ">>fra<<"). */
  languages() {
    const [start, end] = LANGUAGE_CODE;
    return this.pieces.filter((p) => p.startsWith(start) && p.endsWith(end)).map((p) => p.slice(start.length, -end.length));
  }

  /** This tokenizer with every source starting with `language`'s token (">>fra<<" of "fra") unless
   *  it starts with its own: what a multilingual model translates into. */
  forTarget(language) {
    const code = `${LANGUAGE_CODE[0]}${language}${LANGUAGE_CODE[1]}`;
    if (!this.index.has(code)) throw new RangeError(`target language ${language}: ${code} is not in the model's vocabulary`);
    if (!this.targets.has(language)) {
      const tokenizer = Object.assign(Object.create(VocabularyTokenizer.prototype), this);
      tokenizer.prefix = [this.index.get(code)];
      this.targets.set(language, tokenizer);
    }
    return this.targets.get(language);
  }

  get size() { return this.pieces.length; }

  get unkId() { return this.record.unk_id; }

  pieceToId(piece) { return this.index.get(piece) ?? this.record.unk_id; }

  /** text -> ids: a leading ">>xxx<<" is split off before segmenting, as Marian does. */
  encode(text) {
    const [start, end] = LANGUAGE_CODE;
    const code = [];
    if (text.startsWith(start) && text.includes(end)) {
      const cut = text.indexOf(end) + end.length;
      code.push(text.slice(0, cut));
      text = text.slice(cut);
    }
    const ids = [...(code.length ? [] : this.prefix),
                 ...[...code, ...this.source.encodePieces(text)].map((piece) => this.pieceToId(piece))];
    return this.record.append_eos ? [...ids, this.record.eos_id] : ids;
  }

  /** ids -> text, the special tokens left out. */
  decode(ids) {
    return this.joiner.decodePieces(ids.filter((id) => !this.special.has(id)).map((id) => {
      if (id < 0 || id >= this.pieces.length) throw new RangeError(`token id ${id} is outside the vocabulary`);
      return this.pieces[id];
    }));
  }
}

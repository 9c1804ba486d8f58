// Where a text splits into sentences, and a sentence into clauses: kformer/decode/sentences.py line for
// line (tests/test_web.py checks that both give the same splits). An ES module with no
// dependencies: the page and Node (for that test) both import it. Strings are iterated by UTF-16
// code unit, as Python iterates code points: every character the rules look at is in the BMP.

// Python's str.isspace() characters.
export const WHITESPACE = "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006" +
  "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000";
const WIDE_ENDS = "。！？｡";
const ENDS = ".!?…" + WIDE_ENDS;
const CLOSERS = "\"'”’」』）)】》〉]";
const ABBREVIATIONS = new Set(
  "mr mrs ms dr prof st jr sr vs etc e.g i.e no mt fig inc ltd co corp dept approx a.m p.m u.s u.k".split(" "));
const WIDE_CLAUSE_MARKS = "，、；：";
const CLAUSE_MARKS = ",;:" + WIDE_CLAUSE_MARKS;
const OPENERS = "\"'“‘(（[「『";

const isSpace = (c) => WHITESPACE.includes(c);
const words = (text) => text.split(new RegExp(`[${WHITESPACE}]+`)).filter((w) => w);

/** Python's str.strip(chars). */
export function strip(text, chars = WHITESPACE) {
  let start = 0, end = text.length;
  while (start < end && chars.includes(text[start])) start++;
  while (end > start && chars.includes(text[end - 1])) end--;
  return text.slice(start, end);
}

function lstrip(text, chars) {
  let start = 0;
  while (start < text.length && chars.includes(text[start])) start++;
  return text.slice(start);
}

export function isWide(character) {
  const code = character.codePointAt(0);
  return (code >= 0x3000 && code <= 0x9fff) || (code >= 0xac00 && code <= 0xd7af) ||
    (code >= 0xf900 && code <= 0xfaff) || (code >= 0xff00 && code <= 0xffef);
}

function endsHere(line, start, end, after) {
  const run = line.slice(end, after);
  if ([...run].some((c) => WIDE_ENDS.includes(c)) || after === line.length) return true;
  const following = line[after];
  if (!isSpace(following)) return "!?".includes(run[0]) && isWide(following);
  const rest = lstrip(line.slice(after), WHITESPACE);
  if (rest && rest[0] >= "a" && rest[0] <= "z") return false;
  if (run === ".") {
    const before = words(line.slice(start, end));
    const word = lstrip(before.length ? before[before.length - 1] : "", OPENERS);
    if ((word.length === 1 && /^\p{L}$/u.test(word)) || ABBREVIATIONS.has(word.toLowerCase())) return false;
  }
  return true;
}

/** The sentences of one line, without surrounding whitespace, in order; [] for a blank line. */
export function splitSentences(line) {
  const sentences = [];
  let start = 0, i = 0;
  while (i < line.length) {
    if (!ENDS.includes(line[i])) { i++; continue; }
    let after = i;
    while (after < line.length && ENDS.includes(line[after])) after++;
    while (after < line.length && CLOSERS.includes(line[after])) after++;
    if (endsHere(line, start, i, after)) {
      const sentence = strip(line.slice(start, after));
      if (sentence) sentences.push(sentence);
      start = after;
    }
    i = after;
  }
  const rest = strip(line.slice(start));
  if (rest) sentences.push(rest);
  return sentences;
}

/** The clauses of a sentence, split after each clause mark; clauses.join("") === sentence. */
export function splitClauses(sentence) {
  const clauses = [];
  let start = 0;
  for (let i = 0; i < sentence.length; i++) {
    const character = sentence[i];
    if (!CLAUSE_MARKS.includes(character) || i + 1 === sentence.length) continue;
    if (WIDE_CLAUSE_MARKS.includes(character) || isSpace(sentence[i + 1])) {
      let end = i + 1;
      while (end < sentence.length && isSpace(sentence[end])) end++;
      if (end > start) {
        clauses.push(sentence.slice(start, end));
        start = end;
      }
    }
  }
  if (start < sentence.length) clauses.push(sentence.slice(start));
  return clauses;
}

/** What goes between translated sentences in `language` (ISO 639-1). */
export function joiner(language) {
  return ["zh", "ja", "th", "lo", "my", "km"].includes(language) ? "" : " ";
}

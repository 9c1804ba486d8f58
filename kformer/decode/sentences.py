"""Where a text splits into sentences, and a sentence into clauses: plain character rules, the
same in export/web/sentences.js (tested to give the same splits), so the page translates a
paragraph as the Python runners do.

Pure Python, no tokenizer: kformer.decode.text_batches decides which sentences are too long for the model.
"""

# Python's str.isspace() characters, spelled out so that the page's JavaScript uses the same set.
WHITESPACE = (
    "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
    "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
WIDE_ENDS = "。！？｡"  # full-width: a sentence ends here whatever follows
ENDS = ".!?…" + WIDE_ENDS  # a run of these ends one sentence ("?!", "...", "。。")
CLOSERS = "\"'”’」』）)】》〉]"  # quotes and brackets that close a sentence stay with it
OPENERS = "\"'“‘(（[「『"  # quotes and brackets before a word: "(J. Smith" is the word "J"
# Words a "." follows without ending the sentence (lower case, without their last "."); a single
# letter ("J. Smith") is one too.
ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof st jr sr vs etc e.g i.e no mt fig inc ltd co corp dept approx a.m p.m u.s u.k".split()
)
WIDE_CLAUSE_MARKS = "，、；："  # a clause ends after these
CLAUSE_MARKS = ",;:" + WIDE_CLAUSE_MARKS  # the narrow ones only before whitespace ("1,000", "12:30")


def is_wide(character):
    """CJK ideographs, kana, hangul and full-width forms: scripts written without spaces."""
    code = ord(character)
    return (
        0x3000 <= code <= 0x9FFF
        or 0xAC00 <= code <= 0xD7AF
        or 0xF900 <= code <= 0xFAFF
        or 0xFF00 <= code <= 0xFFEF
    )


def _ends_here(line, start, end, after):
    """Whether the run of sentence ends line[end:after] (closers included) ends a sentence begun
    at `start`."""
    run = line[end:after]
    if any(c in WIDE_ENDS for c in run) or after == len(line):
        return True
    following = line[after]
    if following not in WHITESPACE:  # "3.14", "Yahoo!Japan"; but "好!我" ends in a wide script
        return run[0] in "!?" and is_wide(following)
    rest = line[after:].lstrip(WHITESPACE)
    if rest and "a" <= rest[0] <= "z":  # "e.g. this", "... and then"
        return False
    if run == ".":
        word = line[start:end].split()[-1] if line[start:end].split() else ""
        word = word.lstrip(OPENERS)
        if len(word) == 1 and word.isalpha() or word.lower() in ABBREVIATIONS:
            return False
    return True


def split_sentences(line):
    """The sentences of one line of text, without surrounding whitespace, in order; [] for a
    blank line. Nothing is dropped but whitespace between sentences."""
    sentences, start, i = [], 0, 0
    while i < len(line):
        if line[i] not in ENDS:
            i += 1
            continue
        after = i
        while after < len(line) and line[after] in ENDS:
            after += 1
        while after < len(line) and line[after] in CLOSERS:
            after += 1
        if _ends_here(line, start, i, after):
            sentence = line[start:after].strip(WHITESPACE)
            if sentence:
                sentences.append(sentence)
            start = after
        i = after
    rest = line[start:].strip(WHITESPACE)
    return sentences + [rest] if rest else sentences


def split_clauses(sentence):
    """The clauses of a sentence: it is split after each clause mark (a narrow one only when
    whitespace follows), the whitespace kept with the clause before it; "".join(clauses) ==
    sentence."""
    clauses, start = [], 0
    for i, character in enumerate(sentence):
        if character not in CLAUSE_MARKS or i + 1 == len(sentence):
            continue
        if character in WIDE_CLAUSE_MARKS or sentence[i + 1] in WHITESPACE:
            end = i + 1
            while end < len(sentence) and sentence[end] in WHITESPACE:
                end += 1
            if end > start:
                clauses.append(sentence[start:end])
                start = end
    if start < len(sentence):
        clauses.append(sentence[start:])
    return clauses


def joiner(language):
    """What goes between translated sentences in `language` (an ISO 639-1 code): nothing for
    the scripts written without spaces, else a space."""
    return "" if language in ("zh", "ja", "th", "lo", "my", "km") else " "

"""Which of the served source languages a text is written in: the share of its letters in each
language's script (by Unicode character name: CJK, HANGUL, CYRILLIC...; Latin where no other is
listed). It tells zh from en, ru or ko; languages that share a script (en, fr) tie, and the one
served first wins the tie. A model's vocabulary cannot tell them apart: kformer trains one
tokenizer on both sides of a corpus."""

import unicodedata

SCRIPTS = {
    "zh": ("CJK",), "ja": ("CJK", "HIRAGANA", "KATAKANA"), "ko": ("HANGUL",), "ru": ("CYRILLIC",),
    "uk": ("CYRILLIC",), "ar": ("ARABIC",), "hi": ("DEVANAGARI",), "el": ("GREEK",), "he": ("HEBREW",),
    "th": ("THAI",),
}  # fmt: skip
LATIN = ("LATIN",)
# A text's script shows in its first characters; reading a megabyte of them only takes the time
# of every other request (it runs on the server's event loop).
SAMPLE_CHARACTERS = 10_000


def script_share(text, language):
    """The share (0-1) of the letters of `text` (of its first SAMPLE_CHARACTERS) written in
    `language`'s script; 0 without letters."""
    letters = [c for c in text[:SAMPLE_CHARACTERS] if c.isalpha()]
    scripts = SCRIPTS.get(language, LATIN)
    return sum(unicodedata.name(c, "").startswith(scripts) for c in letters) / max(1, len(letters))


def detect(text, languages):
    """[{"language", "confidence": percent}] for each of `languages`, the likeliest first (ties
    in the order given): LibreTranslate's /detect answer."""
    found = [
        {"language": code, "confidence": round(100.0 * script_share(text, code), 1)} for code in languages
    ]
    return sorted(found, key=lambda d: -d["confidence"])

"""A language pair, "zh-en": what a corpus is read as, what a model translates, what a server
offers. On disk it stays the text "source-target" (the "direction" of corpus.json and manifests)."""

import dataclasses

NAMES = {
    "ar": "Arabic", "de": "German", "en": "English", "es": "Spanish", "fr": "French", "hi": "Hindi",
    "it": "Italian", "ja": "Japanese", "ko": "Korean", "nl": "Dutch", "pl": "Polish", "pt": "Portuguese",
    "ru": "Russian", "tr": "Turkish", "uk": "Ukrainian", "vi": "Vietnamese", "zh": "Chinese",
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class LanguagePair:
    """Codes of the language translated from and into."""

    source: str
    target: str

    @classmethod
    def parse(cls, text):
        """ "zh-en" -> LanguagePair("zh", "en"); ValueError for anything else."""
        parts = text.split("-") if isinstance(text, str) else []
        if len(parts) != 2 or not all(parts):
            raise ValueError(f"a language pair looks like 'zh-en', got {text!r}")
        return cls(*parts)

    def __str__(self):
        return f"{self.source}-{self.target}"

    def reversed(self):
        return LanguagePair(self.target, self.source)


def language_name(code):
    """The English name of a language code ("zh" -> "Chinese"), or the code where none is known."""
    return NAMES.get(code, code)

"""LibreTranslate's API, so that its clients and apps work unchanged: `POST /translate` (q a string
or a list; source, target, format, alternatives, api_key; a JSON body, a URL-encoded form or the
query string), `POST /detect`, `GET /languages`, and its error shape {"error": message}.

A kformer model translates one language pair. source "auto" is its source language (reported as
detected with the share of the text's characters its vocabulary knows as the confidence, which is
all /detect can say too); format "html" is refused: markup would be translated as text.
"""

import dataclasses

from kformer.decode import text_batches
from kformer.serve.requests import BadRequest

NAMES = {
    "ar": "Arabic", "de": "German", "en": "English", "es": "Spanish", "fr": "French", "it": "Italian",
    "ja": "Japanese", "ko": "Korean", "nl": "Dutch", "pt": "Portuguese", "ru": "Russian", "zh": "Chinese",
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Request:
    texts: list
    single: bool  # q was a string: answers are strings, not lists
    auto: bool  # source "auto": answers say the detected language
    alternatives: int


def languages(source, target):
    """GET /languages: every language the server translates from, with its targets."""
    return [{"code": source, "name": NAMES.get(source, source), "targets": [target]}]


def _whole(value, name):
    if isinstance(value, bool):
        value = None
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = -1
    if number < 0 or (isinstance(value, float) and not value.is_integer()):
        raise BadRequest(f"Invalid request: {name} must be a whole number >= 0, got {value!r}", field=name)
    return number


def parse(fields, source, target, beam_size):
    """A Request from a /translate request's fields, for a model from `source` into `target`
    whose exported beam size is `beam_size` (alternatives come from the beam)."""
    for name in ("q", "source", "target"):
        if fields.get(name) in (None, "", []):
            raise BadRequest(f"Invalid request: missing {name} parameter", field=name)
    q = fields["q"]
    if not (isinstance(q, str) or (isinstance(q, list) and all(isinstance(t, str) for t in q))):
        raise BadRequest("Invalid request: q must be a string or a list of strings", field="q")
    for name, supported in (("source", (source, "auto")), ("target", (target,))):
        if fields[name] not in supported:
            raise BadRequest(f"{fields[name]} is not supported", field=name)
    text_format = fields.get("format") or "text"
    if text_format != "text":
        raise BadRequest(
            f"{text_format} format is not supported (this server translates text)", field="format"
        )
    alternatives = _whole(fields.get("alternatives") or 0, "alternatives")
    if alternatives >= beam_size:
        raise BadRequest(
            f"Invalid request: alternatives must be at most {beam_size - 1} (the model's beam size is {beam_size})",
            field="alternatives",
        )
    texts = [q] if isinstance(q, str) else q
    return Request(texts, isinstance(q, str), fields["source"] == "auto", alternatives)


def detected(text, tokenizer, source):
    """{"language", "confidence"}: the model's source language, with the percentage of the text's
    characters that are pieces of its vocabulary (a character that is none becomes <unk>)."""
    unknown, characters = text_batches.unknown_characters(tokenizer, text)
    return {"language": source, "confidence": round(100.0 * (characters - unknown) / max(1, characters), 1)}


def respond(request, translations, tokenizer, source):
    """The /translate answer: translatedText (a string, or a list when q was), and alternatives
    and detectedLanguage when asked for."""
    answers = []
    for text, translation in zip(request.texts, translations):
        answer = {"translatedText": translation.text}
        if request.alternatives:
            answer["alternatives"] = [h.text for h in translation.alternatives[1 : request.alternatives + 1]]
        if request.auto:
            answer["detectedLanguage"] = detected(text, tokenizer, source)
        answers.append(answer)
    if request.single:
        return answers[0]
    return (
        {key: [answer[key] for answer in answers] for key in answers[0]}
        if answers
        else {"translatedText": []}
    )

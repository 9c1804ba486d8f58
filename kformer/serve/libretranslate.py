"""LibreTranslate's API, so that its clients and apps work unchanged: `POST /translate` (q a string
or a list; source, target, format, alternatives, api_key; a JSON body, a URL-encoded form or the
query string), `POST /detect`, `GET /languages`, and its error shape {"error": message}.

The server routes a request to the model of its source and target; source "auto" is the served
source language into `target` that kformer.serve.detect finds (reported as detectedLanguage).
format "html" translates a web page's text and keeps its markup (kformer.serve.html).
"""

import dataclasses
import json

from kformer.contracts.pair import language_name
from kformer.serve.requests import BadRequest

ALIASES = {"zh-Hans": "zh", "zh-CN": "zh"}  # LibreTranslate 1.9's name of Chinese, and a common one


@dataclasses.dataclass(frozen=True)
class Request:
    texts: list
    single: bool  # q was a string: answers are strings, not lists
    source: str  # a language code, or "auto"
    target: str
    alternatives: int
    html: bool  # format "html": q is a web page, its markup kept (kformer.serve.html)


def languages(pairs):
    """GET /languages: every language the server translates from, with its targets; `pairs`:
    (source, target) of each model, in the order served."""
    targets = {}
    for source, target in pairs:
        targets.setdefault(source, []).append(target)
    return [{"code": s, "name": language_name(s), "targets": t} for s, t in targets.items()]


def _whole(value, name):
    """A whole number >= 0 given as a number or its digits (a form's fields are text); anything
    else, however large or odd (true, 1e999), is a 400 naming the field and what it got."""
    number = -1
    if not isinstance(value, bool) and (not isinstance(value, float) or value.is_integer()):
        try:
            number = int(value)
        except (TypeError, ValueError, OverflowError):
            pass
    if number < 0:
        shown = json.dumps(value)[:40] if isinstance(value, bool | float) else repr(value)[:40]
        raise BadRequest(f"Invalid request: {name} must be a whole number >= 0, got {shown}", field=name)
    return number


def parse(fields):
    """A Request from a /translate request's fields (the server checks the pair and the
    alternatives against the model it picks: `check_alternatives`)."""
    for name in ("q", "source", "target"):
        if fields.get(name) in (None, "", []):
            raise BadRequest(f"Invalid request: missing {name} parameter", field=name)
    q = fields["q"]
    if not (isinstance(q, str) or (isinstance(q, list) and all(isinstance(t, str) for t in q))):
        raise BadRequest("Invalid request: q must be a string or a list of strings", field="q")
    for name in ("source", "target"):
        if not isinstance(fields[name], str):
            raise BadRequest(f"Invalid request: {name} must be a language code", field=name)
    text_format = fields.get("format") or "text"
    if text_format not in ("text", "html"):
        raise BadRequest(f"{text_format} format is not supported (text or html)", field="format")
    alternatives = _whole(fields.get("alternatives") or 0, "alternatives")
    texts = [q] if isinstance(q, str) else q
    source, target = (ALIASES.get(fields[name], fields[name]) for name in ("source", "target"))
    return Request(texts, isinstance(q, str), source, target, alternatives, text_format == "html")


def check_alternatives(request, beam_size):
    """Alternatives come from the beam: at most beam_size - 1 besides the translation."""
    if request.alternatives >= beam_size:
        raise BadRequest(
            f"Invalid request: alternatives must be at most {beam_size - 1} (the model's beam size is {beam_size})",
            field="alternatives",
        )


def respond(request, translations, detected=None):
    """The /translate answer: translatedText (a string, or a list when q was), alternatives when
    asked for, and detectedLanguage ({"language", "confidence"} of each text) for source "auto"."""
    answers = []
    for text, translation in zip(request.texts, translations):
        answer = {"translatedText": translation.text}
        if request.alternatives:
            answer["alternatives"] = [h.text for h in translation.alternatives[1 : request.alternatives + 1]]
        if detected is not None:
            answer["detectedLanguage"] = detected(text)
        answers.append(answer)
    if request.single:
        return answers[0]
    return (
        {key: [answer[key] for answer in answers] for key in answers[0]}
        if answers
        else {"translatedText": []}
    )

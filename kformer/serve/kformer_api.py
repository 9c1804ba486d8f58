"""kformer's own JSON API: `POST /v1/translate` {"texts": [str, ...], "source" and "target" (language
codes: needed where the server has several models; source may be "auto"), "format" ("text", or
"html": each text a web page whose markup is kept; no alternatives), and any search option:
"beam_size", "alpha", "max_length", "no_repeat_ngram", "nbest"} ->
{"translations": [{"translation", "score", "alternatives": [{"translation", "score"}, ...]}, ...]},
one per text, in order (kformer.decode.text_batches.Translation.to_dict)."""

from kformer.serve.requests import BadRequest, json_object

OPTIONS = ("beam_size", "alpha", "max_length", "no_repeat_ngram", "nbest")


PAIR = ("source", "target")
FORMATS = ("text", "html")


def parse(body):
    """(texts, {"source", "target"}: a code or None each, search option changes, whether the
    texts are web pages) of a request body."""
    data = json_object(body)
    unknown = sorted(set(data) - {"texts", "format", *PAIR, *OPTIONS})
    if unknown:
        raise BadRequest(
            f"unknown field {unknown[0]!r}; the fields are texts, format, {', '.join(PAIR + OPTIONS)}",
            field=unknown[0],
        )
    texts = data.get("texts")
    if texts is None:
        raise BadRequest("missing field 'texts' (a list of strings)", field="texts")
    if not isinstance(texts, list) or not all(isinstance(text, str) for text in texts):
        raise BadRequest("field 'texts' must be a list of strings", field="texts")
    for name in PAIR:
        if data.get(name) is not None and not isinstance(data[name], str):
            raise BadRequest(f"field {name!r} must be a language code", field=name)
    if data.get("format", "text") not in FORMATS:
        raise BadRequest(f"field 'format' must be one of {', '.join(FORMATS)}", field="format")
    pair = {name: data.get(name) or None for name in PAIR}
    changes = {name: data[name] for name in OPTIONS if data.get(name) is not None}
    return texts, pair, changes, data.get("format") == "html"


def respond(translations):
    return {"translations": [t.to_dict() for t in translations]}

"""Reading request bodies strictly: a size limit, JSON or a URL-encoded form (or the query string),
valid UTF-8, text that is text. Every failure is a `BadRequest` with the status and a message
naming what is wrong; a client that leaves before its body is in is `ClientGone`."""

import json
import urllib.parse

from starlette.requests import ClientDisconnect


class BadRequest(Exception):
    def __init__(self, message, status=400, field=None):
        super().__init__(message)
        self.status, self.field = status, field


class ClientGone(Exception):
    """The client disconnected before its answer was ready (counted as 499, nginx's code)."""


async def read_body(request, max_bytes):
    """The request's body, or 413 once it is over max_bytes (read no further than that)."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > max_bytes:
        raise BadRequest(
            f"the request body is {int(declared):,} bytes, more than the limit {max_bytes:,}", 413
        )
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:
                raise BadRequest(f"the request body is over the limit of {max_bytes:,} bytes", 413)
            chunks.append(chunk)
    except ClientDisconnect:
        raise ClientGone from None
    return b"".join(chunks)


def _form(raw, where):
    try:
        return dict(urllib.parse.parse_qsl(raw.decode("utf-8"), keep_blank_values=True, errors="strict"))
    except UnicodeDecodeError as e:
        raise BadRequest(f"the {where} is not valid UTF-8 (at byte {e.start})") from None


def json_object(body):
    """A JSON body that must be an object."""
    try:
        value = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise BadRequest(f"the request body is not valid UTF-8 (at byte {e.start})") from None
    except ValueError as e:
        raise BadRequest(f"the request body is not valid JSON ({e})") from None
    except RecursionError:  # the parser's stack, not the server's fault: no request nests this deep
        raise BadRequest("the request body is nested too deeply to be a request") from None
    if not isinstance(value, dict):
        raise BadRequest(f"the request body must be a JSON object, not {type(value).__name__}")
    for key, item in value.items():
        check_text(key, None)
        for text in item if isinstance(item, list) else [item]:
            if isinstance(text, str):
                check_text(text, key)
    return value


def check_text(text, field):
    """Refuses a string that is not text: JSON's escapes can spell a lone surrogate ("\\ud800"),
    which is no character, and which no tokenizer, parser or answer can encode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        where = f"field {field!r}" if field else "a field's name"
        raise BadRequest(
            f"Invalid request: {where} holds a lone surrogate (U+{ord(text[e.start]):04X} at {e.start}), "
            "which is not text",
            field=field,
        ) from None


def fields(request, body):
    """Fields of a request as LibreTranslate reads them: the query string's, then the body's (a
    JSON object, or a URL-encoded form) over them."""
    values = _form(request.scope.get("query_string", b""), "query string")
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind == "application/json" or (not kind and body.lstrip().startswith(b"{")):
        values.update(json_object(body))
    elif kind in ("application/x-www-form-urlencoded", "") or not body:
        values.update(_form(body, "request body"))
    else:
        raise BadRequest(f"unsupported Content-Type {kind}: send JSON or a URL-encoded form", 415)
    return values

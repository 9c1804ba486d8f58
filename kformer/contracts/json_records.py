"""JSON files as frozen dataclasses: read and written in one place, checked field by field.

A `Record` subclass declares its fields with their types; `from_dict` builds it from a JSON
object, refusing a value of another type with one line naming the file and the field (so that a
hand-edited or truncated file is an error, never a KeyError later), and `to_dict` gives the
object written back. Fields of a nested Record, a tuple of them, a `LanguagePair` (written as
"zh-en") or `X | None` are converted both ways; other values are JSON's own.
"""

import dataclasses
import json
import os
import types
import typing


def write_json(path, value):
    """Writes `value` as JSON atomically (temp file, then rename): never a half-written file."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=2, sort_keys=True, ensure_ascii=False)
        f.write("\n")
    os.replace(tmp, path)


def read_json(path, error=ValueError):
    """The JSON value in `path`; `error` (a ValueError) naming the file if it is not valid JSON."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise error(f"{path}: not valid JSON ({e})") from None


class Record:
    """Base of the frozen dataclasses kept as JSON objects. `ERROR` is the ValueError subclass
    a malformed file raises; keys a record does not declare are left out when it is read (a
    newer kformer's additions)."""

    ERROR: typing.ClassVar[type] = ValueError

    @classmethod
    def from_dict(cls, values, where="record"):
        if not isinstance(values, dict):
            raise cls.ERROR(f"{where}: expected a JSON object, got {type(values).__name__}")
        hints = typing.get_type_hints(cls)
        found = {}
        for field in dataclasses.fields(cls):
            if field.name in values:
                found[field.name] = _decoded(
                    hints[field.name], values[field.name], f"{where}: {field.name}", cls
                )
            elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
                raise cls.ERROR(f"{where}: {field.name} is missing")
        return cls(**found)

    def check_types(self):
        """Raises ERROR naming the first field whose value is not of its declared type (for
        values made in Python, which `from_dict` did not check)."""
        hints = typing.get_type_hints(type(self))
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            _decoded(hints[field.name], _encoded(value), f"{type(self).__name__}: {field.name}", type(self))

    def to_dict(self):
        return {field.name: _encoded(getattr(self, field.name)) for field in dataclasses.fields(self)}

    @classmethod
    def load(cls, path):
        return cls.from_dict(read_json(path, cls.ERROR), where=path)

    def save(self, path):
        write_json(path, self.to_dict())

    def replace(self, **changes):
        """A copy with `changes` (dataclasses.replace)."""
        return dataclasses.replace(self, **changes)


def _decoded(kind, value, where, record):
    """`value` of a JSON file as the field type `kind` wants it."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(kind):
            return None
        options = [k for k in typing.get_args(kind) if k is not type(None)]
        for option in options[:-1]:  # the first type the value is; the last one's error
            try:
                return _decoded(option, value, where, record)
            except record.ERROR:
                pass
        return _decoded(options[-1], value, where, record)
    if typing.get_origin(kind) is tuple:
        item = typing.get_args(kind)[0]
        _expect(value, list, where, record)
        return tuple(_decoded(item, v, f"{where}[{i}]", record) for i, v in enumerate(value))
    if typing.get_origin(kind) is dict and _is_record(typing.get_args(kind)[1]):
        _expect(value, dict, where, record)
        item = typing.get_args(kind)[1]
        return {k: _nested(item, v, f"{where}: {k}", record) for k, v in value.items()}
    if _is_record(kind):
        return _nested(kind, value, where, record)
    if hasattr(kind, "parse"):  # a value written as its text (LanguagePair)
        _expect(value, str, where, record)
        try:
            return kind.parse(value)
        except ValueError as e:
            raise record.ERROR(f"{where}: {e}") from None
    base = typing.get_origin(kind) or kind
    _expect(value, (int, float) if base is float else base, where, record)
    return value


def _nested(kind, value, where, record):
    """A Record inside `record`: its errors are the outer record's (the file's) kind."""
    try:
        return kind.from_dict(value, where)
    except ValueError as e:
        raise record.ERROR(str(e)) from None


def _is_record(kind):
    return isinstance(kind, type) and issubclass(kind, Record)


def _expect(value, kind, where, record):
    if not isinstance(value, kind) or (isinstance(value, bool) and kind in (int, (int, float))):
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise record.ERROR(f"{where} must be {names}, got {json.dumps(value, default=repr)[:80]}")


def _encoded(value):
    if isinstance(value, Record):
        return value.to_dict()
    if isinstance(value, tuple):
        return [_encoded(v) for v in value]
    if isinstance(value, dict):
        return {k: _encoded(v) for k, v in value.items()}
    if hasattr(value, "parse"):
        return str(value)
    return value

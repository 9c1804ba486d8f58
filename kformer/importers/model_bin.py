"""CTranslate2's model.bin, read without CTranslate2: its variables by name, as float32 where
they are weights (int8 rows divided by their scales, float16 and bfloat16 widened) and as
Python scalars where they are settings (num_heads, pre_norm, activation, ...).

The layout (binary version 6, what CTranslate2 3.0 and later write): a uint32 version, the spec's
name, a uint32 revision, a uint32 count of variables, each one's name, uint8 rank, uint32 dims,
uint8 dtype and uint32 byte count before its bytes; then a uint32 count of aliases, each a name and
the name of the variable it stands for. Strings are a uint16 length (with the final NUL) and bytes."""

import struct

import numpy as np

VERSION = 6
DTYPES = ("float32", "int8", "int16", "int32", "float16", "bfloat16")  # CTranslate2's DataType order


class ModelBin:
    """The model.bin at `path`: `spec` (e.g. "TransformerSpec"), `revision`, `variables` {name:
    array or scalar}. A file of another version or cut short is a one-line ValueError."""

    def __init__(self, path):
        self.path = path
        with open(path, "rb") as f:
            self._data, self._at = f.read(), 0
        try:
            self._read()
        except (struct.error, UnicodeDecodeError, IndexError) as e:
            raise ValueError(f"{path}: cut short or not a CTranslate2 model ({e})") from None
        del self._data

    def _unpack(self, fmt):
        values = struct.unpack_from(f"<{fmt}", self._data, self._at)
        self._at += struct.calcsize(f"<{fmt}")
        return values if len(values) > 1 else values[0]

    def _string(self):
        length = self._unpack("H")
        text = self._data[self._at : self._at + length - 1].decode("utf-8")
        self._at += length
        return text

    def _read(self):
        version = self._unpack("I")
        if version != VERSION:
            raise ValueError(
                f"{self.path}: CTranslate2 binary version {version}; kformer reads version {VERSION} "
                "(convert the model again with ctranslate2 >= 3.0)"
            )
        self.spec, self.revision = self._string(), self._unpack("I")
        raw = {}
        for _ in range(self._unpack("I")):
            name = self._string()
            shape = [self._unpack("I") for _ in range(self._unpack("B"))]
            dtype, size = DTYPES[self._unpack("B")], self._unpack("I")
            if self._at + size > len(self._data):
                raise ValueError(f"{self.path}: cut short in {name}")
            raw[name] = _array(self._data[self._at : self._at + size], dtype, shape)
            self._at += size
        for _ in range(self._unpack("I")):
            alias, name = self._string(), self._string()
            raw[alias] = raw[name]
        self.variables = _dequantized(raw)


def _array(data, dtype, shape):
    if dtype == "bfloat16":  # the upper half of a float32's bits
        bits = np.frombuffer(data, np.uint16).astype(np.uint32) << 16
        return bits.view(np.float32).reshape(shape)
    array = np.frombuffer(data, dtype).reshape(shape)
    return array.item() if not shape else array


def _dequantized(raw):
    """Every weight as float32: an int8 or int16 weight times 1 / its `_scale` (per row, or one)."""
    values = {}
    for name, value in raw.items():
        if name.endswith("_scale") or not isinstance(value, np.ndarray):
            values.setdefault(name, value)
            continue
        scale = raw.get(f"{name}_scale")
        if scale is not None:
            scale = np.asarray(scale, np.float32)
            value = value.astype(np.float32) / (scale[:, None] if scale.ndim else scale)
        values[name] = value.astype(np.float32)
    return {name: value for name, value in values.items() if not name.endswith("_scale")}

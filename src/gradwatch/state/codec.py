"""Objects to JSON and back, as data only: the values parsers and detectors keep between scans.

What `Encoder` takes: None, bools, ints, strings, floats (non-finite ones tagged), lists, tuples,
sets, dicts, deques, bytes, stdlib and numpy arrays (numbers as base64 of their bytes, other
dtypes item by item) and numpy scalars, DataFrames (as columns), compiled regexes (pattern and
flags), bare `object()` tokens, members of known enums, known named tuples, and objects of known
classes (`gradwatch.state.known_types`) through their `state_dict()` (by default their
attributes) with their class's `STATE_VERSION`. Anything else is a `StateError` when saving: no
value is written that cannot be read back as data.

Every container and object is numbered in the order it is first met, and met again it is written as
`{"$": "ref", "i": N}`: objects shared between a parser and the stream (the skip counters, the
templates a Megatron parser compares by identity) are shared again after loading.

`Decoder` makes nothing but those types, classes only by their registered name from the same
allow-list (never an import, never a constructor but a named tuple's: `cls.__new__` and the saved
attributes), and refuses any damage with a `StateError`: a wrong type, an unknown class, tag or
key, another class version, nesting deeper than `MAX_DEPTH`.
"""

from __future__ import annotations

import array
import base64
import binascii
import enum
import math
import re
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from gradwatch.state.stateful import StateError, load_state, state_of, state_version

__all__ = ["MAX_DEPTH", "Decoder", "Encoder", "StateError"]

#: Deeper nesting than any gradwatch state has: a file that nests more was not written by us.
MAX_DEPTH = 100
#: numpy dtypes kept as their bytes (bools and numbers); others go element by element
_RAW_KINDS = frozenset("biufc")
_FLOATS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


class Encoder:
    """Encodes one graph of objects; references between its parts are kept (see module docstring)."""

    def __init__(self, known: Mapping[str, type]) -> None:
        self._known = known
        self._memo: dict[int, int] = {}
        self._alive: list[object] = []  # (ids are unique only while their objects live)

    def encode(self, value: Any, depth: int = 0) -> Any:
        kind = type(value)
        if value is None or kind in (bool, int, str):
            return value
        if kind is float:
            return value if math.isfinite(value) else {"$": "f", "v": repr(value)}
        if depth > MAX_DEPTH:
            raise StateError(f"nested deeper than {MAX_DEPTH} levels")
        seen = self._memo.get(id(value))
        if seen is not None:
            return {"$": "ref", "i": seen}
        self._memo[id(value)] = len(self._memo)
        self._alive.append(value)
        return self._compound(value, kind, depth + 1)

    def _compound(self, value: Any, kind: type, depth: int) -> Any:
        enc = self.encode
        if kind is list:
            return [enc(v, depth) for v in value]
        if kind is tuple:
            return {"$": "tuple", "v": [enc(v, depth) for v in value]}
        if kind in (set, frozenset):
            return {"$": kind.__name__, "v": [enc(v, depth) for v in value]}
        if kind is dict:
            return {"$": "dict", "v": [[enc(k, depth), enc(v, depth)] for k, v in value.items()]}
        if kind is deque:
            return {"$": "deque", "v": [enc(v, depth) for v in value], "n": value.maxlen}
        if kind is bytes:
            return {"$": "bytes", "v": base64.b64encode(value).decode()}
        if kind is np.ndarray:
            return self._array(value, depth)
        if isinstance(value, np.generic):
            return {"$": "np", "dt": value.dtype.str, "v": enc(value.item(), depth)}
        if kind is pd.DataFrame:
            columns = [enc(c, depth) for c in value.columns]
            arrays = [self._array(value[c].to_numpy(), depth) for c in value.columns]
            return {"$": "df", "c": columns, "v": arrays, "i": self._array(value.index.to_numpy(), depth)}
        if kind is re.Pattern:
            return {"$": "re", "p": enc(value.pattern, depth), "fl": value.flags}
        if kind is object:
            return {"$": "token"}
        if kind is array.array:
            return {"$": "array", "tc": value.typecode, "v": base64.b64encode(value.tobytes()).decode()}
        name = _qualname(kind)
        if self._known.get(name) is not kind:
            raise StateError(f"{name} is not a type gradwatch saves")
        if isinstance(value, enum.Enum):
            return {"$": "enum", "c": name, "v": value.name}
        if isinstance(value, tuple):  # a NamedTuple
            return {"$": "ntuple", "c": name, "v": [enc(v, depth) for v in value]}
        state = {str(k): enc(v, depth) for k, v in state_of(value).items()}
        return {"$": "obj", "c": name, "ver": state_version(kind), "s": state}

    def _array(self, array: np.ndarray, depth: int) -> dict[str, Any]:
        if array.dtype.kind in _RAW_KINDS:
            raw = np.ascontiguousarray(array).tobytes()
            return {"$": "nd", "dt": array.dtype.str, "sh": list(array.shape), "v": base64.b64encode(raw).decode()}
        return {"$": "nd", "dt": "O", "sh": list(array.shape), "v": [self.encode(v, depth) for v in array.ravel()]}


class Decoder:
    """Decodes what one `Encoder` wrote; raises `StateError` for anything it did not write."""

    def __init__(self, known: Mapping[str, type]) -> None:
        self._known = known
        self._memo: list[Any] = []
        self._tags: dict[str, Callable[[dict[str, Any], int], Any]] = {
            "tuple": lambda d, n: tuple(self._items(d, n)),
            "set": lambda d, n: set(self._items(d, n)),
            "frozenset": lambda d, n: frozenset(self._items(d, n)),
            "deque": self._deque,
            "dict": self._dict,
            "bytes": lambda d, n: self._b64(d["v"]),
            "nd": self._array,
            "np": self._np_scalar,
            "df": self._frame,
            "re": self._regex,
            "token": lambda d, n: object(),
            "array": self._stdlib_array,
            "enum": self._enum,
            "obj": self._object,
            "ntuple": self._named_tuple,
        }

    def decode(self, data: Any, depth: int = 0) -> Any:
        try:
            return self._decode(data, depth)
        except StateError:
            raise
        except (KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError, re.error) as e:
            raise StateError(f"damaged value ({type(e).__name__}: {e})") from None

    def _decode(self, data: Any, depth: int) -> Any:
        kind = type(data)
        if data is None or kind in (bool, int, float, str):
            return data
        if depth > MAX_DEPTH:
            raise StateError(f"nested deeper than {MAX_DEPTH} levels")
        if kind is list:
            out: list[Any] = []
            self._memo.append(out)
            out.extend(self._decode(v, depth + 1) for v in data)
            return out
        if kind is not dict:
            raise StateError(f"unexpected {kind.__name__}")
        tag = data.get("$")
        if tag == "f":
            return _FLOATS[data["v"]]
        if tag == "ref":
            index = data["i"]
            if type(index) is not int or not 0 <= index < len(self._memo) or self._memo[index] is _PENDING:
                raise StateError(f"reference to {index!r}, which is not an earlier value")
            return self._memo[index]
        decode = self._tags.get(tag) if isinstance(tag, str) else None
        if decode is None:
            raise StateError(f"unknown tag {tag!r}")
        slot = len(self._memo)
        self._memo.append(_PENDING)  # numbered before its parts, as the encoder numbered it
        value = decode(data, depth + 1)
        if self._memo[slot] is _PENDING:
            self._memo[slot] = value
        return value

    def _items(self, data: dict[str, Any], depth: int) -> list[Any]:
        items = data["v"]
        if type(items) is not list:
            raise StateError("items are not a list")
        return [self._decode(v, depth) for v in items]

    def _deque(self, data: dict[str, Any], depth: int) -> deque[Any]:
        maxlen = data["n"]
        if maxlen is not None and (type(maxlen) is not int or maxlen < 0):
            raise StateError(f"deque length {maxlen!r}")
        return deque(self._items(data, depth), maxlen)

    def _dict(self, data: dict[str, Any], depth: int) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        self._memo[-1] = out  # (its values may refer back to it)
        for pair in data["v"]:
            if type(pair) is not list or len(pair) != 2:
                raise StateError("a dict entry is not a pair")
            out[self._decode(pair[0], depth)] = self._decode(pair[1], depth)
        return out

    @staticmethod
    def _b64(text: Any) -> bytes:
        if type(text) is not str:
            raise StateError("bytes are not a base64 string")
        try:
            return base64.b64decode(text, validate=True)
        except binascii.Error as e:
            raise StateError(f"bad base64: {e}") from None

    def _array(self, data: dict[str, Any], depth: int) -> np.ndarray:
        shape = data["sh"]
        if type(shape) is not list or not all(type(n) is int and n >= 0 for n in shape):
            raise StateError(f"array shape {shape!r}")
        if data["dt"] == "O":
            items = self._items(data, depth)
            array = np.empty(len(items), dtype=object)
            array[:] = items
            return array.reshape(shape)
        dtype = np.dtype(str(data["dt"]))
        if dtype.kind not in _RAW_KINDS or dtype.fields is not None or dtype.subdtype is not None:
            raise StateError(f"array dtype {data['dt']!r}")
        return np.frombuffer(self._b64(data["v"]), dtype=dtype).reshape(shape).copy()

    def _np_scalar(self, data: dict[str, Any], depth: int) -> np.generic:
        dtype = np.dtype(str(data["dt"]))
        if dtype.kind not in _RAW_KINDS or dtype.fields is not None:
            raise StateError(f"scalar dtype {data['dt']!r}")
        return dtype.type(self._decode(data["v"], depth))  # type: ignore[no-any-return]

    def _frame(self, data: dict[str, Any], depth: int) -> pd.DataFrame:
        columns = [self._decode(c, depth) for c in data["c"]]
        arrays = [self._array(a, depth) for a in data["v"]]
        if len(columns) != len(arrays):
            raise StateError("a frame's columns and arrays differ in number")
        return pd.DataFrame(dict(zip(columns, arrays, strict=True)), index=self._array(data["i"], depth))

    def _regex(self, data: dict[str, Any], depth: int) -> re.Pattern[Any]:
        pattern, flags = self._decode(data["p"], depth), data["fl"]
        if type(pattern) not in (str, bytes) or type(flags) is not int:
            raise StateError("a regex is not a pattern and flags")
        return re.compile(pattern, flags)

    def _class(self, name: Any) -> type:
        cls = self._known.get(name) if isinstance(name, str) else None
        if cls is None:
            raise StateError(f"{name!r} is not a type gradwatch saves")
        return cls

    def _enum(self, data: dict[str, Any], depth: int) -> enum.Enum:
        cls = self._class(data["c"])
        if not issubclass(cls, enum.Enum) or not isinstance(data["v"], str):
            raise StateError(f"{data['c']} has no member {data['v']!r}")
        return cls[data["v"]]

    def _stdlib_array(self, data: dict[str, Any], depth: int) -> array.array[Any]:
        code = data["tc"]
        if not isinstance(code, str) or code not in array.typecodes:
            raise StateError(f"array type code {code!r}")
        out = array.array(code)
        out.frombytes(self._b64(data["v"]))
        return out

    def _named_tuple(self, data: dict[str, Any], depth: int) -> tuple[Any, ...]:
        cls = self._class(data["c"])
        items = self._items(data, depth)
        if not issubclass(cls, tuple) or len(items) != len(getattr(cls, "_fields", ())):
            raise StateError(f"{data['c']} is not a named tuple of {len(items)} fields")
        return cls(*items)  # type: ignore[no-any-return]

    def _object(self, data: dict[str, Any], depth: int) -> Any:
        cls = self._class(data["c"])
        if issubclass(cls, enum.Enum):
            raise StateError(f"{data['c']} is an enum")
        if data["ver"] != state_version(cls):
            raise StateError(f"{data['c']} state version {data['ver']!r}, this gradwatch has {state_version(cls)}")
        saved = data["s"]
        if type(saved) is not dict:
            raise StateError(f"the state of {data['c']} is not a mapping")
        obj = cls.__new__(cls)
        self._memo[-1] = obj  # (its attributes may refer back to it)
        load_state(obj, {k: self._decode(v, depth) for k, v in saved.items()})
        return obj


#: a slot numbered but not yet filled (a reference to it is a cycle that no encoder writes)
_PENDING = object()

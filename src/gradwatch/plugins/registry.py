"""Adding a class to a registry: checked when added (pluggy-style), and remembered with its origin.

Each registry (`gradwatch.detectors`, `gradwatch.parsers`) says what its classes must look like;
this module does the part they share: naming the plugin in the error, refusing a key that another
class holds, and remembering where each class came from for `gradwatch detectors`/`formats`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from gradwatch.errors import PluginError

#: The origin of the classes that ship with gradwatch.
BUILTIN = "built-in"

T = TypeVar("T")

_origins: dict[tuple[str, str], str] = {}
_loading: list[str] = []  # the plugins being imported, innermost last


@contextmanager
def loading(origin: str) -> Iterator[None]:
    """Classes registered inside this block come from `origin` (a plugin being imported)."""
    _loading.append(origin)
    try:
        yield
    finally:
        _loading.pop()


def origin_of(kind: str, name: str) -> str:
    """Where the registered `kind` ("detector" or "parser") `name` came from."""
    return _origins.get((kind, name), BUILTIN)


def add(table: dict[str, T], kind: str, key_attr: str, cls: T, problem: str | None) -> None:
    """Put `cls` in `table` under its `key_attr`, or raise `PluginError` saying who and what.

    `problem` is the registry's verdict on `cls` (None: it fits the contract). Registering the same
    class again is a no-op; another class under a taken key is an error.
    """
    origin = _loading[-1] if _loading else _origin_by_module(cls)
    who = f"{kind} {getattr(cls, '__qualname__', repr(cls))}"
    if origin != BUILTIN:
        who = f"plugin {origin}: {who}"
    if problem is not None:
        raise PluginError(f"{who}: {problem}")
    key: str = getattr(cls, key_attr)
    old = table.get(key)
    if old is cls:
        return
    if old is not None:
        raise PluginError(
            f"{who}: {key_attr} {key!r} is already registered by {origin_of(kind, key)} "
            f"({getattr(old, '__qualname__', old)}); choose another {key_attr}"
        )
    table[key] = cls
    _origins[(kind, key)] = origin


def _origin_by_module(cls: Any) -> str:
    """Outside a plugin import: gradwatch's own classes are built-in, anything else names its module."""
    module = str(getattr(cls, "__module__", "?"))
    return BUILTIN if module == "gradwatch" or module.startswith("gradwatch.") else f"module {module}"

"""What an object saves of itself between scans: `state_dict()` / `load_state_dict()`, versioned.

A class may define both (plain values in, plain values out: numbers, strings, lists, arrays, other
saved objects) and a `STATE_VERSION`, bumped when what it saves changes meaning. Most need
neither: by default an object saves its attributes (those of `__dict__` and `__slots__`) and
loads them back, and its version is 1. A dataclass's saved attributes must cover its fields,
and a saved name that the class does not know is refused (a state of another build of it).
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["StateError", "attributes", "load_state", "state_of", "state_version"]


class StateError(ValueError):
    """A saved state that this gradwatch cannot take up: damaged, or written by other code."""


def state_version(cls: type) -> int:
    version = getattr(cls, "STATE_VERSION", 1)
    return version if type(version) is int else 1


def attributes(obj: object) -> dict[str, Any]:
    """The instance attributes of `obj`: its `__dict__` and whatever its `__slots__` hold."""
    found = dict(getattr(obj, "__dict__", {}))
    for cls in type(obj).__mro__:
        for name in cls.__dict__.get("__slots__", ()):
            if name not in ("__dict__", "__weakref__") and hasattr(obj, name):
                found[name] = getattr(obj, name)
    return found


def state_of(obj: object) -> dict[str, Any]:
    """What `obj` saves: its own `state_dict()`, else its attributes."""
    custom = getattr(obj, "state_dict", None)
    return dict(custom()) if callable(custom) else attributes(obj)


def load_state(obj: object, state: dict[str, Any]) -> None:
    """Give `obj` (new, not initialised) the saved `state`; `StateError` when they do not fit."""
    custom = getattr(obj, "load_state_dict", None)
    if callable(custom):
        custom(state)
        return
    cls = type(obj)
    if dataclasses.is_dataclass(cls):
        fields = {f.name for f in dataclasses.fields(cls)}
        missing = fields - state.keys()
        unknown = {k for k in state.keys() - fields if not hasattr(cls, k)}
        if missing or unknown:
            what = f"lacks {sorted(missing)}" if missing else f"has unknown {sorted(unknown)}"
            raise StateError(f"the saved {cls.__qualname__} {what}")
    for name, value in state.items():
        object.__setattr__(obj, name, value)  # (frozen dataclasses too: this is their construction)

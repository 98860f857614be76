"""What `scan` keeps of parsers, detectors and incidents between runs, as data (never a pickle).

`dump` turns an object graph into JSON-able data (`codec`), each object through its
`state_dict()` with its class's `STATE_VERSION` (`stateful`); `restore` makes it again from that
data, with classes from an allow-list only (`known_types`); `restore_check` also holds a file's
restored parsers and detectors against new ones built from the current config and code, so that a
state of another build (a parser that has gained an attribute) is refused, not run.
"""

from __future__ import annotations

import sys
from types import CodeType
from typing import Any

from gradwatch.config import Settings
from gradwatch.detectors import DETECTORS
from gradwatch.parsers import PARSERS
from gradwatch.pipeline import FileCheck
from gradwatch.state.codec import Decoder, Encoder
from gradwatch.state.stateful import StateError, attributes

__all__ = ["StateError", "dump", "known_types", "restore", "restore_check"]

#: Modules whose classes hold the state of a check or of the incidents. Looked up among the
#: modules already imported: a name in a state file never imports anything.
_MODULES = frozenset(
    {
        "gradwatch.alerts",
        "gradwatch.config",
        "gradwatch.downsample",
        "gradwatch.events",
        "gradwatch.evidence",
        "gradwatch.incidents",
        "gradwatch.pipeline",
        "gradwatch.records",
        "gradwatch.spike_score",
        "gradwatch.plugins.guard",
    }
)
_PACKAGES = ("gradwatch.parsers.", "gradwatch.detectors.")


def known_types() -> dict[str, type]:
    """The classes a state may hold, by qualified name: those of gradwatch's state modules, its
    parsers' and detectors' modules, and the registered parsers and detectors (plugins' too)."""
    found: list[type] = [*PARSERS.values(), *DETECTORS.values(), *(d.Config for d in DETECTORS.values())]
    for name, module in list(sys.modules.items()):
        if name in _MODULES or name.startswith(_PACKAGES):
            found += [v for v in vars(module).values() if isinstance(v, type) and v.__module__ == name]
    return {f"{cls.__module__}.{cls.__qualname__}": cls for cls in found}


def dump(obj: object) -> Any:
    """`obj` as JSON-able data; `StateError` when it holds a value of a type not saved."""
    try:
        return Encoder(known_types()).encode(obj)
    except RecursionError:
        raise StateError("nested too deeply") from None


def restore(data: Any) -> Any:
    """The object `dump` gave `data` for; `StateError` when `data` is anything else."""
    try:
        return Decoder(known_types()).decode(data)
    except RecursionError:
        raise StateError("nested too deeply") from None


def restore_check(data: Any, path: str, settings: Settings) -> FileCheck:
    """A saved check of `path`, if its parsers and detectors are those this code and `settings`
    build, with the same attributes; `StateError` otherwise."""
    check = restore(data)
    if type(check) is not FileCheck:
        raise StateError(f"a {type(check).__name__}, not a check")
    fresh = FileCheck(path, settings)
    _same_parts("parser", check.stream.parsers, fresh.stream.parsers)
    _same_parts("detector", check.detectors, fresh.detectors)
    return check


def _same_parts(what: str, saved: Any, fresh: list[Any]) -> None:
    """Refuse saved parts of other classes, lacking an attribute a new one has, or holding one
    that their code never names (a state of another build: it would fail further on)."""
    if type(saved) is not list or [type(p) for p in saved] != [type(p) for p in fresh]:
        raise StateError(f"the {what}s are not those of this gradwatch and config")
    for old, new in zip(saved, fresh, strict=True):
        kept, wanted = attributes(old).keys(), attributes(new).keys()
        unknown = kept - wanted - _names_in_code(type(new))
        if wanted - kept or unknown:
            change = f"lacks {sorted(wanted - kept)}" if wanted - kept else f"has unknown {sorted(unknown)}"
            raise StateError(f"the saved {type(new).__name__} {change}")


def _names_in_code(cls: type) -> set[str]:
    """The names the methods of `cls` use (attributes set after `__init__` among them)."""
    members = [v for klass in cls.__mro__ for v in vars(klass).values()]
    functions = [f for v in members for f in ((v.fget, v.fset) if isinstance(v, property) else (v,))]
    codes = [getattr(getattr(f, "__func__", f), "__code__", None) for f in functions]
    names: set[str] = set()
    while codes:
        code = codes.pop()
        if isinstance(code, CodeType):
            names.update(code.co_names)
            codes += code.co_consts
    return names

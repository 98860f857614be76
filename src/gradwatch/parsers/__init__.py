"""Parser registry: trainer families by name, in the order lines are offered to them.

Main parsers come first; auxiliary ones (DeepSpeed engine lines, errors) read lines that appear
inside every trainer's log. `new_parsers()` gives fresh instances: each file has its own state.
Plugin parsers register after the built-in ones (see `gradwatch.plugins`), so they are offered
the lines that no built-in main parser took.
"""

from __future__ import annotations

import inspect
import re

from gradwatch.errors import UsageError
from gradwatch.parsers.base import ParseOutput, Parser
from gradwatch.parsers.composer import ComposerParser
from gradwatch.parsers.config_blocks import ConfigParser
from gradwatch.parsers.deepspeed import DeepSpeedParser
from gradwatch.parsers.errors_parser import ErrorParser
from gradwatch.parsers.fp16_scaler import Fp16ScalerParser
from gradwatch.parsers.generic import GenericParser
from gradwatch.parsers.hf_trainer import HfTrainerParser
from gradwatch.parsers.jsonl import JsonlParser
from gradwatch.parsers.megatron import MegatronParser
from gradwatch.parsers.nemo import NemoParser
from gradwatch.parsers.olmo import OlmoParser
from gradwatch.parsers.torchtitan import TorchtitanParser
from gradwatch.plugins import registry
from gradwatch.records import COLUMNS, declare_extra_metrics

__all__ = ["PARSERS", "ParseOutput", "Parser", "new_parsers", "register"]

PARSERS: dict[str, type[Parser]] = {}


def register(cls: type[Parser]) -> type[Parser]:
    """Add a parser class, checked now rather than at the first line it reads (pluggy-style).

    Raises `PluginError` naming the plugin and the mismatch: not a `Parser`, no `name` or
    `description`, `parse` not implemented, a `scan` that does not compile, an `extra_metrics` name
    that clashes with a column, or a name another class holds.
    """
    registry.add(PARSERS, "parser", "name", cls, _problem(cls))
    declare_extra_metrics(cls.extra_metrics)
    return cls


_NAME = re.compile(r"[a-z][a-z0-9_-]*\Z")
_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]*\Z")


def _problem(cls: object) -> str | None:
    """What keeps `cls` from being a parser, in words; None when it fits."""
    if not (isinstance(cls, type) and issubclass(cls, Parser)):
        return "is not a subclass of gradwatch.api.Parser"
    if not (isinstance(getattr(cls, "name", None), str) and _NAME.match(cls.name)):
        return "needs `name`: a lowercase str such as 'mytrainer' (for --format and reports)"
    if not isinstance(getattr(cls, "description", None), str):
        return "needs `description`: a one-line str for `gradwatch formats`"
    if inspect.isabstract(cls):
        return f"does not implement {', '.join(sorted(cls.__abstractmethods__))}"
    if cls.scan is not None:
        try:
            re.compile(cls.scan)
        except (TypeError, re.error) as e:
            return f"`scan` must be None or a regex, got {cls.scan!r}: {e}"
    extra = cls.extra_metrics
    if not isinstance(extra, tuple) or not all(isinstance(n, str) and _IDENTIFIER.match(n) for n in extra):
        return f"`extra_metrics` must be a tuple of lowercase identifiers, got {extra!r}"
    taken = sorted(set(extra) & {*COLUMNS, "source"})
    if taken:
        return f"`extra_metrics` {taken} are canonical columns already: record them under that name"
    return None


# NeMo 2.0 lines contain `iteration 3/9 |`: the FSDP-style parsers go before Megatron's.
for _cls in (
    OlmoParser,
    ComposerParser,
    TorchtitanParser,
    HfTrainerParser,
    NemoParser,
    JsonlParser,
    MegatronParser,
    DeepSpeedParser,
    Fp16ScalerParser,
    ConfigParser,
    ErrorParser,
    GenericParser,
):
    register(_cls)


def new_parsers(fmt: str | None = None, extra: list[Parser] | None = None, path: str = "") -> list[Parser]:
    """Fresh parser instances for one file: all of them, or one format plus the auxiliary ones.

    `extra` are parsers built from the config (user regex formats); `fmt` may name one of them.
    Installed plugins are loaded first; theirs run behind a guard that names `path` if they fail.
    """
    from gradwatch.plugins import guard, loader  # they import this registry: not at module level

    loader.load_installed()
    extra_names = {p.name for p in extra or []}
    if fmt is not None and fmt not in PARSERS and fmt not in extra_names:
        known = sorted(PARSERS.keys() | extra_names)
        raise UsageError(f"unknown format {fmt!r}; known formats: {', '.join(known)}")
    made = (
        guard.new_parser(cls, path)
        for name, cls in PARSERS.items()
        if fmt is None or name == fmt or (cls.auxiliary and not cls.fallback)
    )
    chosen = [p for p in made if p is not None]
    extras = [p for p in extra or [] if fmt is None or fmt not in extra_names or p.name == fmt]
    main = [p for p in chosen if not p.auxiliary] + extras
    return main + [p for p in chosen if p.auxiliary and not p.fallback] + [p for p in chosen if p.fallback]

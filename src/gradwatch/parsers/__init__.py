"""Parser registry: trainer families by name, in the order lines are offered to them.

Main parsers come first; auxiliary ones (DeepSpeed engine lines, errors) read lines that appear
inside every trainer's log. `new_parsers()` gives fresh instances: each file has its own state.
"""

from __future__ import annotations

from gradwatch.errors import UsageError
from gradwatch.parsers.base import ParseOutput, Parser
from gradwatch.parsers.composer import ComposerParser
from gradwatch.parsers.deepspeed import DeepSpeedParser
from gradwatch.parsers.errors_parser import ErrorParser
from gradwatch.parsers.hf_trainer import HfTrainerParser
from gradwatch.parsers.jsonl import JsonlParser
from gradwatch.parsers.megatron import MegatronParser
from gradwatch.parsers.nemo import NemoParser
from gradwatch.parsers.olmo import OlmoParser
from gradwatch.parsers.torchtitan import TorchtitanParser

__all__ = ["PARSERS", "ParseOutput", "Parser", "new_parsers", "register"]

PARSERS: dict[str, type[Parser]] = {}


def register(cls: type[Parser]) -> type[Parser]:
    """Add a parser class to the registry; refuses a name that is taken."""
    if cls.name in PARSERS and PARSERS[cls.name] is not cls:
        raise ValueError(f"parser name {cls.name!r} is already registered by {PARSERS[cls.name]!r}")
    PARSERS[cls.name] = cls
    return cls


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
    ErrorParser,
):
    register(_cls)


def new_parsers(fmt: str | None = None, extra: list[Parser] | None = None) -> list[Parser]:
    """Fresh parser instances for one file: all of them, or one format plus the auxiliary ones.

    `extra` are parsers built from the config (user regex formats); `fmt` may name one of them.
    """
    extra_names = {p.name for p in extra or []}
    if fmt is not None and fmt not in PARSERS and fmt not in extra_names:
        known = sorted(PARSERS.keys() | extra_names)
        raise UsageError(f"unknown format {fmt!r}; known formats: {', '.join(known)}")
    chosen = [cls() for name, cls in PARSERS.items() if fmt is None or name == fmt or cls.auxiliary]
    extras = [p for p in extra or [] if fmt is None or fmt not in extra_names or p.name == fmt]
    main = [p for p in chosen if not p.auxiliary] + extras
    return main + [p for p in chosen if p.auxiliary]

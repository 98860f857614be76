"""How the running command prints text: its `--color` and `--width` (rich-free: set as options parse).

The options' callbacks set these once per command (also to their defaults), before the command
runs; `console.stdout_console` reads them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = ["COLORS", "TextOutput", "configure", "current"]

#: `--color` values.
COLORS = ("auto", "always", "never")


@dataclass(frozen=True)
class TextOutput:
    #: auto (rich's choice: NO_COLOR, FORCE_COLOR, a terminal or not), always or never
    color: str = "auto"
    #: columns to lay text out at; None: the terminal's width, or no wrapping when not a terminal
    width: int | None = None


_current = TextOutput()


def configure(**changes: str | int | None) -> None:
    """Set fields of the running command's `TextOutput`."""
    global _current
    _current = dataclasses.replace(_current, **changes)  # type: ignore[arg-type]


def current() -> TextOutput:
    return _current

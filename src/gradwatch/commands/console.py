"""The rich console gradwatch prints its text output with: laid out for a terminal or for a pipe.

On a terminal, text is laid out at the terminal's width. Anywhere else (a pipe, a CI log, a file) a
line is never wrapped and never padded: `grep` and the `file:line` that people copy need the whole
line on one line, and the spaces that pad a line to the width are noise in logs and diffs.
`--width N` lays out at N columns in both. `--color auto` is rich's choice (NO_COLOR, FORCE_COLOR,
whether stdout is a terminal); `always` and `never` override it (`text_output`).
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from rich.console import Console, ConsoleOptions, ConsoleRenderable, RenderHook, RenderResult
from rich.segment import Segment

from gradwatch.commands import text_output

__all__ = ["stdout_console"]

#: The width text is laid out at when stdout is not a terminal: no line of a report comes near it,
#: so none is wrapped.
UNWRAPPED = 1 << 20
#: A console's height where no terminal gives one (rich's own default).
_DEFAULT_HEIGHT = 25


def stdout_console() -> Console:
    """A console on stdout, set by the command's `TextOutput`."""
    chosen = text_output.current()
    tty = _isatty(sys.stdout)
    width = chosen.width if chosen.width is not None else (None if tty else UNWRAPPED)
    # (given a width, rich wants a height too, or takes a "dumb" forced terminal for 80x25)
    height = None if width is None else (shutil.get_terminal_size().lines if tty else _DEFAULT_HEIGHT)
    colors: dict[str, Any] = {}
    if chosen.color == "always":
        colors = {"force_terminal": True, "no_color": False, "color_system": "standard"}
    elif chosen.color == "never":
        colors = {"color_system": None, "no_color": True}
    console = Console(highlight=False, width=width, height=height, **colors)
    if not tty:
        console.push_render_hook(_Trimmed())
    return console


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # (no such method; a closed stream)
        return False


class _Trimmed(RenderHook):
    """Everything printed loses the spaces that end its lines."""

    def process_renderables(self, renderables: list[ConsoleRenderable]) -> list[ConsoleRenderable]:
        return [_TrimmedLines(r) for r in renderables]


@dataclass
class _TrimmedLines:
    """A renderable whose lines end at their last character: tables, columns and padding fill a
    line with spaces to the width they were given."""

    renderable: ConsoleRenderable

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for line, newline in Segment.split_lines_terminator(console.render(self.renderable, options)):
            yield from _rstrip(line)
            if newline:
                yield Segment.line()


def _rstrip(line: list[Segment]) -> Iterable[Segment]:
    end = len(line)
    while end and not line[end - 1].control and not line[end - 1].text.rstrip(" "):
        end -= 1
    kept = line[:end]
    if kept and not kept[-1].control:
        last = kept[-1]
        kept[-1] = Segment(last.text.rstrip(" "), last.style, last.control)
    return kept

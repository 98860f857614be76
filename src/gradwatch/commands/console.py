"""The rich consoles gradwatch prints with (NO_COLOR and non-terminals respected by rich)."""

from __future__ import annotations

from rich.console import Console


def stdout_console() -> Console:
    return Console(highlight=False, soft_wrap=False)


def stderr_console() -> Console:
    return Console(stderr=True, highlight=False)

"""Plugin failures: each reported once, as one line on stderr, and remembered for the exit code.

A plugin that fails to import, breaks the registration contract or raises while it runs must not
stop the built-in detectors, so it is reported here instead of raised; `cli` then exits with 2.
"""

from __future__ import annotations

import sys

_reported: list[str] = []
_printing = True


def report(message: str) -> None:
    """Print `error: <message>` on stderr unless this very message was printed already."""
    if message in _reported:
        return
    _reported.append(message)
    if _printing:
        print(f"error: {message}", file=sys.stderr, flush=True)


def withhold() -> None:
    """Print nothing from now on, only remember: a worker process's failures are the main
    process's to print (`since`), once, whichever worker met them."""
    global _printing
    _printing = False


def count() -> int:
    """How many failures this process remembers (a mark for `since`)."""
    return len(_reported)


def since(mark: int) -> list[str]:
    """The failures remembered after the first `mark` of them."""
    return _reported[mark:]


def any_failed() -> bool:
    """Whether a plugin failed in this process (the exit code is then at least 2)."""
    return bool(_reported)

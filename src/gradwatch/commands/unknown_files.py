"""Files that a folder or a glob brought in and that are in no known format: skipped with one note.

A folder of logs often holds a `notes.txt` or a `requirements.txt` too: reading one is no error of
the user's, so `check` and `scan` leave such files out of the report and say so once. A file named
on the command line that holds no training records still fails the command (exit 2).
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from gradwatch.alerts import Alert, Severity
from gradwatch.pipeline import FileSummary, no_format_message

__all__ = ["is_skipped", "skipped_note"]

#: The note names this many files, then counts the others.
NAMED_IN_NOTE = 5


def is_skipped(
    path: Path | None, named: Collection[Path], summary: FileSummary, alerts: list[Alert], fmt: str | None = None
) -> bool:
    """Whether `path`, found by a walk (not in `named`), is in no known format: no records, no read
    error, and no alert that something went wrong (a crash log with a traceback is reported)."""
    if path is None or path in named or summary.records:
        return False
    if any(a.severity >= Severity.WARNING for a in alerts):
        return False
    return summary.error is None or summary.error == no_format_message(summary.path, summary.lines, fmt)


def skipped_note(paths: list[str]) -> str:
    """One line for every skipped file: `skipped 2 files in no known format: notes.txt, requirements.txt`."""
    shown = ", ".join(paths[:NAMED_IN_NOTE])
    if len(paths) > NAMED_IN_NOTE:
        shown += f" and {len(paths) - NAMED_IN_NOTE:,} more"
    return f"skipped {len(paths):,} file{'s' if len(paths) != 1 else ''} in no known format: {shown}"

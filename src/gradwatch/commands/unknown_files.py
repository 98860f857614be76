"""Files that a folder or a glob brought in and that are in no known format, or no regular
files: skipped with one note each.

A folder of logs often holds a `notes.txt` or a `requirements.txt` too: reading one is no error of
the user's, so `check` and `scan` leave such files out of the report and say so once. A file named
on the command line that holds no training records still fails the command (exit 2). A named pipe,
socket or device that a folder or glob brings in is never opened (a pipe would block the read, a
device never ends), and the note names it, so that a log written through a pipe is not missed in
silence.
"""

from __future__ import annotations

import stat
from collections.abc import Collection
from pathlib import Path

from gradwatch.alerts import Alert, Severity
from gradwatch.errors import InputError
from gradwatch.pipeline import FileSummary, no_format_message
from gradwatch.sources.walk import kind_of

__all__ = ["is_skipped", "nothing_found", "skipped_note", "special_kind", "special_note"]

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
    return f"skipped {_files(len(paths))} in no known format: {_listed(paths)}"


def special_note(paths: list[Path]) -> str:
    """One line for the files a walk never opened: `skipped 1 file that is not a regular file (never
    opened): runs/pipe.log (a named pipe)`."""
    named = [f"{p} ({special_kind(p)})" for p in paths]
    that = "that is not a regular file" if len(paths) == 1 else "that are not regular files"
    return f"skipped {_files(len(paths))} {that} (never opened): {_listed(named)}"


def nothing_found(paths: list[str], special: list[Path]) -> InputError:
    """The error of a command whose paths hold no log file (but perhaps pipes, sockets, devices)."""
    unread = f": {special_note(special)}" if special else ""
    return InputError(f"no log files found in {', '.join(paths)}{unread}")


#: What a file that is not a regular file is, as the note says it.
_KINDS = {
    stat.S_IFIFO: "a named pipe",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a device",
    stat.S_IFBLK: "a device",
}


def special_kind(path: Path) -> str:
    """What a file that is not a regular file is: `a named pipe`, `a socket`, `a device`."""
    return _KINDS.get(kind_of(path) or 0, "not a regular file")


def _files(n: int) -> str:
    return f"{n:,} file{'s' if n != 1 else ''}"


def _listed(names: list[str]) -> str:
    """The first `NAMED_IN_NOTE` names, then how many more."""
    shown = ", ".join(names[:NAMED_IN_NOTE])
    if len(names) > NAMED_IN_NOTE:
        shown += f" and {len(names) - NAMED_IN_NOTE:,} more"
    return shown

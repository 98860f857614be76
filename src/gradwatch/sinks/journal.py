"""What was delivered, for good: an append-only journal beside the `scan --state` file.

The state file says what is owed; it can be lost (damaged, a format that changed, deleted), and
then the logs are read again from their start and every incident update comes up again. This
file says what was already handed over, and outlives any state: one JSON line per update taken
by a sink, appended and fsynced before the delivery counts as done, read at every scan::

    {"key": "<incident> <event> <severity>", "idempotency_key": "gradwatch-<hash of key>", "incident": ...,
     "event": "opened", "severity": "critical", "sink": "webhook", "at": "2026-12-03T13:20:05Z"}

So an update is sent again only when a scan is killed between a sink taking it and its line
reaching the disk (at most one per kill, with the same idempotency key). A line that does not
parse (a write cut short) is skipped; the next line starts on a line of its own.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path

from gradwatch.incidents import Note

__all__ = ["SUFFIX", "Journal", "idempotency_key", "note_key"]

#: The journal of state file FILE is FILE.journal.
SUFFIX = ".journal"


def note_key(note: Note) -> str:
    """What makes a note the same one again (a log read anew after a config change): its incident,
    what happened to it, and the severity it reached."""
    return f"{note.incident} {note.event} {note.severity}"


def idempotency_key(note: Note) -> str:
    """The note's key as receivers get it (`Idempotency-Key`): printable in a header whatever the
    run's name, so a hash."""
    return "gradwatch-" + hashlib.sha256(note_key(note).encode("utf-8", "surrogatepass")).hexdigest()[:32]


class Journal:
    """The (note key -> sinks that took it) of every delivery so far; `record` adds one."""

    def __init__(self, path: Path, taken: dict[str, set[str]], ends_mid_line: bool = False) -> None:
        self.path = path
        self.taken = taken
        self._ends_mid_line = ends_mid_line

    @classmethod
    def beside(cls, state: Path, warn: Callable[[str], None]) -> Journal:
        """The journal of the state file `state`; empty when there is none yet."""
        path = state.with_name(state.name + SUFFIX)
        try:
            raw = _read_regular(path)
        except FileNotFoundError:
            return cls(path, {})
        except OSError as e:
            warn(f"cannot read the notification journal {path} ({e.strerror or e}): updates it lists may be sent again")
            return cls(path, {})
        taken: dict[str, set[str]] = {}
        damaged = 0
        for line in raw.splitlines():
            entry = _entry(line)
            if entry is None:
                damaged += bool(line.strip())
            else:
                taken.setdefault(entry[0], set()).add(entry[1])
        if damaged:
            warn(f"notification journal {path}: {damaged} damaged line{'s' if damaged != 1 else ''} skipped")
        return cls(path, taken, ends_mid_line=bool(raw) and not raw.endswith(b"\n"))

    def took(self, note: Note, sink: str) -> bool:
        """Whether `sink` has taken `note`."""
        return sink in self.taken.get(note_key(note), ())

    def owed_to(self, note: Note, sinks: set[str]) -> set[str]:
        """Those of `sinks` that have not taken `note` yet."""
        return {s for s in sinks if not self.took(note, s)}

    def incidents(self) -> set[str]:
        """The incidents of which some update was delivered."""
        return {key.rsplit(" ", 2)[0] for key in self.taken}

    def record(self, note: Note, sink: str) -> None:
        """Append that `sink` took `note`, on disk before this returns (OSError when it cannot be)."""
        entry = {
            "key": note_key(note),
            "idempotency_key": idempotency_key(note),
            "incident": note.incident,
            "event": note.event,
            "severity": str(note.severity),
            "sink": sink,
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        line = ("\n" if self._ends_mid_line else "") + json.dumps(entry) + "\n"
        created = not self.path.exists()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o600)  # (a FIFO: ENXIO)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        if created:
            _fsync_directory(self.path.parent)
        self._ends_mid_line = False
        self.taken.setdefault(entry["key"], set()).add(sink)


def _read_regular(path: Path) -> bytes:
    """The file's bytes; a FIFO or device in its place is an error, never a read that blocks."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        with os.fdopen(os.dup(fd), "rb") as fh:
            return fh.read()
    finally:
        os.close(fd)


def _entry(line: bytes) -> tuple[str, str] | None:
    """(key, sink) of a journal line; None for one that does not parse."""
    try:
        doc = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("key"), str) or not isinstance(doc.get("sink"), str):
        return None
    return doc["key"], doc["sink"]


def _fsync_directory(directory: Path) -> None:
    """A new file's name is durable once its directory is synced."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

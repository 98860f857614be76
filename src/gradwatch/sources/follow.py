"""Following live log files by offset, through rotation, truncation, deletion and files yet to come.

A `FileFollower` owns one path. Each `poll()` hands on the raw bytes appended since the last one,
in whole chunks (history is read the same way, only more of it): partial last lines are the
parser's business (`LogStream` holds them). Before reading, it checks what the path names now:

* another file (rotation by rename): the old file is read to its end, then the new one from 0;
* nothing, and the old file still has a name somewhere (renamed away): as above, once a new
  file appears; nothing and no name left (deleted): the same, reported as missing;
* the same file, but shorter than our offset or with different first bytes (copytruncate, or
  rewritten in place): read again from 0.

When a file ends without a newline, a newline is handed on before the next file's first byte, so
two files never merge into one line. Limits, as in every tailer: lines written to a file between
our last look and its truncation are lost (copytruncate copies them elsewhere), and a file that is
rotated away twice between two looks is missed in between.

A `Follower` owns all the paths of a command line: plain paths (waited for when missing) and globs
and directories (searched again on `poll(rescan=True)`, so new per-rank files are picked up; a
match that is a file already read under another name, i.e. a rotated copy, is skipped).

Nothing here prints: what happens to a file is reported through `FollowEvents`.
"""

from __future__ import annotations

import contextlib
import glob
import os
import stat
from collections import deque
from collections.abc import Callable
from typing import Protocol

from gradwatch.sources.archive import CHUNK_BYTES, LOG_SUFFIXES
from gradwatch.sources.fingerprint import Fingerprint

__all__ = ["FileFollower", "FollowEvents", "Follower", "OnData", "watch_dir"]

#: Receives (path, bytes) in file order.
OnData = Callable[[str, bytes], None]
#: Files finished by rotation, remembered so that a glob matching their new name skips them.
_RETIRED_KEPT = 256


class FollowEvents(Protocol):
    """What can happen to a followed path, for the command to render."""

    def file_added(self, path: str) -> None:
        """A file is followed from now on (at start, or when it appeared)."""

    def file_rotated(self, path: str) -> None:
        """The file was renamed away: it was read to its end; a new file at `path` is read from 0."""

    def file_truncated(self, path: str) -> None:
        """The file shrank or its first bytes changed: it is read again from its start."""

    def file_missing(self, path: str) -> None:
        """Nothing is at `path` (not yet, or deleted): waiting for it."""

    def file_unreadable(self, path: str, reason: str) -> None:
        """The path exists but cannot be read; it is tried again later."""


class FileFollower:
    """One path, read by offset. `from_end` skips what the first file found already holds."""

    def __init__(self, path: str, on_data: OnData, events: FollowEvents, *, from_end: bool = False) -> None:
        self.path = path
        self.offset = 0
        self.retired: list[Fingerprint] = []  # files finished by rotation, collected by the Follower
        self._on_data, self._events = on_data, events
        self._from_end = from_end
        self._fd: int | None = None
        self._fp: Fingerprint | None = None
        self._ends_line = True  # the last byte handed on was a newline (or nothing was)
        self._skip_partial = False  # started from the end in the middle of a line
        self._reported: str | None = None  # the problem last reported, so that it is said once

    @property
    def is_open(self) -> bool:
        return self._fd is not None

    def poll(self) -> None:
        """Notice rotation, truncation and deletion, then hand on whatever is new.

        Identity comes first: bytes past our offset in a rewritten file are not a continuation.
        """
        if self._fd is None and not self._open(announce=True):
            return
        try:
            self._check_identity()
            if self._fd is not None:
                self._drain()
        except OSError as e:  # EIO, ESTALE on NFS: keep the offset, try again at the next poll
            self.close()
            self._report(f"read failed: {e.strerror or e}")

    @property
    def fingerprint(self) -> Fingerprint | None:
        """The file being read, None while there is none."""
        return self._fp if self._fd is not None else None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _open(self, announce: bool) -> bool:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            self._from_end = False  # a file that appears later is new: all of it is read
            self._report(None)
            return False
        except OSError as e:
            self._report(e.strerror or str(e))
            return False
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            self._report("not a regular file")
            return False
        fp = Fingerprint.of(fd)
        if self._fp is not None and self._fp.names(st) and self._fp.recheck(fd) is not None:
            pass  # the same file again after a read error: go on from the offset we had
        elif self._from_end:
            self.offset = st.st_size
            self._skip_partial = st.st_size > 0 and os.pread(fd, 1, st.st_size - 1) != b"\n"
        else:
            self.offset = 0
        self._fd, self._fp, self._from_end, self._reported = fd, fp, False, None
        if announce:
            self._events.file_added(self.path)
        return True

    def _report(self, problem: str | None) -> None:
        """Say once that the path is missing (None) or unreadable, until that changes."""
        key = problem or "missing"
        if key == self._reported:
            return
        self._reported = key
        if problem is None:
            self._events.file_missing(self.path)
        else:
            self._events.file_unreadable(self.path, problem)

    def _drain(self) -> None:
        fd = self._fd
        assert fd is not None
        while (size := os.fstat(fd).st_size) > self.offset:
            data = os.pread(fd, min(size - self.offset, CHUNK_BYTES), self.offset)
            if not data:
                return
            self.offset += len(data)
            if self._skip_partial:
                cut = data.find(b"\n")
                if cut < 0:
                    continue
                self._skip_partial, data = False, data[cut + 1 :]
                if not data:
                    continue
            self._ends_line = data.endswith(b"\n")
            self._on_data(self.path, data)

    def _check_identity(self) -> None:
        fd, fp = self._fd, self._fp
        assert fd is not None and fp is not None
        try:
            st: os.stat_result | None = os.stat(self.path)
        except FileNotFoundError:
            st = None
        if st is not None and fp.names(st):
            self._check_rewritten(st.st_size)
            return
        # renamed away or deleted: finish the old file (it may have changed before it went)
        self._check_rewritten(os.fstat(fd).st_size)
        self._drain()
        deleted = st is None and os.fstat(fd).st_nlink == 0
        assert self._fp is not None
        self.retired.append(self._fp)
        self.close()
        self._end_line()
        self._fp = None
        if deleted:
            self._report(None)
        else:
            self._events.file_rotated(self.path)
            self._reported = "missing"  # until a new file appears, "rotated" said it all
        if st is not None:
            self._open(announce=False)

    def _check_rewritten(self, size: int) -> None:
        """Start again from 0 when the open file shrank below our offset or its first bytes changed."""
        fd, fp = self._fd, self._fp
        assert fd is not None and fp is not None
        now = fp.recheck(fd)
        if now is not None and size >= self.offset:
            self._fp = now
            return
        self._events.file_truncated(self.path)
        self._end_line()
        self.offset = 0
        self._fp = Fingerprint.of(fd)

    def _end_line(self) -> None:
        if not self._ends_line:
            self._ends_line = True
            self._on_data(self.path, b"\n")


class Follower:
    """Every file named by the user's paths, globs and directories, each with its own FileFollower."""

    def __init__(self, specs: list[str], on_data: OnData, events: FollowEvents, *, from_end: bool = False) -> None:
        self._on_data, self._events = on_data, events
        self._from_end = from_end  # applies to the files found at the first look only
        self._searches: list[tuple[str, list[str]]] = []  # (what the user gave, its globs)
        self._followers: dict[str, FileFollower] = {}
        self._retired: deque[Fingerprint] = deque(maxlen=_RETIRED_KEPT)
        self._skipped: dict[str, tuple[int, int]] = {}  # glob matches that are files we read already
        self._unmatched_said: set[str] = set()
        for spec in specs:
            if os.path.isdir(spec):
                self._searches.append((spec, [os.path.join(spec, "**", "*" + suffix) for suffix in LOG_SUFFIXES]))
            elif glob.has_magic(spec) and not os.path.exists(spec):  # `run[1].log` may be a name
                self._searches.append((spec, [spec]))
            else:
                self._add(spec)

    @property
    def reading(self) -> int:
        """How many files are open now (missing and unreadable paths are not counted)."""
        return sum(f.is_open for f in self._followers.values())

    def poll(self, rescan: bool) -> None:
        """Read every file; with `rescan`, search the globs for new files first."""
        if rescan:
            self._scan()
        for follower in self._followers.values():
            follower.poll()
            if follower.retired:
                self._retired.extend(follower.retired)
                follower.retired.clear()
        self._from_end = False

    def close(self) -> None:
        for follower in self._followers.values():
            follower.close()

    def watch_dirs(self) -> set[tuple[str, bool]]:
        """(directory, recursive) pairs whose changes should wake us up."""
        dirs = {(watch_dir(os.path.dirname(os.path.abspath(p))), False) for p in self._followers}
        for _, patterns in self._searches:
            for pattern in patterns:
                fixed, magic = _split_magic(os.path.abspath(pattern))
                dirs.add((watch_dir(fixed), magic))
        return dirs

    def _add(self, path: str) -> None:
        self._followers[path] = FileFollower(path, self._on_data, self._events, from_end=self._from_end)

    def _scan(self) -> None:
        for spec, patterns in self._searches:
            matches = sorted({m for pattern in patterns for m in glob.glob(pattern, recursive=True)})
            if not matches and spec not in self._unmatched_said:
                self._unmatched_said.add(spec)
                self._events.file_missing(spec)
            for path in matches:
                if path in self._followers:
                    continue
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                ident = (st.st_dev, st.st_ino)
                if not stat.S_ISREG(st.st_mode) or self._skipped.get(path) == ident:
                    continue
                if self._already_read(path, st):
                    self._skipped[path] = ident
                    continue
                self._add(path)

    def _already_read(self, path: str, st: os.stat_result) -> bool:
        """Whether `path` is a file we read under another name: one being read, or a rotated one."""
        if any(fp is not None and fp.names(st) for fp in (f.fingerprint for f in self._followers.values())):
            return True
        candidates = [fp for fp in self._retired if fp.names(st)]
        if not candidates:
            return False
        with contextlib.suppress(OSError), open(path, "rb") as fh:
            return any(fp.recheck(fh.fileno()) is not None for fp in candidates)
        return False


def _split_magic(pattern: str) -> tuple[str, bool]:
    """The directory before a glob's first magic part, and whether magic remains in directories."""
    parts = pattern.split(os.sep)
    for i, part in enumerate(parts):
        if glob.has_magic(part):
            return os.sep.join(parts[:i]) or os.sep, i < len(parts) - 1
    return os.path.dirname(pattern), False


def watch_dir(path: str) -> str:
    """`path`, or its nearest existing ancestor: a directory that does not exist yet is waited for
    by watching where it will be created."""
    while not os.path.isdir(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path

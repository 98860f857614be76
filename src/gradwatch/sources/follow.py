"""Following live log files by offset, through rotation, truncation, deletion and files yet to come.

A `FileFollower` owns one path. Each `poll()` hands on the raw bytes appended since the last one,
in whole chunks (history is read the same way, only more of it): partial last lines are the
parser's business (`LogStream` holds them). Before reading, it checks what the path names now:

* another file, or nothing (rotation by rename, or deletion): the old file is read on by its
  descriptor, since a writer may still append to it (`tee -a`, a logger that reopens late),
  until it has been quiet for the rotate wait once the new file holds bytes (or at once when it
  was deleted); the new file is read from 0 meanwhile (like Fluent Bit's and Vector's rotate wait);
* the same file, but with different first bytes (copytruncate, rewritten): the rest of what we
  had not read yet is taken from the copy beside it (`log.1`: same first bytes, and the checksum
  of what we read matches), then the file is read again from 0;
* the same file with its first bytes intact but shorter than our offset, or with other bytes just
  before it (cut short, even if it grew back past our offset between two looks): read on from
  the line where it stops matching what was read, so no line is handed on twice. That line is
  exact within the last ~500 lines read; further back, the last read that still matches is used
  (`sources.marks`), and the command is told how many lines after it may have been read before
  (`sources.resume` drops those, as `scan` does).

When a file ends without a newline, a newline is handed on before the next file's first byte, so
two files never merge into one line. Limits, as in every tailer: what a writer appends to a
copytruncated file between logrotate's copy and its truncate is lost (logrotate itself drops
it), and a file rotated away twice between two looks is missed. A renamed file is read by its
descriptor, so compressing it later (logrotate's `compress`) loses nothing; but copytruncate's
copy, and files rotated in and out between two looks, are looked for under plain names only: one
already compressed is not read.

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
import time
import zlib
from collections import deque
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Protocol

from gradwatch.sources.archive import CHUNK_BYTES, LOG_SUFFIXES
from gradwatch.sources.exclude import Excludes
from gradwatch.sources.fingerprint import Fingerprint
from gradwatch.sources.marks import Mark, Marks, crc_range, last_match
from gradwatch.sources.walk import glob_paths

__all__ = ["DEFAULT_ROTATE_WAIT_S", "FileFollower", "FollowEvents", "Follower", "OnData", "watch_dir"]

#: Receives (path, bytes) in file order.
OnData = Callable[[str, bytes], None]
#: Files finished by rotation, remembered so that a glob matching their new name skips them.
_RETIRED_KEPT = 256
#: How long a rotated file is read on after it last grew (the issue's and Vector's order of magnitude).
DEFAULT_ROTATE_WAIT_S = 30.0
#: The last bytes read from a file, kept as they were to find where a file cut short stops matching.
_KEPT_BYTES = 32 << 10
#: Reads up to this size get a mark at every line's end (what is read while following; not history).
_LINE_MARKS_UP_TO = 1 << 20
#: Bytes compared just before the offset at every look.
_SEAM_BYTES = 256


class FollowEvents(Protocol):
    """What can happen to a followed path, for the command to render."""

    def file_added(self, path: str) -> None:
        """A file is followed from now on (at start, or when it appeared)."""

    def file_rotated(self, path: str) -> None:
        """The file was renamed away: it is read on until quiet; a new file at `path` is read from 0."""

    def file_truncated(self, path: str, resumed_at: int, read_before: int) -> None:
        """The file shrank or was rewritten: it is read again from byte `resumed_at` (0: its start);
        up to `read_before` lines after it may be lines read before (where it was cut further back
        than every line end is known: `sources.resume` tells which)."""

    def file_missing(self, path: str) -> None:
        """Nothing is at `path` (not yet, or deleted): waiting for it."""

    def file_unreadable(self, path: str, reason: str) -> None:
        """The path exists but cannot be read; it is tried again later."""


class _Reader:
    """One open file: where we are in it, and enough of what was read to find where it still matches.

    `marks` (`sources.marks`) checksum what was read from `base` to `offset`, at earlier reads;
    `kept` holds the last bytes read, [offset - len(kept), offset), as they were, so that a file cut
    short is resumed at the exact byte where it stops matching.
    """

    def __init__(self, fd: int, fp: Fingerprint, offset: int, skip_partial: bool = False) -> None:
        self.fd: int | None = fd
        self.fp = fp
        self.marks = Marks(offset)
        self.kept = bytearray()
        self.kept_at = self.marks.here  # where `kept` starts
        self.skip_partial = skip_partial  # started from the end in the middle of a line
        self.seen_size = offset  # (rotated files) the size at the last look, and since when it is so
        self.quiet_since = 0.0

    @property
    def offset(self) -> int:
        return self.marks.offset

    def record(self, data: bytes) -> None:
        """`data` was read at `offset`: move on, and remember what it was."""
        if len(data) > _KEPT_BYTES:
            self._advance(data[:-_KEPT_BYTES])
            self.kept.clear()
            self.kept_at, data = self.marks.here, data[-_KEPT_BYTES:]
        self._advance(data)
        self.kept += data
        if len(self.kept) > 2 * _KEPT_BYTES:  # keep from a mark on, so that its crc is known
            self.kept_at = next(m for m in self.marks.points if m.offset >= self.offset - _KEPT_BYTES)
            del self.kept[: len(self.kept) - (self.offset - self.kept_at.offset)]

    def _advance(self, data: bytes) -> None:
        """A mark at the end of `data`, and at each line's end in it while following (small reads):
        a job rolled back a few hundred lines is then resumed at the exact line."""
        self.marks.add(data, None if len(data) <= _LINE_MARKS_UP_TO else 0)

    def matching_prefix(self, size: int) -> Mark:
        """How far the file still holds what was read from it (a byte offset, with the crc up to there).

        The checksums at the marks find the last read that still matches; the bytes kept find the
        start of the first line after it that differs. Reads the file from `base`: only done when
        the file was cut or rewritten.
        """
        fd = self.fd
        assert fd is not None
        end = min(size, self.offset)
        if end <= self.marks.base:  # (cut before where reading began: nothing there was read)
            return Mark(end, 0, 0)
        kept_start = self.kept_at.offset
        checks = [m for m in self.marks.points if m.offset < kept_start] + [self.kept_at]
        good = last_match(fd, checks, self.marks.base, end)
        if good.offset == kept_start < end:
            now = os.pread(fd, end - kept_start, kept_start)
            same = _common_prefix(now, self.kept[: end - kept_start])
            # (new bytes may begin as old ones did, "line 3" after "line 2": from a line's start)
            if kept_start + same < size:
                same = now.rfind(b"\n", 0, same) + 1
            good = Mark(kept_start + same, zlib.crc32(now[:same], good.crc), good.lines + now.count(b"\n", 0, same))
        return good

    def seam_matches(self) -> bool:
        """Whether the bytes just before `offset` are still those read: a file cut short and grown
        back past our offset between two looks, with its first bytes intact, shows here."""
        fd = self.fd
        assert fd is not None
        n = min(_SEAM_BYTES, len(self.kept))
        return n == 0 or os.pread(fd, n, self.offset - n) == self.kept[-n:]

    def resume_at(self, at: Mark) -> None:
        """Go on from `at` (where the file still matches what was read), forgetting what follows."""
        kept_start = self.kept_at.offset
        if at.offset < kept_start:
            self.kept.clear()
            self.kept_at = at
        else:
            del self.kept[at.offset - kept_start :]
        self.marks.resume(at)  # (before the base, after --from-end: nothing is known before it)
        if at.offset <= self.marks.base:
            self.kept_at = self.marks.here

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _holds_what_was_read(fd: int, reader: _Reader) -> bool:
    """Whether `fd` holds what `reader` read from its file: the crc from its base to its offset."""
    return crc_range(fd, reader.marks.base, reader.offset, 0) == reader.marks.crc


def _common_prefix(a: bytes, b: bytes | bytearray) -> int:
    """The length of the longest common prefix (halving: each comparison runs in C)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class FileFollower:
    """One path, read by offset. `from_end` skips what the first file found already holds.

    The file at `path` is the current one; files renamed away or deleted are read on by their
    descriptors until they have been quiet for `rotate_wait` seconds (once a new file at `path`
    is being written, or at once when the old one is deleted). While several files are read, each
    hands on whole lines only, so lines of two files never merge.
    """

    def __init__(
        self,
        path: str,
        on_data: OnData,
        events: FollowEvents,
        *,
        from_end: bool = False,
        rotate_wait: float = DEFAULT_ROTATE_WAIT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.retired: list[Fingerprint] = []  # files finished by rotation, collected by the Follower
        self._on_data, self._events = on_data, events
        self._from_end = from_end
        self._rotate_wait, self._clock = rotate_wait, clock
        self._current: _Reader | None = None  # the file at `path` (its fd is None after a read error)
        self._rotated: list[_Reader] = []  # renamed away or deleted, still read
        self._mid_line: _Reader | None = None  # whose last bytes handed on did not end a line
        self._reported: str | None = None  # the problem last reported, so that it is said once
        #: (dev, ino) of the files opened and of those beside it that are not ours (there before, copies)
        self._known: set[tuple[int, int]] | None = None

    @property
    def is_open(self) -> bool:
        return self._current is not None and self._current.fd is not None

    @property
    def offset(self) -> int:
        """Where the current file is read from next."""
        return 0 if self._current is None else self._current.offset

    @property
    def fingerprint(self) -> Fingerprint | None:
        """The file being read at `path`, None while there is none."""
        return self._current.fp if self.is_open and self._current is not None else None

    @property
    def fingerprints(self) -> list[Fingerprint]:
        """Every file open: the current one and the rotated ones still read."""
        return [r.fp for r in [*self._rotated, self._current] if r is not None and r.fd is not None]

    def poll(self) -> None:
        """Notice rotation, truncation and deletion, then hand on whatever is new: the rotated files'
        lines first (they were written first), then the current file's.

        Identity comes first: bytes past our offset in a rewritten file are not a continuation.
        """
        if not self.is_open:
            self._open(announce=True)
        else:
            self._guarded(self._check_identity)
        now = self._clock()
        for old in list(self._rotated):
            try:
                self._read(old, whole_lines=self._several())
                self._retire_when_quiet(old, now)
            except OSError:  # gone for good (a stale NFS handle): what it held was read
                self._retire(old)
        if self.is_open:
            self._guarded(lambda: self._read(self._current, whole_lines=self._several()))

    def close(self) -> None:
        for reader in [*self._rotated, self._current]:
            if reader is not None:
                reader.close()

    def _several(self) -> bool:
        """Whether more than one file is read: each then hands on whole lines only."""
        return len(self._rotated) + self.is_open > 1

    def _guarded(self, step: Callable[[], object]) -> None:
        """EIO, ESTALE on NFS: keep the offset, try again at the next poll."""
        try:
            step()
        except OSError as e:
            assert self._current is not None
            self._current.close()
            self._report(f"read failed: {e.strerror or e}")

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
        old = self._current
        if old is not None and old.fp.names(st) and old.fp.recheck(fd) is not None:
            old.fd = fd  # the same file again after a read error: go on from the offset we had
        else:
            if old is not None:
                self._end_line(old)
            skip = self._from_end and st.st_size > 0 and os.pread(fd, 1, st.st_size - 1) != b"\n"
            self._current = _Reader(fd, Fingerprint.of(fd), st.st_size if self._from_end else 0, skip)
            if self._known is None:
                self._known = {(s.st_dev, s.st_ino) for _, s in self._siblings()}
            self._known.add((st.st_dev, st.st_ino))
        self._from_end, self._reported = False, None
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

    def _read(self, reader: _Reader | None, whole_lines: bool) -> None:
        """Hand on what `reader`'s file holds past its offset; with `whole_lines`, up to its last
        newline (the rest is read later), so that another file's lines are not glued to it."""
        assert reader is not None and reader.fd is not None
        if self._mid_line not in (None, reader):
            return  # another file's line is not finished yet
        while (size := os.fstat(reader.fd).st_size) > reader.offset:
            data = os.pread(reader.fd, min(size - reader.offset, CHUNK_BYTES), reader.offset)
            if whole_lines and len(data) < CHUNK_BYTES:  # (a chunk without a newline goes on whole)
                data = data[: data.rfind(b"\n") + 1]
            if not data or not reader.seam_matches():  # cut short since it was looked at: the next look resyncs
                return
            self._hand(reader, data)

    def _hand(self, reader: _Reader, data: bytes) -> None:
        reader.record(data)
        if reader.skip_partial:
            cut = data.find(b"\n")
            if cut < 0:
                return
            reader.skip_partial, data = False, data[cut + 1 :]
            if not data:
                return
        self._mid_line = None if data.endswith(b"\n") else reader
        self._on_data(self.path, data)

    def _end_line(self, reader: _Reader) -> None:
        """Two files never merge into one line: a newline after a file's unfinished last line."""
        if self._mid_line is reader:
            self._mid_line = None
            self._on_data(self.path, b"\n")

    def _check_identity(self) -> None:
        current = self._current
        assert current is not None and current.fd is not None
        try:
            st: os.stat_result | None = os.stat(self.path)
        except FileNotFoundError:
            st = None
        self._check_rewritten(current)
        if st is not None and current.fp.names(st):
            return
        # renamed away or deleted: read on by the descriptor until it has been quiet a while
        current.seen_size, current.quiet_since = os.fstat(current.fd).st_size, self._clock()
        self._rotated.append(current)
        self._current = None
        self._pick_up_missed()
        if st is None and os.fstat(current.fd).st_nlink == 0:
            self._report(None)
        else:
            self._events.file_rotated(self.path)
            self._reported = "missing"  # until a new file appears, "rotated" said it all
        if st is not None:
            self._open(announce=False)

    def _check_rewritten(self, current: _Reader) -> None:
        """The open file shrank below our offset, or its first bytes or the bytes just before our
        offset changed (copytruncate, cut short, rewritten in place): go on from where it still
        matches what was read (0 after copytruncate), after the rest of a copy, if one is found."""
        assert current.fd is not None
        size = os.fstat(current.fd).st_size
        now = current.fp.recheck(current.fd)
        if now is not None and size >= current.offset and current.seam_matches():
            current.fp = now
            return
        # (other first bytes after --from-end: nothing to compare them with)
        at = Mark(0, 0, 0) if now is None and current.marks.base > 0 else current.matching_prefix(size)
        # (inexact, with bytes after it: the lines up to the next mark may have been read before)
        after = None if at.offset >= min(size, current.kept_at.offset) else current.marks.after(at)
        self._read_copies(current)
        self._end_line(current)
        self._events.file_truncated(self.path, at.offset, 0 if after is None else max(0, after.lines - at.lines - 1))
        current.resume_at(at)
        current.fp = Fingerprint.of(current.fd)

    def _read_copies(self, current: _Reader) -> None:
        """copytruncate: what was written after our last read and before the copy is in the copy
        (a new file beside ours that begins as ours did): it is read on from our offset. Copies of
        truncations we missed between two looks (new files beside ours holding something else)
        are read whole after it, oldest first; a copy of what the log holds now (its truncation is
        still to come) is left for the next look."""
        if self._known is None or current.fd is None:
            return
        known, live = self._known, Fingerprint.of(current.fd)
        new = sorted((st.st_mtime_ns, path) for path, st in self._siblings() if (st.st_dev, st.st_ino) not in known)
        for _, path in new:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError:
                continue
            copy: _Reader | None = None
            try:
                st = os.fstat(fd)
                if current.fp.recheck(fd) is not None:  # a copy of what we read
                    known.add((st.st_dev, st.st_ino))
                    if st.st_size > current.offset and _holds_what_was_read(fd, current):
                        copy = _Reader(fd, current.fp, current.offset, current.skip_partial)
                        if self._mid_line is current:  # the copy holds the rest of that line
                            self._mid_line = copy
                elif live.head_len == 0 or live.recheck(fd) is None:  # not what the log holds now
                    known.add((st.st_dev, st.st_ino))
                    copy = _Reader(fd, Fingerprint.of(fd), 0)
                if copy is not None:
                    self._read(copy, whole_lines=False)
            except OSError:
                pass
            finally:
                if copy is None:
                    os.close(fd)
                else:
                    self._end_line(copy)
                    copy.close()

    def _siblings(self) -> list[tuple[str, os.stat_result]]:
        """Regular files beside ours whose name starts with its name (`log.1`, `log-20240101`), but
        not compressed ones."""
        folder, name = os.path.split(self.path)
        found = []
        with contextlib.suppress(OSError), os.scandir(folder or ".") as entries:
            for e in entries:
                if e.name != name and e.name.startswith(name) and not e.name.endswith(".gz"):
                    with contextlib.suppress(OSError):
                        if e.is_file(follow_symlinks=False):
                            found.append((e.path, e.stat(follow_symlinks=False)))
        return found

    def _pick_up_missed(self) -> None:
        """Files rotated in and out between two looks (created at `path`, written, renamed away
        before we looked): new files beside ours, read from 0 after the one just rotated."""
        if self._known is None:
            return
        missed = [
            (st.st_mtime_ns, path)
            for path, st in self._siblings()
            if (st.st_dev, st.st_ino) not in self._known and st.st_size > 0
        ]
        for _, path in sorted(missed):
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError:
                continue
            reader = _Reader(fd, Fingerprint.of(fd), 0)
            st = os.fstat(fd)
            self._known.add((st.st_dev, st.st_ino))
            reader.seen_size, reader.quiet_since = st.st_size, self._clock()
            self._rotated.append(reader)

    def _retire_when_quiet(self, old: _Reader, now: float) -> None:
        """A rotated file is done once it stopped growing `rotate_wait` ago and the writer is
        elsewhere: a newer file holds bytes, or the old one is deleted."""
        assert old.fd is not None
        st = os.fstat(old.fd)
        if st.st_size != old.seen_size:
            old.seen_size, old.quiet_since = st.st_size, now
            return
        moved_on = st.st_nlink == 0 or self._successor_written(old)
        if now - old.quiet_since < self._rotate_wait or not moved_on or self._mid_line not in (None, old):
            return
        self._read(old, whole_lines=False)
        self._retire(old)

    def _successor_written(self, old: _Reader) -> bool:
        """Whether a file that came after `old` (the one now at `path`, or one rotated since) holds
        bytes: the writer moved on to it."""
        later = [*self._rotated[self._rotated.index(old) + 1 :], self._current]
        return any(r is not None and r.fd is not None and os.fstat(r.fd).st_size > 0 for r in later)

    def _retire(self, old: _Reader) -> None:
        self._end_line(old)
        old.close()
        self._rotated.remove(old)
        self.retired.append(old.fp)


class Follower:
    """Every file named by the user's paths, globs and directories, each with its own FileFollower."""

    def __init__(
        self,
        specs: list[str],
        on_data: OnData,
        events: FollowEvents,
        *,
        from_end: bool = False,
        rotate_wait: float = DEFAULT_ROTATE_WAIT_S,
        exclude: Excludes | None = None,
    ) -> None:
        self._on_data, self._events = on_data, events
        self._exclude = exclude or Excludes()  # `--exclude`: files never followed
        self._from_end = from_end
        self._rotate_wait = rotate_wait  # applies to the files found at the first look only
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
            elif not self._exclude.matches(Path(spec)):
                self._add(spec)

    @property
    def reading(self) -> int:
        """How many files are open now (missing and unreadable paths are not counted)."""
        return sum(f.is_open for f in self._followers.values())

    def poll(self, rescan: bool, only: Collection[str] | None = None) -> None:
        """Read every file (or the paths of `only`); with `rescan`, search the globs for new files first."""
        if rescan:
            self._scan()
        for path, follower in self._followers.items():
            if only is not None and path not in only:
                continue
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
        self._followers[path] = FileFollower(
            path, self._on_data, self._events, from_end=self._from_end, rotate_wait=self._rotate_wait
        )

    def _scan(self) -> None:
        for spec, patterns in self._searches:
            matches = sorted({m for pattern in patterns for m in glob_paths(pattern)})  # (no symlink loop)
            if not matches and spec not in self._unmatched_said:
                self._unmatched_said.add(spec)
                self._events.file_missing(spec)
            for path in matches:
                if path in self._followers or self._exclude.matches(Path(path)):
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
        if any(fp.names(st) for f in self._followers.values() for fp in f.fingerprints):
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

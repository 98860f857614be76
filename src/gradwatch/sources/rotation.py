"""Which file is which at the start of a scan: the saved files found again by identity, not path.

Like Fluent Bit and Vector, a file is what its `Fingerprint` says. A saved file is looked for under
the scan's paths and under the usual rotated names of where it was (`train.log.1`,
`train.log-20240306`, and the same compressed: `train.log.1.gz`): the same inode holding what was
read (renamed, rotated, or simply grown), else another inode holding it (the copy that
copytruncate left, or the rotated file compressed since: its decompressed bytes are compared and
read on). It goes on from its offset there, read to its end before the file now at its old name,
which is read from its start. So a rotated file matched again by the glob is not read as new, and
what was appended to it before the rename is not lost. A file at a rotated name that no saved
state holds and that was written since the last scan began is one rotated in and out between two
scans (or a copy of a truncation this scan did not see): it is read from its start, before the
file at the path. A path whose file no saved state holds is read from its start: new, or why not.

A file cut short in place (the same inode and first bytes, but shorter than what was read, or with
other bytes before where reading stopped: a job that cut its log back to a checkpoint's line) goes
on where it stops matching what was read (`sources.marks`, `sources.resume`), not from its start.

Not recoverable: lines written between logrotate's copy and its truncate (copytruncate's own race),
and what a file held past the last scan when it was deleted.
"""

from __future__ import annotations

import contextlib
import glob
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from gradwatch.sources.checkpoint import FileState
from gradwatch.sources.fingerprint import Fingerprint
from gradwatch.sources.marks import last_match
from gradwatch.sources.resume import Cut

_GZIP_MAGIC = b"\x1f\x8b"
#: How much older than the last scan a file found under a rotated name may look and still be
#: taken for one rotated in and out since (clocks of file servers differ a little).
_CLOCK_SLACK_S = 2.0

__all__ = ["Matching", "Opened", "match"]


@dataclass
class Opened:
    """A regular file opened for this scan, and how its saved state goes on in it."""

    path: str
    fd: int
    st: os.stat_result
    #: under the scan's paths (else found under a rotated name)
    scanned: bool = True
    gzip: bool = False
    #: a plain file read before, compressed since: its state's offset counts decompressed bytes
    compressed: bool = False
    #: cut short since it was read: its state goes on from where it still matches
    cut: Cut | None = None


@dataclass
class Matching:
    """What to read, in order: (state, file, why from its start: None when resumed)."""

    reads: list[tuple[FileState, Opened, str | None]] = field(default_factory=list)
    #: (path, message) of the scan's paths that cannot be read
    errors: list[tuple[str, str]] = field(default_factory=list)
    opened: list[Opened] = field(default_factory=list)

    def close(self) -> None:
        for o in self.opened:
            os.close(o.fd)


def rotated_names(path: str) -> list[str]:
    """Where logrotate and friends move `path`: `.1`, `.0`, `.N`, `-YYYYMMDD`, each maybe `.gz`."""
    escaped = glob.escape(path)
    return sorted(glob.glob(f"{escaped}.[0-9]*") + glob.glob(f"{escaped}-[0-9]*"))


def match(states: list[FileState], paths: list[Path], since: float | None = None) -> Matching:
    """Find every state of a file under `paths` (see module docstring); `states` is updated: the
    states of files that are gone are dropped, new ones added. `since`: when the last scan began
    (None: no scan before), for the files rotated in and out since."""
    m = Matching()
    scanned = [o for o in (_open(str(p), m) for p in paths) if o is not None]
    names = {o.path for o in scanned}
    ours = [s for s in states if s.key in names or s.path in names]
    found: dict[int, Opened] = {}
    extra: dict[str, Opened | None] = {}

    def candidates(s: FileState) -> list[Opened]:
        out = list(scanned)
        for name in [s.path, *rotated_names(s.path), *rotated_names(s.key)]:
            if name not in names and name not in extra:
                extra[name] = _open(name, m, scanned=False)
            opened = extra.get(name)
            if opened is not None and all(opened is not o for o in out):
                out.append(opened)
        return out

    taken: set[int] = set()

    def claim(s: FileState, among: list[Opened], same_inode: bool) -> None:
        o = next((o for o in among if id(o) not in taken and _holds(s, o, same_inode)), None)
        if o is not None:
            found[id(s)] = o
            taken.add(id(o))

    for s in ours:  # most often: the same file under the same name, grown
        claim(s, scanned, same_inode=True)
    for same_inode in (True, False):  # then: renamed, or copied before a truncation (or compressed)
        for s in ours:
            if id(s) not in found:
                claim(s, candidates(s), same_inode)
    for s in ours:  # then: cut short in place
        if id(s) not in found:
            o = next((o for o in candidates(s) if id(o) not in taken and _cut_short(s, o)), None)
            if o is not None:
                found[id(s)] = o
                taken.add(id(o))
    m.reads = [(s, found[id(s)], None) for s in ours if id(s) in found]
    plain = [s.fingerprint for s, o, _ in m.reads if not o.gzip and s.fingerprint is not None]
    if since is not None:  # rotated in and out since the last scan: read whole, oldest first
        missed = [(o.st.st_mtime, s.key, o) for s in ours for o in candidates(s) if _missed(o, since, taken, scanned)]
        # (a file renamed while this scan opened it is open twice: read under the name it was found at)
        read = {(o.st.st_dev, o.st.st_ino) for o in [*scanned, *found.values()]}
        for _, key, o in sorted(missed, key=lambda t: t[0]):
            if (o.st.st_dev, o.st.st_ino) in read or _compressing(o, plain):
                continue
            read.add((o.st.st_dev, o.st.st_ino))
            taken.add(id(o))
            plain += [] if o.gzip else [Fingerprint.of(o.fd)]
            m.reads.append((FileState(key=key, path=o.path), o, "rotated"))
    lost = [s for s in ours if id(s) not in found]
    for o in scanned:
        if id(o) not in taken and not _compressing(o, plain):
            plain += [] if o.gzip else [Fingerprint.of(o.fd)]
            m.reads.append(_new(o, m.reads, lost))
    kept, looked_for = {id(s) for s, _, _ in m.reads}, {id(s) for s in ours}
    states[:] = [s for s in states if id(s) in kept or (id(s) not in looked_for and os.path.lexists(s.path))]
    present = {id(s) for s in states}
    states += [s for s, _, _ in m.reads if id(s) not in present]
    return m


def _holds(s: FileState, o: Opened, same_inode: bool) -> bool:
    fp = s.fingerprint
    if fp is None or fp.names(o.st) != same_inode:  # (None: read from the start)
        return False
    if o.gzip and not same_inode and fp.recheck(o.fd) is None:  # (read plain, compressed since)
        o.compressed = fp.holds_compressed(o.fd, s.offset)
        return o.compressed
    return o.st.st_size >= s.offset and fp.holds(o.fd, s.offset)


def _cut_short(s: FileState, o: Opened) -> bool:
    """Whether `o` is the file of `s` cut short in place (same inode, same first bytes, but not
    what was read up to its offset); if so, `s` goes on where `o` still matches what was read."""
    fp, marks = s.fingerprint, s.marks
    if fp is None or o.gzip or not fp.names(o.st) or fp.recheck(o.fd) is None or not marks.points:
        return False
    at = last_match(o.fd, marks.points, marks.base, min(o.st.st_size, s.offset))
    if at.offset <= marks.base:  # (nothing read still there: rewritten)
        return False
    after = marks.after(at)
    o.cut = Cut(at.offset, 0 if after is None else max(0, after.lines - at.lines - 1))
    marks.resume(at)
    s.offset = at.offset
    return True


def _compressing(o: Opened, plain: list[Fingerprint]) -> bool:
    """Whether `o` is a compressed copy of a plain file this scan reads (`plain`: gzip has not
    removed that one yet): it is left for the next scan, where the plain file's state finds it."""
    return o.gzip and any(fp.head_len > 0 and fp.holds_compressed(o.fd, None) for fp in plain)


def _missed(o: Opened, since: float, taken: set[int], scanned: list[Opened]) -> bool:
    """Whether `o`, under a rotated name and held by no saved state, was written since the last
    scan began: a file rotated in and out between two scans, unread."""
    unread = id(o) not in taken and all(o is not f for f in scanned)
    return unread and o.st.st_size > 0 and o.st.st_mtime > since - _CLOCK_SLACK_S


def _new(
    o: Opened, reads: list[tuple[FileState, Opened, str | None]], lost: list[FileState]
) -> tuple[FileState, Opened, str | None]:
    """A state for a file no saved state holds, and why it is read from its start."""
    before = next((s for s in lost if s.path == o.path or s.key == o.path), None)
    if before is not None:
        lost.remove(before)
        fp = before.fingerprint
        why = "new" if fp is None else "truncated" if fp.names(o.st) else "rotated"  # (None: no usable state)
        before.path = o.path
        return before, o, why
    moved = any(o.path in (s.path, s.key) for s, f, _ in reads if f is not o)
    return FileState(key=o.path), o, "rotated" if moved else "new"


def _open(path: str, m: Matching, scanned: bool = True) -> Opened | None:
    """Open a regular file without blocking (a FIFO is refused, not waited on); an error is
    noted in `m` for a file of the scan's paths (a rotated name may have gone away)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        if scanned:
            reason = "no such file" if isinstance(e, FileNotFoundError) else f"cannot read: {e.strerror or e}"
            m.errors.append((path, f"{path}: {reason}"))
        return None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        with contextlib.suppress(OSError):
            os.close(fd)
        if scanned:
            m.errors.append((path, f"{path}: not a regular file"))
        return None
    opened = Opened(path, fd, st, scanned, gzip=os.pread(fd, 2, 0) == _GZIP_MAGIC)
    m.opened.append(opened)
    return opened

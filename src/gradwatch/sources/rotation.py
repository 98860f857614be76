"""Which file is which at the start of a scan: the saved files found again by identity, not path.

Like Fluent Bit and Vector, a file is what its `Fingerprint` says. A saved file is looked for under
the scan's paths and under the usual rotated names of where it was (`train.log.1`,
`train.log-20240306`): the same inode holding what was read (renamed, rotated, or simply grown),
else another inode holding it (the copy that copytruncate left). It goes on from its offset there,
read to its end before the file now at its old name, which is read from its start. So a rotated
file matched again by the glob is not read as new, and what was appended to it before the rename
is not lost. A path whose file no saved state holds is read from its start: new, or why not.

Not recoverable: lines written between logrotate's copy and its truncate (copytruncate's own race),
a file deleted before it was read to its end, and a rotated file already compressed (`.gz`).
"""

from __future__ import annotations

import contextlib
import glob
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from gradwatch.sources.checkpoint import FileState

__all__ = ["Matching", "Opened", "match"]


@dataclass
class Opened:
    """A regular file opened for this scan."""

    path: str
    fd: int
    st: os.stat_result
    #: under the scan's paths (else found under a rotated name)
    scanned: bool = True


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
    """Where logrotate and friends move `path`: `.1`, `.0`, `.N`, `-YYYYMMDD` (plain text only)."""
    escaped = glob.escape(path)
    found = sorted(glob.glob(f"{escaped}.[0-9]*") + glob.glob(f"{escaped}-[0-9]*"))
    return [p for p in found if not p.endswith(".gz")]


def match(states: list[FileState], paths: list[Path]) -> Matching:
    """Find every state of a file under `paths` (see module docstring); `states` is updated: the
    states of files that are gone are dropped, new ones added."""
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
    for same_inode in (True, False):  # then: renamed, or copied before a truncation
        for s in ours:
            if id(s) not in found:
                claim(s, candidates(s), same_inode)
    m.reads = [(s, found[id(s)], None) for s in ours if id(s) in found]
    lost = [s for s in ours if id(s) not in found]
    for o in scanned:
        if id(o) not in taken:
            m.reads.append(_new(o, m.reads, lost))
    kept, looked_for = {id(s) for s, _, _ in m.reads}, {id(s) for s in ours}
    states[:] = [s for s in states if id(s) in kept or (id(s) not in looked_for and os.path.lexists(s.path))]
    present = {id(s) for s in states}
    states += [s for s, _, _ in m.reads if id(s) not in present]
    return m


def _holds(s: FileState, o: Opened, same_inode: bool) -> bool:
    fp = s.fingerprint
    if fp is None or fp.names(o.st) != same_inode or o.st.st_size < s.offset:  # (None: read from the start)
        return False
    return fp.holds(o.fd, s.offset)


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
    opened = Opened(path, fd, st, scanned)
    m.opened.append(opened)
    return opened

"""Walking directories for logs: each real directory once, whatever its symlinks.

`glob.glob(..., recursive=True)` and `os.walk(followlinks=True)` follow a symlink to a parent
again and again: two such links make a tree of 2^40 paths before the kernel's ELOOP stops it,
and `tail DIR` or `scan 'DIR/**/*.log'` never start. Here a directory is entered once, by the
first path found to it (real directories before symlinked ones), and only regular files are
returned: a named pipe would block its reader, a device never ends.
"""

from __future__ import annotations

import glob
import os
import stat
from collections.abc import Iterator
from pathlib import Path

__all__ = ["glob_paths", "is_regular", "walk_files"]

_RECURSIVE = "**"


def walk_files(root: Path) -> list[Path]:
    """The regular files under the directory `root` (hidden ones too), sorted."""
    return sorted(Path(f) for d in _directories(str(root), hidden=True) for f in _regular_files(d))


def glob_paths(pattern: str) -> list[str]:
    """`glob.glob(pattern, recursive=True)`, sorted, but each real directory is searched once
    under a `**`, and only regular files are returned."""
    parts = pattern.split(os.sep)
    if _RECURSIVE not in parts:
        return sorted(p for p in glob.glob(pattern) if is_regular(p))
    k = parts.index(_RECURSIVE)
    head, rest = os.sep.join(parts[:k]) or os.sep * (k > 0), os.sep.join(parts[k + 1 :])  # ('/**/x': '/')
    bases = glob.glob(head) if glob.has_magic(head) else [head or os.curdir]
    found: set[str] = set()
    for base in bases:
        for d in _directories(base, hidden=False):
            if not rest:
                found.update(_regular_files(d))
                continue
            below = os.path.join(glob.escape(d), rest)
            found.update(glob_paths(below.removeprefix(os.curdir + os.sep) if not head else below))
    return sorted(found)


def is_regular(path: str | Path) -> bool:
    """Whether `path` is a regular file (symlinks followed)."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def _directories(root: str, hidden: bool) -> Iterator[str]:
    """`root` and the directories under it, each real one once (by device and inode): those
    reached without a symlink first, then those only a symlink leads to (`hidden`: with the
    names that begin with a dot, which a glob's `**` leaves out)."""
    seen: set[tuple[int, int]] = set()
    real: list[str] = [root]  # stacks of directories to enter: reached without a symlink,
    linked: list[str] = []  # and through one
    while real or linked:
        d = real.pop() if real else linked.pop()
        try:
            st = os.stat(d)
        except OSError:
            continue
        ident = (st.st_dev, st.st_ino)
        if not stat.S_ISDIR(st.st_mode) or ident in seen:
            continue
        seen.add(ident)
        yield d
        try:
            entries = sorted(os.scandir(d), key=lambda e: e.name, reverse=True)
        except OSError:
            continue
        for entry in entries:
            if not hidden and entry.name.startswith("."):
                continue
            try:
                if entry.is_dir():
                    (linked if entry.is_symlink() else real).append(entry.path)
            except OSError:
                continue


def _regular_files(directory: str) -> Iterator[str]:
    """The regular files directly in `directory` (symlinks to them too)."""
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return
    for entry in entries:
        try:
            if entry.is_file():
                yield entry.path
        except OSError:
            continue

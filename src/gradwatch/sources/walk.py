"""Walking directories for logs: each real directory once, whatever its symlinks.

`glob.glob(..., recursive=True)` and `os.walk(followlinks=True)` follow a symlink to a parent
again and again: two such links make a tree of 2^40 paths before the kernel's ELOOP stops it,
and `tail DIR` or `scan 'DIR/**/*.log'` never start. Here a directory is entered once, by the
first path found to it (real directories before symlinked ones). Only regular files are read: a
named pipe would block its reader, a device never ends. The others a walk meets are never opened,
only listed (`Found.special`), so that the user is told they were left out.
"""

from __future__ import annotations

import glob
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Found", "glob_found", "glob_paths", "glob_root", "is_regular", "kind_of", "walk_files", "walk_found"]

_RECURSIVE = "**"


@dataclass
class Found:
    """What a walk or a glob met, sorted: the regular files, and the files that are not (named
    pipes, sockets, devices), which are never opened."""

    files: list[Path] = field(default_factory=list)
    special: list[Path] = field(default_factory=list)


def walk_files(root: Path) -> list[Path]:
    """The regular files under the directory `root` (hidden ones too), sorted."""
    return walk_found(root).files


def walk_found(root: Path) -> Found:
    """The files under the directory `root` (hidden ones too), and those that are not regular."""
    return _sorted(f for d in _directories(str(root), hidden=True) for f in _files(d))


def glob_paths(pattern: str) -> list[str]:
    """`glob.glob(pattern, recursive=True)`, sorted, but each real directory is searched once
    under a `**`, and only regular files are returned."""
    return sorted(path for path, regular in dict(_globbed(pattern)).items() if regular)


def glob_found(pattern: str) -> Found:
    """The files `pattern` matches (`glob_paths`), and the matches that are not regular files."""
    return _sorted(_globbed(pattern))


def glob_root(pattern: str) -> str:
    """The folder a glob searches: its parts before the first one with magic (`runs` for
    `runs/*/train.log`, `.` for `*.log`)."""
    parts = pattern.split(os.sep)
    fixed = next(i for i, part in enumerate(parts) if glob.has_magic(part) or i == len(parts) - 1)
    return os.sep.join(parts[:fixed]) or (os.sep if pattern.startswith(os.sep) else os.curdir)


def is_regular(path: str | Path) -> bool:
    """Whether `path` is a regular file (symlinks followed)."""
    return kind_of(path) == stat.S_IFREG


def kind_of(path: str | Path) -> int | None:
    """What `path` is (`stat.S_IFREG`, `S_IFIFO`, ...; symlinks followed); None: it is not there."""
    try:
        return stat.S_IFMT(os.stat(path).st_mode)
    except OSError:
        return None


def _globbed(pattern: str) -> Iterator[tuple[str, bool]]:
    """What `pattern` matches that is not a directory: (path, whether it is a regular file)."""
    parts = pattern.split(os.sep)
    if _RECURSIVE not in parts:
        for match in glob.glob(pattern):
            kind = kind_of(match)
            if kind is not None and kind != stat.S_IFDIR:
                yield match, kind == stat.S_IFREG
        return
    k = parts.index(_RECURSIVE)
    head, rest = os.sep.join(parts[:k]) or os.sep * (k > 0), os.sep.join(parts[k + 1 :])  # ('/**/x': '/')
    bases = glob.glob(head) if glob.has_magic(head) else [head or os.curdir]
    for base in bases:
        for d in _directories(base, hidden=False):
            if not rest:
                yield from _files(d)
                continue
            below = os.path.join(glob.escape(d), rest)
            yield from _globbed(below.removeprefix(os.curdir + os.sep) if not head else below)


def _sorted(found: Iterator[tuple[str, bool]]) -> Found:
    """The regular and the other files of `found`, each once, sorted."""
    files = dict(found)
    return Found([Path(f) for f in sorted(files) if files[f]], [Path(f) for f in sorted(files) if not files[f]])


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


def _files(directory: str) -> Iterator[tuple[str, bool]]:
    """The files directly in `directory` (symlinks to them too), each with whether it is a
    regular file (a symlink that leads nowhere is no file)."""
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return
    for entry in entries:
        try:
            if entry.is_file():
                yield entry.path, True
            elif not entry.is_dir() and kind_of(entry.path) is not None:
                yield entry.path, False
        except OSError:
            continue

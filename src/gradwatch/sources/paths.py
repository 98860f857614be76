"""The files a command reads, from the paths the user gave: files, folders and quoted globs.

A folder is searched recursively for `archive.LOG_SUFFIXES` (and the same names with `.gz`), a
glob is matched (`sources.walk`: each real folder once), a file is taken as named. Each file is
read once, by identity (device and inode), under the first name it was given by: `check notes.txt
logs/` with logs/notes.txt, `check a.log a.log`, or two globs that both match a file. `--exclude`
leaves files out (`sources.exclude`: relative to the folder or glob that found them). What a folder
or glob meets that is no regular file (a named pipe, a socket, a device) is never opened: it is
listed in `special`, for a note. A path that does not exist is kept: reading it reports the error
for that file alone.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field
from pathlib import Path

from gradwatch.sources.archive import LOG_SUFFIXES
from gradwatch.sources.exclude import Excludes
from gradwatch.sources.walk import Found, glob_found, glob_root, walk_found

__all__ = ["Expanded", "expand"]


@dataclass
class Expanded:
    """The files to read, in the order given, and the files folders and globs met that are no
    regular files (never opened)."""

    exclude: Excludes = field(default_factory=Excludes)
    files: list[Path] = field(default_factory=list)
    special: list[Path] = field(default_factory=list)
    _seen: set[tuple[int, int] | Path] = field(default_factory=set)

    def add(self, arg: str) -> list[Path]:
        """Add the files of one argument; return those not added before."""
        found, root = _found(arg)
        self.special += [f for f in found.special if f not in self.special and not self.exclude.matches(f, root)]
        added: list[Path] = []
        for f in found.files:
            ident = _identity(f)
            if ident not in self._seen and not self.exclude.matches(f, root):
                self._seen.add(ident)
                added.append(f)
        self.files += added
        return added


def expand(args: list[str], exclude: Excludes | None = None) -> Expanded:
    """The files of `args`, each once, but those `exclude` leaves out."""
    out = Expanded(exclude or Excludes())
    for arg in args:
        out.add(arg)
    return out


def _found(arg: str) -> tuple[Found, str | None]:
    """What one argument names, with the folder it was found in (None: named)."""
    p = Path(arg)
    if p.is_dir():
        walked = walk_found(p)
        return Found([f for f in walked.files if _is_log(f)], [f for f in walked.special if _is_log(f)]), arg
    if not p.exists() and glob.has_magic(arg):
        return glob_found(arg), glob_root(arg)
    return Found([p]), None


def _is_log(path: Path) -> bool:
    return path.name.removesuffix(".gz").endswith(LOG_SUFFIXES)


def _identity(path: Path) -> tuple[int, int] | Path:
    """The file's device and inode (symlinks followed); a path that cannot be looked at is its own."""
    try:
        st = os.stat(path)
    except OSError:
        return path
    return st.st_dev, st.st_ino

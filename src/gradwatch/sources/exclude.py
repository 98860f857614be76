"""`--exclude GLOB`: files left out of what a command reads.

A glob matches a file when it matches the file's name, the name of a folder on its path, or the
end of its path (`*` also matches `/`): `*.txt`, `notes.txt`, `old` (everything under a folder
named old), `logs/old/*`. The path is the one the user gave: for a file found in a folder or by a
glob, from that folder on (`logs/old/train.log` for `check logs`, whether logs is /tmp/logs or
not), for a file named on the command line as it was named (a shell expands `runs/*/*.log` before
gradwatch sees it). The folders above are not looked at: `--exclude tmp` leaves out a folder named
tmp inside the logs, not every log under /tmp. The whole path as given also matches, so that an
absolute glob (`/scratch/*/old/*`) works.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path, PurePath

__all__ = ["Excludes"]

#: What a folder's name is not: the folder it is given from is no name of the user's.
_NO_NAMES = ("", os.curdir, os.pardir, os.sep)


@dataclass(frozen=True)
class Excludes:
    """The `--exclude` globs of one command (none: nothing is left out)."""

    globs: tuple[str, ...] = ()

    def matches(self, path: Path, root: str | None = None) -> bool:
        """Whether one of the globs leaves `path` out. `root`: the folder (or a glob's folder,
        `walk.glob_root`) as the user gave it, in which `path` was found; None: `path` was named."""
        if not self.globs:
            return False
        parts = _parts_from(path, root)
        names = set(parts)
        ends = {str(PurePath(*parts[i:])) for i in range(len(parts))}
        return any(fnmatchcase(text, g) for g in self.globs for text in (*names, *ends, str(path)))


def _parts_from(path: Path, root: str | None) -> tuple[str, ...]:
    """The parts of `path` from the folder `root` on (its own name first, where it has one), or
    all of them as given."""
    if root is None:
        return PurePath(path).parts[PurePath(path).is_absolute() :]
    below = PurePath(os.path.relpath(path, root)).parts
    name = os.path.basename(os.path.normpath(root))
    return below if name in _NO_NAMES else (name, *below)

"""`--exclude GLOB`: files left out of what a command reads.

A glob matches a file when it matches the file's name, the name of a folder on its path, or the
end of its path (`*` also matches `/`): `*.txt`, `notes.txt`, `old` (everything under a folder
named old), `runs/*/debug.log`. It applies to every path, named on the command line or found in
a folder or by a glob: a shell expands `logs/*.log` before gradwatch sees it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path, PurePath

__all__ = ["Excludes"]


@dataclass(frozen=True)
class Excludes:
    """The `--exclude` globs of one command (none: nothing is left out)."""

    globs: tuple[str, ...] = ()

    def matches(self, path: Path) -> bool:
        """Whether one of the globs leaves `path` out."""
        if not self.globs:
            return False
        parts = PurePath(os.path.abspath(path)).parts
        names = set(parts[1:])
        ends = {str(PurePath(*parts[i:])) for i in range(len(parts))}
        return any(fnmatchcase(text, g) for g in self.globs for text in (*names, *ends))

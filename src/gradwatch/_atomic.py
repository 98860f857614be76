"""Write a file so that readers see either its old content or the new one, never a half.

The bytes go to a temporary file in the same directory, are fsync'ed, and the temporary file is
renamed over the target (`os.replace` is atomic within one filesystem); the directory is fsync'ed
too, so that the rename itself survives a crash. A process killed mid-write leaves the old file
intact and, at worst, a stray `.NAME.*.tmp` beside it.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

__all__ = ["write_atomic"]


def write_atomic(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Replace `path` by `data` atomically; the new file gets permission bits `mode`."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), mode)
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return  # some filesystems do not let a directory be opened: the rename is still done
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)

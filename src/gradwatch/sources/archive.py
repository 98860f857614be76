"""Reading archived logs in large chunks.

Gzip files are recognised by their magic bytes, whatever their name, and read transparently.
"""

from __future__ import annotations

import gzip
import os
import stat
import zlib
from collections.abc import Iterator
from pathlib import Path

from gradwatch.errors import InputError

LOG_SUFFIXES = (".log", ".txt", ".out", ".jsonl")
CHUNK_BYTES = 4 << 20


def read_chunks(path: Path, size: int = CHUNK_BYTES, first: int | None = None, start: int = 0) -> Iterator[bytes]:
    """The file's bytes from `start` on, in chunks of about `size` (the first of about `first`,
    when given); gzip is decompressed on the fly (`start` counts decompressed bytes)."""
    try:
        # (without blocking: a named pipe's open would wait for a writer, see `_regular`)
        fh = os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb")
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror or e}") from None
    with fh:
        _regular(path, fh.fileno())
        try:
            if fh.read(2) == b"\x1f\x8b":
                fh.seek(0)
                stream = gzip.GzipFile(fileobj=fh)
                stream.seek(start)
                yield from _chunks(stream, size, path, first or size)
            else:
                fh.seek(start)
                yield from _chunks(fh, size, path, first or size)
        except OSError as e:
            raise InputError(f"{path}: read failed: {e.strerror or e}") from None


#: What a path named may be besides a regular file, as a message says it.
_NOT_FILES = {
    stat.S_IFDIR: "is a directory with no log files",
    stat.S_IFIFO: "is a named pipe, not a file (a pipe is read only as a log to check, not here)",
    stat.S_IFCHR: "is a device, not a file",
    stat.S_IFBLK: "is a device, not a file",
    stat.S_IFSOCK: "is a socket, not a file",
}


def _regular(path: Path, fd: int) -> None:
    """Refuse what is not a regular file (a pipe may never end or block, `/dev/zero` never ends).

    Raises:
        InputError: the message says what it is.
    """
    kind = stat.S_IFMT(os.fstat(fd).st_mode)
    if kind != stat.S_IFREG:
        raise InputError(f"{path}: {_NOT_FILES.get(kind, 'not a regular file')}")


def _chunks(stream: object, size: int, path: Path, first: int) -> Iterator[bytes]:
    """Chunks of about `size` bytes, the first of about `first`. Gzip is decompressed piece by
    piece (`read1`): a single `read(size)` would drop everything it had decompressed when it
    meets a damaged or cut end."""
    read = stream.read1 if isinstance(stream, gzip.GzipFile) else stream.read  # type: ignore[attr-defined]
    buf = bytearray()
    wanted = first
    while True:
        try:
            data = read(wanted - len(buf))
        except (EOFError, zlib.error, gzip.BadGzipFile) as e:
            if buf:
                yield bytes(buf)
            raise InputError(f"{path}: damaged gzip data ({e}); what came before it was read") from None
        if not data:
            if buf:
                yield bytes(buf)
            return
        if not buf and len(data) >= wanted:  # a whole chunk at once (a plain file): no copy
            yield data
            wanted = size
            continue
        buf += data
        if len(buf) >= wanted:
            yield bytes(buf)
            buf.clear()
            wanted = size


def file_size(path: Path) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0

"""Reading archived logs: expanding the paths a user gave, and reading files in large chunks.

A directory is searched recursively for `*.log *.txt *.out *.jsonl` (and the same names with
`.gz`). Gzip files are recognised by their magic bytes, whatever their name, and read transparently.
"""

from __future__ import annotations

import glob
import gzip
import os
import zlib
from collections.abc import Iterator
from pathlib import Path

from gradwatch.errors import InputError

LOG_SUFFIXES = (".log", ".txt", ".out", ".jsonl")
CHUNK_BYTES = 4 << 20


def expand_paths(args: list[str]) -> list[Path]:
    """Files to read, in the order given; directories and unexpanded globs are expanded.

    A path that does not exist is kept: reading it reports the error for that file alone.
    """
    out: list[Path] = []
    for arg in args:
        p = Path(arg)
        if p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.is_file() and f.name.removesuffix(".gz").endswith(LOG_SUFFIXES))
            out.extend(found)
        elif not p.exists() and glob.has_magic(arg):
            out.extend(Path(m) for m in sorted(glob.glob(arg, recursive=True)))
        else:
            out.append(p)
    return out


def read_chunks(path: Path, size: int = CHUNK_BYTES, first: int | None = None, start: int = 0) -> Iterator[bytes]:
    """The file's bytes from `start` on, in chunks of about `size` (the first of about `first`,
    when given); gzip is decompressed on the fly (`start` counts decompressed bytes)."""
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed below, also on error
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory with no log files") from None
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror or e}") from None
    with fh:
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

"""Which file is this? Device and inode, plus a checksum of the first bytes.

Inode numbers alone are not enough: after copytruncate the inode stays the same while the content
starts over, and a deleted file's inode can be reused by the next file created. A checksum of the
first `HEAD_BYTES` tells "same file, grown" from "same inode, new content" (Vector does the same).
The checksum covers what the file held when we last looked, so a young file's fingerprint grows
with it until it covers `HEAD_BYTES`.

`scan` also checksums the bytes just before where it stopped reading (`tail_crc`): a file that
`holds` both checksums, and at least the bytes read, is the file it read, under whatever name and
inode it has now (the copy that copytruncate left), and a new file in the old one's place is not,
even with the same header (the same config dump) and a reused inode.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace

__all__ = ["HEAD_BYTES", "Fingerprint"]

#: Bytes checksummed at the start of a file: more than one log line, so a rewrite shows.
HEAD_BYTES = 256


@dataclass(frozen=True)
class Fingerprint:
    """The identity of an open file."""

    dev: int
    ino: int
    #: how many leading bytes `head_crc` covers (less than HEAD_BYTES while the file is young)
    head_len: int
    head_crc: int
    #: how many bytes before the offset it was taken at `tail_crc` covers (0: none)
    tail_len: int = 0
    tail_crc: int = 0

    @classmethod
    def of(cls, fd: int, offset: int = 0) -> Fingerprint:
        """The fingerprint of `fd`, with the bytes before `offset` (where reading stopped)."""
        st = os.fstat(fd)
        head = os.pread(fd, HEAD_BYTES, 0)
        tail = _before(fd, offset)
        return cls(st.st_dev, st.st_ino, len(head), zlib.crc32(head), len(tail), zlib.crc32(tail))

    @classmethod
    def of_read(cls, st: os.stat_result, head: bytes, tail: bytes | bytearray) -> Fingerprint:
        """The fingerprint of a file as it was read: its first bytes and the last ones read (a file
        truncated while it was read is not fingerprinted by what it holds afterwards)."""
        head, tail = head[:HEAD_BYTES], tail[-HEAD_BYTES:]
        return cls(st.st_dev, st.st_ino, len(head), zlib.crc32(head), len(tail), zlib.crc32(tail))

    def holds(self, fd: int, offset: int) -> bool:
        """Whether `fd` holds what this fingerprint was taken of, read up to `offset`: the same
        first bytes and the same bytes before `offset` (whatever its inode)."""
        return self._holds(lambda at, n: os.pread(fd, n, at), offset)

    def holds_compressed(self, fd: int, offset: int | None) -> bool:
        """`holds`, for the decompressed bytes of the gzip file `fd` (rotated, then compressed);
        `offset` None: whether it begins as this file did (a compressed copy of it)."""
        with contextlib.suppress(OSError, EOFError, zlib.error), os.fdopen(os.dup(fd), "rb") as raw:
            stream = gzip.GzipFile(fileobj=raw)

            def read(at: int, n: int) -> bytes:
                stream.seek(at)  # (forward: head, then tail)
                return stream.read(n)

            return self._holds(read, offset)
        return False

    def _holds(self, read: Callable[[int, int], bytes], offset: int | None) -> bool:
        head = read(0, self.head_len)
        if len(head) < self.head_len or zlib.crc32(head) != self.head_crc:
            return False
        if offset is None:
            return True
        start = max(0, offset - self.tail_len)
        tail = read(start, offset - start)
        return len(tail) == self.tail_len and zlib.crc32(tail) == self.tail_crc

    def names(self, st: os.stat_result) -> bool:
        """Whether `st` (a stat of the path) is this file rather than a new one in its place."""
        return (st.st_dev, st.st_ino) == (self.dev, self.ino)

    def recheck(self, fd: int) -> Fingerprint | None:
        """The fingerprint of `fd` now, or None when its first bytes changed (rewritten in place)."""
        head = os.pread(fd, HEAD_BYTES, 0)
        if len(head) < self.head_len or zlib.crc32(head[: self.head_len]) != self.head_crc:
            return None
        if len(head) == self.head_len:
            return self
        return replace(self, head_len=len(head), head_crc=zlib.crc32(head))


def _before(fd: int, offset: int, length: int = HEAD_BYTES) -> bytes:
    """Up to `length` bytes that end at `offset`."""
    start = max(0, offset - length)
    return os.pread(fd, offset - start, start)

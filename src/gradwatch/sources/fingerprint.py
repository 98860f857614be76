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

import os
import zlib
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

    def holds(self, fd: int, offset: int) -> bool:
        """Whether `fd` holds what this fingerprint was taken of, read up to `offset`: the same
        first bytes and the same bytes before `offset` (whatever its inode)."""
        head = os.pread(fd, self.head_len, 0)
        if len(head) < self.head_len or zlib.crc32(head) != self.head_crc:
            return False
        tail = _before(fd, offset, self.tail_len)
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

"""Which file is this? Device and inode, plus a checksum of the first bytes.

Inode numbers alone are not enough: after copytruncate the inode stays the same while the content
starts over, and a deleted file's inode can be reused by the next file created. A checksum of the
first `HEAD_BYTES` tells "same file, grown" from "same inode, new content" (Vector does the same).
The checksum covers what the file held when we last looked, so a young file's fingerprint grows
with it until it covers `HEAD_BYTES`.
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

    @classmethod
    def of(cls, fd: int) -> Fingerprint:
        st = os.fstat(fd)
        head = os.pread(fd, HEAD_BYTES, 0)
        return cls(st.st_dev, st.st_ino, len(head), zlib.crc32(head))

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

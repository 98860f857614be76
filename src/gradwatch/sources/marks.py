"""Where a file cut short stops matching what was read from it: marks along what was read.

A `Mark` is an offset read up to, with the crc of the bytes from where reading began (`base`) to
it and the number of lines before it. When a file turns out shorter than what was read, or other
bytes lie just before where reading stopped (a job cut its log back to a checkpoint's line, a
file rewritten in place), `last_match` checksums the file from `base` mark by mark and finds the
last mark it still matches: reading goes on from there, and what lies before it is not read twice.

Marks are kept at line ends (every line end of small reads; of large reads, the last ones and,
before them, line ends evenly apart) and thinned as they age: past `kept`, every other one of
the older half goes, so the newest lines' marks are exact and older ones ever further apart. How far
apart two marks are is what is inexact about a cut far back: between the last mark that matches and
the next one, the file may hold lines that were read before (`sources/resume.py` says what `scan`
does with them).

`tail` keeps marks in memory beside the last bytes read (`sources/follow.py`), `scan` in its
state file (`sources/checkpoint.py`): a thousand marks, some 20 KB, whatever the log's size.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterable
from typing import NamedTuple

from gradwatch.sources.archive import CHUNK_BYTES

__all__ = ["MARKS_KEPT", "Mark", "Marks", "crc_range", "last_match"]

#: Marks kept per file: the last ~500 lines are exact.
MARKS_KEPT = 1024
#: Before the line ends marked one by one, a large read is marked this many times, evenly: it is
#: not one long gap.
_SPARSE_MARKS = 256


class Mark(NamedTuple):
    """A point read up to: its offset, the crc of the bytes from the base to it, the lines before it."""

    offset: int
    crc: int
    lines: int


class Marks:
    """The marks of one file, from `base` (where reading began) to `offset` (where it stands)."""

    def __init__(self, base: int = 0, kept: int = MARKS_KEPT) -> None:
        self.base = self.offset = base
        self.crc = self.lines = 0  # up to `offset`
        self.points: list[Mark] = []
        self.kept = kept

    @property
    def here(self) -> Mark:
        """Where reading stands, as a mark."""
        return Mark(self.offset, self.crc, self.lines)

    def add(self, data: bytes, line_ends: int | None = None, at_end: bool = True) -> None:
        """`data` was read at `offset`: a mark at its last `line_ends` line ends (None: every one)
        and, with `at_end`, at its end."""
        ends = _line_ends(data, line_ends)
        if at_end and (not ends or ends[-1] != len(data)):
            ends.append(len(data))
        start, lines = 0, self.lines
        for end in ends:
            self.crc = zlib.crc32(data[start:end], self.crc)
            lines += data.count(b"\n", start, end)
            self.points.append(Mark(self.offset + end, self.crc, lines))
            start = end
        self.crc = zlib.crc32(data[start:], self.crc)
        self.lines = lines + data.count(b"\n", start)
        self.offset += len(data)
        while len(self.points) > self.kept:  # every other one of the older half goes (not the first)
            half = len(self.points) // 2
            self.points[:half] = self.points[0:half:2]

    def resume(self, at: Mark) -> None:
        """Go on from `at` (where the file still matches what was read), forgetting what follows;
        a mark before `base` starts the marks over from it (nothing is known before the base)."""
        if at.offset < self.base:
            self.base, at = at.offset, Mark(at.offset, 0, 0)
        self.offset, self.crc, self.lines = at
        self.points = [m for m in self.points if m.offset <= at.offset]

    def after(self, at: Mark) -> Mark | None:
        """The first mark past `at` (None: none)."""
        return next((m for m in self.points if m.offset > at.offset), None)


def last_match(fd: int, marks: Iterable[Mark], base: int, end: int) -> Mark:
    """The last of `marks` (in order, from `base`) up to `end` whose crc `fd` still matches;
    Mark(base, 0, 0) when none does. Reads the file from `base` up to that mark and one more."""
    good, pos, crc = Mark(base, 0, 0), base, 0
    for mark in marks:
        if mark.offset > end:
            break
        crc = crc_range(fd, pos, mark.offset, crc)
        pos = mark.offset
        if crc != mark.crc:
            break
        good = mark
    return good


def crc_range(fd: int, start: int, end: int, crc: int) -> int:
    """`crc` carried on over the bytes [start, end) of `fd`."""
    while start < end:
        data = os.pread(fd, min(end - start, CHUNK_BYTES), start)
        if not data:
            break
        crc, start = zlib.crc32(data, crc), start + len(data)
    return crc


def _line_ends(data: bytes, wanted: int | None) -> list[int]:
    """The offsets just past the last `wanted` newlines of `data` (None: all), and before them a
    line end every 1/`_SPARSE_MARKS` of `data`, in order."""
    ends: list[int] = []
    if wanted is None:
        at = data.find(b"\n")
        while at >= 0:
            ends.append(at + 1)
            at = data.find(b"\n", at + 1)
        return ends
    at = len(data)
    while len(ends) < wanted and (at := data.rfind(b"\n", 0, at)) >= 0:
        ends.append(at + 1)
    stride = max(len(data) // _SPARSE_MARKS, 1)
    last = ends[-1] - 1 if ends else len(data)
    while (at := data.rfind(b"\n", 0, min(last, last // stride * stride))) >= 0:
        ends.append(at + 1)
        last = at
    return ends[::-1]

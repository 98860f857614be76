"""Numbers read out of many byte ranges of a block at once: the bulk readers' conversion step.

The ranges are gathered into one buffer, one space after each, and numpy's C parser reads the
buffer in one call. Before that each range is checked to hold exactly one token of number
characters (spaces around it allowed), so that a field that is empty, holds two words or a
`nan` cannot shift the values of the fields after it; a row with such a range is left to the
caller's slower path. numpy reads a number as `float()` does, to the last bit.
"""

from __future__ import annotations

import warnings

import numpy as np

_SPACE = ord(" ")
#: bytes a decimal number may hold: what `float()` reads, less `nan`, `inf` and underscores
_NUMBER_BYTE = np.zeros(256, dtype=bool)
_NUMBER_BYTE[np.frombuffer(b"0123456789.eE+-", dtype=np.uint8)] = True


def numbers_at(codes: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """The number in each range `codes[starts:ends]`, for ranges given as rows of `k` columns.

    Returns (values of the rows that qualified, (rows, k); which rows qualified), or None when a
    range that looked like a number is none (`1.2.3`): the caller then reads the block its
    slower way. `ends` must be valid positions of `codes` (the byte after each range: a
    separator such as `|`, overwritten in the copy).
    """
    rows, k = starts.shape
    if rows == 0:
        return np.zeros((0, k)), np.zeros(0, dtype=bool)
    first = starts.ravel()
    lengths = ends.ravel() - first
    width = lengths + 1  # the range and the separator after it
    offsets = np.cumsum(width) - width
    total = int(offsets[-1] + width[-1])
    buf = codes[np.arange(total) + np.repeat(first - offsets, width)]
    buf[offsets + lengths] = _SPACE
    filled = buf != _SPACE
    begins = filled.copy()  # the first byte of each run of non-spaces
    begins[1:] &= ~filled[:-1]
    runs = np.add.reduceat(begins, offsets, dtype=np.intp)
    odd = np.logical_or.reduceat(filled & ~_NUMBER_BYTE[buf], offsets)
    ok = ((runs == 1) & ~odd).reshape(rows, k).all(axis=1)
    if not ok.all():
        buf = buf[np.repeat(np.repeat(ok, k), width)]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # numpy only warns (and stops) at text that is no number
            values = np.fromstring(buf.tobytes(), dtype=np.float64, sep=" ")
    except (ValueError, DeprecationWarning):
        return None
    if values.size != int(ok.sum()) * k:
        return None
    return values.reshape(-1, k), ok

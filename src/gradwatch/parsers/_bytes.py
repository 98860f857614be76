"""Byte-level searches over a block (`Block.codes`, one byte a character) shared by the layout
readers: lines by their count of one separator, fixed texts at many positions, line starts."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Separated:
    """The lines of a block that hold a separator byte exactly `k` times (`lines_with`)."""

    lines: np.ndarray  # their indices
    starts: np.ndarray  # where each begins
    ends: np.ndarray  # where each ends (its newline)
    at: np.ndarray  # (lines, k): where the separators are


def lines_with(codes: np.ndarray, newlines: np.ndarray, byte: int, k: int) -> Separated:
    """The lines with `byte` exactly `k` times, found with one pass over the block."""
    found = np.flatnonzero(codes == byte)
    before = np.searchsorted(found, newlines)  # separators before each line's end
    counts = np.diff(before, prepend=0)
    lines = np.flatnonzero(counts == k)
    at = found[(before - counts)[lines][:, None] + np.arange(k)]
    return Separated(lines, line_starts(newlines, lines), newlines[lines], at)


def line_starts(newlines: np.ndarray, lines: np.ndarray) -> np.ndarray:
    """Where the lines `lines` (indices) begin, in a block whose lines end at `newlines`."""
    return np.where(lines > 0, newlines[lines - 1] + 1, 0)


def strings(codes: np.ndarray, width: int) -> np.ndarray:
    """Every `width` bytes of `codes` as one string, item i starting at byte i (a view, no copy):
    indexing it with positions compares whole texts in one operation."""
    return np.ndarray((len(codes) - width + 1,), dtype=f"S{width}", buffer=codes, strides=(1,))


def text_at(codes: np.ndarray, positions: np.ndarray, text: bytes) -> np.ndarray:
    """Per position, whether `text` is there (a position that leaves no room for it: no)."""
    if not text:
        return np.ones(len(positions), dtype=bool)
    room = len(codes) - len(text)
    if room < 0:
        return np.zeros(len(positions), dtype=bool)
    return (positions <= room) & (strings(codes, len(text))[np.minimum(positions, room)] == text)


def shaped_like(window: np.ndarray, shape: bytes) -> np.ndarray:
    """Per row of `window` (bytes, as wide as `shape`), whether it is `shape` with any digit
    where `shape` has a 0 (a date and time, say: b"0000-00-00 00:00:00")."""
    codes = np.frombuffer(shape, dtype=np.uint8)
    digits = codes == ord("0")
    ok: np.ndarray = ((window - ord("0") < 10) == digits).all(axis=1)
    return ok & (window[:, ~digits] == codes[~digits]).all(axis=1)


def texts_at(codes: np.ndarray, positions: np.ndarray, texts: tuple[bytes, ...] | list[bytes]) -> np.ndarray:
    """Per row of `positions` (rows, one column per text), whether each of `texts` is at its
    column's position (a position that leaves no room for it, or is negative: no).

    Texts of 8 bytes or more are compared as 64-bit words (the last may overlap the one before),
    all of them in one gather: a layout's keys are a few dozen words a line, and one gather costs
    less than one string comparison per key. Shorter texts are compared as strings.
    """
    ok = np.ones(len(positions), dtype=bool)
    words_of, offsets, expected = [], [], []  # per text, how many words; per word, where and what
    for j, text in enumerate(texts):
        if len(text) < 8:
            at = positions[:, j]
            ok &= (at >= 0) & text_at(codes, np.maximum(at, 0), text)
            words_of.append(0)
            continue
        starts = dict.fromkeys([*range(0, len(text) - 7, 8), len(text) - 8])
        words_of.append(len(starts))
        for start in starts:
            offsets.append(start)
            expected.append(int.from_bytes(text[start : start + 8], "little"))
    if not offsets:
        return ok
    words = np.ndarray((max(len(codes) - 7, 0),), dtype="<u8", buffer=codes, strides=(1,))  # unaligned
    # each word's position, row-major (a gather through an index in memory order takes half the
    # time), by repeating each text's column: a third of the time of a column selection
    at = np.repeat(positions, words_of, axis=1)
    at += np.array(offsets)
    if len(at) and not (at.min() >= 0 and at.max() < len(words)):  # some text has no room there
        ok &= ((at >= 0) & (at < len(words))).all(axis=1)
        at[~ok] = 0
        if not len(words):
            return ok
    found = words[at.ravel()].reshape(at.shape)
    return ok & (found == np.array(expected, dtype=np.uint64)).all(axis=1)

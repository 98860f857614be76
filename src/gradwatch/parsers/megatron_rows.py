"""Megatron record lines found and read at numpy speed, for the bulk path.

A run prints every record of one shape with the same fields in the same order and spacing;
only the values' widths vary. So such a line is known by its pipes: as many as the first
record of the shape had, `iteration` the same distance before the first, each field's key
right after its pipe, nothing but spaces after the last. One pass over the block's bytes finds
the pipes, and every check and every number is one numpy operation over all lines. A line that
has the pipes but fails a check is handed back (`Rows.odd`): the template regex reads it, or
else the per-line path, so what is read here is what the regex would read, only faster.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gradwatch.parsers._bytes import lines_with, strings, text_at, texts_at
from gradwatch.parsers._tokens import numbers_at

_PIPE = ord("|")
_ITERATION = np.frombuffer(b"iteration", dtype=np.uint8)
_DIGIT_OR_SPACE = np.zeros(256, dtype=bool)
_DIGIT_OR_SPACE[np.frombuffer(b"0123456789 ", dtype=np.uint8)] = True
_WORD = np.zeros(256, dtype=bool)  # what `\b` before `iteration` must not follow
_WORD[np.frombuffer(b"0123456789_abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", dtype=np.uint8)] = True
#: larger steps are not exact as floats: the regex path reads them
_EXACT_INT = 2.0**53
#: prefixes before `iteration` up to this long are searched all at once (longer ones one by one)
_PREFIX_SEARCHED = 64


@dataclass(frozen=True)
class Layout:
    """Where the parts of one record shape sit, measured on a record of that shape."""

    #: bytes from `iteration` to the first pipe
    head: int
    #: from `iteration` to the `/` between step and total
    slash: int
    #: what follows `iteration`: b"=", b":" or nothing
    sep: bytes
    #: after each pipe but the last: the field's key up to its value, e.g. b" lm loss:"
    keys: tuple[bytes, ...]
    #: the fields (indices into `keys`) whose values are read, in the template's order
    wanted: tuple[int, ...]
    #: what follows the last pipe
    tail: bytes

    @staticmethod
    def of(line: str, at: int, wanted: list[int]) -> Layout | None:
        """The layout of the record `line` whose `iteration` is at `at`; `wanted` are the fields
        the template reads. None where the line has no simple shape (wrapped, not ASCII)."""
        first = line.find("|", at)
        if first < 0 or not line.isascii():
            return None
        head = line[at:first]
        *fields, tail = line[first + 1 :].split("|")
        keys = []
        for part in fields:
            sep = part.rfind(":")
            if sep < 0:
                sep = part.rfind("=")
            if sep < 0:
                return None
            keys.append(part[: sep + 1].encode())
        if tail.strip() or "/" not in head or "\0" in line:
            return None
        after = head[9:10] if head[9:10] in ("=", ":") else ""
        return Layout(len(head), head.find("/"), after.encode(), tuple(keys), tuple(wanted), tail.encode())

    @property
    def widest(self) -> int:
        """The longest run of bytes compared at once (a block must hold it)."""
        return max(8, self.head, len(self.tail), *map(len, self.keys))

    @property
    def step_from(self) -> int:
        """From `iteration` to where the step's digits may begin."""
        return 9 + len(self.sep)


@dataclass
class Rows:
    """Record lines read by `find`: one entry per line, in order."""

    #: where each line's `iteration` is, and where the line starts
    at: np.ndarray
    line_starts: np.ndarray
    #: per line: step, total, then the wanted fields' values
    values: np.ndarray
    #: starts and ends of the lines that have the pipes of a record but failed a check
    odd: list[tuple[int, int]]


def find(layout: Layout, codes: np.ndarray, newlines: np.ndarray, controls: bool = True) -> Rows:
    """The record lines of `layout`'s shape in a block (`codes`, its bytes, ASCII; `newlines`,
    the positions of its newlines, one ending each line; `controls`: whether it may hold
    carriage returns or escapes)."""
    found = lines_with(codes, newlines, _PIPE, len(layout.keys) + 1)
    lines, starts, ends, at_pipe = found.lines, found.starts, found.ends, found.at
    if not len(lines) or len(codes) < layout.widest:  # too short to compare: the regex reads it
        none = np.zeros(0, dtype=np.int64)
        return Rows(
            none, none, np.zeros((0, 2 + len(layout.wanted))), list(zip(starts.tolist(), ends.tolist(), strict=True))
        )
    at = at_pipe[:, 0] - layout.head
    ok = at >= starts
    at = np.maximum(at, 0)
    head = strings(codes, layout.head)[np.minimum(at, len(codes) - layout.head)].view(np.uint8).reshape(-1, layout.head)
    ok &= (head[:, :9] == _ITERATION).all(axis=1)
    if layout.sep:
        ok &= head[:, 9] == layout.sep[0]
    ok &= head[:, layout.slash] == ord("/")
    digits = np.delete(head[:, layout.step_from :], layout.slash - layout.step_from, axis=1)
    ok &= _DIGIT_OR_SPACE[digits].all(axis=1)
    ok &= (at == starts) | ~_WORD[codes[np.maximum(at - 1, 0)]]
    ok &= _plain_prefixes(codes, starts, at, controls)
    ok &= texts_at(codes, at_pipe[:, : len(layout.keys)] + 1, layout.keys)  # each key right after its pipe
    ok &= (ends - at_pipe[:, -1] - 1 == len(layout.tail)) & text_at(codes, at_pipe[:, -1] + 1, layout.tail)
    chosen = np.flatnonzero(ok)
    at_ok, pipes_ok = at[chosen], at_pipe[chosen]
    wanted = np.array(layout.wanted, dtype=np.intp)
    key_len = np.array([len(layout.keys[j]) for j in layout.wanted], dtype=np.int64)
    token_starts = np.column_stack(
        [at_ok + layout.step_from, at_ok + layout.slash + 1, pipes_ok[:, wanted] + 1 + key_len]
    )
    token_ends = np.column_stack([at_ok + layout.slash, pipes_ok[:, 0], pipes_ok[:, wanted + 1]])
    values, good = numbers_at(codes, token_starts, token_ends)
    small = values[:, 0] < _EXACT_INT
    values, good_rows = values[small], chosen[good][small]
    accepted = np.zeros(len(lines), dtype=bool)
    accepted[good_rows] = True
    odd = list(zip(starts[~accepted].tolist(), ends[~accepted].tolist(), strict=True))
    return Rows(at[good_rows], starts[good_rows], values, odd)


def _plain_prefixes(codes: np.ndarray, starts: np.ndarray, at: np.ndarray, controls: bool) -> np.ndarray:
    """Per line, whether what precedes its `iteration` is read alike per line: no carriage return
    (the per-line path splits the line there), no escape (`clean()` removes it, which may join a
    word to `iteration`), no earlier `iteration` (the per-line path takes the first)."""
    ok = np.ones(len(at), dtype=bool)
    odd = np.flatnonzero((codes == ord("\r")) | (codes == 0x1B)) if controls else ()
    if len(odd):
        line = np.searchsorted(starts, odd, side="right") - 1  # the candidate line each may be in
        inside = (line >= 0) & (odd < at[np.maximum(line, 0)])
        ok[line[inside]] = False
    rows = np.flatnonzero(at - starts >= 9)  # room for an `iteration` before
    width = at[rows] - starts[rows]
    at_once = (width <= _PREFIX_SEARCHED) & (starts[rows] + _PREFIX_SEARCHED <= len(codes))
    if at_once.any():  # (Megatron-LM's ` [date] ` before every record)
        prefixes = strings(codes, _PREFIX_SEARCHED)[starts[rows[at_once]]]
        ok[rows[at_once][np.char.find(prefixes, b"iteration", 0, width[at_once]) >= 0]] = False
    for row in rows[~at_once].tolist():
        if b"iteration" in codes[starts[row] : at[row]].tobytes():
            ok[row] = False
    return ok

"""JSON-lines records found and read at numpy speed, for the bulk path.

A logger writes every record of one shape with the same keys in the same order and spacing;
only the values' widths vary. Keys hold no commas and bulk values are numbers or `null`, so such
a line is known by its commas: as many as the first record of the shape had, the text between
the values (`{"step": `, `, "loss": `, `}`) exactly that record's. One pass over the block's
bytes finds the commas; every check is one operation over all lines, and the values are checked
against JSON's number grammar (the template regex's), a line's values in one RE2 search
(`_tokens.rows_matching`), before Arrow converts them. A line that has the commas but fails a
check is handed back (`Rows.odd`) to the template regex.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from gradwatch.parsers._arrow import mask
from gradwatch.parsers._bytes import lines_with, text_at, texts_at
from gradwatch.parsers._tokens import floats_of, ranges_array, rows_matching

_COMMA = ord(",")
#: the template's value grammar (jsonl._NUMBER, or null) without lookarounds, for RE2; a step
#: (jsonl._STEP_VALUE) is such a value of at most 15 digits only, a number one that is not null
_EXP = r"(?:[eE][+-]?[0-9]{1,2})?"
_NUMBER = rf"-?[1-9][0-9]{{0,16}}(?:\.[0-9]+)?{_EXP}|0(?:\.[0-9]+)?{_EXP}|-0(?:\.[0-9]+{_EXP}|[eE][+-]?[0-9]{{1,2}})"
#: what a value may be: its kind in `Layout.kinds`, and the grammar of each kind
KINDS = ("step", "number", "nullable")
GRAMMARS = {"step": r"0|[1-9][0-9]{0,14}", "number": _NUMBER, "nullable": rf"{_NUMBER}|null"}


@dataclass(frozen=True)
class Layout:
    """The fixed text of one record shape, measured on a record of that shape."""

    #: from the line start to the first value
    head: bytes
    #: between one value and the next, e.g. b', "loss": '
    between: tuple[bytes, ...]
    #: after the last value
    tail: bytes
    #: per value in line order, what it may be (one of KINDS)
    kinds: tuple[str, ...]
    #: per value in line order, the template group that holds it (0: group 1)
    order: tuple[int, ...]

    @staticmethod
    def of(match: re.Match[str], kinds: tuple[str, ...]) -> Layout | None:
        """The layout of the record line `match` (the template regex's), whose values are its
        groups (group 1, the step, is in a lookahead), of these `kinds` in group order; None
        where the line is not ASCII."""
        line = match.group()
        if not line.isascii() or "\0" in line:
            return None
        order = sorted(range(len(kinds)), key=lambda g: match.start(g + 1))
        spans = [(match.start(g + 1) - match.start(), match.end(g + 1) - match.start()) for g in order]
        texts = [
            line[: spans[0][0]],
            *(line[a[1] : b[0]] for a, b in zip(spans, spans[1:], strict=False)),
            line[spans[-1][1] :],
        ]
        if "," in texts[0] or "," in texts[-1] or not all(t.startswith(",") for t in texts[1:-1]):
            return None
        encoded = [t.encode() for t in texts]
        return Layout(encoded[0], tuple(encoded[1:-1]), encoded[-1], tuple(kinds[g] for g in order), tuple(order))

    @property
    def commas(self) -> int:
        return sum(t.count(b",") for t in self.between)


@dataclass
class Rows:
    """Record lines read by `find`, in order: their starts, and per line its values in the
    template's group order (null is NaN)."""

    line_starts: np.ndarray
    values: np.ndarray
    #: starts and ends of the lines that have the commas of a record but failed a check
    odd: list[tuple[int, int]]


def find(layout: Layout, codes: np.ndarray, newlines: np.ndarray) -> Rows:
    """The record lines of `layout`'s shape in an ASCII block (`codes`, its bytes; `newlines`,
    where its lines end)."""
    found = lines_with(codes, newlines, _COMMA, layout.commas)
    lines, starts, ends, at = found.lines, found.starts, found.ends, found.at
    k = len(layout.kinds)
    widest = max(len(layout.head), len(layout.tail), *map(len, layout.between))
    if not len(lines) or len(codes) < widest:
        return Rows(np.zeros(0, dtype=np.int64), np.zeros((0, k)), _spans(starts, ends))
    # the first comma of each text between two values: where the value before it ends
    first = np.cumsum([0, *(t.count(b",") for t in layout.between[:-1])])
    value_ends = np.column_stack([at[:, first], ends - len(layout.tail)])
    value_starts = np.column_stack([starts + len(layout.head), at[:, first] + np.array(list(map(len, layout.between)))])
    ok = (value_starts <= value_ends).all(axis=1)
    ok &= text_at(codes, starts, layout.head) & text_at(codes, np.maximum(value_ends[:, -1], 0), layout.tail)
    ok &= texts_at(codes, at[:, first], layout.between)
    chosen = np.flatnonzero(ok)
    tokens = ranges_array(codes, value_starts[chosen], value_ends[chosen])
    good = rows_matching(tokens, tuple(GRAMMARS[kind] for kind in layout.kinds))
    read = floats_of(tokens if good.all() else tokens.filter(mask(np.repeat(good, k))), "null")
    values = np.zeros((0, k)) if read is None else read
    if read is None:  # not expected: what is left matches the grammar
        good = np.zeros(len(chosen), dtype=bool)
    accepted = np.zeros(len(lines), dtype=bool)
    accepted[chosen[good]] = True
    table = np.empty((int(good.sum()), k))
    table[:, layout.order] = values.reshape(-1, k)
    return Rows(starts[accepted], table, _spans(starts[~accepted], ends[~accepted]))


def _spans(starts: np.ndarray, ends: np.ndarray) -> list[tuple[int, int]]:
    return list(zip(starts.tolist(), ends.tolist(), strict=True))

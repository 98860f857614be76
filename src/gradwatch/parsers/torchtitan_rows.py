"""torchtitan metrics lines found and read at numpy speed, for the bulk path.

torchtitan prints every metrics line of a run with the same fields in the same order, with the
same colours and spacing between them; only the values' widths vary (and the padding after each
colon). No value, colour code or logger name holds a colon, so such a line is known by its colons:
two in the time, one after each field's key, one more after a `[rankN]:` head. Counted from the
line's end, they place everything: the time right before the first of them, each key (with the
spaces and colour code before it) right before its colon, the tail after the last value. Every
check is one operation over all lines: fixed texts compared as strings, the time's digits read by
numpy, a line's values checked by RE2 against the bulk regex's own grammars in one search
(`_tokens.rows_matching`; these patterns: RE2's `\\d` and `\\w` are ASCII, as in a `re.ASCII`
regex) and converted by Arrow's cast. The heads before the time equal to the first line's are
compared as bytes (`_heads`). A line that may be a metrics line (`COLONS`) but fails a check is
handed back (`Rows.odd`) to the regex.

A line that passes holds nothing but ASCII text that the checks compared, so in a block that is
not ASCII (`?` in `Block.codes` for the other characters) a line with such a character fails.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from gradwatch.parsers._arrow import arrow, indices, mask, numpy_of
from gradwatch.parsers._bytes import line_starts, shaped_like, strings, text_at, texts_at
from gradwatch.parsers._text import digit_numbers, timestamps
from gradwatch.parsers._tokens import floats, holds, ranges_array, rows_matching

# The values' grammars, which the bulk regex (torchtitan.py) is built from.
HEAD = r"(?:\[(?:rank|default)\d{1,5}\]:)?\[titan\] "
STEP = r"\d{1,15}"
NUMBER = r"-?\d{1,17}(?:\.\d+)?(?:[eE][+-]?\d{1,2})?"
GROUPED = r"\d[\d,]{0,20}(?:\.\d+)?"  # 7,322
MEMORY = r"[\d.]+\w*\([\d.]+%\)"
MFU = r"(?:(\d+(?:\.\d+)?)%|N/A)"
_HEAD = re.compile(HEAD.encode())  # (a bytes pattern: `\d` is ASCII, as in RE2)
#: the fields of a metrics line in order (grad_norm may be missing), by grammar, each group with
#: what must be replaced before Arrow reads its values as the regex's reader does (None: not read)
_GROUPS: tuple[tuple[tuple[str, ...], str, tuple[tuple[str, str], ...] | None], ...] = (
    (("step",), STEP, ()),
    (("loss", "grad_norm"), NUMBER, ()),
    (("memory",), MEMORY, None),
    (("tps", "tflops"), GROUPED, ((",", ""),)),  # thousands separators
    (("mfu",), MFU, (("%", ""), ("N/A", "nan"))),  # N/A: not logged
)
_GRAMMAR_OF = {name: grammar for names, grammar, _ in _GROUPS for name in names}
_FIELDS = ("step", "loss", "grad_norm", "memory", "tps", "tflops", "mfu")
#: the metrics read, in the order of `Rows.values` (after the time)
METRICS = ("loss", "grad_norm", "tps", "tflops", "mfu")
#: colons of a line the bulk regex may match: the time's 2, 6 or 7 fields', maybe the head's
COLONS = (8, 10)

_TIME = b"0000-00-00 00:00:00,000"  # where the time's digits are: its zeros
#: the time's numbers (`timestamps`): year, month, day, hour, minute, second, milliseconds
_TIME_NUMBERS = ((0, 4), (5, 7), (8, 10), (11, 13), (14, 16), (17, 19), (20, 23))


@dataclass(frozen=True)
class Layout:
    """The fixed text of a run's metrics lines, measured on one of them."""

    #: per field, from the end of the value before it (of the time, for the step) to its colon,
    #: e.g. b" - root - INFO - \x1b[31mstep:", b"  \x1b[32mloss:"
    keys: tuple[bytes, ...]
    #: the fields' names in order (of `_FIELDS`)
    fields: tuple[str, ...]
    #: after the last value, e.g. b"\x1b[39m"
    tail: bytes

    @staticmethod
    def of(line: str) -> Layout:
        """The layout of `line`, a whole line the bulk regex matched (so ASCII, and a value runs
        from the spaces after its colon to the next space, tab, carriage return or escape)."""
        time_end = line.index("[titan] ") + 8 + len(_TIME)
        colons = [k for k, ch in enumerate(line) if ch == ":" and k > time_end]
        keys, end = [], time_end
        for colon in colons:
            keys.append(line[end : colon + 1].encode())
            end = colon + 1
            while line[end : end + 1] == " ":
                end += 1
            while end < len(line) and line[end] not in " \t\r\x1b":
                end += 1
        fields = tuple(name for name in _FIELDS if name != "grad_norm" or len(colons) == len(_FIELDS))
        return Layout(tuple(keys), fields, line[end:].encode())


@dataclass
class Rows:
    """Metrics lines read by `find`, in order."""

    line_starts: np.ndarray
    steps: np.ndarray
    #: per line: its time (NaN where `timestamp` reads none), then the METRICS (NaN: not logged)
    values: np.ndarray
    #: starts and ends of the other lines with as many colons as a metrics line (`COLONS`)
    odd: list[tuple[int, int]]


def find(layout: Layout, codes: np.ndarray, newlines: np.ndarray, colons: np.ndarray) -> Rows:
    """The metrics lines of `layout`'s shape in a block (`codes`, a byte per character; `newlines`,
    where its lines end; `colons`, where its colons are)."""
    before = np.searchsorted(colons, newlines)  # colons before each line's end
    counts = np.diff(before, prepend=0)
    width = 2 + len(layout.keys)  # the time's colons and the fields'
    lines = np.flatnonzero((counts == width) | (counts == width + 1))  # with a head or without
    maybe = (counts >= COLONS[0]) & (counts <= COLONS[1])
    if len(codes) < len(_TIME):  # too short to compare: the regex reads it
        none = np.zeros(0, dtype=np.int64)
        return Rows(none, none, np.zeros((0, 1 + len(METRICS))), _spans(newlines, np.flatnonzero(maybe)))
    at = colons[before[lines, None] - width + np.arange(width)]
    starts, ends = line_starts(newlines, lines), newlines[lines]
    time = at[:, 0] - 13
    key_starts = at[:, 2:] + 1 - np.array([len(k) for k in layout.keys])
    tail = ends - len(layout.tail)
    # each key holds one colon, its last byte: where it is found, nothing of the value before it
    # is in it; the tail holds none (here a tail position is past the last colon, not negative)
    ok = (time >= starts) & (key_starts[:, 0] == at[:, 0] + 10) & (tail > at[:, -1])
    ok &= texts_at(codes, key_starts, layout.keys)
    ok &= text_at(codes, tail, layout.tail)
    clock = strings(codes, len(_TIME))[np.clip(time, 0, len(codes) - len(_TIME))]
    clock = clock.view(np.uint8).reshape(-1, len(_TIME))
    ok &= shaped_like(clock, _TIME)
    chosen = np.flatnonzero(ok)
    heads = _heads(codes, starts[chosen], time[chosen])
    # each value with the spaces before it: taken out of the block in one pass
    token_starts = at[chosen, 2:] + 1
    token_ends = np.column_stack([key_starts[chosen, 1:], tail[chosen]])
    read = _read(ranges_array(codes, token_starts, token_ends), layout.fields, heads)
    rows = chosen[read.good]
    accepted = np.zeros(len(newlines), dtype=bool)
    accepted[lines[rows]] = True
    values = np.column_stack([_times(clock[rows]), read.metrics])
    return Rows(starts[rows], read.steps, values, _spans(newlines, np.flatnonzero(maybe & ~accepted)))


@dataclass
class _Read:
    """What `_read` made of rows of tokens."""

    good: np.ndarray  # which rows match their grammars
    steps: np.ndarray  # of those
    metrics: np.ndarray  # theirs, (rows, METRICS)


def _heads(codes: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Per line, whether the text from its start to its time (`starts` to `ends`) is all of
    `HEAD`. A run's lines share one head (`[rank0]:[titan] `), so those equal to the first line's
    are compared at numpy speed and the head read once; RE2 reads the others."""
    if not len(starts):
        return np.zeros(0, dtype=bool)
    first = codes[starts[0] : ends[0]].tobytes()
    same = (ends - starts == len(first)) & text_at(codes, starts, first)
    good = same & (_HEAD.fullmatch(first) is not None)
    others = np.flatnonzero(~same)
    if len(others):
        good[others] = _matching(ranges_array(codes, starts[others, None], ends[others, None]), HEAD, 1)
    return good


def _read(tokens: Any, fields: tuple[str, ...], good: np.ndarray) -> _Read:
    """Rows of tokens (row after row: the `fields`' values with the spaces before them) of the
    lines whose heads are `good`: which rows match their grammars (`rows_matching`), and the
    values of those, converted as the bulk regex's reader converts them."""
    _, pc = arrow()

    width = len(fields)
    n = len(tokens) // width
    good = good & rows_matching(tokens, tuple(f" +(?:{_GRAMMAR_OF[name]})" for name in fields))
    read: list[tuple[list[str], Any, tuple[tuple[str, str], ...]]] = []
    for names, _, replace in _GROUPS:
        present = [name for name in names if name in fields]
        if replace is not None:
            read.append((present, _columns(tokens, width, [fields.index(name) for name in present]), replace))
    kept = int(good.sum())
    steps, metrics = np.zeros(kept, dtype=np.int64), np.full((kept, len(METRICS)), np.nan)
    for present, column, replace in read:
        if not good.all():
            column = column.filter(mask(np.repeat(good, len(present))))
        column = pc.ascii_ltrim(column, " ")
        for text, by in replace:
            if holds(column, text[0]):
                column = pc.replace_substring(column, text, by)
        values = floats(column) if len(column) else np.zeros(0)
        if values is None:  # not expected: every value matches its grammar; if so, all go to the regex
            return _Read(np.zeros(n, dtype=bool), steps[:0], metrics[:0])
        for name, value in zip(present, values.reshape(kept, len(present)).T, strict=True):
            if name == "step":
                steps = value.astype(np.int64)
            else:
                metrics[:, METRICS.index(name)] = value
    return _Read(good, steps, metrics)


def _columns(tokens: Any, width: int, columns: list[int]) -> Any:
    """Of rows of `width` tokens, these columns, row after row."""
    rows = np.arange(len(tokens) // width)
    return tokens.take(indices((rows[:, None] * width + np.array(columns)).ravel()))


def _matching(tokens: Any, grammar: str, width: int) -> np.ndarray:
    """Per row of `width` tokens, whether each is all of `grammar` (RE2)."""
    _, pc = arrow()

    matched = numpy_of(pc.match_substring_regex(tokens, f"^(?:{grammar})$"))
    return np.all(matched.reshape(-1, width), axis=1)


def _times(clock: np.ndarray) -> np.ndarray:
    """`timestamps` of times as rows of `_TIME`'s bytes."""
    return timestamps(digit_numbers(clock, _TIME_NUMBERS))


def _spans(newlines: np.ndarray, lines: np.ndarray) -> list[tuple[int, int]]:
    """Where these lines (indices) start and end."""
    return list(zip(line_starts(newlines, lines).tolist(), newlines[lines].tolist(), strict=True))


def step_lines(codes: np.ndarray, newlines: np.ndarray, colons: np.ndarray) -> np.ndarray:
    """For each `step:` of a block, the line (index) that holds it, in order; found from the block's
    `colons`. A metrics line holds one: no other key ends in `step`."""
    at = colons[colons >= 4]
    return np.searchsorted(newlines, at[text_at(codes, at - 4, b"step")])

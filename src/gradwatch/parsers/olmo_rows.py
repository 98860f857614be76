"""OLMo records found and read at numpy speed, for the bulk path.

An OLMo record is a marker line (`<time> ... [step=N/M,epoch=E]`) and then one indented
`key=value` line per metric, the same keys in the same order at every step of a run (a few
shapes alternate at most: with and without evaluation metrics). So a record is known by its
layout: the marker, then exactly the learned key texts at the starts of the next lines, then a
line that begins with a date, which is what ends a record in the per-line path. One search of
the block finds the markers; every check and every number is one numpy or Arrow operation over
all records. A record that fits no layout exactly is left to the per-line path, so what is read
here is what the per-line path would read, only faster.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gradwatch.parsers._arrow import arrow, numpy_of
from gradwatch.parsers._bytes import line_starts, text_at, texts_at
from gradwatch.parsers._text import digit_numbers, timestamps
from gradwatch.parsers._tokens import numbers_at, ranges_array

_MARK = b"[step="
#: `olmo._MARKER` from the `[` on, for RE2 with Python's ASCII classes spelled out (`\s` takes
#: \x0b, \x0c and \x1c-\x1f in Python, not in RE2)
_SPACE = r"[\t\n\x0b\x0c\r\x1c-\x1f ]"
_MARKER_TAIL = (
    r"^\[step=[0-9]{1,18}/(?:[0-9]+|\?+|None)(?:,epoch=[0-9]+)?(?:,eta=[^\]]*)?\]"
    rf"{_SPACE}*(?:[0-9A-Za-z_.-]+:[0-9]+{_SPACE}*)?$"
)
#: where the digits, dashes, separator and colons of `YYYY-MM-DD HH:MM:SS` sit
_DIGITS = np.array([0, 1, 2, 3, 5, 6, 8, 9, 11, 12, 14, 15, 17, 18])
_FIELDS = ((0, 4), (5, 7), (8, 10), (11, 13), (14, 16), (17, 19), (20, 23))  # year .. second, milliseconds
_IS_DIGIT = np.zeros(256, dtype=bool)
_IS_DIGIT[ord("0") : ord("9") + 1] = True
_DATE_SEPARATOR = np.zeros(256, dtype=bool)  # `[ T_-]` of `_text._TS`
_DATE_SEPARATOR[np.frombuffer(b" T_-", dtype=np.uint8)] = True


@dataclass(frozen=True)
class Layout:
    """The metric lines of one record shape, as a record read one by one showed them."""

    #: each metric line up to and including its `=`, indentation too, e.g. b"    train/PPL="
    keys: tuple[bytes, ...]
    #: (index into `keys`, canonical metric) of the lines whose values are read, in line order:
    #: the first line of each metric, as the per-line path keeps the first value
    read: tuple[tuple[int, str], ...]


@dataclass
class Records:
    """Bulk records of a block (`Hits`): where each begins (its marker line), how many lines it
    covers, its step, time and metrics (NaN: not logged), and which metrics it printed as
    nan or inf (comma-separated, in line order, as the per-line path lists them)."""

    at: np.ndarray
    steps: np.ndarray
    ts: np.ndarray
    values: dict[str, np.ndarray]
    nonfinite: np.ndarray
    line_counts: np.ndarray

    @staticmethod
    def empty(names: tuple[str, ...]) -> Records:
        none = np.zeros(0, dtype=np.int64)
        return Records(none, none, np.zeros(0), {n: np.zeros(0) for n in names}, np.zeros(0, dtype=object), none)

    def __len__(self) -> int:
        return len(self.at)

    @property
    def starts(self) -> list[int]:
        return self.at.tolist()  # type: ignore[no-any-return]

    @property
    def spans(self) -> np.ndarray:
        return self.line_counts

    def step(self, k: int) -> int:
        return int(self.steps[k])

    def subset(self, keep: list[int] | np.ndarray) -> Records:
        index = np.asarray(keep, dtype=np.int64)  # once, not once per field
        values = {name: column[index] for name, column in self.values.items()}
        return Records(
            self.at[index], self.steps[index], self.ts[index], values, self.nonfinite[index], self.line_counts[index]
        )


def find(
    layouts: list[Layout], codes: np.ndarray, newlines: np.ndarray, ascii_only: bool, controls: bool = True
) -> Records:
    """The records of a block (`codes`, one byte a character; `newlines`, where its lines end;
    `controls`: whether it may hold escapes or carriage returns) that fit one of `layouts`
    exactly, in order."""
    names = tuple(dict.fromkeys(name for layout in layouts for _, name in layout.read))
    marks, lines = _markers(codes, newlines)
    if not len(marks):
        return Records.empty(names)
    # lines the per-line path reads otherwise: escapes and carriage returns (and in a block that
    # is not ASCII, `?`, which may stand for any character)
    odd_lines = np.zeros(len(newlines) + 1, dtype=np.int64)
    if controls or not ascii_only:
        odd = (codes == 27) | (codes == 13)
        if not ascii_only:
            odd |= codes == ord("?")
        odd_lines[1:] = np.cumsum(np.bincount(np.searchsorted(newlines, np.flatnonzero(odd)), minlength=len(newlines)))
    found = [_of_layout(layout, names, codes, newlines, marks, lines, odd_lines) for layout in layouts]
    found = [f for f in found if len(f)]
    if not found:
        return Records.empty(names)

    def joined(part: str) -> np.ndarray:
        return np.concatenate([getattr(f, part) for f in found])

    values = {name: np.concatenate([f.values[name] for f in found]) for name in names}
    both = Records(joined("at"), joined("steps"), joined("ts"), values, joined("nonfinite"), joined("line_counts"))
    return both.subset(np.argsort(both.at, kind="stable"))


def _markers(codes: np.ndarray, newlines: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where `[step=` is, on lines that hold it once, and the index of each one's line."""
    brackets = np.flatnonzero(codes == ord("["))
    marks = brackets[text_at(codes, brackets, _MARK)]
    lines = np.searchsorted(newlines, marks)
    alone = np.ones(len(marks), dtype=bool)
    repeated = lines[1:] == lines[:-1]
    alone[1:] &= ~repeated
    alone[:-1] &= ~repeated
    return marks[alone], lines[alone]


def _of_layout(
    layout: Layout,
    names: tuple[str, ...],
    codes: np.ndarray,
    newlines: np.ndarray,
    marks: np.ndarray,
    lines: np.ndarray,
    odd_lines: np.ndarray,
) -> Records:
    """The markers (at `marks`, on `lines`) whose records have `layout`'s shape and read as the
    per-line path reads them; `odd_lines[k]` counts the odd lines before line k."""
    k = len(layout.keys)
    # the line after the record must be in the block: it ends the record
    ok = lines + k + 1 < len(newlines)
    marks, lines = marks[ok], lines[ok]
    ok = odd_lines[lines + k + 1] == odd_lines[lines]
    ok &= texts_at(codes, newlines[lines[:, None] + np.arange(k)] + 1, layout.keys)  # each key at its line's start
    ok &= _starts_with_date(codes, newlines[lines + k] + 1)
    marks, lines = marks[ok], lines[ok]
    starts = line_starts(newlines, lines)
    ts, dated = _times(codes, starts, newlines[lines])
    ok = dated & _marker_ok(codes, marks, newlines[lines])
    marks, lines, starts, ts = marks[ok], lines[ok], starts[ok], ts[ok]
    value_starts = np.column_stack([newlines[lines + j] + 1 + len(layout.keys[j]) for j, _ in layout.read])
    value_ends = np.column_stack([newlines[lines + j + 1] for j, _ in layout.read])
    values, ok = numbers_at(codes, value_starts, value_ends, drop=",")
    steps = _steps(codes, marks[ok])
    marks, starts, ts = marks[ok], starts[ok], ts[ok]
    n = len(marks)
    read = [name for _, name in layout.read]
    columns = {name: values[:, read.index(name)] if name in read else np.full(n, np.nan) for name in names}
    nonfinite = np.full(n, "", dtype=object)
    flagged = ~np.isfinite(values)
    for row in np.flatnonzero(flagged.any(axis=1)).tolist():
        nonfinite[row] = ",".join(name for name, bad in zip(read, flagged[row], strict=True) if bad)
    return Records(starts, steps, ts, columns, nonfinite, np.full(n, k + 1, dtype=np.int64))


def _starts_with_date(codes: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Whether the lines at `at` begin `YYYY-` or `[YYYY-`: such a line ends a record in the
    per-line path (it is no metric line, and no launcher prefix hides its first character)."""
    at = at + (codes[np.minimum(at, len(codes) - 1)] == ord("["))
    room = at + 5 <= len(codes)
    window = codes[np.minimum(at[:, None] + np.arange(5), len(codes) - 1)]
    return room & _IS_DIGIT[window[:, :4]].all(axis=1) & (window[:, 4] == ord("-"))


def _times(codes: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The time each line (`starts` to `ends`) begins with, as `_text.timestamp` reads it, and
    whether it is read here: `[`, then `YYYY-MM-DD HH:MM:SS`, then nothing or milliseconds."""
    at = starts + (codes[starts] == ord("["))
    last = len(codes) - 1
    window = codes[np.minimum(at[:, None] + np.arange(24), last)]
    room = at + 24 <= ends
    ok = room & _IS_DIGIT[window[:, _DIGITS]].all(axis=1)
    ok &= (window[:, 4] == ord("-")) & (window[:, 7] == ord("-")) & _DATE_SEPARATOR[window[:, 10]]
    ok &= (window[:, 13] == ord(":")) & (window[:, 16] == ord(":"))
    fraction = ((window[:, 19] == ord(".")) | (window[:, 19] == ord(","))) & _IS_DIGIT[window[:, 20]]
    millis = fraction & _IS_DIGIT[window[:, 21]] & _IS_DIGIT[window[:, 22]] & ~_IS_DIGIT[window[:, 23]]
    ok &= ~fraction | millis
    fields = digit_numbers(window, _FIELDS)
    fields[:, 6] *= millis
    ts = timestamps(fields)
    return ts, ok & ~np.isnan(ts)


def _marker_ok(codes: np.ndarray, marks: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Whether the text from each `[step=` to its line's end is a marker `olmo._MARKER` takes."""
    _, pc = arrow()

    if not len(marks):
        return np.zeros(0, dtype=bool)
    tails = ranges_array(codes, marks, ends)
    return numpy_of(pc.match_substring_regex(tails, _MARKER_TAIL))


def _steps(codes: np.ndarray, marks: np.ndarray) -> np.ndarray:
    """The step after each `[step=` (1 to 18 digits, then `/`: checked by `_marker_ok`)."""
    pa, pc = arrow()

    if not len(marks):
        return np.zeros(0, dtype=np.int64)
    first = marks + len(_MARK)
    window = codes[np.minimum(first[:, None] + np.arange(19), len(codes) - 1)]
    slash = first + np.argmax(window == ord("/"), axis=1)
    digits = ranges_array(codes, first, slash)
    return numpy_of(pc.cast(digits, pa.int64()))

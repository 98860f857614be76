"""Numbers read out of many byte ranges of a block at once: the bulk readers' conversion step.

The ranges become one Arrow string array over the block's own bytes (no copy: the bytes between
the ranges are values of their own, dropped by a `take`), trimmed of spaces and cast to float64
in C. Arrow's cast (fast_float) reads every decimal number exactly as `float()` does, to the
last bit, and refuses what `float()` refuses over the characters `0-9 . e E + -` (tested on
all short strings of them); its one extension, `nan(...)`, is looked for. A range that is no
number (empty, two words, `1,234`) makes its row one for the caller's slower path.

Where the caller's grammar is narrower than `float()`'s, a row's tokens are checked against it
in one RE2 search (`rows_matching`) before they are converted.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gradwatch.parsers._arrow import arrow, indices, mask, numpy_of, string_scalar

#: what `float()` reads from ASCII text (less underscores, which the per-line path handles)
_FLOAT = r"^[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|(?i:nan|inf|infinity))$"


def numbers_at(
    codes: np.ndarray, starts: np.ndarray, ends: np.ndarray, drop: str = ""
) -> tuple[np.ndarray, np.ndarray]:
    """The number in each range `codes[starts:ends]`, for ranges given as rows of `k` columns,
    ascending and apart (each ends at or before the next one starts); `codes` is ASCII. `drop`:
    a character taken out first (thousands separators, as `_text.number` does).

    Returns (values of the rows whose every range is a number, (rows, k); which rows those are).
    """
    _, pc = arrow()

    rows, k = starts.shape
    if rows == 0:
        return np.zeros((0, k)), np.zeros(0, dtype=bool)
    tokens = ranges_array(codes, starts, ends)
    if drop and holds(tokens, drop):  # (a search of the bytes costs a tenth of the replace)
        tokens = pc.replace_substring(tokens, drop, "")
    tokens = pc.ascii_trim_whitespace(tokens)
    values = floats(tokens)
    if values is not None:
        return values.reshape(rows, k), np.ones(rows, dtype=bool)
    good = numpy_of(pc.match_substring_regex(tokens, _FLOAT))
    ok = np.all(good.reshape(rows, k), axis=1)
    values = floats(tokens.filter(mask(np.repeat(ok, k))))
    if values is None:  # not expected (what is left matches the grammar); if so, all go the slow way
        return np.zeros((0, k)), np.zeros(rows, dtype=bool)
    return values.reshape(-1, k), ok


def ranges_array(codes: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> Any:
    """The ranges `codes[starts:ends]` (ascending and apart), row by row, as an Arrow string
    array: one over the block's own bytes, whose values between the ranges a `take` drops."""
    pa, _ = arrow()

    n = starts.size
    bounds = np.empty(2 * n + 2, dtype=np.int64)  # the ranges and what lies between them
    bounds[0], bounds[-1] = 0, len(codes)
    bounds[1:-1:2], bounds[2:-1:2] = starts.ravel(), ends.ravel()
    pieces = pa.LargeStringArray.from_buffers(2 * n + 1, pa.py_buffer(bounds), pa.py_buffer(codes))
    return pieces.take(indices(np.arange(1, 2 * n, 2)))


def floats(tokens: Any) -> np.ndarray | None:
    """The tokens as float64, or None when one is no number as `float()` reads numbers."""
    pa, pc = arrow()

    if holds(tokens, "("):
        return None  # Arrow reads `nan(...)`, `float()` does not
    try:
        return numpy_of(pc.cast(tokens, pa.float64()))
    except pa.ArrowInvalid:
        return None


def holds(tokens: Any, char: str) -> bool:
    """Whether a token may hold the ASCII `char`: its byte is somewhere in their data buffer
    (which may hold bytes past the last token: then a false yes, which costs only a search)."""
    return bool((np.frombuffer(tokens.buffers()[2], dtype=np.uint8) == ord(char)).any())


def rows_matching(tokens: Any, grammars: tuple[str, ...]) -> np.ndarray:
    """Per row of `tokens` (row after row, one token per grammar), whether each token is all of
    its grammar (RE2 patterns that take no `|`).

    A row's tokens are joined with `|` and RE2 reads each row once: a search costs mostly per
    string, and this is a third of the time of one search per token. As no grammar takes `|`, a
    token holding one fails, as it would alone; the others are split where they were joined.
    """
    pa, pc = arrow()

    width = len(grammars)
    if len(tokens) == 0:
        return np.zeros(0, dtype=bool)
    rows = pa.LargeListArray.from_arrays(indices(np.arange(0, len(tokens) + 1, width)), tokens)
    joined = pc.binary_join(rows, string_scalar("|"))
    row = r"\|".join(f"(?:{grammar})" for grammar in grammars)
    return numpy_of(pc.match_substring_regex(joined, f"^{row}$"))


def floats_of(tokens: Any, null: str) -> np.ndarray | None:
    """The tokens as float64, the word `null` (`None`, `null`) as NaN; None when one is neither
    that nor a number as `float()` reads numbers."""
    _, pc = arrow()

    nulls = numpy_of(pc.equal(tokens, string_scalar(null)))
    if not nulls.any():
        return floats(tokens)
    read = floats(tokens.filter(mask(~nulls)))
    if read is None:
        return None
    values = np.full(len(tokens), np.nan)
    values[~nulls] = read
    return values

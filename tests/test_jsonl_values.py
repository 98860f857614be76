"""The JSON-lines bulk reader tells which values the template's grammar takes with one RE2
search per line (`_tokens.rows_matching`, the line's values joined with `|`): it must take
exactly what the grammar takes, value by value.

Tokens are drawn from the characters numbers are made of (and `null`'s, and `|`), short and long,
and compared with each kind's grammar as `re` reads it, one token at a time.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradwatch.parsers._tokens import floats_of, ranges_array, rows_matching
from gradwatch.parsers.jsonl_rows import GRAMMARS, KINDS

ALONE = {kind: re.compile(f"(?:{pattern})") for kind, pattern in GRAMMARS.items()}

EDGES = [
    "0",
    "00",
    "01",
    "-0",
    "-00",
    "-01",
    "0.",
    ".0",
    ".",
    "-",
    "+1",
    "1.",
    "1..2",
    "1.2.3",
    "0.5",
    "-0.5",
    "10",
    "100.25",
    "1e5",
    "1E+05",
    "1e-5",
    "-0e5",
    "-0.0e1",
    "1e123",
    "1e",
    "1e+",
    "null",
    "nul",
    "nulll",
    "NaN",
    "Infinity",
    "-Infinity",
    "",
    " 1",
    "1 ",
    "12345678901234567",
    "123456789012345678",
    "1234567890123456.5",
    "12345678901234567.5",
    "123456789012345",
    "1234567890123456",
    "9" * 40,
    "0.000000000000000000001",
    "1.5e2",
    "2.e3",
    "3.4e",
    "5-5",
    "6+6",
    "1e5.5",
    "1e1e1",
    "0x1F",
    "1_000",
    "|",
    "1|2",
    "null|",
    "|1",
]


def _tokens(texts: list[str], gap: str = ", ") -> object:
    """The texts as the reader sees them: ranges of one block (with text between them)."""
    block = gap + gap.join(texts) + gap
    codes = np.frombuffer(block.encode(), dtype=np.uint8)
    starts, at = [], len(gap)
    for t in texts:
        starts.append(at)
        at += len(t) + len(gap)
    starts_arr = np.array(starts, dtype=np.int64).reshape(-1, 1)
    ends_arr = starts_arr + np.array([len(t) for t in texts], dtype=np.int64).reshape(-1, 1)
    return ranges_array(codes, starts_arr, ends_arr)


def _check(texts: list[str]) -> None:
    """Each kind's grammar over the texts, one a row and in rows of every kind (a row is taken
    when each of its tokens is), against `re` reading each token alone."""
    tokens = _tokens(texts)
    alone = {kind: [ALONE[kind].fullmatch(t) is not None for t in texts] for kind in KINDS}
    for kind in KINDS:
        assert rows_matching(tokens, (GRAMMARS[kind],)).tolist() == alone[kind], kind
    rows = len(texts) // len(KINDS)
    if rows:
        row_tokens = _tokens(texts[: rows * len(KINDS)])
        found = rows_matching(row_tokens, tuple(GRAMMARS[kind] for kind in KINDS))
        expected = [all(alone[kind][r * len(KINDS) + c] for c, kind in enumerate(KINDS)) for r in range(rows)]
        assert found.tolist() == expected


def test_edge_cases_are_read_as_the_grammar_reads_them() -> None:
    _check(EDGES)
    _check([])


def test_many_tokens_are_read_as_the_grammar_reads_them() -> None:
    _check(EDGES * 1000)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(alphabet="0123456789.-+eEnul|", max_size=22), min_size=1, max_size=40))
def test_random_tokens_are_read_as_the_grammar_reads_them(texts: list[str]) -> None:
    _check(texts)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.from_regex(ALONE["nullable"], fullmatch=True), min_size=1, max_size=30))
def test_every_grammatical_value_is_taken(texts: list[str]) -> None:
    _check(texts)


@pytest.mark.parametrize(
    "texts", [["1.5", "-2e3", "7", "0.25"], ["1.5", "null", "-2e3", "7"], ["null", "null"], ["3", "null", "1e-05"]]
)
def test_values_convert_with_null_as_nan(texts: list[str]) -> None:
    tokens = _tokens(texts)
    values = floats_of(tokens, "null")
    assert values is not None
    np.testing.assert_array_equal(values, [float("nan") if t == "null" else float(t) for t in texts])

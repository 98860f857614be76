"""The JSON-lines bulk reader tells which values the template's grammar takes by their bytes where
they are plain decimals, and by RE2 otherwise: it must take exactly what the grammar takes.

Tokens are drawn from the characters numbers are made of (and `null`'s), short and long, and
compared with the grammar's own regex (`jsonl_rows._VALUE`, as `re` reads it).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradwatch.parsers._tokens import ranges_array
from gradwatch.parsers.jsonl_rows import _VALUE, _Values

GRAMMAR = re.compile(_VALUE)
STEP = re.compile(r"^(?:0|[1-9][0-9]{0,14})$")

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
    found = _Values.of(_tokens(texts))
    assert found.good.tolist() == [GRAMMAR.match(t) is not None for t in texts]
    assert found.null.tolist() == [t == "null" for t in texts]
    assert found.digits.tolist() == [STEP.match(t) is not None for t in texts]


def test_edge_cases_are_read_as_the_grammar_reads_them() -> None:
    _check(EDGES)
    _check([])


def test_many_tokens_are_read_a_slice_at_a_time_as_the_grammar_reads_them() -> None:
    _check(EDGES * 1000)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(alphabet="0123456789.-+eEnul", max_size=22), min_size=1, max_size=40))
def test_random_tokens_are_read_as_the_grammar_reads_them(texts: list[str]) -> None:
    _check(texts)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.from_regex(GRAMMAR, fullmatch=True), min_size=1, max_size=30))
def test_every_grammatical_value_is_taken(texts: list[str]) -> None:
    _check([t.rstrip("\n") for t in texts])


@pytest.mark.parametrize(
    "texts", [["1.5", "-2e3", "7", "0.25"], ["1.5", "null", "-2e3", "7"], ["null", "null"], ["3", "null", "1e-05"]]
)
def test_values_convert_with_null_as_nan(texts: list[str]) -> None:
    tokens = _tokens(texts)
    values = _Values.of(tokens).floats(tokens, np.ones(len(texts), dtype=bool))
    assert values is not None
    np.testing.assert_array_equal(values, [float("nan") if t == "null" else float(t) for t in texts])

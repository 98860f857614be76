"""The bulk readers' number conversion reads what `float()` reads, to the last bit, and leaves
every row with a range that `float()` would not read to the slower path."""

from __future__ import annotations

import random
import struct

import numpy as np
import pytest

from gradwatch.parsers._tokens import numbers_at


def _ranges(tokens: list[list[str]], pad: str = " ") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A block `| tok | tok |` per row, and the byte ranges of its tokens (with their padding)."""
    text, starts, ends = "", [], []
    for row in tokens:
        line_starts, line_ends = [], []
        text += "x"
        for token in row:
            text += "|"
            line_starts.append(len(text))
            text += pad + token + pad
            line_ends.append(len(text))
        text += "|\n"
        starts.append(line_starts)
        ends.append(line_ends)
    return np.frombuffer(text.encode(), dtype=np.uint8), np.array(starts), np.array(ends)


def _random_number(rng: random.Random) -> str:
    kind = rng.randrange(5)
    if kind == 0:
        return f"{rng.uniform(-1e6, 1e6):.{rng.randint(0, 9)}f}"
    if kind == 1:
        return f"{rng.uniform(0, 20) * 10 ** rng.randint(-300, 300):.{rng.randint(0, 17)}E}"
    if kind == 2:  # any double, as repr prints it
        return repr(struct.unpack("d", struct.pack("Q", rng.getrandbits(64)))[0])
    if kind == 3:
        return str(rng.randint(0, 10 ** rng.randint(1, 25)))
    return rng.choice(["nan", "-inf", "Infinity", "NAN", "-0.0", "+.5e-3", "1.e5", "00012", "1e400", "5e-324"])


def test_numbers_are_read_as_float_reads_them() -> None:
    rng = random.Random(7)
    rows = [[_random_number(rng) for _ in range(6)] for _ in range(5000)]
    codes, starts, ends = _ranges(rows)
    values, ok = numbers_at(codes, starts, ends)
    assert ok.all()
    expected = np.array([[float(t) for t in row] for row in rows])
    assert values.shape == expected.shape
    same = (values == expected) | (np.isnan(values) & np.isnan(expected))
    assert same.all(), [rows[i] for i in np.flatnonzero(~same.all(axis=1))[:5]]
    assert (np.signbit(values) == np.signbit(expected)).all()


ODD = ["", "7 1.5", "1.2.3", "1,234", "'0.5'", "nan(1)", "1_000", "0x10", "1e", "--1", "1e5e3"]


@pytest.mark.parametrize("odd", ODD)
def test_a_row_with_a_range_that_is_no_plain_number_is_left_out(odd: str) -> None:
    rows = [["1.5", "2"], ["3", odd], ["4.25", "-5e-3"]]
    codes, starts, ends = _ranges(rows)
    values, ok = numbers_at(codes, starts, ends)
    assert ok.tolist() == [True, False, True]
    assert values.tolist() == [[1.5, 2.0], [4.25, -5e-3]]


def test_padding_of_any_ascii_whitespace_is_trimmed_as_float_does() -> None:
    codes, starts, ends = _ranges([["1.5", "2"], ["3", "4"]], pad=" \t")
    values, ok = numbers_at(codes, starts, ends)
    assert ok.all() and values.tolist() == [[1.5, 2.0], [3.0, 4.0]]


@pytest.mark.parametrize("seed", range(4))
def test_digit_numbers_reads_each_span_as_int_does(seed: int) -> None:
    """The clock readers' numbers (`_text.digit_numbers`): the spans' digits as `int()` reads
    them, up to 18 digits a number (what int64 holds)."""
    from gradwatch.parsers._text import digit_numbers

    rng = random.Random(seed)
    spans = ((0, 4), (5, 7), (7, 8), (9, 27), (27, 30), (30, 32))
    rows = ["".join(rng.choice("0123456789") for _ in range(32)) for _ in range(500)]
    rows += ["9" * 32, "0" * 32]
    window = np.frombuffer("".join(rows).encode(), dtype=np.uint8).reshape(len(rows), 32)
    expected = [[int(row[a:b]) for a, b in spans] for row in rows]
    assert digit_numbers(window, spans).tolist() == expected
    with pytest.raises(ValueError, match="18 digits"):
        digit_numbers(window, ((0, 19),))

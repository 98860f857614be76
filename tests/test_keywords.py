"""The stream's keyword search finds exactly the lines that hold a match of the parsers' `scan`
alternation as `re` reads it, by RE2 over the lines or by `re` branch by branch."""

from __future__ import annotations

import re

import numpy as np
import pytest

from gradwatch.parsers import new_parsers
from gradwatch.parsers.keywords import Keywords, split_branches
from gradwatch.synth import FORMATS, RunSpec, generate

_ODD = [
    "Grad overflow on iteration 5",
    "[2024-03-02 08:00:00] step=12, skipped=0, lr=[1e-4]",
    "step=x but steps: 7 later",
    "a checkpoint\tand Traceback (most recent call last)",
    "padded vocab (size: 50257) with 175 dummy tokens (new size: 50432)",
    "[step=3/100] train/CrossEntropyLoss=2.5",
    "ieration iteratio iteration",
    "\x1b[32m[rank0]:[titan] step:  5  loss: 3.2\x1b[39m",
    "{'loss': 2.5}",
    "",
]


def _lines_with_a_match(pattern: str, text: str) -> list[int]:
    regex = re.compile(pattern)
    return [i for i, line in enumerate(text.split("\n")[:-1]) if regex.search(line)]


def _block(text: str) -> tuple[np.ndarray, np.ndarray]:
    codes = np.frombuffer(text.encode(), dtype=np.uint8)
    return codes, np.flatnonzero(codes == 10)


@pytest.mark.parametrize("fmt", FORMATS)
def test_both_searches_find_the_lines_re_finds(fmt: str) -> None:
    lines = "".join(generate(RunSpec(fmt=fmt, steps=300, seed=2))).split("\n")
    text = (
        "\n".join(line for pair in zip(lines, _ODD * (len(lines) // len(_ODD) + 1), strict=False) for line in pair)
        + "\n"
    )
    scans = [p.scan for p in new_parsers() if p.scan]
    keywords = Keywords(scans)
    expected = _lines_with_a_match("|".join(scans), text)
    assert len(expected) > 100
    assert keywords.lines(*_block(text)).tolist() == expected
    starts = [0, *(m.end() for m in re.finditer("\n", text))]
    found_lines = sorted({np.searchsorted(starts, p, side="right") - 1 for p in keywords.positions(text)})
    assert found_lines == expected


@pytest.mark.parametrize("pattern", [r"(?<=x)step", r"step\s+\d", r"(a)\1"])
def test_what_re2_would_read_otherwise_is_left_to_re(pattern: str) -> None:
    text = "x step 5\nstep\x1c7\naa\nnone\n"
    keywords = Keywords([pattern])
    assert keywords.lines(*_block(text)) is None
    starts = [0, *(m.end() for m in re.finditer("\n", text))]
    found = sorted({int(np.searchsorted(starts, p, side="right")) - 1 for p in keywords.positions(text)})
    assert found == _lines_with_a_match(pattern, text)


def test_branches_are_split_only_at_the_top_level() -> None:
    assert split_branches(r"a|b(?:c|d)|[|]|\||e") == ["a", "b(?:c|d)", "[|]", r"\|", "e"]


def test_in_a_block_that_is_not_ascii_no_line_re_finds_is_missed() -> None:
    """Each other character is a `?` to RE2 (see Block): `\\d` and `\\w` take it too."""
    text = "step=\u0663 of a run\nnaïve step=5\nno keyword here é\n\u2588\u2588 checkpoint\nsteps: \u0661\n"
    shadow = np.frombuffer(text.encode("ascii", errors="replace"), dtype=np.uint8)
    scans = [p.scan for p in new_parsers() if p.scan]
    found = Keywords(scans).lines(shadow, np.flatnonzero(shadow == 10), ascii_only=False)
    expected = _lines_with_a_match("|".join(scans), text)
    assert expected == [0, 1, 3, 4]
    assert set(expected) <= set(found.tolist())
    assert Keywords([r"(?i)step"]).lines(shadow, np.flatnonzero(shadow == 10), ascii_only=False) is None

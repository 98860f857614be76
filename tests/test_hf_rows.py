"""The HF Trainer bulk reader's search by RE2 (`hf_rows`) reads exactly what the template regex
reads: the same lines, the same values to the bit, whatever is odd about a dict or the bar after
it; the stream's results equal the plain path's, also where dicts stand for many steps each
(`logging_steps` > 1) and a worker guesses how many came before its segment."""

from __future__ import annotations

import pickle
import random
import re

import numpy as np
import pytest

from gradwatch.parsers.base import Block, number_table
from gradwatch.parsers.hf_rows import Layout
from gradwatch.parsers.hf_trainer import _PAIR, _compile_template, _dicts, _Template
from tests.test_stream import _assert_same, _bulk_records, _parse

_DICT = "{{'loss': 2.{:04d}, 'grad_norm': 0.5, 'learning_rate': 1e-05, 'epoch': 0.1}}"
_BAR = " 10%|\u2588         | {}/100000 [00:10<01:30,  1.00s/it]"

#: a dict line, or the bar line after it, as it may be printed otherwise (the count stays right)
DICT_CASES = [
    lambda d: d + " \t\r",
    lambda d: d + "\0",
    lambda d: d + "x",
    lambda d: d.replace(", ", ",  ", 1),
    lambda d: d.replace(", ", ",\t", 1),
    lambda d: d.replace("': ", "':", 1),
    lambda d: " " + d,
    lambda d: d.replace("{", "{\0", 1),
    lambda d: d.replace("'grad_norm': 0.5", "'grad_norm': None"),
    lambda d: d.replace("'epoch': 0.1", "'epoch': None"),
    lambda d: d.replace("'loss': 2.", "'loss': None, 'x': 2.", 1),
    lambda d: d.replace("'grad_norm': 0.5", "'grad_norm': 'high'"),
    lambda d: d.replace("'grad_norm': 0.5", "'grad_norm': nan"),
    lambda d: d.replace("'grad_norm': 0.5", "'grad_norm': inf"),
    lambda d: d.replace("'grad_norm': 0.5", "'grad_norm': -0"),
    lambda d: d.replace("'grad_norm': 0.5", "'grad_norm': 00.50"),
    lambda d: d.replace("'grad_norm': 0.5", "'grad_norm': 0."),
    lambda d: d.replace("'grad_norm': 0.5", "'grad_norm': .5"),
    lambda d: d.replace("'grad_norm': 0.5", "'grad_norm': +0.5"),
    lambda d: d.replace("'grad_norm': 0.5", "'grad_norm': 5E-1"),
    lambda d: d.replace("'grad_norm': 0.5", "'grad_norm': 5e-01"),
    lambda d: d.replace("'grad_norm': 0.5", "'grad_norm': 5e-100"),
    lambda d: d.replace("'grad_norm': 0.5", "'grad_norm': 12345678901234567.25e99"),
    lambda d: d.replace("'grad_norm': 0.5", "'grad_norm': 123456789012345678"),
    lambda d: d.replace("'grad_norm': 0.5", "'grad_norm': 1_000"),
    lambda d: d.replace("'grad_norm': 0.5", "'grad_norm': 0.\u0665"),
    lambda d: d.replace("'epoch': 0.1", "'epoch': 0.1, 'extra': 2.0"),
    lambda d: d.replace(", 'epoch': 0.1", ""),
    lambda d: d.replace("'grad_norm'", "'grad_norm2'"),
    lambda d: d.replace("'", '"'),
]
BAR_CASES = [
    lambda b: b.replace(" 10%", "100%"),
    lambda b: b.replace(" 10%", "  0%"),
    lambda b: b.replace(" 10%", "1000%"),
    lambda b: b.replace(" 10%", "10%"),
    lambda b: b.replace(" 10%", "%"),
    lambda b: b.replace(" 10%", "x10%"),
    lambda b: b.replace(" 10%", "\t10%"),
    lambda b: " " * 12 + b,
    lambda b: b.replace("\u2588", "|"),
    lambda b: b.replace("\u2588", "\r"),
    lambda b: b.replace("\u2588", ""),
    lambda b: b.replace("\u2588         ", ""),
    lambda b: b.replace("| ", "|", 1) if b.count("| ") == 1 else b.replace("| ", "|"),
    lambda b: b.replace("| ", "|  "),
    lambda b: b.replace("/100000", "/x"),
    lambda b: b.replace("/100000", " /100000"),
    lambda b: b.replace("/100000 [00:10<01:30,  1.00s/it]", "/1"),
    lambda b: b.replace("| ", "| 1\u0663"),
    lambda b: b.replace("| ", "| 99999999999999"),
    lambda b: b.replace("| ", "| 999999999999999"),
    lambda b: re.sub(r"\| \d+/", "| 987654321098765/", b),  # the longest count
    lambda b: re.sub(r"\| \d+/", "| 9876543210987654/", b),
    lambda b: b.replace("\u2588", "\u2588\r", 1) + "\r",
    lambda b: "",
]


def _template() -> _Template:
    line = _DICT.format(1)
    template = _compile_template(_PAIR.findall(line), line)
    assert template is not None
    return template


def _block(text: str) -> Block:
    """`text` as the stream hands a block to a bulk reader (see LogStream._parse_block)."""
    data = text.encode()
    if data.isascii():
        codes = np.frombuffer(data, dtype=np.uint8)
    else:
        codes = np.frombuffer(text.encode("ascii", errors="replace"), dtype=np.uint8)
    return Block(text, codes, np.flatnonzero(codes == 10), data.isascii())


def _log(dicts: int, edit: dict[int, str]) -> str:
    """Dicts each followed by a bar counting it; `edit[k]` replaces dict k and its bar."""
    return "".join(edit.get(k, _DICT.format(k) + "\n" + _BAR.format(k) + "\n") for k in range(1, dicts + 1))


def _assert_reads_as_the_regex(text: str) -> int:
    """`_dicts` finds the lines that `template.dict_lines` matches, with its groups to the bit; returns
    how many."""
    template = _template()
    hits = _dicts(template, _block(text))
    matches = list(template.dict_lines.finditer(text))
    assert hits.at.tolist() == [m.start() for m in matches]
    if matches:
        groups = [g for m in matches for g in m.groups()]
        table = number_table(groups, len(matches), nan="None")
        assert hits.values.tobytes() == np.ascontiguousarray(table).tobytes()
    return len(matches)


def _edited(case_of_dict, case_of_bar, k: int) -> str:
    return case_of_dict(_DICT.format(k)) + "\n" + case_of_bar(_BAR.format(k)) + "\n"


def _same(x: str) -> str:
    return x


@pytest.mark.parametrize("case", range(len(DICT_CASES)))
def test_odd_dicts_are_read_as_the_regex_reads_them(case: int) -> None:
    text = _log(40, {20: _edited(DICT_CASES[case], _same, 20), 40: _edited(DICT_CASES[case], _same, 40)})
    assert _assert_reads_as_the_regex(text) >= 38


@pytest.mark.parametrize("case", range(len(BAR_CASES)))
def test_odd_bars_are_read_as_the_regex_reads_them(case: int) -> None:
    text = _log(40, {20: _edited(_same, BAR_CASES[case], 20), 40: _edited(_same, BAR_CASES[case], 40)})
    assert _assert_reads_as_the_regex(text) >= 38


def test_dicts_without_a_bar_after_them_and_blocks_without_dicts() -> None:
    assert _assert_reads_as_the_regex(_DICT.format(1) + "\n") == 1
    assert _assert_reads_as_the_regex(_DICT.format(1) + "\n" + _DICT.format(2) + "\n" + _BAR.format(2) + "\n") == 2
    assert _assert_reads_as_the_regex("no dict here\n") == 0
    assert _assert_reads_as_the_regex(_BAR.format(1) + "\n") == 0


_NOISE = ["0", "9", "-", ".", "e", "E", "+", " ", "\t", "\r", "\n", ",", "'", ":", "{", "}", "|", "/", "%", "N"]
_NOISE += ["None", "\u0663", "\u2588", "\0", "x", "'loss'", ", 'epoch': 0.1", _DICT.format(7), _BAR.format(7)]


def test_a_template_pickled_by_an_earlier_gradwatch_reads_as_a_new_one() -> None:
    """A scan state of an earlier version holds templates whose `block` regex also read the bar
    after a dict (its count group 1) and a `layout` for RE2 made from it: restored with them,
    a template reads a block as a new one does."""
    template = _template()
    old = pickle.loads(pickle.dumps(template))
    body = template.line.pattern
    bar = r" *\d{1,3}%\|[^|\n\r]*\| (\d{1,15})/\d"
    old.__dict__["block"] = re.compile(rf"^(?=[^\n]*\n{bar}){body}[ \t\r]*$", re.M)
    old.__dict__["layout"] = Layout(b"{'loss': ", rf"^{body}[ \t\r]*\n{bar}")
    block = _block(_log(40, {20: _edited(DICT_CASES[0], _same, 20)}))
    new_hits, old_hits = _dicts(template, block), _dicts(old, block)
    assert len(new_hits) == 40
    assert [f.tobytes() for f in old_hits.fields()] == [f.tobytes() for f in new_hits.fields()]


def test_random_edits_are_read_as_the_regex_reads_them() -> None:
    """Seeded fuzz: a few characters inserted, deleted or replaced at random in a small log."""
    rng = random.Random(0)
    base = _log(12, {})
    for _ in range(400):
        text = base
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(text))
            cut = rng.choice([0, 1, 1, 2])
            text = text[:at] + rng.choice([*_NOISE, ""]) + text[at + cut :]
        _assert_reads_as_the_regex(text if text.endswith("\n") else text + "\n")


_EDITS = [(case, _same) for case in DICT_CASES] + [(_same, case) for case in BAR_CASES]


@pytest.mark.parametrize("edit", range(len(_EDITS)))
def test_stream_reads_odd_dicts_and_bars_as_the_plain_path(edit: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """In the bulk reader's stretch (the bars count the dicts), one odd dict or bar: the stream's
    records equal the plain path's, and the ordinary dicts around it are read in bulk."""
    data = _log(400, {k: _edited(*_EDITS[edit], k) for k in (300, 350)}).encode()
    bulk = _bulk_records(monkeypatch)
    fast = _parse(data)
    _assert_same(fast, _parse(data, every_line=True))
    assert bulk[0] >= 250

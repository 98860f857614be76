"""The torchtitan bulk reader's layout search (`torchtitan_rows`) reads exactly what the bulk regex
reads: the same lines, the same steps, times and values to the bit, whatever is odd about a
metrics line; and the stream's results equal the plain path's."""

from __future__ import annotations

import pickle
import random
import re
from collections.abc import Callable

import numpy as np
import pytest

from gradwatch.parsers.base import Block, TableHits
from gradwatch.parsers.torchtitan import _BULK_LINE, TorchtitanParser, _of_matches
from gradwatch.parsers.torchtitan_rows import Layout, find
from tests.test_stream import _assert_same, _bulk_records, _parse

_LINE = (
    "[rank0]:[titan] 2024-03-02 08:{minute:02d}:{second:02d},325 - root - INFO - \x1b[31mstep: {step:2d}  "
    "\x1b[32mloss: 10.{step:05d}  \x1b[38;2;180;60;0mgrad_norm:  6.1386  "
    "\x1b[38;2;54;234;195mmemory: 61.27GiB(77.41%)  \x1b[34mtps: 7,270  \x1b[36mtflops: 131.90  "
    "\x1b[35mmfu: 13.34%\x1b[39m"
)


def _line(step: int) -> str:
    return _LINE.format(minute=step // 60 % 60, second=step % 60, step=step)


#: a metrics line as it may be printed otherwise: some the regex still reads, some it does not
LINE_CASES = [
    lambda s: s.replace("  \x1b[32mloss", "   \x1b[32mloss"),
    lambda s: s.replace("loss: ", "loss:      "),
    lambda s: s.replace("loss: ", "loss:"),
    lambda s: s.replace("loss: ", "loss:\t"),
    lambda s: s.replace("  \x1b[32m", " \t\x1b[32m"),
    lambda s: s + " \t\r",
    lambda s: s + "\r",
    lambda s: s + "x",
    lambda s: s + "\0",
    lambda s: s.replace("\x1b[32m", "\x1b[33m"),
    lambda s: s.replace("\x1b[32m", ""),
    lambda s: s.replace("\x1b[39m", ""),
    lambda s: s.replace("\x1b[39m", "\x1b[0m"),
    lambda s: re.sub(r"  \x1b\[[\d;]*mgrad_norm: +\S+", "", s),
    lambda s: re.sub(r"  \x1b\[[\d;]*mgrad_norm: +\S+", "", s).replace("[rank0]:", ""),  # 8 colons
    lambda s: s.replace("  \x1b[34mtps:", "  \x1b[34mlr: 0.001  \x1b[34mtps:"),
    lambda s: s.replace("  \x1b[34mtps:", "  \x1b[34mlr:  \x1b[34mtps:"),
    lambda s: s.replace("memory:", "memory::"),
    lambda s: re.sub(r"step: +\d+", "step: 123456789012345", s),
    lambda s: re.sub(r"step: +\d+", "step: 1234567890123456", s),
    lambda s: re.sub(r"step: +\d+", "step: 0007", s),
    lambda s: re.sub(r"step: +\d+", "step: -7", s),
    lambda s: re.sub(r"step: +\d+", "step: 7.0", s),
    lambda s: s.replace("13.34%", "N/A"),
    lambda s: s.replace("13.34%", "N/A%"),
    lambda s: s.replace("13.34%", "13.34"),
    lambda s: s.replace("13.34%", "13.%"),
    lambda s: s.replace("13.34%", "-13.34%"),
    lambda s: s.replace("13.34%", "1e3%"),
    lambda s: s.replace("7,270", "1,234,567"),
    lambda s: s.replace("7,270", "7,,270"),
    lambda s: s.replace("7,270", ",270"),
    lambda s: s.replace("7,270", "7,270."),
    lambda s: s.replace("7,270", "7,270.5"),
    lambda s: s.replace("7,270", "1" + "0" * 22),
    lambda s: s.replace("131.90", "nan"),
    lambda s: s.replace("131.90", "131|90"),  # a row's tokens are joined with `|` to be matched
    lambda s: s.replace("131.90", "131.90|"),
    lambda s: s.replace("loss: ", "loss: |"),
    lambda s: s.replace("7,270", "7,270 | 1"),
    lambda s: s.replace("131.90", "inf"),
    lambda s: re.sub(r"loss: \S+", "loss: -1.5e-03", s),
    lambda s: re.sub(r"loss: \S+", "loss: 1.5E+3", s),
    lambda s: re.sub(r"loss: \S+", "loss: 1.5e123", s),
    lambda s: re.sub(r"loss: \S+", "loss: 1.5e", s),
    lambda s: re.sub(r"loss: \S+", "loss: -0", s),
    lambda s: re.sub(r"loss: \S+", "loss: 1.", s),
    lambda s: re.sub(r"loss: \S+", "loss: .5", s),
    lambda s: re.sub(r"loss: \S+", "loss: +1.5", s),
    lambda s: re.sub(r"loss: \S+", "loss: 1" + "0" * 17, s),
    lambda s: re.sub(r"loss: \S+", "loss: 1" + "0" * 16, s),
    lambda s: re.sub(r"loss: \S+", "loss: 10.7x22", s),
    lambda s: re.sub(r"loss: \S+", "loss: 1:5", s),
    lambda s: re.sub(r"loss: \S+", "loss: nan(1)", s),
    lambda s: re.sub(r"loss: (\S+)", "loss: \\1 2", s),
    lambda s: re.sub(r"loss: +[-0-9.]*[0-9]", "\\g<0>\u0661", s),
    lambda s: s.replace("loss", "l\u043ess"),
    lambda s: s.replace("GiB(", " GiB("),
    lambda s: s.replace("61.27GiB(77.41%)", "1GiB(7%)"),
    lambda s: s.replace("61.27GiB(77.41%)", "61.27(77.41%)"),
    lambda s: s.replace("61.27GiB(77.41%)", "61.27GiB(77.41)"),
    lambda s: s.replace(" - root - ", " - torchtitan.train - "),
    lambda s: s.replace(" - root - ", " - ro:ot - "),
    lambda s: s.replace(" INFO ", " WARNING "),
    lambda s: s.replace("[rank0]:", "[rank12345]:"),
    lambda s: s.replace("[rank0]:", "[rank123456]:"),
    lambda s: s.replace("[rank0]:", "[default7]:"),
    lambda s: s.replace("[rank0]:", ""),
    lambda s: s.replace("[rank0]:", "[rank0]: "),
    lambda s: s.replace("[rank0]:", "[rank0]:[rank0]:"),
    lambda s: s.replace("[rank0]:", "0: "),
    lambda s: s.replace("[rank0]:", "[rank\u0663]:"),  # a digit to `re` without ASCII, not to RE2
    lambda s: s.replace("[rank0]:", "[rank0]\n[rank0]:"),  # the head on a line of its own
    lambda s: " " + s,
    lambda s: "x\r" + s,
    lambda s: s.replace(",325 ", ",32 "),
    lambda s: s.replace(",325 ", ".325 "),
    lambda s: s.replace("2024-03-02", "2024-13-02"),
    lambda s: s.replace("2024-03-02", "0000-03-02"),
    lambda s: s.replace("2024-03-02", "2024-03-45"),
    lambda s: s.replace("2024-03-02 08", "2024-03-02T08"),
    lambda s: s.replace("2024", "2\u0660\u0662\u0664"),
    lambda s: s.replace("[titan] ", "[titan]  "),
    lambda s: s[: len(s) // 2],
    lambda s: s + "\n" + s,
]


def _block(lines: list[str]) -> Block:
    """The block of these lines as the stream hands it over (see `LogStream._parse_block`)."""
    data = ("\n".join(lines) + "\n").encode()
    if data.isascii():
        text, codes = data.decode(), np.frombuffer(data, dtype=np.uint8)
    else:
        text = data.decode("utf-8", errors="replace")
        codes = np.frombuffer(text.encode("ascii", errors="replace"), dtype=np.uint8)
    return Block(text, codes, np.flatnonzero(codes == 10), data.isascii())


def _by_layout(block: Block, first: str = _line(1)) -> TableHits:
    """The metrics lines of the block as the bulk reader finds them, its layout measured on `first`."""
    parser = TorchtitanParser()
    parser._layout = Layout.of(first)
    return parser._find(block, np.flatnonzero(block.codes == ord(":")))


def _assert_as_the_regex_reads(block: Block, hits: TableHits) -> None:
    expected = _of_matches(list(_BULK_LINE.finditer(block.text)))
    assert hits.at.tolist() == expected.at.tolist()
    assert hits.line_starts.tolist() == hits.at.tolist()
    assert hits.steps.tolist() == expected.steps.tolist()
    nan = np.isnan(expected.values)
    assert (np.isnan(hits.values) == nan).all()
    assert (hits.values[~nan].view(np.uint64) == expected.values[~nan].view(np.uint64)).all()  # to the bit


def _layout_reads(block: Block, first: str = _line(1)) -> int:
    """How many lines the layout itself reads (the others go to the regex)."""
    layout = Layout.of(first)
    return len(find(layout, block.codes, block.newlines, np.flatnonzero(block.codes == ord(":"))).steps)


@pytest.mark.parametrize("case", range(len(LINE_CASES)))
def test_an_odd_metrics_line_is_read_as_the_regex_reads_it(case: int) -> None:
    lines = [_line(step) for step in range(1, 61)]
    for k in (0, 29, 59):  # first, middle, last line of the block
        lines[k] = LINE_CASES[case](lines[k])
    block = _block(lines)
    _assert_as_the_regex_reads(block, _by_layout(block))
    assert _layout_reads(block) >= 57  # the ordinary lines by the layout


#: what a fuzzed line may get: characters and values that the grammars treat specially
_CHARS = "0123456789 .,-+eE%:|\t\r\x1b[]m;()/NA_x\0\u0661\u00e9"
_TOKENS = ["", "1", "-0", "1e5", "1.", ".5", "1,2", "N/A", "nan", "inf", "7,,3", "1e-03", "00", "1" * 16, "1" * 18]


def _mutated(line: str, rng: random.Random) -> str:
    for _ in range(rng.randint(1, 3)):
        kind = rng.randrange(4)
        at = rng.randrange(len(line) + 1)
        if kind == 0:
            line = line[:at] + rng.choice(_CHARS) + line[at:]
        elif kind == 1:
            line = line[:at] + line[at + 1 :]
        elif kind == 2:
            line = line[:at] + rng.choice(_CHARS) + line[at + 1 :]
        else:  # a value replaced by another token
            values = list(re.finditer(r"(?<=: )( *)(\S+?)(?=  |\x1b|$)", line))
            if values:
                m = rng.choice(values)
                line = line[: m.start(2)] + rng.choice(_TOKENS) + line[m.end(2) :]
    return line


@pytest.mark.parametrize("seed", range(6))
def test_fuzzed_metrics_lines_are_read_as_the_regex_reads_them(seed: int) -> None:
    rng = random.Random(seed)
    lines = [_line(step) for step in range(1, 401)]
    for k in range(len(lines)):
        if rng.random() < 0.5:
            lines[k] = _mutated(lines[k], rng)
    block = _block(lines)
    _assert_as_the_regex_reads(block, _by_layout(block))


#: metrics lines of other shapes, each of which a layout is measured on
SHAPES = [
    lambda s: s.replace("[rank0]:", ""),
    lambda s: re.sub(r"  \x1b\[[\d;]*mgrad_norm: +\S+", "", s),
    lambda s: re.sub(r"\x1b\[[\d;]*m", "", s),
    lambda s: s.replace("13.34%", "N/A") + " \r",
    lambda s: re.sub(r"\x1b\[[\d;]*m", "", s) + "\r",
    lambda s: s.replace("  ", "   "),
]


@pytest.mark.parametrize(
    "shape", SHAPES, ids=["no-head", "no-grad-norm", "no-colours", "mfu-n/a", "no-colours-cr", "wide"]
)
def test_a_layout_measured_on_any_metrics_line_reads_the_lines_of_its_shape(shape: Callable[[str], str]) -> None:
    lines = [shape(_line(step)) for step in range(1, 61)]
    lines[30:30] = [_line(7).replace("  \x1b[34mtps:", "  \x1b[34mlr: 0.1  \x1b[34mtps:"), "[rank0]: CUDA error"]
    block = _block(lines)
    _assert_as_the_regex_reads(block, _by_layout(block, lines[0]))
    assert _layout_reads(block, lines[0]) == 60


def test_a_block_that_is_not_ascii_is_read_as_the_regex_reads_it() -> None:
    lines = [_line(step) for step in range(1, 61)]
    lines[3] = "[rank0]: caf\u00e9 \u2014 ::::::::"  # a line that may be a metrics line by its colons
    lines[10] = lines[10].replace("loss", "l\u00f6ss")
    lines[20] = lines[20].replace("7,270", "7,2\u00e90")
    lines[30] = lines[30].replace("[rank0]", "[r\u00e4nk0]")
    lines[40] = lines[40] + "\u00e9"
    block = _block(lines)
    assert not block.ascii
    _assert_as_the_regex_reads(block, _by_layout(block))
    assert _layout_reads(block) == 55


def test_the_layout_is_measured_again_when_most_lines_no_longer_fit_it() -> None:
    old = [re.sub(r"\x1b\[[\d;]*m", "", _line(step)) for step in range(1, 11)]
    block = _block(old + [_line(step) for step in range(11, 61)])
    parser = TorchtitanParser()
    parser._layout = Layout.of(old[0])
    colons = np.flatnonzero(block.codes == ord(":"))
    _assert_as_the_regex_reads(block, parser._find(block, colons))
    assert parser._layout == Layout.of(_line(11))


def test_a_line_shorter_than_the_layouts_tail_at_the_start_of_a_block_is_not_taken_for_one() -> None:
    """Its tail would begin before the block: compared there, the end of the block would be read,
    which here holds the tail."""
    first = _line(1) + " " * 1000
    tail = len(Layout.of(first).tail)
    short = _line(2).replace("GiB", "G" * (tail - 2 - len(_line(2)) + 1) + "iB")  # a long memory unit
    block = _block([short, _line(3), first.replace("step:  1", "step:  4")])
    assert block.newlines[0] == tail - 2  # its tail would begin 2 bytes before the block
    _assert_as_the_regex_reads(block, _by_layout(block, first))


def test_a_block_too_short_to_compare_goes_to_the_regex() -> None:
    block = _block([":::::::::"])
    _assert_as_the_regex_reads(block, _by_layout(block))


def test_a_parser_pickled_by_an_older_version_reads_on() -> None:
    """Scan states on disk hold pickled parsers: one without a layout, with a round of another shape."""
    state = TorchtitanParser().__getstate__()
    del state["_layout"]
    state["_round"] = object()
    parser = pickle.loads(pickle.dumps(TorchtitanParser()))
    parser.__setstate__(state)
    data = "".join(_line(step) + "\n" for step in range(1, 300)).encode()
    assert parser._layout is None and parser._round.applied == -1
    assert len(_parse(data)[1]) == 299


def test_a_log_whose_lines_change_shape_is_read_in_bulk_and_as_the_plain_path_reads_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lines = [_line(step) for step in range(1, 3001)]
    lines[1500:] = [re.sub(r"\x1b\[[\d;]*m", "", s).replace("[rank0]:", "") for s in lines[1500:]]
    data = "\n".join(lines).encode() + b"\n"
    bulk = _bulk_records(monkeypatch)
    chunks = [len(data) // 3] * 2
    fast = _parse(data, chunks)
    _assert_same(fast, _parse(data, chunks, every_line=True))
    assert bulk[0] >= 2900

"""OLMo's bulk path (`parsers/olmo_rows.py`) reads exactly what the per-line path reads.

Records of a known shape are found by their layout for a whole block; every line that the
per-line path would read otherwise (an odd value, another shape, an escape, a launcher prefix, a
record cut by the block's end) must be left to it, so results equal the plain path's whole, cut
at random chunk boundaries, and restored from a pickled stream.
"""

from __future__ import annotations

import pickle
import random
import re

import pytest

from gradwatch.synth import Anomaly, RunSpec, generate
from tests.test_stream import _assert_reads_as_plain, _assert_same, _bulk_records, _parse

_TRACEBACK = 'Traceback (most recent call last):\n  File "train.py", line 3, in <module>\n    main()'


def _value(line: str, new: str) -> str:
    """A metric line with another value."""
    return line[: line.index("=") + 1] + new


#: replacements for a metric line (its text, its step): odd values, shapes and bytes
METRIC_LINES = [
    lambda s, n: _value(s, "nan"),
    lambda s, n: _value(s, "inf"),
    lambda s, n: _value(s, "-Infinity"),
    lambda s, n: _value(s, "'0.91'"),
    lambda s, n: _value(s, "1_000"),
    lambda s, n: _value(s, "1,2,3"),
    lambda s, n: _value(s, ",5"),
    lambda s, n: _value(s, ""),
    lambda s, n: _value(s, "12.5s"),
    lambda s, n: _value(s, "1e400"),
    lambda s, n: _value(s, "nan(1)"),
    lambda s, n: _value(s, "\u0661.5"),
    lambda s, n: _value(s, "2.5 "),
    lambda s, n: _value(s, " 2.5\t"),
    lambda s, n: _value(s, "2.5\x1c"),
    lambda s, n: _value(s, "2=5"),
    lambda s, n: _value(s, "\x1b[31m2.5\x1b[0m"),
    lambda s, n: s + "\r",
    lambda s, n: s + "\r    train/CE loss=9.5",
    lambda s, n: s + "\r    optim/step skipped=1",  # a metric of its own, even after a value not read
    lambda s, n: "\t" + s.lstrip(),
    lambda s, n: s.lstrip(),  # unindented: a bare metric line, still the record's
    lambda s, n: "0:     " + s.lstrip(),  # a launcher prefix that ate the indentation
    lambda s, n: s.replace("/", "/_", 1),  # another key for the same metric
    lambda s, n: s.upper(),
    lambda s, n: s + "\n    extra/metric=1.0",  # another shape
    lambda s, n: s + "\n" + s,  # the same metric twice: the first value counts
    lambda s, n: s + "\n",  # an empty line inside a record
    lambda s, n: s + "\n   ",  # a blank one ends it
    lambda s, n: "",  # a metric missing
]

#: replacements for a marker line
MARKER_LINES = [
    lambda s, n: s.replace("]", ",eta=1h2m3s]", 1) if s.startswith("[") else s.replace(",epoch", ",eta=0h1m,epoch"),
    lambda s, n: s + "  console_logger.py:62",
    lambda s, n: re.sub(r"/\d+", "/???", s),
    lambda s, n: re.sub(r"/\d+", "/None", s),
    lambda s, n: s.replace("[step=", "[step=x"),
    lambda s, n: s + " [step=3/9]",
    lambda s, n: "0: " + s,
    lambda s, n: "[rank0]:" + s,
    lambda s, n: "\x1b[32m" + s,
    lambda s, n: s.replace("-03-", "-13-", 1),
    lambda s, n: s.replace(":", "", 1) if s[:1] != "[" else s,
    lambda s, n: re.sub(r"(\d\d:\d\d:\d\d)", r"\1.123456", s, count=1),
    lambda s, n: re.sub(r"(\d\d:\d\d:\d\d)[.,]\d+", r"\1", s, count=1),
    lambda s, n: re.sub(r"(\d\d:\d\d:\d\d)", r"\1,5", s, count=1),
    lambda s, n: re.sub(r"(\d{4}-\d\d-\d\d) ", r"\1T", s, count=1),
    lambda s, n: re.sub(r"(\d{4}-\d\d-\d\d) ", r"\1x", s, count=1),  # no time: a record without one
    lambda s, n: re.sub(r"/\d+", "/\u00e9\u00e9", s),  # `?` where the block is not ASCII: no marker
    lambda s, n: re.sub(r"\[step=\d+", "[step=1234567890123456789", s),
    lambda s, n: re.sub(r"\[step=(\d+)", lambda m: f"[step={int(m.group(1)) - 40}", s),  # a resume
    lambda s, n: s + "\n" + s.split("[step=")[0] + "Saving checkpoint for step 7 to '/ckpt/step7'...",
    lambda s, n: s.split("[step=")[0] + "Checkpoint saved to /ckpt/step7\n" + s,
    lambda s, n: s.split("[step=")[0] + "Will resume training from step 3, epoch 0\n" + s,
    lambda s, n: _TRACEBACK + "\n" + s,
    lambda s, n: "ValueError: bad batch\n" + s,
    lambda s, n: s + "\n" + s,  # a bare marker before the record
    lambda s, n: s.replace("[step=", "[step=\u0661"),
]


def _olmo_log(fmt: str, seed: int, rate: float) -> bytes:
    """A synthetic OLMo run (a resume, an anomaly) with odd marker and metric lines, at random
    and then each kind once in turn in the second half."""
    rng = random.Random(seed)
    spec = RunSpec(fmt=fmt, steps=1500, seed=seed, restarts=(700,), anomalies=(Anomaly("loss_spike", 1100),))
    lines = "".join(generate(spec)).split("\n")
    markers = [k for k, line in enumerate(lines) if "[step=" in line]
    metrics = [k for k, line in enumerate(lines) if line.startswith("    ") and "=" in line]
    for k in markers[10:]:
        if rng.random() < rate:
            lines[k] = rng.choice(MARKER_LINES)(lines[k], k)
    for k in metrics[100:]:
        if rng.random() < rate / 4:
            lines[k] = rng.choice(METRIC_LINES)(lines[k], k)
    late_markers = [k for k in markers if k > len(lines) // 2][::7]
    for k, make in zip(late_markers, MARKER_LINES, strict=False):
        lines[k] = make(lines[k], k)
    late_metrics = [k for k in metrics if k > len(lines) // 2][3::29]
    for k, make in zip(late_metrics, METRIC_LINES, strict=False):
        lines[k] = make(lines[k], k)
    return "\n".join(lines).encode()


@pytest.mark.parametrize("fmt", ["olmo", "olmo-core"])
def test_bulk_reader_takes_the_ordinary_records(fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    bulk = _bulk_records(monkeypatch)
    records = _parse("".join(generate(RunSpec(fmt=fmt, steps=2000, seed=5))).encode())[1]
    assert bulk[0] >= 0.95 * len(records), f"{bulk[0]} of {len(records)} records read in bulk"


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("fmt", ["olmo", "olmo-core"])
def test_bulk_reader_equals_the_plain_path_with_odd_lines(fmt: str, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    data = _olmo_log(fmt, seed, rate=0.02)
    bulk = _bulk_records(monkeypatch)
    _assert_reads_as_plain(data, seed)
    assert bulk[0] > 100, "the bulk reader should have read records of this log"


def _each_once(fmt: str, make, marker: bool) -> bytes:
    """A short run with one kind of odd line at several places: on a marker, or on each metric
    line of a record in turn (the first, a value read, one not read, the last)."""
    lines = "".join(generate(RunSpec(fmt=fmt, steps=160, seed=1))).split("\n")
    markers = [k for k, line in enumerate(lines) if "[step=" in line]
    for r, k in enumerate(markers[40:140:10]):
        target = k if marker else k + 1 + r % (markers[1] - markers[0] - 1)
        lines[target] = make(lines[target], target)
    return "\n".join(lines).encode()


@pytest.mark.parametrize("fmt", ["olmo", "olmo-core"])
@pytest.mark.parametrize(
    ("make", "marker"),
    [*((m, True) for m in MARKER_LINES), *((m, False) for m in METRIC_LINES)],
    ids=[*(f"marker{k}" for k in range(len(MARKER_LINES))), *(f"metric{k}" for k in range(len(METRIC_LINES)))],
)
def test_each_odd_line_is_read_as_the_plain_path_reads_it(fmt: str, make, marker: bool) -> None:
    data = _each_once(fmt, make, marker)
    _assert_same(_parse(data), _parse(data, every_line=True))


@pytest.mark.parametrize("fmt", ["olmo", "olmo-core"])
def test_bulk_reader_resumes_from_a_pickled_stream(fmt: str) -> None:
    data = _olmo_log(fmt, seed=7, rate=0.02)
    chunks = [len(data) // 5] * 4
    _assert_same(_parse(data, chunks, pickled=True), _parse(data, chunks, every_line=True))


def test_alternating_shapes_are_all_read_in_bulk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every tenth record carries evaluation metrics: both shapes are remembered, not relearned."""
    lines = "".join(generate(RunSpec(fmt="olmo", steps=1000, seed=2))).split("\n")
    markers = [k for k, line in enumerate(lines) if "[step=" in line]
    for k in reversed(markers[::10]):
        lines.insert(k + 2, "    eval/CrossEntropyLoss=3.25")
    data = "\n".join(lines).encode()
    bulk = _bulk_records(monkeypatch)
    fast = _parse(data)
    _assert_same(fast, _parse(data, every_line=True))
    assert bulk[0] >= 0.9 * len(fast[1])


def test_a_bare_marker_keeps_its_step_for_the_lines_after_it() -> None:
    """OLMo-core prints markers without metrics between intervals: a checkpoint line after one
    takes its step, not that of the bulk record before it."""
    lines = "".join(generate(RunSpec(fmt="olmo-core", steps=200, seed=4))).split("\n")
    markers = [k for k, line in enumerate(lines) if "[step=" in line]
    k = markers[150]
    bare = re.sub(r"\[step=\d+", "[step=9999", lines[k])
    lines[k:k] = [bare, lines[k].split("[step=")[0] + "Checkpoint saved to /ckpt/step9999"]
    data = "\n".join(lines).encode()
    fast = _parse(data)
    _assert_same(fast, _parse(data, every_line=True))
    assert [e[2] for e in fast[2] if "path" in dict(e[4])] == [9999]


def test_a_parser_pickled_before_the_bulk_path_reads_on() -> None:
    """`scan` keeps parsers pickled between runs: one from before the bulk path (an open record
    as a tuple, no shapes) loads and finishes its record, then learns shapes as usual."""
    from gradwatch.parsers.base import ParseOutput
    from gradwatch.parsers.olmo import OlmoParser

    old = OlmoParser()
    state = {k: v for k, v in old.__dict__.items() if k not in ("_layouts", "_bulk")}
    state["_open"] = (7, 3, None, {"loss": 2.5}, [])
    parser = OlmoParser.__new__(OlmoParser)
    parser.__setstate__(pickle.loads(pickle.dumps(state)))
    out = ParseOutput()
    assert parser.parse("    train/PPL=12.2", 4, None, out)
    assert parser.parse("2024-03-02 08:00:30.325 node:0  olmo.train:908  INFO    [step=8/9,epoch=0]", 5, 1.0, out)
    assert parser.parse("    train/CrossEntropyLoss=2.4", 6, None, out)
    parser.flush(out)
    frame = out.records.take()
    assert list(frame.step) == [7, 8] and list(frame.loss) == [2.5, 2.4] and frame.ppl[0] == 12.2
    assert len(parser._layouts) == 1

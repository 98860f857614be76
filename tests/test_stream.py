"""The stream's fast paths read exactly what the plain line-by-line path reads.

`LogStream` searches blocks for candidate lines and reads the main format's records in bulk; both
are optimisations, so the records and events must equal those of offering every line to every
parser, and must not depend on where the input was cut into chunks.
"""

from __future__ import annotations

import random
from pathlib import Path

import pandas as pd
import pytest

from gradwatch.parsers import new_parsers
from gradwatch.parsers.stream import LogStream
from gradwatch.synth import FORMATS, Anomaly, RunSpec, generate
from tests.conftest import REAL


def _parse(data: bytes, chunks: list[int] | None = None, every_line: bool = False):
    stream = LogStream(new_parsers())
    if every_line:
        stream._scan = None  # the plain path: every line to every parser
    frames, events = [], []
    pos = 0
    for size in chunks or [len(data)]:
        stream.feed(data[pos : pos + size])
        pos += size
        batch = stream.take()
        frames.append(batch.records)
        events += batch.events
    stream.feed(data[pos:])
    stream.close()
    batch = stream.take()
    frames.append(batch.records)
    events += batch.events
    records = pd.concat(frames, ignore_index=True)
    return stream.format, records, [(e.kind, e.line, e.step, sorted(e.data.items())) for e in events]


def _random_chunks(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    sizes, total = [], 0
    while total < n:
        size = rng.choice([1, 7, 100, 4096, 65536])
        sizes.append(size)
        total += size
    return sizes


def _assert_same(a, b) -> None:
    assert a[0] == b[0]
    pd.testing.assert_frame_equal(a[1], b[1])
    assert a[2] == b[2]


def _synth(fmt: str) -> bytes:
    spec = RunSpec(fmt=fmt, steps=600, seed=3, anomalies=(Anomaly("grad_norm_spike", 400),))
    return "".join(generate(spec)).encode()


@pytest.mark.parametrize("fmt", FORMATS)
def test_fast_paths_equal_the_plain_path_on_synthetic_logs(fmt: str) -> None:
    data = _synth(fmt)
    plain = _parse(data, every_line=True)
    assert len(plain[1]) > 50, "the generator's log should be read"
    _assert_same(_parse(data), plain)
    chunks = _random_chunks(len(data), seed=1)
    _assert_same(_parse(data, chunks), _parse(data, chunks, every_line=True))


def _real_files() -> list[Path]:
    return sorted(REAL.rglob("*.log")) if REAL.is_dir() else []


@pytest.mark.parametrize("path", _real_files(), ids=lambda p: p.name[:40])
def test_fast_paths_equal_the_plain_path_on_real_logs(path: Path) -> None:
    data = path.read_bytes()
    plain = _parse(data, every_line=True)
    _assert_same(_parse(data), plain)
    chunks = _random_chunks(len(data), seed=2)
    _assert_same(_parse(data, chunks), _parse(data, chunks, every_line=True))


def test_real_logs_are_present_or_this_says_why() -> None:
    if not _real_files():
        pytest.skip("real samples not present: ../shared/samples/real (third-party logs, not shipped)")


def test_bulk_path_reads_a_nan_step_and_a_validation_record_in_order() -> None:
    """A record of another shape in the middle of bulk-read records keeps its place and its NaN flag."""
    line = (
        " iteration {:8d}/  159576 | consumed samples:       488048 | elapsed time per iteration (ms): 61947.6 | "
        "learning rate: 6.000E-05 | global batch size:   176 |{loss} loss scale: 65536.0 | grad norm: 23.4 | "
        "num zeros: 0.0 | number of skipped iterations:   0 | number of nan iterations:   0 |\n"
    )
    text = "".join(line.format(i, loss=" lm loss: 3.317482E+00 |") for i in range(1, 2000))
    text += line.format(2000, loss="")
    text += " validation loss at iteration 2000 | lm loss value: 7.174200E+00 | lm loss PPL: 1.305315E+03 |\n"
    text += "".join(line.format(i, loss=" lm loss: 3.317482E+00 |") for i in range(2001, 4000))
    data = (text * 3).encode()  # and a second and third pass: the step goes back (a resume)
    fast = _parse(data, chunks=[len(data) // 3, len(data) // 3])
    _assert_same(fast, _parse(data, every_line=True))
    records = fast[1]
    nan_rows = records[records.nonfinite == "loss"]
    assert list(nan_rows.step) == [2000, 2000, 2000]
    assert records.line.is_monotonic_increasing

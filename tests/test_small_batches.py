"""The small-batch paths (a live tail's batch of a record or two) compute what the bulk paths do.

`gradwatch tail` feeds one record at a time, so the window code has plain numpy paths for small
batches beside the pandas ones; record batches carry their numpy columns from the builder. Each
test feeds the same values in one batch and in random small ones and compares the results.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gradwatch.detectors.base import ColumnBatch, median
from gradwatch.detectors.loss_divergence import LossDivergence
from gradwatch.detectors.stall import Stall
from gradwatch.detectors.steps import StepGaps
from gradwatch.downsample import MinMaxBuckets
from gradwatch.parsers.stream import Batch, BatchFacts
from gradwatch.records import COLUMNS, RecordBuilder, columns_of
from gradwatch.spike_score import SpikeScore
from tests.conftest import metric_columns


def _cuts(rng: np.random.Generator, n: int, most: int = 9) -> list[tuple[int, int]]:
    """Random consecutive (start, end) pieces of range(n), most of them of a few values."""
    pieces, pos = [], 0
    while pos < n:
        size = int(rng.integers(1, most + 1)) if rng.random() < 0.9 else int(rng.integers(10, 60))
        pieces.append((pos, min(n, pos + size)))
        pos += size
    return pieces


def test_median_is_numpys() -> None:
    rng = np.random.default_rng(0)
    for n in [*range(1, 30), 127, 128]:
        values = np.round(rng.normal(0, 1, n), 1)  # rounded: ties in the middle
        assert median(values) == np.median(values)


def test_step_gaps_row_by_row_match_the_vectorised_path() -> None:
    rng = np.random.default_rng(1)
    steps = np.cumsum(rng.choice([0, 1, 10, 10, 10, 500, -30], size=400)) + 5
    steps[rng.random(400) < 0.05] = -1  # records without a step
    whole = StepGaps(20.0)
    expected = whole.segments(steps)
    pieces = StepGaps(20.0)
    found, intervals = [], []
    for lo, hi in _cuts(rng, len(steps)):
        found += [(a + lo, b + lo, reset) for a, b, reset in pieces.segments(steps[lo:hi])]
        intervals.append(pieces.row_intervals)
    assert [(lo, reset) for lo, _, reset in found if lo == 0 or reset] == [(lo, reset) for lo, _, reset in expected]
    np.testing.assert_array_equal(np.concatenate(intervals), whole.row_intervals)


def test_loss_divergence_trend_is_the_same_in_small_batches() -> None:
    """The trend medians kept between batches are those the whole series gives, bit for bit."""
    rng = np.random.default_rng(2)
    values = np.round(3 + np.cumsum(rng.normal(0, 0.05, 1200)), 2)
    whole = LossDivergence()
    med, ref = whole._trend(values, 0)
    small = LossDivergence()
    parts: list[tuple[np.ndarray, np.ndarray]] = []
    for lo, hi in _cuts(rng, len(values)):
        joined = np.concatenate([small._tail, values[lo:hi]])
        parts.append(small._trend(joined, len(small._tail)))
        small._tail = joined[-small._keep :]
    np.testing.assert_array_equal(np.concatenate([p[0] for p in parts]), med)
    np.testing.assert_array_equal(np.concatenate([p[1] for p in parts]), ref)


def test_loss_divergence_alerts_are_the_same_bits_in_small_batches() -> None:
    """The level mean (of the 100 logs before) is the same bits however the run is cut: its
    baseline and threshold in an alert too (numpy's sum for small batches and pandas' running
    sum for large ones differed in the last bits, so --jobs 1 and 2 could)."""
    rng = np.random.default_rng(12)
    n = 3000
    loss = 3 + rng.normal(0, 0.05, n)
    loss[900:960] = 7.5  # held at over twice the earlier mean
    loss[2000:2008] = 3 + np.arange(8) * 0.4  # rising on consecutive logs
    batches = [_loss_batch(loss, lo, hi) for lo, hi in _cuts(rng, n, most=40)]
    whole = [a.to_json() for a in LossDivergence().update(_loss_batch(loss, 0, n))]
    detector = LossDivergence()
    cut = [a.to_json() for b in batches for a in detector.update(b)]
    assert cut == whole
    assert {"critical", "warning"} <= {a["severity"] for a in whole}


def _loss_batch(loss: np.ndarray, lo: int, hi: int) -> Batch:
    data = {"step": np.arange(lo, hi) + 1, "line": np.arange(lo, hi) + 1, "loss": loss[lo:hi]}
    return Batch(columns_of({**data, "nonfinite": np.full(hi - lo, "", dtype=object)}).frame)


def test_stall_pace_medians_small_and_bulk() -> None:
    rng = np.random.default_rng(3)
    stall = Stall()
    joined = np.round(rng.exponential(10.0, 80), 1)
    ends = np.array([0, 1, 5, 49, 50, 79])
    bulk = stall._medians_through(joined, np.repeat(ends, 2))[::2]  # over SMALL_BATCH: the pandas path
    small = np.concatenate([stall._medians_through(joined, ends[i : i + 1]) for i in range(len(ends))])
    np.testing.assert_array_equal(small, bulk)
    assert np.isnan(stall._medians_through(np.empty(0), np.array([0])))[0]


def test_spike_score_is_the_same_in_small_batches() -> None:
    rng = np.random.default_rng(4)
    n = 3000
    loss = rng.normal(3.0, 0.01, n)
    loss[1500:2700] = 2.5  # a constant stretch: no spread, nothing judged
    loss[[400, 2800]] = 9.0
    grad = np.abs(rng.normal(1.0, 0.1, n))
    bulk, small = SpikeScore(), SpikeScore()
    for lo in range(0, n, 50):
        bulk.update(metric_columns({"loss": loss[lo : lo + 50], "grad_norm": grad[lo : lo + 50]}))
    for lo, hi in _cuts(rng, n, most=3):
        small.update(metric_columns({"loss": loss[lo:hi], "grad_norm": grad[lo:hi]}))
    assert small.spikes == bulk.spikes and small.counted == bulk.counted
    assert small.spikes["loss"] >= 2


def test_min_max_buckets_queue_small_additions() -> None:
    rng = np.random.default_rng(5)
    x = np.arange(5000, dtype=np.float64)
    y = rng.random(5000)
    y[[10, 4000]] = [np.nan, np.inf]
    whole, small = MinMaxBuckets(64), MinMaxBuckets(64)
    whole.add(x, y)
    for lo, hi in _cuts(rng, len(x), most=2):
        small.add(x[lo:hi], y[lo:hi])
    for a, b in zip(whole.envelope(40).__dict__.values(), small.envelope(40).__dict__.values(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert small.x_range() == whole.x_range() and len(small) == len(whole)


def _mixed_builder() -> RecordBuilder:
    """Rows and bulk chunks, out of line order, from two parsers."""
    builder = RecordBuilder()
    builder.add(7, 30, None, {"loss": 2.0}, source="megatron")
    builder.add(8, 31, 5.0, {"loss": 1.0, "grad_norm": np.nan}, ("grad_norm",), source="deepspeed")
    builder.add_columns(
        np.array([5, 6]),
        np.array([10, 40]),
        np.array([np.nan, 1.0]),
        {"loss": np.array([3.0, 4.0])},
        np.array(["", ""], dtype=object),
        "megatron",
    )
    return builder


@pytest.mark.parametrize("drop", [frozenset(), frozenset({"deepspeed"})])
def test_a_batchs_columns_are_its_frames(drop: frozenset[str]) -> None:
    """Some rows dropped: the columns a check hands on (no frame built) are those of the frame a
    live tail takes, and the frame built from them when asked for is that frame."""
    frame = _mixed_builder().take(drop)
    columns = columns_of(_mixed_builder().take_columns(drop) or {})
    assert list(frame.columns) == list(COLUMNS) and frame["line"].is_monotonic_increasing
    assert len(columns) == len(frame) and all(name in columns for name in COLUMNS) and "other" not in columns
    for name in COLUMNS:
        expected = frame[name].to_numpy()
        assert columns[name].dtype == expected.dtype
        np.testing.assert_array_equal(columns[name], expected)
        assert not columns[name].flags.writeable
    with pytest.raises(KeyError):
        columns["other"]
    pd.testing.assert_frame_equal(columns.frame, frame)
    batch = ColumnBatch.of_columns(BatchFacts(), columns)
    assert batch.records is columns.frame and ColumnBatch.of(batch) is batch
    assert ColumnBatch.of(Batch(frame)).columns["loss"].tolist() == frame["loss"].tolist()


def test_a_batch_is_made_anew_by_dataclasses_replace() -> None:
    """A plugin's detector may make its own batch of the one it is handed with
    `dataclasses.replace` (found by review: the batch of columns refused the keywords)."""
    import dataclasses

    from gradwatch.events import Event, EventKind

    batch = ColumnBatch.of_columns(BatchFacts(last_step=9), columns_of(_mixed_builder().take_columns() or {}))
    fewer = batch.records[batch.records["step"] > 6]
    replaced = dataclasses.replace(batch, records=fewer)
    assert replaced.records is fewer and replaced.columns["step"].tolist() == fewer["step"].tolist()
    assert replaced.last_step == 9 and batch.columns["step"].tolist() == [5, 7, 8, 6]
    event = Event(EventKind.CHECKPOINT_LOAD, 3, 5, None, {})
    moved = dataclasses.replace(batch, events=[event])
    assert moved.events == [event] and moved.columns["loss"].tolist() == batch.columns["loss"].tolist()


def test_a_batchs_frame_can_be_written_to() -> None:
    """A plugin may change the frame it is handed (its own copy of the columns): the columns the
    detectors read stay as they were."""
    columns = columns_of(_mixed_builder().take_columns() or {})
    frame = ColumnBatch.of_columns(BatchFacts(), columns).records
    frame.loc[0, "loss"] = 99.0
    frame.loc[0, "nonfinite"] = "loss"
    assert columns["loss"][0] != 99.0 and columns["nonfinite"][0] == ""


def test_a_batchs_flagged_records_are_worked_out_once_and_cannot_be_changed() -> None:
    """`Columns.flagged`: the records with a non-finite value logged, as the detectors that leave
    them to the nonfinite detector read them, computed once a batch and read-only."""
    builder = RecordBuilder()
    names = np.array(["", "loss", "", "grad_norm,loss"], dtype=object)
    builder.add_columns(np.arange(4), np.arange(1, 5), np.full(4, np.nan), {"loss": np.ones(4)}, names, "x")
    columns = columns_of(builder.take_columns() or {})
    flagged = columns.flagged()
    assert flagged.tolist() == [False, True, False, True]
    assert columns.flagged() is flagged
    with pytest.raises(ValueError, match="read-only"):
        flagged[0] = True

"""What a report or a comparison draws of one log, collected while the pipeline reads it.

The log goes through the same pipeline as `check` (so the alerts are check's alerts); an `on_batch`
callback keeps, per metric, a min/max-downsampled buffer (bounded, see `gradwatch.downsample`), the
fp16 overflows and the loss scale their messages tell, where the log has records and where a
metric was not finite (`gaps`), and for `compare` the points of the last steps.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from gradwatch.alerts import Alert
from gradwatch.config import Settings
from gradwatch.downsample import MinMaxBuckets
from gradwatch.errors import InputError
from gradwatch.events import EventKind
from gradwatch.parsers.stream import Batch
from gradwatch.pipeline import FileSummary, check_path
from gradwatch.plots.gaps import LogInterval
from gradwatch.plots.panels import STEPS
from gradwatch.plots.trend import RecentWindow
from gradwatch.workers import default_jobs

if TYPE_CHECKING:
    import pandas as pd

#: Buckets kept per metric: a few per pixel of a 1,000-pixel-wide panel.
CAPACITY = 4096


@dataclass
class RunSeries:
    """One log, ready to draw: its check results and its downsampled series."""

    summary: FileSummary
    alerts: list[Alert]
    series: dict[str, MinMaxBuckets]
    #: fp16 overflows: at their step, the loss scale they left (what the trainer printed)
    overflows: MinMaxBuckets
    recent: dict[str, RecentWindow] = field(default_factory=dict)
    #: the loss scale as the overflow and scale-increase events tell it (DeepSpeed, apex, fairseq:
    #: trainers that log no scale in their records)
    event_scale: MinMaxBuckets = field(default_factory=lambda: MinMaxBuckets(CAPACITY))
    #: every record's x (as value too): where the log has no records at all
    records: MinMaxBuckets = field(default_factory=lambda: MinMaxBuckets(CAPACITY))
    #: per metric, the x of its non-finite values (as value too)
    nonfinite: dict[str, MinMaxBuckets] = field(default_factory=dict)
    #: the most common distance between records' x
    interval: float = 1.0

    def logged(self, metric: str) -> bool:
        buckets = self.series.get(metric)
        return buckets is not None and len(buckets) > 0

    def steps_text(self) -> str:
        s = self.summary
        return f"{s.first_step:,}-{s.last_step:,}" if s.first_step is not None and s.last_step is not None else "none"

    def spike_text(self) -> str:
        """OLMo 2's spike score per metric, in percent of steps (n/a: too few steps to judge)."""
        pct = self.summary.spike_score.percent()
        return ", ".join(f"{m} {v:.3f}%" if v is not None else f"{m} n/a" for m, v in pct.items())

    def x_range(self) -> tuple[float, float] | None:
        spans = [r for b in (*self.series.values(), self.event_scale) if (r := b.x_range()) is not None]
        if not spans:
            return None
        return min(r[0] for r in spans), max(r[1] for r in spans)


class SeriesCollector:
    """An `on_batch` callback that downsamples the given metrics against `x` as batches pass.

    `x` is a record column: "step", or "tokens" (consumed tokens, for `compare --x tokens`).
    """

    def __init__(self, metrics: Iterable[str], x: str = "step", window: int | None = None) -> None:
        self.x = x
        self.series = {m: MinMaxBuckets(CAPACITY) for m in metrics}
        self.overflows = MinMaxBuckets(CAPACITY)
        self.event_scale = MinMaxBuckets(CAPACITY)
        self.records = MinMaxBuckets(CAPACITY)
        self.nonfinite = {m: MinMaxBuckets(CAPACITY) for m in self.series}
        self.interval = LogInterval()
        self.recent = {m: RecentWindow(window) for m in self.series} if window else {}

    def __call__(self, batch: Batch) -> None:
        rec = batch.records
        if len(rec):
            x = rec[self.x].to_numpy(dtype=np.float64)
            steps = rec["step"].to_numpy()
            self.records.add(x, x)
            self.interval.add(x[self._regular(rec)])
            for name, buckets in self.series.items():
                values = rec[name].to_numpy()
                buckets.add(x, values)
                if self.recent:
                    self.recent[name].add(steps, values)
            self._nonfinite(x, rec["nonfinite"].to_numpy())
        if self.x == "step":
            self._scale_events(batch)

    def _regular(self, rec: pd.DataFrame) -> np.ndarray:
        """The records of the trainer's progress lines: those that log more than the loss scale.

        A log of DeepSpeed overflows has a record per overflow, several on consecutive steps; the
        log interval is that of its `step=N` lines, or every step between them would be a gap.
        """
        regular = [m for m in self.series if m not in STEPS]
        if not regular:
            return np.ones(len(rec), dtype=bool)
        return rec[regular].notna().to_numpy().any(axis=1)

    def _nonfinite(self, x: np.ndarray, names: np.ndarray) -> None:
        """The x of each listed metric's non-finite values (few rows: looked at one by one)."""
        for i in np.flatnonzero(names.astype(bool)):
            for name in str(names[i]).split(","):
                if name in self.nonfinite:
                    self.nonfinite[name].add(x[i : i + 1], x[i : i + 1])

    def _scale_events(self, batch: Batch) -> None:
        scaled = [
            e
            for e in batch.events
            if e.kind in (EventKind.OVERFLOW, EventKind.SCALE_INCREASE) and e.step is not None and "new" in e.data
        ]
        if not scaled:
            return
        at = np.array([e.step for e in scaled], dtype=np.float64)
        new = np.array([e.data["new"] for e in scaled], dtype=np.float64)
        self.event_scale.add(at, new)
        overflow = np.array([e.kind is EventKind.OVERFLOW for e in scaled])
        self.overflows.add(at[overflow], new[overflow])

    def run(self, summary: FileSummary, alerts: list[Alert]) -> RunSeries:
        return RunSeries(
            summary,
            alerts,
            self.series,
            self.overflows,
            self.recent,
            self.event_scale,
            self.records,
            self.nonfinite,
            self.interval.value(),
        )


def collect(
    path: Path, settings: Settings, metrics: Iterable[str], x: str = "step", window: int | None = None
) -> RunSeries:
    """Read one log through the pipeline; a log without records is an `InputError`."""
    collector = SeriesCollector(metrics, x, window)
    summary, alerts = check_path(path, settings, on_batch=collector, jobs=default_jobs())
    if summary.records == 0:
        raise InputError(summary.error or f"{path}: no training records")
    return collector.run(summary, alerts)

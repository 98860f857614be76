"""What a report or a comparison draws of one log, collected while the pipeline reads it.

The log goes through the same pipeline as `check` (so the alerts are check's alerts); an `on_batch`
callback keeps, per metric, a min/max-downsampled buffer (bounded, see `gradwatch.downsample`), the
steps of fp16 overflow events, and for `compare` the points of the last steps.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gradwatch.alerts import Alert
from gradwatch.config import Settings
from gradwatch.downsample import MinMaxBuckets
from gradwatch.errors import InputError
from gradwatch.events import EventKind
from gradwatch.parsers.stream import Batch
from gradwatch.pipeline import FileSummary, check_path
from gradwatch.plots.trend import RecentWindow
from gradwatch.workers import default_jobs

#: Buckets kept per metric: a few per pixel of a 1,000-pixel-wide panel.
CAPACITY = 4096


@dataclass
class RunSeries:
    """One log, ready to draw: its check results and its downsampled series."""

    summary: FileSummary
    alerts: list[Alert]
    series: dict[str, MinMaxBuckets]
    overflows: MinMaxBuckets
    recent: dict[str, RecentWindow] = field(default_factory=dict)

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
        spans = [r for b in self.series.values() if (r := b.x_range()) is not None]
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
        self.recent = {m: RecentWindow(window) for m in self.series} if window else {}

    def __call__(self, batch: Batch) -> None:
        rec = batch.records
        if len(rec):
            x = rec[self.x].to_numpy(dtype=np.float64)
            steps = rec["step"].to_numpy()
            for name, buckets in self.series.items():
                values = rec[name].to_numpy()
                buckets.add(x, values)
                if self.recent:
                    self.recent[name].add(steps, values)
        if self.x == "step":
            at = [e.step for e in batch.events if e.kind is EventKind.OVERFLOW and e.step is not None]
            if at:
                self.overflows.add(np.array(at, dtype=np.float64), np.ones(len(at)))


def collect(
    path: Path, settings: Settings, metrics: Iterable[str], x: str = "step", window: int | None = None
) -> RunSeries:
    """Read one log through the pipeline; a log without records is an `InputError`."""
    collector = SeriesCollector(metrics, x, window)
    summary, alerts = check_path(path, settings, on_batch=collector, jobs=default_jobs())
    if summary.records == 0:
        raise InputError(summary.error or f"{path}: no training records")
    return RunSeries(summary, alerts, collector.series, collector.overflows, collector.recent)

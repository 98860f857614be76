"""Where a metric is heading at the end of a run, and which run heads off alone.

Why: the logit-norm failure was found by comparing runs of one model (4, 16 and 32 nodes; bf16
versus float32 gradient reduction): only some runs' output-logit norm grew, while the loss looked
fine in all of them. `compare` measures each run's last `span` steps and marks a run whose metric
grows while the others' stay flat.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gradwatch.plots.axes import number

#: growth (last tenth of the window over its first tenth, medians) at which a metric "grows"
GROWS = 1.2
#: growth below which a metric counts as flat (or falling) for the comparison
FLAT = 1.1


@dataclass(frozen=True)
class Trend:
    """A metric over the last steps of one run."""

    last: float  #: last logged value
    growth: float  #: median of the window's last tenth over the median of its first tenth (NaN: too few)
    slope: float  #: d ln(value) / d step, per 1,000 steps, least squares (NaN: too few positive values)

    @property
    def grows(self) -> bool:
        return self.growth >= GROWS

    @property
    def flat(self) -> bool:
        return not self.growth >= FLAT  # NaN (too short to tell) does not block another run's mark


class RecentWindow:
    """The (step, value) points of a run's last `span` steps, bounded whatever the log's length.

    Points past the newest step are dropped: after a resume replays steps, only the replay counts.
    """

    def __init__(self, span: int) -> None:
        self.span = span
        self._steps = np.empty(0, dtype=np.int64)
        self._values = np.empty(0)

    def add(self, steps: np.ndarray, values: np.ndarray) -> None:
        ok = np.isfinite(values) & (steps >= 0)
        if not ok.any():
            return
        steps = np.concatenate([self._steps, steps[ok]])
        values = np.concatenate([self._values, values[ok]])
        newest = steps[-1]
        keep = (steps > newest - self.span) & (steps <= newest)
        self._steps, self._values = steps[keep], values[keep]

    def trend(self) -> Trend | None:
        """None when nothing was logged."""
        v, s = self._values, self._steps
        if len(v) == 0:
            return None
        growth = math.nan
        if len(v) >= 4:
            tenth = max(1, len(v) // 10)
            first = float(np.median(v[:tenth]))
            if first > 0:
                growth = float(np.median(v[-tenth:])) / first
        slope = math.nan
        pos = v > 0
        if pos.sum() >= 3 and np.ptp(s[pos]) > 0:
            slope = float(np.polyfit(s[pos].astype(np.float64), np.log(v[pos]), 1)[0]) * 1000.0
        return Trend(float(v[-1]), growth, slope)


def grows_alone(trends: list[Trend | None]) -> list[bool]:
    """Per run: its metric grows while every other run that logs it stays flat (needs two runs)."""
    logged = [t for t in trends if t is not None]
    out = []
    for t in trends:
        others = [o for o in logged if o is not t]
        out.append(t is not None and t.grows and bool(others) and all(o.flat for o in others))
    return out


@dataclass(frozen=True)
class TrendRow:
    """One line of compare's table: a run's metric, its trend, and whether it grows alone."""

    run: str
    metric: str
    trend: Trend | None
    grows_alone: bool

    def cells(self) -> tuple[str, str, str]:
        """last, growth and slope as printed in the console and HTML tables."""
        t = self.trend
        if t is None:
            return "not logged", "", ""
        slope = f"{t.slope:+.3g}" if math.isfinite(t.slope) else "-"
        return number(t.last), f"{number(t.growth)}x" if math.isfinite(t.growth) else "-", slope


def trend_rows(labels: list[str], windows: list[dict[str, RecentWindow]], metrics: list[str]) -> list[TrendRow]:
    """Per run and metric, in run order; the marking compares the runs metric by metric."""
    table: dict[str, list[TrendRow]] = {}
    for metric in metrics:
        trends = [w[metric].trend() if metric in w else None for w in windows]
        marks = grows_alone(trends)
        table[metric] = [TrendRow(lab, metric, t, m) for lab, t, m in zip(labels, trends, marks, strict=True)]
    return [table[m][i] for i in range(len(labels)) for m in metrics]

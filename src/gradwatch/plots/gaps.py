"""Where a drawn line must stop: steps the log skipped, and steps whose value blew up.

Why: a line drawn straight across 280 steps that were never logged, or across a NaN, shows a
trend that no step had (a loss scale "sliding" from 2^16 to 2^14). A gap is a stretch without
any record longer than `GAP_INTERVALS` log intervals, the interval being the run's most common
step between records; a non-finite value breaks its own metric's line and is drawn as a band.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from gradwatch.downsample import MinMaxBuckets

#: Missing log intervals in a row from which the line is broken.
GAP_INTERVALS = 5
#: Distinct intervals counted (the most common one is the log interval): bounds the memory.
_MAX_INTERVAL = 1 << 20


class LogInterval:
    """The most common positive distance between consecutive records' x, counted batch by batch."""

    def __init__(self) -> None:
        self._counts: Counter[float] = Counter()
        self._last: float | None = None

    def add(self, x: np.ndarray) -> None:
        x = x[np.isfinite(x) & (x >= 0)]
        if not len(x):
            return
        if self._last is not None:
            x = np.concatenate([[self._last], x])
        self._last = float(x[-1])
        steps = np.diff(x)
        steps = steps[(steps > 0) & (steps <= _MAX_INTERVAL)]
        values, counts = np.unique(steps, return_counts=True)
        self._counts.update(dict(zip(values.tolist(), counts.tolist(), strict=True)))

    def value(self) -> float:
        """The log interval (1 when fewer than two records were seen)."""
        return self._counts.most_common(1)[0][0] if self._counts else 1.0


def find_gaps(records: MinMaxBuckets, interval: float) -> list[tuple[float, float]]:
    """The stretches without records longer than `GAP_INTERVALS` intervals: (last x before, first after).

    `records` holds each record's x as its value too, so a bucket's minimum and maximum are the
    first and last x it saw: the distance between buckets is exact, whatever their width.
    """
    if len(records) < 2:
        return []
    env = records.envelope(len(records))
    last, first = env.hi[:-1], env.lo[1:]
    wide = first - last > GAP_INTERVALS * interval
    return list(zip(last[wide].tolist(), first[wide].tolist(), strict=True))


def bands(steps: MinMaxBuckets, interval: float) -> list[tuple[float, float]]:
    """Stretches of non-finite steps, each widened by half an interval on both sides so that one
    step is a visible band; stretches less than two intervals apart are one band."""
    if not len(steps):
        return []
    env = steps.envelope(len(steps))
    out: list[tuple[float, float]] = []
    for lo, hi in zip(env.lo.tolist(), env.hi.tolist(), strict=True):
        if out and lo - out[-1][1] <= 1.5 * interval:
            out[-1] = (out[-1][0], hi + interval / 2)
        else:
            out.append((lo - interval / 2, hi + interval / 2))
    return out


def broken(xs: np.ndarray, ys: np.ndarray, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The polyline with a NaN point (a break) between consecutive points that have a break
    position strictly between them, or at the later one."""
    if not len(at) or len(xs) < 2:
        return xs, ys
    at = np.sort(at)
    passed = np.searchsorted(at, xs, side="left")
    cut = np.flatnonzero(np.diff(passed) > 0) + 1
    if not len(cut):
        return xs, ys
    return np.insert(xs, cut, np.nan), np.insert(ys, cut, np.nan)

"""The run-level spike score of OLMo 2: the percentage of logged steps more than 7 sigma away
from the rolling mean of the previous 1000 values, for the loss and for the grad norm.

One number per metric that says how rough a run was, comparable across runs. Computed
incrementally with the last `window` values carried across batches.

A window's sums are those of two blocks of the run's values, blocks of `window` values counted
from the run's first (`window_stats`): the sum from the window's start to the end of its first
block, and from the start of the next block to the window's end. Each adds only values inside
the window, so a huge value leaves no residue once it is out (running sums kept it as a rounding
error: 184 spikes counted after one 1e12 among unit noise, not 1), and each value's stats are
the same bits however the run was cut into batches (pandas' compensated running sums depend,
in their last bits, on where a batch began). Sums are taken about the median of the run's first
100 values, against cancellation: in windows of 1000 the stats agree with numpy's two passes
over each window to 1e-9 of the spread (pandas' were off by 2e-4 where values of 1e6 had passed
through), however far the first value lies from the rest. It costs a few numpy passes per batch,
a third less than pandas' rolling mean and std.
"""

from __future__ import annotations

import bottleneck as bn
import numpy as np

from gradwatch.records import Columns

METRICS = ("loss", "grad_norm")


class SpikeScore:
    #: per metric, the finite values seen (where the blocks begin) and the median of the first
    #: `min_periods` of them (the origin the sums are taken from, against cancellation: not the
    #: first value, which may be an outlier); class defaults, so that scores pickled in a scan
    #: state before they existed still load (blocks then begin at its tail)
    _seen: dict[str, int] = {}
    _origin: dict[str, float] = {}

    def __init__(self, window: int = 1000, sigmas: float = 7.0, min_periods: int = 100) -> None:
        self.window, self.sigmas, self.min_periods = window, sigmas, min_periods
        self._tails = {m: np.empty(0) for m in METRICS}
        self.spikes = dict.fromkeys(METRICS, 0)
        self.counted = dict.fromkeys(METRICS, 0)
        self._seen = dict.fromkeys(METRICS, 0)
        self._origin = {}

    def update(self, records: Columns) -> None:
        for m in METRICS:
            v = records[m]
            v = v[np.isfinite(v)]
            if len(v) == 0:
                continue
            tail = self._tails[m]
            seen = self._seen.get(m, len(tail))
            joined = np.concatenate([tail, v])
            origin = self._origin.get(m)
            first = max(1, min(self.min_periods, self.window))
            if origin is None and seen + len(v) >= first:  # (before, every window has too few values)
                origin = float(bn.median(joined[:first]))  # all of the run so far: fewer than `window`
                self._origin = {**self._origin, m: origin}
            mean, std = window_stats(joined, len(tail), seen - len(tail), self.window, origin or 0.0, self.min_periods)
            judged = np.isfinite(mean) & np.isfinite(std) & (std > 0)
            self.spikes[m] += int(np.sum(np.abs(v[judged] - mean[judged]) > self.sigmas * std[judged]))
            self.counted[m] += int(judged.sum())
            self._tails[m] = joined[-self.window :]
            self._seen = {**self._seen, m: seen + len(v)}

    def percent(self) -> dict[str, float | None]:
        """Spike score per metric in percent, None where too few values were logged."""
        return {m: (100.0 * self.spikes[m] / self.counted[m] if self.counted[m] else None) for m in METRICS}


@np.errstate(over="ignore", invalid="ignore", divide="ignore")  # values near the largest float: inf, NaN
def window_stats(
    joined: np.ndarray, start: int, first: int, window: int, origin: float, min_periods: int
) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard deviation (ddof 1) of the `window` values before each of `joined[start:]`
    (NaN with fewer than `min_periods`; 0 where they are all equal).

    `joined[0]` is the run's value number `first`; `joined` holds the `window` values before
    `joined[start]` (all of them, early in the run). Blocks of `window` values begin at the run's
    multiples of `window` (see the module docstring and `_window_sums`).
    """
    n = len(joined)
    begin = max(start, 1)  # the run's first value has no window
    total, count = _window_sums(joined, begin, first, window, origin, 1)
    squares, _ = _window_sums(joined, begin, first, window, origin, 2)
    variance = np.maximum((squares - total * total / count) / (count - 1), 0.0)
    # all values of a window equal: no spread, whatever the rounding of the sums
    changes = np.concatenate([[0], np.cumsum(joined[1:] != joined[:-1])])
    ends = np.arange(begin, n)
    std = np.where(changes[ends - 1] == changes[np.maximum(ends - window, 0)], 0.0, np.sqrt(variance))
    mean = origin + total / count
    few = count < min_periods
    mean[few], std[few | (count < 2)] = np.nan, np.nan
    if begin == start:
        return mean, std
    return np.concatenate([[np.nan], mean]), np.concatenate([[np.nan], std])


@np.errstate(over="ignore", invalid="ignore")
def window_means(joined: np.ndarray, start: int, first: int, window: int, origin: float) -> np.ndarray:
    """`window_stats`' means alone (NaN where no value came before), at half its cost."""
    begin = max(start, 1)
    total, count = _window_sums(joined, begin, first, window, origin, 1)
    mean = origin + total / count
    return mean if begin == start else np.concatenate([[np.nan], mean])


def _window_sums(
    joined: np.ndarray, begin: int, first: int, window: int, origin: float, power: int
) -> tuple[np.ndarray, np.ndarray]:
    """The sums of the `power`s of (value - `origin`) over the windows before each of
    `joined[begin:]`, and how many values each window holds.

    With `at` a value's place among the blocks, its window's sum is that of its block up to it
    (`up_to`) plus, once `window` values came before it, that of the block `window` places back
    from there to its end (`on_from`).
    """
    n = len(joined)
    # a window longer than the run so far holds all of it, as does one of the run's length plus
    # one: blocks that long (a window of 2**62 is a valid setting) would not fit in memory
    window = min(window, first + n + 1)
    offset = first % window  # the place of joined[0] among the blocks
    at = slice(offset + begin, offset + n)
    # of those, the ones with a full window before them: from the run's value number `window` on
    full = max(at.start, offset + window - first)
    values = np.zeros(-(-(offset + n) // window) * window)
    values[offset : offset + n] = joined - origin
    if power == 2:
        values *= values
    blocks = values.reshape(-1, window)
    up_to = np.zeros_like(blocks)  # each block from its start to the value before
    np.cumsum(blocks[:, :-1], axis=1, out=up_to[:, 1:])
    # each block from a value to its end: the blocks reversed, summed from their start
    on_from = np.cumsum(values[::-1].reshape(-1, window), axis=1).ravel()[::-1]
    summed = up_to.ravel()[at].copy()
    if full < at.stop:
        summed[full - at.start :] += on_from[full - window : at.stop - window]
    count = np.minimum(np.arange(first + begin, first + n), window).astype(np.float64)
    return summed, count

"""The run-level spike score of OLMo 2: the percentage of logged steps more than 7 sigma away
from the rolling mean of the previous 1000 values, for the loss and for the grad norm.

One number per metric that says how rough a run was, comparable across runs. Computed
incrementally with the last `window` values carried across batches.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gradwatch.records import Columns

METRICS = ("loss", "grad_norm")

#: Batches of up to this many values per metric take the plain numpy path (a live tail's batch of
#: a record or two: pandas' rolling set-up would cost more than the arithmetic).
_FEW = 8


class SpikeScore:
    def __init__(self, window: int = 1000, sigmas: float = 7.0, min_periods: int = 100) -> None:
        self.window, self.sigmas, self.min_periods = window, sigmas, min_periods
        self._tails = {m: np.empty(0) for m in METRICS}
        self.spikes = dict.fromkeys(METRICS, 0)
        self.counted = dict.fromkeys(METRICS, 0)

    def update(self, records: Columns) -> None:
        for m in METRICS:
            v = records[m]
            v = v[np.isfinite(v)]
            if len(v) == 0:
                continue
            tail = self._tails[m]
            joined = np.concatenate([tail, v])
            mean, std = self._previous_stats(joined, len(tail))
            judged = np.isfinite(mean) & np.isfinite(std) & (std > 0)
            self.spikes[m] += int(np.sum(np.abs(v[judged] - mean[judged]) > self.sigmas * std[judged]))
            self.counted[m] += int(judged.sum())
            self._tails[m] = joined[-self.window :]

    def _previous_stats(self, joined: np.ndarray, start: int) -> tuple[np.ndarray, np.ndarray]:
        """Mean and standard deviation of the `window` values before each of `joined[start:]`
        (NaN with fewer than `min_periods` of them)."""
        n = len(joined) - start
        if n > _FEW:
            roll = pd.Series(joined).rolling(self.window, min_periods=self.min_periods)
            return roll.mean().shift(1).to_numpy()[start:], roll.std().shift(1).to_numpy()[start:]
        mean, std = np.full(n, np.nan), np.full(n, np.nan)
        for i in range(n):
            end = start + i
            before = joined[max(0, end - self.window) : end]
            if len(before) < self.min_periods:
                continue
            lo = before.min()
            if lo == before.max():  # no spread at all: numpy's mean of equal values may be an ulp off
                mean[i], std[i] = lo, 0.0
            else:
                mean[i], std[i] = before.mean(), before.std(ddof=1)
        return mean, std

    def percent(self) -> dict[str, float | None]:
        """Spike score per metric in percent, None where too few values were logged."""
        return {m: (100.0 * self.spikes[m] / self.counted[m] if self.counted[m] else None) for m in METRICS}

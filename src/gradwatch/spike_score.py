"""The run-level spike score of OLMo 2: the percentage of logged steps more than 7 sigma away
from the rolling mean of the previous 1000 values, for the loss and for the grad norm.

One number per metric that says how rough a run was, comparable across runs. Computed
incrementally with the last `window` values carried across batches.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

METRICS = ("loss", "grad_norm")


class SpikeScore:
    def __init__(self, window: int = 1000, sigmas: float = 7.0, min_periods: int = 100) -> None:
        self.window, self.sigmas, self.min_periods = window, sigmas, min_periods
        self._tails = {m: np.empty(0) for m in METRICS}
        self.spikes = dict.fromkeys(METRICS, 0)
        self.counted = dict.fromkeys(METRICS, 0)

    def update(self, records: pd.DataFrame) -> None:
        for m in METRICS:
            v = records[m].to_numpy()
            v = v[np.isfinite(v)]
            if len(v) == 0:
                continue
            tail = self._tails[m]
            joined = pd.Series(np.concatenate([tail, v]))
            roll = joined.rolling(self.window, min_periods=self.min_periods)
            mean = roll.mean().shift(1).to_numpy()[len(tail) :]
            std = roll.std().shift(1).to_numpy()[len(tail) :]
            judged = np.isfinite(mean) & np.isfinite(std) & (std > 0)
            self.spikes[m] += int(np.sum(np.abs(v[judged] - mean[judged]) > self.sigmas * std[judged]))
            self.counted[m] += int(judged.sum())
            self._tails[m] = joined.to_numpy()[-self.window :]

    def percent(self) -> dict[str, float | None]:
        """Spike score per metric in percent, None where too few values were logged."""
        return {m: (100.0 * self.spikes[m] / self.counted[m] if self.counted[m] else None) for m in METRICS}

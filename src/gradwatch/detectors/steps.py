"""Step bookkeeping shared by detectors: the log interval, and gaps that make history stale."""

from __future__ import annotations

import numpy as np

from gradwatch.detectors.base import SMALL_BATCH


class StepGaps:
    """Splits a detector's rows where the step jumps far ahead of the log interval.

    The interval is the smallest positive step difference seen so far (a log printed every 10
    iterations has interval 10). A jump of more than `factor` intervals means the log skipped a
    stretch of training (an excerpt, or a long gap): baselines from before it are stale.
    """

    def __init__(self, factor: float) -> None:
        self.factor = factor
        self.interval: int | None = None
        self.last_step: int | None = None
        #: the interval known after each row of the last `segments` call (0: not known yet)
        self.row_intervals = np.zeros(0, dtype=np.int64)

    def segments(self, steps: np.ndarray) -> list[tuple[int, int, bool]]:
        """(start, end, reset) slices of `steps`; `reset` says the slice follows a stale gap."""
        if len(steps) == 0:
            return []
        resets = self._resets_few(steps) if len(steps) <= SMALL_BATCH else self._resets(steps)
        bounds = [0, *resets, len(steps)]
        return [
            (lo, hi, lo > 0 or (len(resets) > 0 and resets[0] == 0))
            for lo, hi in zip(bounds, bounds[1:], strict=False)
            if hi > lo
        ]

    def _resets_few(self, steps: np.ndarray) -> list[int]:
        """`_resets` row by row, for a live tail's batch of a record or two (numpy's set-up would dominate)."""
        interval, last = self.interval, self.last_step
        resets: list[int] = []
        intervals: list[int] = []
        for i, step in enumerate(steps.tolist()):
            diff = 0 if last is None else step - last
            if diff > 0:
                if interval is not None and diff > self.factor * interval:
                    resets.append(i)
                interval = diff if interval is None else min(interval, diff)
            intervals.append(interval or 0)
            last = step
        self.interval, self.last_step = interval, last
        self.row_intervals = np.array(intervals, dtype=np.int64)
        return resets

    def _resets(self, steps: np.ndarray) -> list[int]:
        """Rows where the step jumps past `factor` log intervals; updates the interval and `row_intervals`."""
        no_interval = np.iinfo(np.int64).max
        last = self.last_step if self.last_step is not None else -1
        diffs = steps - np.concatenate([[last], steps[:-1]])
        if self.last_step is None:
            diffs[0] = 0
        positive = np.where(diffs > 0, diffs, no_interval)
        start_interval = self.interval if self.interval is not None else no_interval
        interval_after = np.minimum.accumulate(np.concatenate([[start_interval], positive]))
        interval_before = interval_after[:-1]
        known = interval_before != no_interval
        resets = np.flatnonzero((diffs > 0) & known & (diffs > self.factor * np.where(known, interval_before, 1)))
        self.last_step = int(steps[-1])
        self.interval = None if interval_after[-1] == no_interval else int(interval_after[-1])
        self.row_intervals = np.where(interval_after[1:] == no_interval, 0, interval_after[1:])
        return resets.tolist()

"""Step bookkeeping shared by detectors: the log interval, and gaps that make history stale."""

from __future__ import annotations

import numpy as np


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

    def segments(self, steps: np.ndarray) -> list[tuple[int, int, bool]]:
        """(start, end, reset) slices of `steps`; `reset` says the slice follows a stale gap."""
        out: list[tuple[int, int, bool]] = []
        start, reset = 0, False
        for i, step in enumerate(steps.tolist()):
            last = self.last_step
            if last is not None:
                diff = step - last
                if diff > 0 and self.interval is not None and diff > self.factor * self.interval:
                    if i > start:
                        out.append((start, i, reset))
                    start, reset = i, True
                if diff > 0 and (self.interval is None or diff < self.interval):
                    self.interval = diff
            self.last_step = step
        if start < len(steps):
            out.append((start, len(steps), reset))
        return out

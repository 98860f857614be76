"""Skipped steps: optimizer steps skipped silently, faster than the fp16 sawtooth explains.

Sources: DeepSpeed's cumulative `step=N, skipped=K` lines (`step=2000, skipped=1995` is a run
that trained on nothing), and Megatron's per-interval `number of skipped iterations`. After the
start-up calibration, a skip rate over `max_rate` in the last `window` steps is a warning; a run
where nearly every step so far was skipped (`all_skipped_fraction`, after `min_steps`) is critical.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from gradwatch.alerts import Alert, Severity
from gradwatch.detectors.base import BuiltInConfig, Detector, columns
from gradwatch.events import SkipCounts
from gradwatch.parsers.stream import Batch

_HINT = (
    "skipped steps do not train: with fp16 the loss scale keeps overflowing (see loss_scale "
    "alerts; consider bf16 or a lower learning rate); otherwise check for NaN gradients"
)


@dataclass(frozen=True, kw_only=True)
class SkippedStepsConfig(BuiltInConfig):
    positive: ClassVar[tuple[str, ...]] = ("window",)
    window: int = 100
    max_rate: float = 0.25
    all_skipped_fraction: float = 0.9
    min_steps: int = 50
    calibration_steps: int = 100
    quiet_steps: int = 500


class _SkipCounter:
    """Skip bookkeeping for one source of counts (DeepSpeed's cumulative, or Megatron's per-log)."""

    def __init__(self) -> None:
        self.total_steps = 0.0
        self.total_skipped = 0.0
        self.recent: deque[tuple[int, float]] = deque()  # (step, skipped) of logs that skipped
        self.recent_sum = 0.0
        self.all_alerted = False
        self.quiet_until = -(10**18)

    def forget_before(self, step: int) -> None:
        """Drop the skips logged before `step` from the window (an empty window sums to exactly
        0: counts beyond 2**53 would leave a rounding residue that reads as skips)."""
        while self.recent and self.recent[0][0] < step:
            self.recent_sum -= self.recent.popleft()[1]
        if not self.recent:
            self.recent_sum = 0.0


class SkippedSteps(Detector):
    id = "skipped_steps"
    description = "optimizer steps skipped faster than the fp16 sawtooth explains, or all of them"
    Config = SkippedStepsConfig
    config: SkippedStepsConfig

    def __init__(self, config: SkippedStepsConfig | None = None, path: str = "") -> None:
        super().__init__(config, path)
        self._deepspeed = _SkipCounter()
        self._megatron = _SkipCounter()
        self._last_progress: tuple[int, int] | None = None  # DeepSpeed (step, cumulative skipped)
        self._last_record_step: int | None = None

    def update(self, batch: Batch) -> list[Alert]:
        alerts = self._progress(batch.skip_counts)
        rec = columns(batch)
        skipped = rec["skipped"]
        ok = np.isfinite(skipped)
        if ok.any():
            alerts += self._records(rec["step"][ok], rec["line"][ok], skipped[ok])
        return alerts

    def _progress(self, counts: SkipCounts) -> list[Alert]:
        """DeepSpeed's `step=N, skipped=K` lines: K is cumulative. Each line is compared with the
        one before it; a step that does not go forward, or a count that goes back, is another
        engine's counter or a restart, and counts nothing."""
        if not len(counts):
            return []
        steps, totals = counts.step, counts.skipped
        last = self._last_progress if self._last_progress is not None else (0, 0)
        prev_step = np.concatenate([[last[0]], steps[:-1]])
        prev_total = np.concatenate([[last[1]], totals[:-1]])
        forward = (steps > prev_step) & (totals >= prev_total)
        if self._last_progress is None:
            forward[0] = True  # the first line covers the steps from the start
        self._last_progress = (int(steps[-1]), int(totals[-1]))
        counted = np.flatnonzero(forward & (steps > prev_step))
        if not len(counted):
            return []
        steps = steps[counted]
        covered, skipped = steps - prev_step[counted], (totals - prev_total)[counted].astype(np.float64)
        c = self._deepspeed
        if not _in_step_order(c, steps):  # after a restart: each line is looked at in turn
            observe = np.ones(len(steps), dtype=bool)
        else:
            observe = skipped > 0
            # a line that skipped nothing still alerts where the window holds earlier skips, or
            # where the count of steps reaches `min_steps` with nearly all of them skipped
            never = np.iinfo(np.int64).min
            skip_steps = np.where(observe, steps, never)
            last_skip = np.maximum.accumulate(np.concatenate([[c.recent[-1][0] if c.recent else never], skip_steps]))
            observe |= last_skip[:-1] > steps - self.config.window
            observe |= self._all_skipped_at(c, covered, skipped)
        alerts = self._observe_many(c, counts.line[counted], steps, covered, skipped, observe, in_turn=True)
        c.forget_before(int(steps[-1]) - self.config.window + 1)  # as the lines not observed would have
        return alerts

    def _records(self, steps: np.ndarray, lines: np.ndarray, skipped: np.ndarray) -> list[Alert]:
        """Megatron's per-log `number of skipped iterations`: only logs that skipped can alert."""
        prev = np.concatenate([[self._last_record_step if self._last_record_step is not None else -1], steps[:-1]])
        self._last_record_step = int(steps[-1])
        covered = np.where((prev >= 0) & (steps > prev), steps - prev, 0)
        counted = covered > 0
        skipped = np.where(counted, skipped, 0.0)
        return self._observe_many(self._megatron, lines, steps, covered, skipped, counted & (skipped > 0))

    def _all_skipped_at(self, c: _SkipCounter, covered: np.ndarray, skipped: np.ndarray) -> np.ndarray:
        """Per line, whether the totals after it meet the all-skipped test (`_observe`'s first)."""
        if c.all_alerted:
            return np.zeros(len(covered), dtype=bool)
        cfg = self.config
        steps_after, skipped_after = _running(c.total_steps, covered)[1:], _running(c.total_skipped, skipped)[1:]
        return (steps_after >= cfg.min_steps) & (skipped_after >= cfg.all_skipped_fraction * steps_after)

    def _observe_many(
        self,
        c: _SkipCounter,
        lines: np.ndarray,
        steps: np.ndarray,
        covered: np.ndarray,
        skipped: np.ndarray,
        observe: np.ndarray,
        in_turn: bool = False,
    ) -> list[Alert]:
        """`_observe` each of the lines that `observe` marks, with the totals as if every line
        before had been observed; the others only add to the totals (they cannot alert).
        `in_turn`: the lines go forward in steps, and the window also drops, before each line
        observed, what the lines before it would have dropped (in the same order, so that even
        sums beyond 2**53 round as observing every line does)."""
        totals, skips = _running(c.total_steps, covered), _running(c.total_skipped, skipped)
        alerts: list[Alert] = []
        for pos in np.flatnonzero(observe).tolist():
            if in_turn and pos and not observe[pos - 1]:
                c.forget_before(int(steps[pos - 1]) - self.config.window + 1)
            c.total_steps, c.total_skipped = float(totals[pos]), float(skips[pos])
            alert = self._observe(c, int(lines[pos]), int(steps[pos]), int(covered[pos]), float(skipped[pos]))
            if alert is not None:
                alerts.append(alert)
        c.total_steps, c.total_skipped = float(totals[-1]), float(skips[-1])
        return alerts

    def _observe(self, c: _SkipCounter, line: int, step: int, covered: int, skipped: float) -> Alert | None:
        cfg = self.config
        c.total_steps += covered
        c.total_skipped += skipped
        if skipped > 0:
            c.recent.append((step, skipped))
            c.recent_sum += skipped
        c.forget_before(step - cfg.window + 1)
        if (
            not c.all_alerted
            and c.total_steps >= cfg.min_steps
            and c.total_skipped >= cfg.all_skipped_fraction * c.total_steps
        ):
            c.all_alerted = True
            return self.alert(
                Severity.CRITICAL,
                step,
                line,
                "skipped",
                c.total_skipped,
                None,
                cfg.all_skipped_fraction * c.total_steps,
                f"{c.total_skipped:.0f} of {c.total_steps:.0f} steps skipped: the run is not training",
                _HINT,
            )
        if step <= cfg.calibration_steps or step <= c.quiet_until:
            return None
        span = min(cfg.window, step)
        if c.recent_sum / span > cfg.max_rate:
            c.quiet_until = step + cfg.quiet_steps
            return self.alert(
                Severity.WARNING,
                step,
                line,
                "skipped",
                c.recent_sum,
                None,
                cfg.max_rate * span,
                f"{c.recent_sum:.0f} of the last {span} steps were skipped "
                f"(rate {c.recent_sum / span:.2f} > {cfg.max_rate:g})",
                _HINT,
            )
        return None


def _running(start: float, added: np.ndarray) -> np.ndarray:
    """`start`, then the total after each of `added`: summed in turn in floating point, as
    `_observe`'s `+=` sums them (numpy's accumulate adds in order), to the last bit."""
    return np.cumsum(np.concatenate([[start], added.astype(np.float64)]))


def _in_step_order(c: _SkipCounter, steps: np.ndarray) -> bool:
    """Whether the skips held and the counted lines `steps` go forward in steps: then the window
    drops what the lines not looked at would have dropped, and its newest skip is its latest."""
    held = np.array([step for step, _ in c.recent], dtype=np.int64)
    return bool((np.diff(np.append(held, steps)) >= 0).all() and (np.diff(steps) > 0).all())

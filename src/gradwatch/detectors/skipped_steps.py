"""Skipped steps: optimizer steps skipped silently, faster than the fp16 sawtooth explains.

Sources: DeepSpeed's cumulative `step=N, skipped=K` lines (`step=2000, skipped=1995` is a run
that trained on nothing), and Megatron's per-interval `number of skipped iterations`. After the
start-up calibration, a skip rate over `max_rate` in the last `window` steps is a warning; a run
where nearly every step so far was skipped (`all_skipped_fraction`, after `min_steps`) is critical.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from gradwatch.alerts import Alert, Severity
from gradwatch.detectors.base import Detector, DetectorConfig
from gradwatch.events import EventKind
from gradwatch.parsers.stream import Batch

_HINT = (
    "skipped steps do not train: with fp16 the loss scale keeps overflowing (see loss_scale "
    "alerts; consider bf16 or a lower learning rate); otherwise check for NaN gradients"
)


@dataclass(frozen=True, kw_only=True)
class SkippedStepsConfig(DetectorConfig):
    window: int = 100
    max_rate: float = 0.25
    all_skipped_fraction: float = 0.9
    min_steps: int = 50
    calibration_steps: int = 100
    quiet_steps: int = 500


class SkippedSteps(Detector):
    id = "skipped_steps"
    description = "optimizer steps skipped faster than the fp16 sawtooth explains, or all of them"
    Config = SkippedStepsConfig
    config: SkippedStepsConfig

    def __init__(self, config: SkippedStepsConfig | None = None, path: str = "") -> None:
        super().__init__(config, path)
        self._last: tuple[int, int] | None = None  # DeepSpeed (step, cumulative skipped)
        self._last_record_step: int | None = None
        self._recent: deque[tuple[int, float]] = deque()  # (step, skipped in that stretch)
        self._recent_sum = 0.0
        self._total_steps = 0.0
        self._total_skipped = 0.0
        self._quiet_until = -(10**18)
        self._all_alerted = False

    def update(self, batch: Batch) -> list[Alert]:
        rec = batch.records
        items: list[tuple[int, int, int, float]] = []  # line, step, steps covered, skipped
        for ev in batch.events:
            if ev.kind is EventKind.SKIP_COUNT and ev.step is not None:
                total = int(ev.data["skipped"])
                if self._last is not None and ev.step > self._last[0] and total >= self._last[1]:
                    items.append((ev.line, ev.step, ev.step - self._last[0], float(total - self._last[1])))
                elif self._last is None and ev.step > 0:
                    items.append((ev.line, ev.step, ev.step, float(total)))
                self._last = (ev.step, total)
        skipped = rec["skipped"].to_numpy()
        steps, lines = rec["step"].to_numpy(), rec["line"].to_numpy()
        for pos in np.flatnonzero(np.isfinite(skipped)):
            step = int(steps[pos])
            last, self._last_record_step = self._last_record_step, step
            if last is not None and step > last:
                items.append((int(lines[pos]), step, step - last, float(skipped[pos])))
        items.sort()
        alerts: list[Alert] = []
        for line, step, covered, k in items:
            alert = self._observe(line, step, covered, k)
            if alert is not None:
                alerts.append(alert)
        return alerts

    def _observe(self, line: int, step: int, covered: int, skipped: float) -> Alert | None:
        cfg = self.config
        self._total_steps += covered
        self._total_skipped += skipped
        self._recent.append((step, skipped))
        self._recent_sum += skipped
        while self._recent and self._recent[0][0] <= step - cfg.window:
            self._recent_sum -= self._recent.popleft()[1]
        if (
            not self._all_alerted
            and self._total_steps >= cfg.min_steps
            and self._total_skipped >= cfg.all_skipped_fraction * self._total_steps
        ):
            self._all_alerted = True
            return self.alert(
                Severity.CRITICAL,
                step,
                line,
                "skipped",
                self._total_skipped,
                None,
                cfg.all_skipped_fraction * self._total_steps,
                f"{self._total_skipped:.0f} of {self._total_steps} steps skipped: the run is not training",
                _HINT,
            )
        if step <= cfg.calibration_steps or step <= self._quiet_until:
            return None
        span = min(cfg.window, step)
        n = self._recent_sum
        if n / span > cfg.max_rate:
            self._quiet_until = step + cfg.quiet_steps
            return self.alert(
                Severity.WARNING,
                step,
                line,
                "skipped",
                n,
                None,
                cfg.max_rate * span,
                f"{n:.0f} of the last {span} steps were skipped (rate {n / span:.2f} > {cfg.max_rate:g})",
                _HINT,
            )
        return None

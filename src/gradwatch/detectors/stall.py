"""Stall: no new step for much longer than a step takes: a hung job (NCCL, I/O, a dead node).

In archived logs the clock is the log's own timestamps: the time of the last record (or, when
records carry no time, of the first timestamped line after it) against the latest timestamped
line of any kind (BLOOM tr11 after iteration 45000: only PULSE watchdog lines for hours), unless
the trainer said it exited or crashed after its last record (that is an end, not a hang). Gaps
between two timestamped records are reported too (the job hung, then went on). The limit is
max(`factor` x the typical time between records, `floor_s`); until the log has shown its pace
(a logged step time, or `min_gaps` timed records) nothing is judged. Live commands use the wall clock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from gradwatch.alerts import Alert, Severity
from gradwatch.detectors.base import Detector, DetectorConfig
from gradwatch.events import EventKind
from gradwatch.parsers.stream import Batch

_ENDS = (EventKind.RUN_END, EventKind.ERROR)

_HINT = (
    "the job stopped making steps while still alive: look for NCCL timeouts, a dead or slow node, "
    "a stuck data loader or checkpoint I/O; py-spy dump on the ranks shows where they wait"
)


@dataclass(frozen=True, kw_only=True)
class StallConfig(DetectorConfig):
    factor: float = 10.0
    floor_s: float = 600.0
    history: int = 50
    min_gaps: int = 1


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


class Stall(Detector):
    id = "stall"
    description = "no new step for max(10x the usual time between steps, 10 min)"
    Config = StallConfig
    config: StallConfig

    def __init__(self, config: StallConfig | None = None, path: str = "") -> None:
        super().__init__(config, path)
        self._gaps: deque[float] = deque(maxlen=self.config.history)  # seconds between records
        self._last: tuple[int, int, float] | None = None  # step, line, ts of the last timed record
        self._last_step: tuple[int, int] | None = None  # step, line of the last record
        self._last_step_ts: float | None = None
        self._last_ts: float | None = None
        self._ended = False  # the trainer exited or crashed after its last record

    def limit(self) -> float:
        """Seconds without a new step that count as a stall (inf until the usual pace is known)."""
        if len(self._gaps) < self.config.min_gaps:
            return float("inf")
        return max(self.config.factor * float(np.median(self._gaps)), self.config.floor_s)

    def update(self, batch: Batch) -> list[Alert]:
        rec = batch.records
        alerts: list[Alert] = []
        steps, lines = rec["step"].to_numpy(), rec["line"].to_numpy()
        ts, step_time = rec["ts"].to_numpy(), rec["step_time_s"].to_numpy()
        for pos in range(len(rec)):
            step, line = int(steps[pos]), int(lines[pos])
            if step < 0:
                continue
            prev_step = self._last_step
            if step_time[pos] == step_time[pos]:
                covered = step - prev_step[0] if prev_step and step > prev_step[0] else 1
                self._gaps.append(float(step_time[pos]) * covered)
            if ts[pos] == ts[pos]:
                t = float(ts[pos])
                if self._last is not None and step > self._last[0]:
                    gap = t - self._last[2]
                    if gap > self.limit():
                        alerts.append(self._stalled(self._last[0], self._last[1], gap, resumed_at=step))
                    elif step_time[pos] != step_time[pos] and gap > 0:
                        self._gaps.append(gap)
                self._last = (step, line, t)
            self._last_step = (step, line)
            self._ended = False
        last_line = self._last_step[1] if self._last_step else 0
        if any(ev.kind in _ENDS and ev.line > last_line for ev in batch.events):
            self._ended = True
        if batch.last_step_ts is not None:
            self._last_step_ts = batch.last_step_ts
        if batch.last_ts is not None:
            self._last_ts = batch.last_ts
        return alerts

    def finish(self) -> list[Alert]:
        if self._ended or self._last_step is None or self._last_ts is None or self._last_step_ts is None:
            return []
        silent = self._last_ts - self._last_step_ts
        if silent > self.limit():
            return [self._stalled(*self._last_step, silent, resumed_at=None)]
        return []

    def _stalled(self, step: int, line: int, seconds: float, resumed_at: int | None) -> Alert:
        limit = self.limit()
        then = f"; steps resumed at {resumed_at}" if resumed_at is not None else " while the log went on"
        return self.alert(
            Severity.WARNING,
            step,
            line,
            "step_time_s",
            seconds,
            None,
            limit,
            f"no new step for {_duration(seconds)} after step {step} (limit {_duration(limit)}){then}",
            _HINT,
        )

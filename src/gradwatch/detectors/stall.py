"""Stall: no new step for much longer than a step takes: a hung job (NCCL, I/O, a dead node).

In archived logs the clock is the log's own timestamps: the time of the last record (or, when
records carry no time, of the first timestamped line after it) against the latest timestamped
line of any kind (BLOOM tr11 after iteration 45000: only PULSE watchdog lines for hours), unless
the trainer said it exited or crashed after its last record (that is an end, not a hang). Gaps
between two timestamped records are reported too (the job hung, then went on); where records carry
no time (Megatron-DeepSpeed's iteration lines, Composer), the record's own logged step time times
the log interval is the time it took, and a hang that ended shows there too (Megatron's elapsed
time per iteration is the interval's wall time over its iterations). A gap with a checkpoint load
(or a start from random) in it is a crashed job that was requeued and resumed, not a hang: a clean
restart raises nothing here (resume_regression judges what it resumed to). The pace is kept per
step (a logged step time, or a gap between timed records over the steps it spans), and a gap is
judged against the pace of as many steps as it covers: the limit is max(`factor` x the typical
time per step x the steps between the two records, `floor_s`), so that the first interval of a
`--log-interval 100` log is not held to one step's time. Until the log has shown its pace (a
logged step time, or `min_gaps` timed records) nothing is judged. Live commands use the wall clock:
`wall_clock_stall(now, last_step_at)` takes the clock from its caller (scan: the file's mtime when
the last step was read), so the detector never reads the time itself and tests can set it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import ClassVar

import bottleneck as bn
import numpy as np

from gradwatch.alerts import Alert, Severity
from gradwatch.detectors.base import (
    SMALL_BATCH,
    BuiltInConfig,
    Detector,
    columns,
    median,
    moving_median,
)
from gradwatch.events import EventKind
from gradwatch.parsers.stream import Batch

_ENDS = (EventKind.RUN_END, EventKind.ERROR)
_RESTARTS = (EventKind.CHECKPOINT_LOAD, EventKind.START_FROM_RANDOM)
_NO_INTERVAL = int(np.iinfo(np.int64).max)

_HINT = (
    "the job stopped making steps while still alive: look for NCCL timeouts, a dead or slow node, "
    "a stuck data loader or checkpoint I/O; py-spy dump on the ranks shows where they wait"
)


@dataclass(frozen=True, kw_only=True)
class StallConfig(BuiltInConfig):
    positive: ClassVar[tuple[str, ...]] = ("history",)
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
        self._gaps: deque[float] = deque(maxlen=self.config.history)  # seconds per step, record by record
        self._last: tuple[int, int, float] | None = None  # step, line, ts of the last timed record
        self._last_step: tuple[int, int] | None = None  # step, line of the last record
        self._interval = _NO_INTERVAL  # smallest step difference between records so far
        self._last_step_ts: float | None = None
        self._last_ts: float | None = None
        self._ended = False  # the trainer exited or crashed after its last record
        self._wall_alerted: tuple[int, int] | None = None  # last step already reported as stalled
        self._last_restart = -1  # line of the latest checkpoint-load / start-from-random line

    def limit(self) -> float:
        """Seconds without a new step that count as a stall (inf until the usual pace is known):
        the next record is due one log interval of steps after the last."""
        if len(self._gaps) < self.config.min_gaps:
            return float("inf")
        steps = self._interval if self._interval != _NO_INTERVAL else 1
        per_step = median(np.asarray(self._gaps, dtype=np.float64))
        return max(self.config.factor * per_step * steps, self.config.floor_s)

    def update(self, batch: Batch) -> list[Alert]:
        rec = columns(batch)
        keep = rec["step"] >= 0
        restarts = np.array([self._last_restart, *(ev.line for ev in batch.events if ev.kind in _RESTARTS)])
        self._last_restart = int(restarts.max())
        alerts = (
            self._records(
                rec["step"][keep],
                rec["line"][keep],
                rec["ts"][keep],
                rec["step_time_s"][keep],
                np.sort(restarts),
            )
            if keep.any()
            else []
        )
        last_line = self._last_step[1] if self._last_step else 0
        if any(ev.kind in _ENDS and ev.line > last_line for ev in batch.events):
            self._ended = True
        if len(rec) or batch.last_step_ts is not None:
            # None while the newest record's time is unknown: an older record's time would be stale
            self._last_step_ts = batch.last_step_ts
        if batch.last_ts is not None:
            self._last_ts = batch.last_ts
        return alerts

    def _records(
        self, steps: np.ndarray, lines: np.ndarray, ts: np.ndarray, step_time: np.ndarray, restarts: np.ndarray
    ) -> list[Alert]:
        """The pace (step times, gaps between timed records) and the gaps that were stalls.

        Vectorised: each record's limit comes from the pace values logged before it. A gap with a
        restart in it (`restarts`: lines of checkpoint-load or start-from-random lines) was the job
        being requeued, not a hang.
        """
        cfg = self.config
        prev_step = np.concatenate([[self._last_step[0] if self._last_step else -1], steps[:-1]])
        prev_line = np.concatenate([[self._last_step[1] if self._last_step else -1], lines[:-1]])
        forward = (prev_step >= 0) & (steps > prev_step)
        # steps a record's logged step time covers: the log interval (smallest step difference so
        # far), never a jump of an excerpt or a resume that skipped ahead
        diffs = np.where(forward, steps - prev_step, _NO_INTERVAL)
        interval = np.minimum.accumulate(np.concatenate([[self._interval], diffs]))[1:]
        self._interval = int(interval[-1])
        covered = np.where(forward, np.minimum(diffs, interval), 1)
        # gaps between consecutive timed records (each against the timed record before it)
        timed = np.isfinite(ts)
        last_t = np.concatenate([[self._last[2] if self._last else np.nan], ts])
        last_s = np.concatenate([[self._last[0] if self._last else -1], steps]).astype(float)
        last_l = np.concatenate([[self._last[1] if self._last else -1], lines])
        idx = np.where(np.concatenate([[self._last is not None], timed]), np.arange(len(ts) + 1), 0)
        idx = np.maximum.accumulate(idx)[:-1]  # for each record: the timed record before it
        span = steps - last_s[idx]  # steps between a record and the timed record before it
        gap = np.where(timed & (span > 0), ts - last_t[idx], np.nan)
        # the pace in seconds per step: a logged step time, else a timed record's gap over its steps
        with np.errstate(divide="ignore", invalid="ignore"):
            pace = np.where(np.isfinite(step_time), step_time, np.where(gap > 0, gap / span, np.nan))
        tail = np.array(self._gaps, dtype=float)
        values = pace[np.isfinite(pace)]
        joined = np.concatenate([tail, values])
        before = len(tail) + np.cumsum(np.isfinite(pace)) - np.isfinite(pace)  # pace values before each row
        known = np.minimum(before, cfg.history) >= cfg.min_gaps
        ends = np.maximum(before - 1, 0)
        # the time each record took: by the log's clock where it has one, else by the trainer's own
        # step time (Megatron's interval mean, without timestamps, includes the hang)
        by_clock = np.isfinite(gap)
        took = np.where(by_clock, gap, np.where(forward, step_time * covered, np.nan))
        spanned = np.where(by_clock, span, covered)  # the steps that time covers
        # a median only where the window's bounds leave the record's judgement in doubt
        with np.errstate(over="ignore", invalid="ignore"):  # a huge factor: inf, still a bound
            needed = known & (took > np.maximum(self._least_limit(joined, ends) * spanned, cfg.floor_s))
            medians = np.full(len(ends), np.nan)
            medians[needed] = self._medians_through(joined, ends[needed])
            limit = np.where(known, np.maximum(cfg.factor * medians * spanned, cfg.floor_s), np.inf)
        alerts = []
        for i in np.flatnonzero(took > limit).tolist():
            s0, l0 = (last_s[idx[i]], last_l[idx[i]]) if by_clock[i] else (prev_step[i], prev_line[i])
            if np.searchsorted(restarts, l0, side="right") < np.searchsorted(restarts, lines[i]):
                continue  # a restart between the two records: downtime of a requeued job
            alerts.append(
                self._stalled(int(s0), int(l0), float(took[i]), resumed_at=int(steps[i]), limit=float(limit[i]))
            )
        self._gaps.extend(values[-cfg.history :].tolist())
        timed_rows = np.flatnonzero(timed)
        if len(timed_rows):
            i = int(timed_rows[-1])
            self._last = (int(steps[i]), int(lines[i]), float(ts[i]))
        self._last_step = (int(steps[-1]), int(lines[-1]))
        self._ended = False
        return alerts

    def _least_limit(self, joined: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """For each index in `ends`: the least `factor` x the median (per step) of the window
        `_medians_through` takes can be: its smallest value's (`factor` is not negative)."""
        padded = np.concatenate([joined, [np.nan]])  # an index past the end: no value yet
        width = min(self.config.history, len(padded))
        with np.errstate(over="ignore"):  # a huge factor: inf, still a bound
            return self.config.factor * bn.move_min(padded, width, min_count=1)[ends]

    def _medians_through(self, joined: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """For each index in `ends`: the median of the last `history` values of `joined` up to it (NaN: none)."""
        if len(ends) > SMALL_BATCH:
            padded = np.concatenate([joined, [np.nan]])  # an index past the end: no value yet
            return moving_median(padded, self.config.history)[ends]
        medians = np.full(len(ends), np.nan)
        for i, end in enumerate(ends.tolist()):
            window = joined[max(0, end - self.config.history + 1) : end + 1]
            if len(window):
                medians[i] = median(window)
        return medians

    def finish(self) -> list[Alert]:
        if self._ended or self._last_step is None or self._last_ts is None or self._last_step_ts is None:
            return []
        silent = self._last_ts - self._last_step_ts
        if silent > self.limit():
            return [self._stalled(*self._last_step, silent, resumed_at=None)]
        return []

    def wall_clock_stall(self, now: float, last_step_at: float) -> list[Alert]:
        """Is the run silent by the wall clock? For commands that watch live logs (scan, tail).

        `last_step_at` is when the last step was written (seconds since the epoch, like `now`).
        One alert per stalled step: a run that resumes and stalls again alerts again; a run whose
        log said it ended is not stalled.
        """
        if self._ended or self._last_step is None or self._last_step == self._wall_alerted:
            return []
        silent = now - last_step_at
        if silent <= self.config.floor_s or silent <= self.limit():  # the floor first: asked at every wake-up
            return []
        self._wall_alerted = self._last_step
        return [self._stalled(*self._last_step, silent, resumed_at=None, then=" (by the wall clock)")]

    def _stalled(
        self,
        step: int,
        line: int,
        seconds: float,
        resumed_at: int | None,
        then: str | None = None,
        limit: float | None = None,
    ) -> Alert:
        limit = self.limit() if limit is None else limit
        if then is None:
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

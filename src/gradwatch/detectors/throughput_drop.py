"""Throughput drop: TFLOPs or tokens/s well under the run's own baseline for a sustained stretch.

A slow GPU or node, thermal throttling or a degraded link drags the whole job. The metric is the
first of tflops, tps or 1/step_time_s that the log has. Baseline: the median of the previous
`window` values; a drop is `sustain` consecutive logs under `fraction` of it (single slow records
after a checkpoint save or validation do not count). A slow stretch that begins at the first
record after a checkpoint save or an evaluation is theirs while it lasts under `pause_logs`:
an asynchronous save (NeMo 2, torch_dist) writes in the background and slows the steps until it
is finalized, tens of steps later; a slow node stays slow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from gradwatch.alerts import Alert, Severity
from gradwatch.detectors.base import (
    BuiltInConfig,
    Detector,
    columns,
    prev_window_highest,
    prev_window_median,
)
from gradwatch.events import EventKind
from gradwatch.parsers.stream import Batch

_HINT = (
    "a slow GPU or node drags the job: compare per-rank step times, check GPU clocks/temperatures "
    "(nvidia-smi -q -d PERFORMANCE), ECC errors and the interconnect; exclude the slow node and restart"
)
_CANDIDATES = ("tflops", "tps", "step_time_s")
_PAUSES = (EventKind.CHECKPOINT_SAVE, EventKind.VALIDATION)


@dataclass(frozen=True, kw_only=True)
class ThroughputDropConfig(BuiltInConfig):
    positive: ClassVar[tuple[str, ...]] = ("window",)
    window: int = 100
    min_history: int = 10
    fraction: float = 0.7
    sustain: int = 5
    pause_logs: int = 50


class ThroughputDrop(Detector):
    id = "throughput_drop"
    description = "TFLOPs or tokens/s under 70% of the run's own baseline for 5+ logs"
    Config = ThroughputDropConfig
    config: ThroughputDropConfig
    #: class defaults for detectors pickled before the pause rule
    _low_after_pause = False
    _last_line = -1
    _last_pause = -1

    def __init__(self, config: ThroughputDropConfig | None = None, path: str = "") -> None:
        super().__init__(config, path)
        self._metric: str | None = None
        self._tail = np.empty(0)
        self._seen = 0
        self._low_run = 0
        self._low_start: tuple[int, int, float] | None = None  # step, line, baseline
        self._in_drop = False
        self._prev_low = False
        self._low_after_pause = False  # the slow stretch began right after a save or evaluation
        self._last_line = -1  # line of the last record read
        self._last_pause = -1  # line of the latest checkpoint-save or evaluation line

    def update(self, batch: Batch) -> list[Alert]:
        rec = columns(batch)
        pauses = np.sort([self._last_pause, *(ev.line for ev in batch.events if ev.kind in _PAUSES)])
        self._last_pause = int(pauses[-1])
        if self._metric is None:
            for name in _CANDIDATES:
                col = rec[name]
                if np.isfinite(col).any():
                    self._metric = name
                    break
            else:
                return []
        raw = rec[self._metric]
        ok = np.isfinite(raw) & (raw > 0)
        if not ok.any():
            return []
        values = raw[ok] if self._metric != "step_time_s" else 1.0 / raw[ok]
        steps, lines = rec["step"][ok], rec["line"][ok]
        prev_lines = np.concatenate([[self._last_line], lines[:-1]])
        # a save or evaluation line after the record before (up to this record's own line)
        after_pause = np.searchsorted(pauses, lines, side="right") > np.searchsorted(pauses, prev_lines, side="right")
        self._last_line = int(lines[-1])
        cfg = self.config
        wanted = None
        if cfg.fraction > 0:  # low only below a fraction of the window's largest; the log after a low too
            highest = prev_window_highest(self._tail, values, cfg.window)
            maybe = values < cfg.fraction * highest
            wanted = maybe | np.concatenate([[self._prev_low], maybe[:-1]])
        med, self._tail = prev_window_median(self._tail, values, cfg.window, wanted)
        n_prev = np.minimum(np.arange(self._seen, self._seen + len(values)), cfg.window)
        self._seen += len(values)
        low = (n_prev >= cfg.min_history) & (values < cfg.fraction * med)
        # only low logs and the first log after them change anything: the rest are skipped
        prev_low = np.concatenate([[self._prev_low], low[:-1]])
        self._prev_low = bool(low[-1])
        alerts: list[Alert] = []
        for pos in np.flatnonzero(low | prev_low).tolist():
            alert = self._observe(
                bool(low[pos]),
                int(steps[pos]),
                int(lines[pos]),
                float(values[pos]),
                float(med[pos]),
                bool(after_pause[pos]),
            )
            if alert is not None:
                alerts.append(alert)
        return alerts

    def _observe(self, low: bool, step: int, line: int, value: float, base: float, after_pause: bool) -> Alert | None:
        cfg = self.config
        label = {"tflops": "TFLOPs", "tps": "tokens/s", "step_time_s": "steps/s"}[self._metric or "tflops"]
        if low:
            if self._low_run == 0:
                self._low_start = (step, line, base)
                self._low_after_pause = after_pause
            self._low_run += 1
            sustain = max(cfg.sustain, cfg.pause_logs) if self._low_after_pause else cfg.sustain
            if self._low_run == sustain and not self._in_drop and self._low_start is not None:
                self._in_drop = True
                s0, l0, b0 = self._low_start
                return self.alert(
                    Severity.WARNING,
                    s0,
                    l0,
                    self._metric,
                    value,
                    b0,
                    cfg.fraction * b0,
                    f"{label} {value:.4g} is {value / b0:.0%} of the run's baseline {b0:.4g} "
                    f"for {sustain} logs since step {s0}",
                    _HINT,
                )
            return None
        self._low_run = 0
        if self._in_drop:
            self._in_drop = False
            return self.alert(
                Severity.INFO,
                step,
                line,
                self._metric,
                value,
                base,
                None,
                f"{label} back at {value / base:.0%} of the baseline",
                "no action needed",
            )
        return None

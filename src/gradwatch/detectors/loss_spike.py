"""Loss spike: a logged loss far above its recent history, then (usually) back down.

Two rules, as in the trainers that check for this themselves. With a short history (fewer than
`warmup` values) Megatron's spiky-loss idea: a factor over the recent median (`short_ratio`) and at
least `short_delta` nats. Past warm-up OLMo-core's: `z_alert` robust sigmas over the median of a
128-value window, and two bars that hold under the heavy tails of real per-step noise, where a
6-sigma test alone fires on ordinary bumps (a +16% two-step bump of a healthy torchtitan run, a
small-batch fine-tune's +29% batch): at least `min_rel_delta` of the median (one-step bumps of
10-20% are common in healthy runs; a spike worth stopping for is larger), and above the largest
step-to-step change (in log) of the window: the run has just shown noise that large, in either
direction, so a value within it is that noise again.

Megatron prints interval means (`--log-interval` 10 or 100), so a one-step spike shows diluted:
the relative floor is divided by the log interval (derived from the step numbers), while the
sigma test adapts by itself because interval means are less noisy too. The baseline median is
over OLMo-core's 128 *steps*: `window / interval` logs, at least `warmup` of them; 128 logs of
interval means span 1280 steps, and their median lags a falling loss so far that a 10% spike at
log interval 10 early in a run stayed under it. The noise is still measured over the last
`window` logs (a 20-value MAD is too unsteady: 3-sigma bumps passed for 6), on the log-to-log
differences (1.4826 x their MAD / sqrt 2): the same as the MAD of the values for pure noise, but
the run's own downward trend over the window is not counted as noise. A spike on a record that
reports skipped iterations during the fp16 start-up calibration is info only: the loss of the
first fp16 steps jumps while the scaler is still finding its range.

Severity: `critical_ratio` times the median or more is critical, less a warning. A spike that
grows within its incident escalates once per level (`Incident`): 1.6x then 4x is a warning, then
a critical alert.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from gradwatch.alerts import Alert, Severity
from gradwatch.detectors.base import (
    BuiltInConfig,
    Detector,
    Incident,
    columns,
    median,
    prev_window_median,
)
from gradwatch.detectors.steps import StepGaps
from gradwatch.parsers.stream import Batch

_HINT = (
    "look at the data batch at this step (bad or repeated samples), the learning rate, and the "
    "grad norm just before it; if the loss does not come back, roll back to an earlier checkpoint "
    "and skip the offending batches"
)


@dataclass(frozen=True, kw_only=True)
class LossSpikeConfig(BuiltInConfig):
    positive: ClassVar[tuple[str, ...]] = ("window",)
    window: int = 128
    warmup: int = 20
    short_ratio: float = 1.5
    short_delta: float = 1.0
    z_alert: float = 6.0
    min_rel_delta: float = 0.3
    sigma_floor: float = 0.005
    critical_ratio: float = 3.0
    calibration_steps: int = 100
    gap_factor: float = 20.0
    quiet: int = 20


def _above_tails(value: float, base: float, recent: np.ndarray) -> bool:
    """Is `value` further above `base` (in log) than the largest step-to-step change of `recent`?
    (True where a loss is not positive: no logarithm, the other rules decide.)"""
    if value <= 0 or base <= 0 or not (recent > 0).all():
        return True
    return math.log(value / base) > float(np.abs(np.diff(np.log(recent))).max(initial=0.0))


class LossSpike(Detector):
    id = "loss_spike"
    description = "loss far above its recent history (factor rule early, robust 6-sigma after)"
    Config = LossSpikeConfig
    config: LossSpikeConfig

    def __init__(self, config: LossSpikeConfig | None = None, path: str = "") -> None:
        super().__init__(config, path)
        self._tail = np.empty(0)
        self._seen = 0
        self._gaps = StepGaps(self.config.gap_factor)
        self._incident = Incident(self.config.quiet)

    def update(self, batch: Batch) -> list[Alert]:
        rec = columns(batch)
        loss = rec["loss"]
        ok = np.isfinite(loss)
        if not ok.any():
            return []
        loss = loss[ok]
        steps, lines = rec["step"][ok], rec["line"][ok]
        skipped = np.nan_to_num(rec["skipped"][ok], nan=0.0)
        alerts: list[Alert] = []
        segments = self._gaps.segments(steps)
        intervals = np.maximum(self._gaps.row_intervals, 1)  # the log interval known at each row
        for lo, hi, reset in segments:
            if reset:
                self._tail = np.empty(0)
            alerts += self._segment(loss[lo:hi], steps[lo:hi], lines[lo:hi], skipped[lo:hi], intervals[lo:hi])
        return alerts

    def _segment(
        self, loss: np.ndarray, steps: np.ndarray, lines: np.ndarray, skipped: np.ndarray, intervals: np.ndarray
    ) -> list[Alert]:
        cfg = self.config
        tail = self._tail
        # the window in logs: `window` steps at the row's log interval, at least `warmup` logs
        sizes = np.minimum(cfg.window, np.maximum(cfg.warmup, cfg.window // intervals))
        med = np.empty(len(loss))
        one_size = sizes[0] == sizes[-1] and bool((sizes == sizes[0]).all())
        for size in [int(sizes[0])] if one_size else np.unique(sizes).tolist():  # several while the interval is learnt
            rows = sizes == size
            med[rows] = prev_window_median(tail, loss, size)[0][rows]
        joined = np.concatenate([tail, loss])
        self._tail = joined[-cfg.window :]
        n_prev = np.minimum(np.arange(len(tail), len(tail) + len(loss)), cfg.window)
        delta = loss - med
        rel_floor = cfg.min_rel_delta / intervals
        cheap = (n_prev >= 1) & (delta > 0) & (delta >= rel_floor * np.abs(med))
        hits: list[int] = []
        for cand in np.flatnonzero(cheap).tolist():
            n = int(n_prev[cand])
            if n < cfg.warmup:
                if loss[cand] >= cfg.short_ratio * med[cand] and delta[cand] >= cfg.short_delta:
                    hits.append(cand)
                continue
            end = len(tail) + cand
            recent = joined[end - n : end]
            diffs = np.diff(recent)
            noise = median(np.abs(diffs - median(diffs))) / math.sqrt(2.0)
            sigma = max(1.4826 * noise, cfg.sigma_floor * abs(float(med[cand])))
            if (
                sigma > 0
                and delta[cand] / sigma >= cfg.z_alert
                and _above_tails(float(loss[cand]), float(med[cand]), recent)
            ):
                hits.append(cand)
        at = np.array(hits, dtype=int)
        calibrating = (skipped[at] > 0) & (steps[at] <= cfg.calibration_steps)
        levels = self._severities(loss[at], med[at], calibrating)
        level_at = dict(zip(at.tolist(), levels.tolist(), strict=True))
        alerts: list[Alert] = []
        start = self._seen
        self._seen += len(loss)
        for kind, pos, first in self._incident.scan(start, len(loss), at, steps, levels):
            if kind == "close":
                alerts.append(
                    self.alert(
                        Severity.INFO,
                        steps[pos],
                        lines[pos],
                        "loss",
                        float(loss[pos]),
                        None,
                        None,
                        f"loss back at its baseline (spike began at step {first})",
                        "no action needed; note the steps in case the run degrades later",
                    )
                )
                continue
            value, base = float(loss[pos]), float(med[pos])
            ratio = f"{value / base:.2f}x" if base > 0 else "above"  # a run may log a loss of 0.0
            note = " during fp16 loss-scale calibration" if level_at[pos] == Severity.INFO else ""
            interval = int(intervals[pos])
            per = f" (interval means of {interval} steps)" if interval > 1 else ""
            alert = self.alert(
                Severity(level_at[pos]),
                steps[pos],
                lines[pos],
                "loss",
                value,
                base,
                base + max(rel_floor[pos] * base, 0.0),
                f"loss {value:.4g} is {ratio} its recent median {base:.4g} (+{value - base:.3g}){per}{note}",
                _HINT,
            )
            alerts.append(self.escalated(alert, first) if kind == "escalate" else alert)
        return alerts

    def _severities(self, loss: np.ndarray, base: np.ndarray, calibrating: np.ndarray) -> np.ndarray:
        """Per spike: critical at `critical_ratio` times the median or more, else a warning; info
        on a record of skipped steps during the fp16 start-up calibration (the scaler is still
        finding its range). A spike that grows past a level escalates its incident (`Incident`)."""
        levels = np.where(loss >= self.config.critical_ratio * base, Severity.CRITICAL, Severity.WARNING)
        return np.where(calibrating, Severity.INFO, levels)

"""Grad-norm spike: a logged grad norm far above its own recent history.

Baseline: the median of the previous `window` grad norms, in log space (fp16 runs log norms of
1e3-1e6, so only ratios mean anything). With fewer than `warmup` values the test is a plain
factor (`short_ratio`); past warm-up a spike must also be `z_alert` robust sigmas (MAD) above the
baseline. A grad norm of exactly 0 (not computed, or an overflow-skipped step) and a value that
repeats the previous one exactly (Megatron-DeepSpeed reprints the last norm on skipped steps) are
ignored. A gap in the step numbers much larger than the log interval restarts the baseline: an
excerpt that jumps thousands of steps ahead compares nothing with stale history.

Severity: `critical_ratio` times the median or more is critical, less a warning, one level lower
in the first `startup_steps` steps. A spike that grows within its incident escalates once per
level (`Incident`): 20x then 5,000x is a warning, then a critical alert.
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
    prev_window_lowest,
    prev_window_median,
)
from gradwatch.detectors.steps import StepGaps
from gradwatch.parsers.stream import Batch


@dataclass(frozen=True, kw_only=True)
class GradNormSpikeConfig(BuiltInConfig):
    positive: ClassVar[tuple[str, ...]] = ("window", "short_ratio", "min_ratio")
    window: int = 128
    warmup: int = 20
    min_history: int = 1
    short_ratio: float = 5.0
    min_ratio: float = 3.0
    z_alert: float = 6.0
    sigma_floor: float = 0.1
    critical_ratio: float = 100.0
    startup_steps: int = 100
    gap_factor: float = 20.0
    quiet: int = 20


class GradNormSpike(Detector):
    id = "grad_norm_spike"
    description = "grad norm far above its own recent history (robust, in log space)"
    Config = GradNormSpikeConfig
    config: GradNormSpikeConfig

    def __init__(self, config: GradNormSpikeConfig | None = None, path: str = "") -> None:
        super().__init__(config, path)
        self._tail = np.empty(0)
        self._last_value = math.nan
        self._seen = 0
        self._gaps = StepGaps(self.config.gap_factor)
        self._incident = Incident(self.config.quiet)

    def update(self, batch: Batch) -> list[Alert]:
        rec = columns(batch)
        g = rec["grad_norm"]
        ok = np.isfinite(g) & (g > 0)
        g, steps, lines = g[ok], rec["step"][ok], rec["line"][ok]
        if len(g) == 0:
            return []
        prev = np.concatenate([[self._last_value], g[:-1]])
        self._last_value = g[-1]
        fresh = g != prev
        g, steps, lines = g[fresh], steps[fresh], lines[fresh]
        alerts: list[Alert] = []
        for lo, hi, reset in self._gaps.segments(steps):
            if reset:
                self._tail = np.empty(0)
            alerts += self._segment(np.log(g[lo:hi]), steps[lo:hi], lines[lo:hi])
        return alerts

    def _segment(self, logv: np.ndarray, steps: np.ndarray, lines: np.ndarray) -> list[Alert]:
        cfg = self.config
        tail = self._tail
        least = math.log(min(cfg.short_ratio, cfg.min_ratio))
        lowest = prev_window_lowest(tail, logv, cfg.window)  # the median is no lower
        med, self._tail = prev_window_median(tail, logv, cfg.window, wanted=logv - lowest >= least)
        n_prev = np.minimum(np.arange(len(tail), len(tail) + len(logv)), cfg.window)
        excess = logv - med
        cheap = (n_prev >= cfg.min_history) & (excess >= least)
        joined = np.concatenate([tail, logv])
        hits: list[int] = []
        sigmas: dict[int, float] = {}
        for cand in np.flatnonzero(cheap).tolist():
            n = int(n_prev[cand])
            if n < cfg.warmup:
                if excess[cand] >= math.log(cfg.short_ratio):
                    hits.append(cand)
                continue
            end = len(tail) + cand
            window = joined[end - n : end]
            sigma = max(1.4826 * median(np.abs(window - med[cand])), cfg.sigma_floor)
            if excess[cand] / sigma >= cfg.z_alert:
                hits.append(cand)
                sigmas[cand] = sigma
        at = np.array(hits, dtype=int)
        levels = self._severities(logv[at] - med[at], steps[at])
        level_at = dict(zip(at.tolist(), levels.tolist(), strict=True))
        alerts: list[Alert] = []
        start = self._seen
        self._seen += len(logv)
        for kind, pos, first in self._incident.scan(start, len(logv), at, steps, levels):
            if kind == "close":
                alerts.append(
                    self.alert(
                        Severity.INFO,
                        steps[pos],
                        lines[pos],
                        "grad_norm",
                        None,
                        None,
                        None,
                        f"grad norm back within its baseline (spike began at step {first})",
                        "no action needed; if spikes recur, look at the data around these steps",
                    )
                )
                continue
            value, base = math.exp(logv[pos]), math.exp(med[pos])
            sigma_text = f", {excess[pos] / sigmas[pos]:.0f} sigma" if pos in sigmas else ""
            alert = self.alert(
                Severity(level_at[pos]),
                steps[pos],
                lines[pos],
                "grad_norm",
                value,
                base,
                base * min(cfg.short_ratio, cfg.min_ratio),
                f"grad norm {value:.4g} is {value / base:.1f}x its recent median {base:.4g}{sigma_text}",
                "a loss spike often follows within a few steps: check the data batch at this step, "
                "lower the learning rate or tighten gradient clipping; with fp16, watch the loss scale",
            )
            alerts.append(self.escalated(alert, first) if kind == "escalate" else alert)
        return alerts

    def _severities(self, log_ratios: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """Per spike: critical at `critical_ratio` times the median or more, else a warning; one
        level lower in the start-up window (optimizer warm-up), so that 100x there still warns."""
        cfg = self.config
        levels = np.where(np.exp(log_ratios) >= cfg.critical_ratio, Severity.CRITICAL, Severity.WARNING)
        return levels - (steps <= cfg.startup_steps)  # type: ignore[no-any-return]

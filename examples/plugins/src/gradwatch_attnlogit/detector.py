"""Attention-logit growth: the largest attention logit pulling away from its own recent level.

Attention logits that grow without bound collapse attention entropy and precede divergence by
hundreds of steps while the loss still looks fine (Dehghani et al. 2023, "Scaling Vision
Transformers to 22 Billion Parameters"; Wortsman et al. 2023, "Small-scale proxies for large-scale
Transformer training instabilities"); QK-layernorm or a lower learning rate are the usual fixes.

Rule: the baseline is the median of the previous `window` logged values. A value at least `ratio`
times the baseline and at least `floor` opens an incident (one warning); `quiet` logs without a
hit close it (one info). The defaults are illustrative, not calibrated on real runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gradwatch.api import Alert, Batch, Detector, DetectorConfig, Incident, Severity, prev_window_median

METRIC = "attn_logit_max"
HINT = "attention entropy is collapsing: consider QK-layernorm, a lower learning rate, or logit soft-capping"


@dataclass(frozen=True, kw_only=True)
class AttnLogitGrowthConfig(DetectorConfig):
    window: int = 50
    min_history: int = 10
    ratio: float = 3.0
    floor: float = 50.0
    quiet: int = 20

    def __post_init__(self) -> None:
        if not 1 <= self.min_history <= self.window:
            raise ValueError(f"min_history must be in [1, window={self.window}], got {self.min_history}")
        if self.ratio <= 1.0:
            raise ValueError(f"ratio must be above 1, got {self.ratio}")


class AttnLogitGrowth(Detector):
    id = "attn_logit_growth"
    description = "max attention logit far above its recent median (example plugin)"
    Config = AttnLogitGrowthConfig
    config: AttnLogitGrowthConfig

    def __init__(self, config: AttnLogitGrowthConfig | None = None, path: str = "") -> None:
        super().__init__(config, path)
        self._tail = np.empty(0)  # the last `window` values, carried across batches
        self._seen = 0  # values seen so far: the incident's row numbers count across batches
        self._incident = Incident(self.config.quiet)

    def update(self, batch: Batch) -> list[Alert]:
        rec = batch.records
        if METRIC not in rec.columns:  # the attnlab parser is not registered
            return []
        values = rec[METRIC].to_numpy(dtype=float)
        ok = np.isfinite(values)
        values, steps, lines = values[ok], rec["step"].to_numpy()[ok], rec["line"].to_numpy()[ok]
        if len(values) == 0:
            return []
        cfg = self.config
        n_prev = np.minimum(np.arange(len(self._tail), len(self._tail) + len(values)), cfg.window)
        base, self._tail = prev_window_median(self._tail, values, cfg.window)
        hit = (n_prev >= cfg.min_history) & (values >= cfg.floor) & (values >= cfg.ratio * base)
        start, self._seen = self._seen, self._seen + len(values)
        alerts: list[Alert] = []
        for kind, pos, first in self._incident.scan(start, len(values), np.flatnonzero(hit), steps):
            step, line = steps[pos], lines[pos]
            if kind == "close":
                text = f"max attention logit back under {cfg.ratio:g}x its median (growth began at step {first})"
                alerts.append(self.alert(Severity.INFO, step, line, METRIC, None, None, None, text, HINT))
            else:
                value, median = values[pos], base[pos]
                text = f"max attention logit {value:.4g} is {value / median:.1f}x its recent median {median:.4g}"
                threshold = cfg.ratio * median
                alerts.append(self.alert(Severity.WARNING, step, line, METRIC, value, median, threshold, text, HINT))
        return alerts

"""Loss collapse: the loss falling abruptly to about 0, with the grad norm going to about 0 too.

That is not learning: it is a data or label fault (all labels masked, a loss computed on padding,
OLMo issue #692 with CrossEntropyLoss=1.8e-06 and total_grad_norm=0.0002). "Abruptly" means the
median of the previous values was at least `min_baseline` and the new value is under `fraction`
of it (or under `absolute`); a loss that declines gradually is left alone.

A record that logged a non-finite value anywhere is left to the nonfinite detector: the HF Trainer
prints `'loss': 0.0` beside `'grad_norm': nan` for a NaN step, which is not a collapse to 0
(a not-logged grad norm still counts as "about 0": many trainers do not print it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gradwatch.alerts import Alert, Severity
from gradwatch.detectors.base import (
    Detector,
    DetectorConfig,
    Incident,
    columns,
    prev_window_median,
    prev_window_range,
)
from gradwatch.parsers.stream import Batch

_HINT = (
    "a loss near 0 with a grad norm near 0 is a data/label fault, not convergence: check the label "
    "masking and padding of the current data, the loss reduction, and whether the data loader "
    "started returning empty or repeated batches"
)


@dataclass(frozen=True, kw_only=True)
class LossCollapseConfig(DetectorConfig):
    window: int = 20
    min_baseline: float = 0.5
    fraction: float = 0.02
    absolute: float = 0.01
    grad_fraction: float = 0.05
    quiet: int = 20


class LossCollapse(Detector):
    id = "loss_collapse"
    description = "loss dropping abruptly to about 0 with the grad norm about 0 (a data/label fault)"
    Config = LossCollapseConfig
    config: LossCollapseConfig

    def __init__(self, config: LossCollapseConfig | None = None, path: str = "") -> None:
        super().__init__(config, path)
        self._loss_tail = np.empty(0)
        self._grad_base = float("nan")
        self._grad_tail = np.empty(0)
        self._seen = 0
        self._incident = Incident(self.config.quiet)
        self._baseline = float("nan")

    def update(self, batch: Batch) -> list[Alert]:
        cfg = self.config
        rec = columns(batch)
        loss = rec["loss"]
        ok = np.isfinite(loss) & (rec["nonfinite"] == "")  # a NaN step is not a collapse
        if not ok.any():
            return []
        grad_all = rec["grad_norm"]
        loss, grad = loss[ok], grad_all[ok]
        steps, lines = rec["step"][ok], rec["line"][ok]
        wanted = None
        if cfg.fraction > 0:  # low only below a fraction of the window's largest, which must reach min_baseline
            _, highest = prev_window_range(self._loss_tail, loss, cfg.window)
            wanted = (loss <= np.maximum(cfg.fraction * highest, cfg.absolute)) & (highest >= cfg.min_baseline)
        med, tail = prev_window_median(self._loss_tail, loss, cfg.window, wanted)
        low = (loss <= np.maximum(cfg.fraction * med, cfg.absolute)) & (med >= cfg.min_baseline)
        gmed, self._grad_tail = prev_window_median(
            self._grad_tail, np.where(np.isfinite(grad), grad, np.nan), cfg.window, low
        )
        # the baseline of a collapsed run must not follow it down: keep the last healthy window
        self._loss_tail = tail if not low.any() else self._healthy_tail(tail, loss, low)
        grad_low = ~np.isfinite(grad) | ~np.isfinite(gmed) | (grad <= cfg.grad_fraction * gmed)
        hits = np.flatnonzero(low & grad_low)
        alerts: list[Alert] = []
        start = self._seen
        self._seen += len(loss)
        for kind, pos, first in self._incident.scan(start, len(loss), hits, steps):
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
                        f"loss away from 0 again (collapse began at step {first})",
                        "check whether the data fault is fixed or only intermittent",
                    )
                )
                continue
            g = grad[pos]
            gtext = f", grad norm {g:.3g}" if np.isfinite(g) else ""
            alerts.append(
                self.alert(
                    Severity.CRITICAL,
                    steps[pos],
                    lines[pos],
                    "loss",
                    float(loss[pos]),
                    float(med[pos]),
                    float(max(cfg.fraction * med[pos], cfg.absolute)),
                    f"loss fell to {loss[pos]:.3g} from a median of {med[pos]:.4g}{gtext}",
                    _HINT,
                )
            )
        return alerts

    def _healthy_tail(self, tail: np.ndarray, loss: np.ndarray, low: np.ndarray) -> np.ndarray:
        keep = np.concatenate([self._loss_tail, loss[~low]])
        return keep[-self.config.window :] if len(keep) else tail

"""Logit-norm drift: the output-logit norm (or z-loss, its proxy) growing while the loss looks fine.

The failure the loss curve hides: under FSDP with bf16 gradient reduction across many nodes, the
output-logit norm can creep up for thousands of steps before perplexity turns Inf. No trainer
prints the logit norm to the console by default, so z-loss (OLMo's `train/ZLoss`) stands in.

Method: medians of consecutive blocks of `block` logged values. Alert when the latest block's
median is `growth` times the lowest block median so far, the last `rising_blocks` blocks each rose,
and the loss median over the same blocks did not rise by more than `loss_tolerance` (when the loss
rises too, it is divergence, another detector's business). Also alert when perplexity is not
finite while the loss is.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gradwatch.alerts import Alert, Severity
from gradwatch.detectors.base import Detector, DetectorConfig
from gradwatch.parsers.stream import Batch

_HINT = (
    "the output-logit norm is growing while the loss hides it: with FSDP, reduce gradients in float32 "
    "(e.g. reduce_dtype=float32), add z-loss or lower the learning rate; compare with a run on fewer nodes"
)


@dataclass(frozen=True, kw_only=True)
class LogitNormDriftConfig(DetectorConfig):
    block: int = 20
    growth: float = 1.5
    z_loss_growth: float = 2.0
    rising_blocks: int = 3
    loss_tolerance: float = 0.02


@dataclass
class _Blocks:
    values: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    medians: list[float] = field(default_factory=list)
    loss_medians: list[float] = field(default_factory=list)
    alerted: bool = False


class LogitNormDrift(Detector):
    id = "logit_norm_drift"
    description = "output-logit norm or z-loss growing steadily while the loss is flat or falling"
    Config = LogitNormDriftConfig
    config: LogitNormDriftConfig

    def __init__(self, config: LogitNormDriftConfig | None = None, path: str = "") -> None:
        super().__init__(config, path)
        self._blocks = {"logit_norm": _Blocks(), "z_loss": _Blocks()}
        self._ppl_alerted = False

    def update(self, batch: Batch) -> list[Alert]:
        rec = batch.records
        if len(rec) == 0:
            return []
        alerts = self._ppl(batch)
        loss = rec["loss"].to_numpy()
        steps, lines = rec["step"].to_numpy(), rec["line"].to_numpy()
        for metric, blocks in self._blocks.items():
            v = rec[metric].to_numpy()
            for pos in np.flatnonzero(np.isfinite(v)):
                blocks.values.append(float(v[pos]))
                blocks.losses.append(float(loss[pos]))
                if len(blocks.values) == self.config.block:
                    alert = self._close_block(metric, blocks, int(steps[pos]), int(lines[pos]))
                    if alert is not None:
                        alerts.append(alert)
        return alerts

    def _close_block(self, metric: str, b: _Blocks, step: int, line: int) -> Alert | None:
        cfg = self.config
        b.medians.append(float(np.median(b.values)))
        losses = [x for x in b.losses if x == x]
        b.loss_medians.append(float(np.median(losses)) if losses else float("nan"))
        b.values.clear()
        b.losses.clear()
        meds = b.medians
        if b.alerted or len(meds) <= cfg.rising_blocks:
            return None
        low_i = int(np.argmin(meds))
        low, now = meds[low_i], meds[-1]
        growth = cfg.growth if metric == "logit_norm" else cfg.z_loss_growth
        recent = meds[-cfg.rising_blocks - 1 :]
        rising = all(a < c for a, c in zip(recent, recent[1:], strict=False))
        loss_then, loss_now = b.loss_medians[low_i], b.loss_medians[-1]
        loss_ok = not (loss_now == loss_now and loss_then == loss_then) or (
            loss_now <= loss_then * (1 + cfg.loss_tolerance)
        )
        if low > 0 and now >= growth * low and rising and loss_ok:
            b.alerted = True
            name = "output-logit norm" if metric == "logit_norm" else "z-loss"
            return self.alert(
                Severity.WARNING,
                step,
                line,
                metric,
                now,
                low,
                growth * low,
                f"{name} grew {now / low:.1f}x (median {low:.4g} -> {now:.4g}) while the loss did not rise",
                _HINT,
            )
        return None

    def _ppl(self, batch: Batch) -> list[Alert]:
        if self._ppl_alerted:
            return []
        rec = batch.records
        names, loss = rec["nonfinite"].to_numpy(), rec["loss"].to_numpy()
        steps, lines = rec["step"].to_numpy(), rec["line"].to_numpy()
        for pos in np.flatnonzero(names != "").tolist():
            if "ppl" in names[pos].split(",") and np.isfinite(loss[pos]):
                self._ppl_alerted = True
                return [
                    self.alert(
                        Severity.CRITICAL,
                        int(steps[pos]),
                        int(lines[pos]),
                        "ppl",
                        None,
                        None,
                        None,
                        f"perplexity is not finite while the loss is {loss[pos]:.4g}",
                        _HINT,
                    )
                ]
        return []

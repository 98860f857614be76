"""Loss collapse: the loss falling abruptly to about 0, with the grad norm going to about 0 too.

That is not learning: it is a data or label fault (all labels masked, a loss computed on padding,
OLMo issue #692 with CrossEntropyLoss=1.8e-06 and total_grad_norm=0.0002). "Abruptly" means the
median of the previous values was at least `min_baseline` and the new value is under `fraction`
of it (or under `absolute`); a loss that declines gradually is left alone.

A record that logged a non-finite value anywhere is left to the nonfinite detector: the HF Trainer
prints `'loss': 0.0` beside `'grad_norm': nan` for a NaN step, which is not a collapse to 0
(a not-logged grad norm still counts as "about 0": many trainers do not print it). But a loss of
exactly 0 in the record after a non-finite grad norm, down from a last loss of `min_baseline` or
more, is the run dying: the NaN gradient went into the weights, every later step's loss is NaN,
and a trainer that keeps NaN out of its running mean (HF's `logging_nan_inf_filter`) prints 0.
"""

from __future__ import annotations

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
    prev_window_highest,
    prev_window_median,
)
from gradwatch.parsers.stream import Batch
from gradwatch.records import Columns

#: Runs of low or healthy losses `LossCollapse._after_low` reads vectorised in one batch
_VECTORISED_RUNS = 32

_HINT = (
    "a loss near 0 with a grad norm near 0 is a data/label fault, not convergence: check the label "
    "masking and padding of the current data, the loss reduction, and whether the data loader "
    "started returning empty or repeated batches"
)
_DEAD_HINT = (
    "a loss of exactly 0 after a NaN/Inf grad norm means the weights went non-finite and every step's "
    "loss is NaN (the trainer leaves NaN out of its running mean and prints 0): stop the run, restart "
    "from the last checkpoint before the non-finite grad norm with gradient clipping, a lower learning "
    "rate or bf16 rather than fp16, and check the data batch at that step"
)


@dataclass(frozen=True, kw_only=True)
class LossCollapseConfig(BuiltInConfig):
    positive: ClassVar[tuple[str, ...]] = ("window",)
    window: int = 20
    min_baseline: float = 0.5
    fraction: float = 0.02
    absolute: float = 0.01
    grad_fraction: float = 0.05
    quiet: int = 20


class LossCollapse(Detector):
    id = "loss_collapse"
    description = (
        "loss dropping abruptly to about 0 with the grad norm about 0 (a data/label fault), "
        "or to exactly 0 after a NaN grad norm"
    )
    Config = LossCollapseConfig
    config: LossCollapseConfig

    def __init__(self, config: LossCollapseConfig | None = None, path: str = "") -> None:
        super().__init__(config, path)
        self._loss_tail = np.empty(0)
        self._grad_tail = np.empty(0)
        self._seen = 0
        self._incident = Incident(self.config.quiet)
        self._after_bad_grad = False  # the last record that logged a loss or grad norm had a non-finite one
        self._last_loss = float("nan")  # ... and the last loss above 0 before it

    def update(self, batch: Batch) -> list[Alert]:
        rec = columns(batch)
        loss, grad = rec["loss"], rec["grad_norm"]
        ok = np.isfinite(loss) & ~rec.flagged()  # a NaN step is not a collapse ...
        dead, last_loss = self._zero_after_bad_grad(rec)  # ... but a 0 after a NaN grad norm is
        rows = np.flatnonzero(ok | dead)
        if not len(rows):
            return []
        low, med = np.zeros(len(loss), dtype=bool), np.full(len(loss), np.nan)
        if ok.any():
            at_ok = np.flatnonzero(ok)
            low[at_ok], med[at_ok] = self._collapsed(loss[ok], grad[ok])
        hits = np.flatnonzero((low | dead)[rows])
        steps, lines = rec["step"], rec["line"]
        alerts: list[Alert] = []
        start = self._seen
        self._seen += len(rows)
        for kind, pos, first in self._incident.scan(start, len(rows), hits, steps[rows]):
            r = rows[pos]
            if kind == "close":
                alerts.append(
                    self.alert(
                        Severity.INFO,
                        steps[r],
                        lines[r],
                        "loss",
                        float(loss[r]),
                        None,
                        None,
                        f"loss away from 0 again (collapse began at step {first})",
                        "check whether the data fault is fixed or only intermittent",
                    )
                )
            elif dead[r]:
                alerts.append(
                    self.alert(
                        Severity.CRITICAL,
                        steps[r],
                        lines[r],
                        "loss",
                        0.0,
                        float(last_loss[r]),
                        None,
                        f"loss printed as exactly 0 after a non-finite grad norm (last loss {last_loss[r]:.4g})",
                        _DEAD_HINT,
                    )
                )
            else:
                g = grad[r]
                gtext = f", grad norm {g:.3g}" if np.isfinite(g) else ""
                alerts.append(
                    self.alert(
                        Severity.CRITICAL,
                        steps[r],
                        lines[r],
                        "loss",
                        float(loss[r]),
                        float(med[r]),
                        float(max(self.config.fraction * med[r], self.config.absolute)),
                        f"loss fell to {loss[r]:.3g} from a median of {med[r]:.4g}{gtext}",
                        _HINT,
                    )
                )
        return alerts

    def _collapsed(self, loss: np.ndarray, grad: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Of these finite losses (and their grad norms), which collapsed: low against the median
        of the previous ones, with the grad norm about 0; and that median."""
        cfg = self.config
        wanted = None
        if cfg.fraction > 0:  # low only below a fraction of the window's largest, which must reach min_baseline
            highest = prev_window_highest(self._loss_tail, loss, cfg.window)
            wanted = (loss <= np.maximum(cfg.fraction * highest, cfg.absolute)) & (highest >= cfg.min_baseline)
        med, tail = prev_window_median(self._loss_tail, loss, cfg.window, wanted)
        low = self._low(loss, med)
        if low.any():  # from the first low loss on, the window holds healthy losses only
            self._loss_tail = self._after_low(loss, med, low, int(np.argmax(low)))
        else:
            self._loss_tail = tail
        gmed, self._grad_tail = prev_window_median(
            self._grad_tail, np.where(np.isfinite(grad), grad, np.nan), cfg.window, low
        )
        grad_low = ~np.isfinite(grad) | ~np.isfinite(gmed) | (grad <= cfg.grad_fraction * gmed)
        return low & grad_low, med

    def _zero_after_bad_grad(self, rec: Columns) -> tuple[np.ndarray, np.ndarray]:
        """Per record, whether it printed a loss of exactly 0 right after a record with a
        non-finite grad norm, down from a last loss of `min_baseline` or more; and that last loss
        (the last one above 0 before each record). Records that log neither loss nor grad norm
        (validation, timers) do not count as "after"."""
        loss, grad, flagged = rec["loss"], rec["grad_norm"], rec.flagged()
        dead, last_loss = np.zeros(len(loss), dtype=bool), np.full(len(loss), np.nan)
        if not (self._after_bad_grad or flagged.any()):  # (the usual batch: every value finite)
            positive = np.flatnonzero(loss > 0)
            if len(positive):
                self._last_loss = float(loss[positive[-1]])
            return dead, last_loss
        trained = np.flatnonzero(np.isfinite(loss) | np.isfinite(grad) | flagged)
        if not len(trained):
            return dead, last_loss
        names = rec["nonfinite"]
        bad_grad = np.array([flagged[i] and "grad_norm" in names[i].split(",") for i in trained.tolist()])
        after_bad = np.concatenate([[self._after_bad_grad], bad_grad[:-1]])
        self._after_bad_grad = bool(bad_grad[-1])
        losses = loss[trained]
        positive = np.concatenate([[self._last_loss], np.where(losses > 0, losses, np.nan)])  # (NaN > 0 is False)
        known = np.maximum.accumulate(np.where(np.isfinite(positive), np.arange(len(positive)), 0))
        before = positive[known]  # before[k]: the last loss above 0 before trained record k
        self._last_loss = float(before[-1])
        last_loss[trained] = before[:-1]
        dead[trained] = after_bad & (losses == 0.0) & (before[:-1] >= self.config.min_baseline)
        return dead, last_loss

    def _low(self, loss: np.ndarray, med: np.ndarray) -> np.ndarray:
        cfg = self.config
        return (loss <= np.maximum(cfg.fraction * med, cfg.absolute)) & (med >= cfg.min_baseline)  # type: ignore[no-any-return]

    def _after_low(self, loss: np.ndarray, med: np.ndarray, low: np.ndarray, first: int) -> np.ndarray:
        """The baseline of a collapsed run must not follow it down: from the batch's first low
        loss on, each loss's median is that of the healthy losses before it (`med` and `low` are
        set there), so that where batches are cut does not matter. A run of low losses leaves the
        window as it is, a run of healthy ones slides it: each run is one vectorised step, and a
        batch that keeps switching is read one loss after the other. Returns the window to carry
        on: the last healthy losses."""
        window = self.config.window
        healthy = np.concatenate([self._loss_tail, loss[:first]])[-window:]
        i, runs = first, 0
        while i < len(loss) and runs < _VECTORISED_RUNS:
            runs += 1
            if low[i]:  # a run of low losses: the window and its median stand still
                rest, still = loss[i:], median(healthy) if len(healthy) else np.nan
                stays = self._low(rest, np.full(len(rest), still))
                end = i + (len(rest) if stays.all() else int(np.argmin(stays)))
                med[i:end], low[i:end] = still, True
            else:  # a run of healthy losses: the window slides over them
                rest_med, _ = prev_window_median(healthy, loss[i:], window)
                rest_low = self._low(loss[i:], rest_med)
                end = i + (int(np.argmax(rest_low)) if rest_low.any() else len(rest_low))
                med[i:], low[i:] = rest_med, rest_low
                healthy = np.concatenate([healthy, loss[i:end]])[-window:]
            i = end
        for k in range(i, len(loss)):  # (one after the other)
            med[k] = median(healthy) if len(healthy) else np.nan
            low[k] = self._low(loss[k : k + 1], med[k : k + 1])[0]
            if not low[k]:
                healthy = np.concatenate([healthy, loss[k : k + 1]])[-window:]
        return healthy

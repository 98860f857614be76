"""Logit-norm drift: the output-logit norm (or z-loss, its proxy) growing while the loss looks fine.

The failure the loss curve hides: under FSDP with bf16 gradient reduction across many nodes, the
output-logit norm can creep up for thousands of steps before perplexity turns Inf. No trainer
prints the logit norm to the console by default, so z-loss (OLMo's `train/ZLoss`) stands in.

Method: medians of consecutive blocks of `block` logged values. Alert when the latest block's
median is `growth` times the lowest block median so far, none of the last `rising_blocks` blocks
fell and the last is above the one `rising_blocks` before, and the loss median over the same
blocks did not rise by more than `loss_tolerance` (when the loss rises too, it is divergence,
another detector's business). Also alert when perplexity is not finite while the loss is.

"None fell", not "each rose": OLMo prints z-loss with 4 decimals (`train/ZLoss=0.0015`), so during a
slow drift consecutive block medians are often equal; requiring a strict rise at every block missed
a 3x drift over 1000 steps entirely. The growth factor still has to be reached.
Blocks are closed with numpy a whole batch at a time; the state kept is the open block, the last
medians and the lowest one, so a 1 GB log costs no Python work per row and no growing list.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import bottleneck as bn
import numpy as np

from gradwatch.alerts import Alert, Severity
from gradwatch.detectors.base import BuiltInConfig, Detector, columns
from gradwatch.detectors.latest_config import LatestConfig
from gradwatch.parsers.stream import Batch

_HINT = (
    "the output-logit norm is growing while the loss hides it: with FSDP, reduce gradients in float32 "
    "(e.g. reduce_dtype=float32), add z-loss or lower the learning rate; compare with a run on fewer nodes"
)


def hint(told: dict[str, Any]) -> str:
    """The hint, naming the run's FSDP reduce dtype and its size where the log printed them."""
    dtype = told.get("fsdp_reduce_dtype")
    size = ", ".join(f"{told[k]} {what}" for k, what in (("nodes", "nodes"), ("world_size", "GPUs")) if told.get(k))
    on = f" on {size}" if size else ""
    if dtype is None:
        return _HINT + (f" (this run: {size})" if size else "")
    if "32" in str(dtype):
        return (
            f"the output-logit norm is growing while the loss hides it: this run already reduces FSDP "
            f"gradients in {dtype} (fsdp_reduce_dtype){on}; add z-loss or lower the learning rate"
        )
    return (
        f"the output-logit norm is growing while the loss hides it: this run reduces FSDP gradients in "
        f"{dtype} (fsdp_reduce_dtype){on}, which loses precision as more ranks are summed; reduce in "
        "float32 (reduce_dtype=float32), add z-loss or lower the learning rate; compare with a run on fewer nodes"
    )


@dataclass(frozen=True, kw_only=True)
class LogitNormDriftConfig(BuiltInConfig):
    positive: ClassVar[tuple[str, ...]] = ("block",)
    block: int = 20
    growth: float = 1.5
    z_loss_growth: float = 2.0
    rising_blocks: int = 3
    loss_tolerance: float = 0.02


@dataclass
class _Blocks:
    """One metric's block state, carried across batches (bounded, whatever the log's length)."""

    values: np.ndarray = field(default_factory=lambda: np.empty(0))  # the open block's values
    losses: np.ndarray = field(default_factory=lambda: np.empty(0))  # and the losses beside them
    recent: np.ndarray = field(default_factory=lambda: np.empty(0))  # the last closed block medians
    closed: int = 0  # blocks closed so far
    low: float = np.inf  # lowest block median so far ...
    loss_at_low: float = np.nan  # ... and the loss median of that block
    alerted: bool = False


class LogitNormDrift(Detector):
    id = "logit_norm_drift"
    description = "output-logit norm or z-loss growing steadily while the loss is flat or falling"
    Config = LogitNormDriftConfig
    config: LogitNormDriftConfig
    #: the run's configuration for the hint (a class default for states pickled before it)
    _told: LatestConfig | None = None

    def __init__(self, config: LogitNormDriftConfig | None = None, path: str = "") -> None:
        super().__init__(config, path)
        self._blocks = {"logit_norm": _Blocks(), "z_loss": _Blocks()}
        self._ppl_alerted = False

    def update(self, batch: Batch) -> list[Alert]:
        if self._told is None:
            self._told = LatestConfig()
        self._told.read(batch.events)
        rec = columns(batch)
        if len(rec) == 0:
            return []
        alerts = self._ppl(batch)
        loss = rec["loss"]
        steps, lines = rec["step"], rec["line"]
        for metric, blocks in self._blocks.items():
            v = rec[metric]
            ok = np.isfinite(v)
            if ok.any():
                alert = self._blocks_of(metric, blocks, v[ok], loss[ok], steps[ok], lines[ok])
                if alert is not None:
                    alerts.append(alert)
        return alerts

    def _blocks_of(
        self, metric: str, b: _Blocks, v: np.ndarray, loss: np.ndarray, steps: np.ndarray, lines: np.ndarray
    ) -> Alert | None:
        """Close the blocks this batch completes (vectorised) and judge each; keep the open one."""
        cfg = self.config
        size = cfg.block
        values, losses = np.concatenate([b.values, v]), np.concatenate([b.losses, loss])
        n = len(values) // size
        carried = len(b.values)
        b.values, b.losses = values[n * size :], losses[n * size :]
        if n == 0:
            return None
        # per block, bottleneck's medians: numpy's (pandas' NaN-aware for the losses), a zero +0.0
        meds = bn.median(values[: n * size].reshape(n, size), axis=1) + 0.0
        loss_meds = bn.nanmedian(losses[: n * size].reshape(n, size), axis=1) + 0.0
        # the lowest block median so far (this block included) and the loss median of that block
        prev_low = np.minimum.accumulate(np.concatenate([[b.low], meds]))
        lows = prev_low[1:]
        new_low = meds < prev_low[:-1]
        at = np.maximum.accumulate(np.where(new_low, np.arange(n), -1))
        loss_then = np.where(at >= 0, loss_meds[np.maximum(at, 0)], b.loss_at_low)
        # the last `rising_blocks` steps between block medians: none down, and up overall
        r = cfg.rising_blocks
        hist = np.concatenate([b.recent, meds])
        j = np.arange(len(b.recent), len(hist))  # index of each new block in hist
        fell = np.concatenate([[False], hist[1:] < hist[:-1]])
        last_fall = np.maximum.accumulate(np.where(fell, np.arange(len(hist)), -1))
        back = np.maximum(j - r, 0)  # (j < r: masked)
        rising = (j >= r) & (hist[j] > hist[back]) & (last_fall[j] <= back)
        count = b.closed + np.arange(1, n + 1)
        growth = cfg.growth if metric == "logit_norm" else cfg.z_loss_growth
        loss_ok = np.isnan(loss_meds) | np.isnan(loss_then) | (loss_meds <= loss_then * (1 + cfg.loss_tolerance))
        hit = (count > r) & (lows > 0) & (meds >= growth * lows) & rising & loss_ok
        b.closed += n
        b.low = float(lows[-1])
        b.loss_at_low = float(loss_then[-1])
        b.recent = hist[-r:]
        if b.alerted or not hit.any():
            return None
        b.alerted = True
        first = int(np.flatnonzero(hit)[0])
        pos = (first + 1) * size - 1 - carried  # the block's last value, in this batch
        low, now = float(lows[first]), float(meds[first])
        name = "output-logit norm" if metric == "logit_norm" else "z-loss"
        return self.alert(
            Severity.WARNING,
            int(steps[pos]),
            int(lines[pos]),
            metric,
            now,
            low,
            growth * low,
            f"{name} grew {now / low:.1f}x (median {low:.4g} -> {now:.4g}) while the loss did not rise",
            self._hint(int(lines[pos])),
        )

    def _hint(self, line: int) -> str:
        return hint(self._told.at(line) if self._told is not None else {})

    def _ppl(self, batch: Batch) -> list[Alert]:
        if self._ppl_alerted:
            return []
        rec = columns(batch)
        names, loss = rec["nonfinite"], rec["loss"]
        steps, lines = rec["step"], rec["line"]
        for pos in np.flatnonzero(rec.flagged()).tolist():
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
                        self._hint(int(lines[pos])),
                    )
                ]
        return []

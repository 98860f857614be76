"""Loss divergence: a sustained rise, not a one-off spike.

Two rules. Trend: the loss rose on `rising_logs` consecutive logged values, by at least
`rise_ratio` and `rise_delta` nats in total (BigScience tr8-104B: 6.37, 6.60, 7.31, 9.12, 10.24).
Sustained level (llm-foundry's KillLossSpike): the loss at least `level_ratio` times the mean of
the `window` values before the excursion for more than `level_logs` consecutive logs: critical,
the run is not coming back by itself.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from gradwatch.alerts import Alert, Severity
from gradwatch.detectors.base import Detector, DetectorConfig
from gradwatch.parsers.stream import Batch

_HINT = (
    "the loss is climbing, not spiking: stop or roll back to a checkpoint before the rise, then lower "
    "the learning rate, check for a bad data shard, and with fp16 consider bf16; check the grad norm "
    "and (if logged) the output-logit norm for what started it"
)


@dataclass(frozen=True, kw_only=True)
class LossDivergenceConfig(DetectorConfig):
    rising_logs: int = 3
    rise_ratio: float = 1.2
    rise_delta: float = 0.3
    window: int = 100
    level_ratio: float = 2.0
    level_logs: int = 4
    quiet: int = 50


class LossDivergence(Detector):
    id = "loss_divergence"
    description = "loss rising for several logs in a row, or held at 2x its earlier mean"
    Config = LossDivergenceConfig
    config: LossDivergenceConfig

    def __init__(self, config: LossDivergenceConfig | None = None, path: str = "") -> None:
        super().__init__(config, path)
        self._prev: float | None = None
        self._run_start: float | None = None  # loss before the current run of rises
        self._rises = 0
        self._window: deque[float] = deque(maxlen=self.config.window)
        self._high = 0  # consecutive logs at level_ratio x the window mean
        self._ref_mean: float | None = None
        self._quiet_left = 0

    def update(self, batch: Batch) -> list[Alert]:
        rec = batch.records
        loss = rec["loss"].to_numpy()
        alerts: list[Alert] = []
        steps, lines = rec["step"].to_numpy(), rec["line"].to_numpy()
        for pos in np.flatnonzero(np.isfinite(loss)):
            alert = self._observe(float(loss[pos]), int(steps[pos]), int(lines[pos]))
            if alert is not None:
                alerts.append(alert)
        return alerts

    def _observe(self, value: float, step: int, line: int) -> Alert | None:
        cfg = self.config
        alert: Alert | None = None
        if self._prev is not None and value > self._prev:
            if self._rises == 0:
                self._run_start = self._prev
            self._rises += 1
        else:
            self._rises = 0
        self._prev = value
        # sustained level against the mean before the excursion began
        ref = self._ref_mean if self._high else (sum(self._window) / len(self._window) if self._window else None)
        if ref is not None and ref > 0 and value >= cfg.level_ratio * ref:
            if self._high == 0:
                self._ref_mean = ref
            self._high += 1
        else:
            self._high, self._ref_mean = 0, None
            self._window.append(value)
        if self._quiet_left > 0:
            self._quiet_left -= 1
            return None
        start = self._run_start
        if self._high > cfg.level_logs and ref is not None:
            alert = self.alert(
                Severity.CRITICAL,
                step,
                line,
                "loss",
                value,
                ref,
                cfg.level_ratio * ref,
                f"loss {value:.4g} has stayed above {cfg.level_ratio:g}x its earlier mean {ref:.4g} "
                f"for {self._high} logs",
                _HINT,
            )
        elif (
            self._rises >= cfg.rising_logs
            and start is not None
            and start > 0
            and value >= cfg.rise_ratio * start
            and value - start >= cfg.rise_delta
        ):
            alert = self.alert(
                Severity.WARNING,
                step,
                line,
                "loss",
                value,
                start,
                cfg.rise_ratio * start,
                f"loss rose on {self._rises} consecutive logs, {start:.4g} -> {value:.4g} ({value / start:.2f}x)",
                _HINT,
            )
        if alert is not None:
            self._quiet_left = cfg.quiet
        return alert

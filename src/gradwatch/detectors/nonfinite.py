"""Non-finite values: NaN or Inf in any metric, including the loss field Megatron leaves out.

Reads the records' `nonfinite` column (filled by the parsers), a rising `number of nan iterations`,
and trainer NaN errors (Megatron's rerun state machine, "found NaN in local grad norm"). Consecutive
bad records are one incident; an info alert says when values are finite again.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gradwatch.alerts import Alert, Severity
from gradwatch.detectors.base import BuiltInConfig, Detector, Incident, columns
from gradwatch.parsers.stream import Batch

_HINT = (
    "the step produced NaN/Inf: with fp16 check the loss scale and overflow lines; otherwise look for "
    "a bad data batch or a learning-rate spike, and restart from the last checkpoint before this step "
    "(consider skipping the offending batches)"
)


@dataclass(frozen=True, kw_only=True)
class NonfiniteConfig(BuiltInConfig):
    quiet: int = 10


class Nonfinite(Detector):
    id = "nonfinite"
    description = "NaN/Inf in any metric, Megatron's omitted loss field, a rising NaN-iteration count"
    Config = NonfiniteConfig
    config: NonfiniteConfig

    def __init__(self, config: NonfiniteConfig | None = None, path: str = "") -> None:
        super().__init__(config, path)
        self._incident = Incident(self.config.quiet)
        self._seen = 0

    def update(self, batch: Batch) -> list[Alert]:
        rec = columns(batch)
        alerts: list[Alert] = []
        for ev in batch.events:
            if ev.reports_nan:
                alerts.append(
                    self.alert(
                        Severity.CRITICAL,
                        ev.step,
                        ev.line,
                        None,
                        None,
                        None,
                        None,
                        f"trainer reported NaN: {ev.data['text'][:160]}",
                        _HINT,
                    )
                )
        if len(rec) == 0:
            return alerts
        names = rec["nonfinite"]
        nan_count = np.nan_to_num(rec["nan_count"], nan=0.0)
        bad = rec.flagged() | (nan_count > 0)
        steps, lines = rec["step"], rec["line"]
        start = self._seen
        self._seen += len(rec)
        for kind, pos, first in self._incident.scan(start, len(rec), np.flatnonzero(bad), steps):
            if kind == "close":
                alerts.append(
                    self.alert(
                        Severity.INFO,
                        steps[pos],
                        lines[pos],
                        None,
                        None,
                        None,
                        None,
                        f"metrics finite again (non-finite values began at step {first})",
                        "check that the run's loss is back at its level before the NaN",
                    )
                )
                continue
            bad_names = names[pos].split(",") if names[pos] else ["nan_count"]
            metric = bad_names[0]
            value: float | None = float(rec[metric][pos]) if metric in rec else None
            if metric == "nan_count":
                what = f"{int(nan_count[pos])} NaN iteration(s) counted"
            elif metric == "loss" and value is not None and np.isnan(value):
                what = "loss is NaN"  # (printed so, or left out as Megatron does on such a step)
                value = None
            else:
                what = f"{', '.join(bad_names)} not finite"
            alerts.append(
                self.alert(
                    Severity.CRITICAL,
                    steps[pos],
                    lines[pos],
                    metric,
                    value,
                    None,
                    None,
                    what,  # (the step is the alert's own: reports show it beside the message)
                    _HINT,
                )
            )
        return alerts

"""Trainer errors: the exception ending a Python traceback, a CUDA or NCCL error, a collective
timeout (the `errors` parser's `error` events).

A crash is the costliest failure a log shows and the quietest one: the records just stop, and
`stall` takes the error as the run's end, not a hang (BigScience tr1-13B iteration 43680: an
uncorrectable ECC error). Every rank prints its own traceback, so the errors up to the next
training record are one incident and one alert. An error after the trainer said it finished
(`Training completed`, `[exiting program ...]`) is a warning: the training is done, but what came
after it (saving, an upload) may not be. NaN reports are `nonfinite`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gradwatch.alerts import Alert, Severity
from gradwatch.detectors.base import BuiltInConfig, Detector, columns
from gradwatch.events import Event, EventKind
from gradwatch.parsers.stream import Batch

_HINT = (
    "the job most likely died here: for CUDA/ECC/Xid errors check the node's GPUs (dmesg, nvidia-smi) "
    "and exclude it; for NCCL or collective timeouts look at the other ranks' logs for the first to "
    "fail; for a Python error fix the code or config; then resume from the last checkpoint"
)

_HINT_AFTER_END = (
    "training had finished: check that the final checkpoint or model was saved whole (and uploaded, "
    "where the job pushes it) before relying on it"
)


@dataclass(frozen=True, kw_only=True)
class TrainerErrorConfig(BuiltInConfig):
    pass


class TrainerError(Detector):
    id = "trainer_error"
    description = "an exception ending a traceback, a CUDA/NCCL error or a collective timeout (NaN: nonfinite)"
    Config = TrainerErrorConfig
    config: TrainerErrorConfig

    def __init__(self, config: TrainerErrorConfig | None = None, path: str = "") -> None:
        super().__init__(config, path)
        self._open_since: int | None = None  # the line of the error that opened the incident
        self._ended_at: int | None = None  # the line where the trainer said it finished

    def update(self, batch: Batch) -> list[Alert]:
        record_lines = np.sort(columns(batch)["line"])
        if self._ended_at is not None and len(record_lines) and record_lines[0] > self._ended_at:
            self._ended_at = None  # training went on after the end (a requeued job in the same log)
        alerts: list[Alert] = []
        for ev in batch.events:
            if ev.kind is EventKind.RUN_END:
                self._ended_at = ev.line
            if ev.kind is not EventKind.ERROR or ev.reports_nan:
                continue
            if self._ended_at is not None and _records_between(record_lines, self._ended_at, ev.line):
                self._ended_at = None
            if self._open_since is not None and not _records_between(record_lines, self._open_since, ev.line):
                continue  # another rank's copy, or the next error of the same crash
            self._open_since = ev.line
            alerts.append(self._alert(ev))
        if self._open_since is not None and len(record_lines) and record_lines[-1] > self._open_since:
            self._open_since = None  # training went on: the next error is a new incident
        return alerts

    def _alert(self, ev: Event) -> Alert:
        text = ev.data.get("text", "")
        short = text if len(text) <= 160 else text[:159] + "…"
        if self._ended_at is not None:
            message = f"error after the trainer said it finished: {short}"
            return self.alert(Severity.WARNING, ev.step, ev.line, None, None, None, None, message, _HINT_AFTER_END)
        at = f"at step {ev.step}" if ev.step is not None and ev.step >= 0 else "before the first step"
        return self.alert(
            Severity.CRITICAL, ev.step, ev.line, None, None, None, None, f"trainer error {at}: {short}", _HINT
        )


def _records_between(record_lines: np.ndarray, after: int, before: int) -> bool:
    """Whether a training record lies between two lines of this batch's file."""
    return bool(np.searchsorted(record_lines, before) > np.searchsorted(record_lines, after, side="right"))

"""Trainer errors: the exception ending a Python traceback, a CUDA or NCCL error, a collective
timeout, a process killed or dead as a launcher, Slurm or a shell reports it (the `errors`
parser's `error` events).

A crash is the costliest failure a log shows and the quietest one: the records just stop, and
`stall` takes the error as the run's end, not a hang (BigScience tr1-13B iteration 43680: an
uncorrectable ECC error). Every rank prints its own traceback, so the errors up to the next
training record are one incident and one alert; an info alert says when training went on after
it (an error caught, or the job requeued). An error after the run ended (`Training completed`,
`[exiting program ...]`, Ctrl-C, Slurm's time limit) is a warning: the training is over, but what
came after it (saving, an upload) may not be; but a launcher or shell reporting a process's
death after the end (an exit code, `Killed`) is the end's own echo, no error. An error glued
onto a progress bar takes the bar's step. NaN reports are `nonfinite`'s.
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

_RESTARTS = (EventKind.CHECKPOINT_LOAD, EventKind.START_FROM_RANDOM)

_HINT_AFTER_END = (
    "the run had already ended (finished, stopped, or out of time): check that its last checkpoint "
    "or model was saved whole (and uploaded, where the job pushes it) before relying on it"
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
        self._ended_at: int | None = None  # the line where the run ended (finished, stopped, out of time)

    def update(self, batch: Batch) -> list[Alert]:
        rec = columns(batch)
        lines, steps = rec["line"], rec["step"]
        alerts: list[Alert] = []
        for ev in batch.events:
            if self._open_since is not None and _records_between(lines, self._open_since, ev.line):
                alerts.append(self._went_on(lines, steps))
            if self._ended_at is not None and _records_between(lines, self._ended_at, ev.line):
                self._ended_at = None  # training went on after the end (a requeued job in the same log)
            if ev.kind is EventKind.RUN_END:
                self._ended_at = ev.line
            elif ev.kind in _RESTARTS:
                self._open_since = None  # a requeued job starting: its error is a crash of its own
            elif self._opens(ev):
                self._open_since = ev.line
                alerts.append(self._alert(ev, _step_of(ev, lines, steps)))
        if self._open_since is not None and len(lines) and lines[-1] > self._open_since:
            alerts.append(self._went_on(lines, steps))
        if self._ended_at is not None and len(lines) and lines[-1] > self._ended_at:
            self._ended_at = None
        return alerts

    def _opens(self, ev: Event) -> bool:
        """Whether `ev` opens an incident: an error when none is open (else it is another rank's
        copy, or the next error of the same crash), but a death report after the run's end."""
        if ev.kind is not EventKind.ERROR or ev.reports_nan or self._open_since is not None:
            return False
        return self._ended_at is None or not ev.data.get("death")

    def _went_on(self, lines: np.ndarray, steps: np.ndarray) -> Alert:
        """The incident is over: a training record came after the error (a caught one, or a requeue)."""
        assert self._open_since is not None
        at, self._open_since = int(np.searchsorted(lines, self._open_since, side="right")), None
        step = int(steps[at])
        return self.alert(
            Severity.INFO,
            step,
            int(lines[at]),
            None,
            None,
            None,
            None,
            "training went on after the error",  # (at the alert's step, shown beside it)
            "the error was caught or the job restarted: check that the run is where it should be",
        )

    def _alert(self, ev: Event, step: int | None) -> Alert:
        text = ev.data.get("text", "")
        short = text if len(text) <= 160 else text[:159] + "…"
        if self._ended_at is not None:
            message = f"error after the run ended: {short}"
            return self.alert(Severity.WARNING, step, ev.line, None, None, None, None, message, _HINT_AFTER_END)
        at = "" if step is not None and step >= 0 else " before the first step"  # (a step is shown beside it)
        return self.alert(
            Severity.CRITICAL, step, ev.line, None, None, None, None, f"trainer error{at}: {short}", _HINT
        )


def _step_of(ev: Event, lines: np.ndarray, steps: np.ndarray) -> int | None:
    """The error's step: a record's on its own line where there is one (the progress bar it was
    glued onto, read after it), else the latest before it (the event's)."""
    at = int(np.searchsorted(lines, ev.line, side="right")) - 1
    if at >= 0 and lines[at] == ev.line and steps[at] >= 0:
        return int(steps[at])
    return ev.step


def _records_between(lines: np.ndarray, after: int, before: int) -> bool:
    """Whether a training record of the batch (`lines`, in file order) lies between two lines."""
    return bool(np.searchsorted(lines, before) > np.searchsorted(lines, after, side="right"))

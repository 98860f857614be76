"""Events: things a log says that are not per-step metrics (overflows, checkpoints, errors).

Events travel beside record batches. Each carries the line it came from so that detectors can
put it in order with the records; `step` is the training step it belongs to when known.

DeepSpeed's `step=N, skipped=K` counters are no events: a run prints one every few steps, which
made hundreds of thousands of event objects in a long log, each built, sent between processes
and looked at one by one. They travel as columns (`SkipCounts`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np


class EventKind(str, Enum):
    OVERFLOW = "overflow"  #: fp16 overflow: data has attempted scale, new scale, hysteresis flag
    SCALE_INCREASE = "scale_increase"  #: dynamic loss scale grew: data has old, new
    SCALE_AT_MINIMUM = "scale_at_minimum"  #: "Current loss scale already at minimum"
    CHECKPOINT_SAVE = "checkpoint_save"
    CHECKPOINT_LOAD = "checkpoint_load"  #: data may have iteration
    START_FROM_RANDOM = "start_from_random"
    VALIDATION = "validation"  #: data has val_loss
    VOCAB = "vocab"  #: data has size (padded vocab size, for the random-init loss level)
    ERROR = "error"  #: a traceback or a trainer error message; data has text
    RUN_END = "run_end"  #: the trainer said it is exiting (normal end, time limit, job finished)
    PARSE_WARNING = "parse_warning"  #: something in the input that we could not read fully
    CONFIG = "config"  #: what the run was told at a start: data has config, raw, source (`run_config`)


#: NaN as a word (not `nanogpt`, `nanotron`): "Unexpected result nan", "found NaN in local grad norm"
_NAN = re.compile(r"(?<![a-z0-9])nan(?![a-z0-9])", re.IGNORECASE)


@dataclass(frozen=True)
class Event:
    kind: EventKind
    line: int
    step: int | None = None
    ts: float | None = None
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def reports_nan(self) -> bool:
        """A trainer error about NaN (Megatron's rerun checks, "found NaN in local grad norm"):
        `nonfinite`'s to report; `trainer_error` takes the other errors."""
        return self.kind is EventKind.ERROR and _NAN.search(self.data.get("text", "")) is not None


@dataclass(frozen=True)
class SkipCounts:
    """DeepSpeed's cumulative `step=N, skipped=K` counters of a batch, in line order, as columns
    of int64 (only those with a valid step)."""

    line: np.ndarray
    step: np.ndarray
    skipped: np.ndarray

    @staticmethod
    def empty() -> SkipCounts:
        none = np.zeros(0, dtype=np.int64)
        return SkipCounts(none, none, none)

    def __len__(self) -> int:
        return len(self.line)

    def where(self, keep: np.ndarray | slice) -> SkipCounts:
        """The counters where `keep` (a mask, indices or a slice) says."""
        return SkipCounts(self.line[keep], self.step[keep], self.skipped[keep])

    def moved(self, offset: int) -> SkipCounts:
        """The counters with their line numbers moved on by `offset`."""
        return SkipCounts(self.line + offset, self.step, self.skipped)


class SkipCountBuilder:
    """Collects counters as a parser reads them: one by one, or many at once (the bulk path)."""

    #: (line, step) of the counter added last, kept past `take` (a class default for older pickles)
    latest: tuple[int, int] | None = None

    def __init__(self) -> None:
        self._parts: list[SkipCounts] = []
        self._rows: list[tuple[int, int, int]] = []

    def add(self, line: int, step: int, skipped: int) -> None:
        self._rows.append((line, step, skipped))
        self.latest = (line, step)

    def add_columns(self, counts: SkipCounts) -> None:
        self._flush_rows()
        self._parts.append(counts)
        if len(counts):
            self.latest = (int(counts.line[-1]), int(counts.step[-1]))

    def emptied(self) -> SkipCountBuilder:
        """A builder without the counters this one holds, but with its `latest`: what a stream
        that goes on from here knows of the counters before (`LogStream.snapshot`)."""
        empty = SkipCountBuilder()
        empty.latest = self.latest
        return empty

    def take(self) -> SkipCounts:
        """Everything added since the last call, in line order (one by one and at once interleave)."""
        self._flush_rows()
        parts, self._parts = self._parts, []
        if not parts:
            return SkipCounts.empty()
        if len(parts) == 1:
            return parts[0]
        joined = SkipCounts(*(np.concatenate([getattr(p, c) for p in parts]) for c in ("line", "step", "skipped")))
        order = np.argsort(joined.line, kind="stable")
        return joined.where(order)

    def _flush_rows(self) -> None:
        if self._rows:
            line, step, skipped = np.array(self._rows, dtype=np.int64).reshape(-1, 3).T
            self._parts.append(SkipCounts(line, step, skipped))
            self._rows = []

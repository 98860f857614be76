"""Events: things a log says that are not per-step metrics (overflows, checkpoints, errors).

Events travel beside record batches. Each carries the line it came from so that detectors can
put it in order with the records; `step` is the training step it belongs to when known.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any


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
    SKIP_COUNT = "skip_count"  #: DeepSpeed step=N, skipped=K (cumulative); data has skipped
    PARSE_WARNING = "parse_warning"  #: something in the input that we could not read fully


@dataclass(frozen=True)
class Event:
    kind: EventKind
    line: int
    step: int | None = None
    ts: float | None = None
    data: dict[str, Any] = field(default_factory=dict)

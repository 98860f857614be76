"""Trainer errors, tracebacks and exits, in any format: they become `error` and `run_end` events.

A Python traceback is reported once, at its last line (the exception), which is the part people
need; CUDA/NCCL errors and Megatron's NaN checks are reported as they appear. A traceback after
`Exception ignored in: ...` is none: Python ignored it (a DataLoader's `__del__` at shutdown).
Exit messages tell a stall detector that silence after them is a finished job, not a hung one.
"""

from __future__ import annotations

import re

from gradwatch.events import EventKind
from gradwatch.parsers.base import ParseOutput, Parser

_TRACEBACK = "Traceback (most recent call last)"
_IGNORED = "Exception ignored in"
_EXCEPTION = re.compile(r"^\s*(?:[\w.]+\.)?(\w*(?:Error|Exception|Interrupt)|SystemExit)(?::\s|$)")
_MARKERS = (
    "Unexpected result nan",
    "found NaN in local",
    "Spiky loss",
    "CUDA error",
    "NCCL error",
    "cudaError",
    "Watchdog caught collective operation timeout",
)
_EXITS = (
    "exiting program",  # Megatron: `[exiting program after N minutes]`, `exiting program at iteration N`
    "[after training is done]",  # Megatron
    "Training completed",  # HF Trainer
    "Execution finished",  # ALCF ezpz launcher
    "Job finished",
)


class ErrorParser(Parser):
    name = "errors"
    segment_safe = True
    scan = "|".join(re.escape(m) for m in (_TRACEBACK, _IGNORED, *_MARKERS, *_EXITS))
    description = "Python tracebacks, trainer/CUDA/NCCL errors and exit messages in any log (events only)"
    auxiliary = True

    def __init__(self) -> None:
        self._in_traceback = False
        self._ignored = False  # the traceback under way is one Python ignored

    @property
    def collecting(self) -> bool:
        return self._in_traceback or self._ignored  # (the line after `Exception ignored in` too)

    def parse(self, text: str, line: int, ts: float | None, out: ParseOutput) -> bool:
        if text.startswith(_IGNORED):
            self._ignored = True
            return True
        if text.startswith(_TRACEBACK):
            self._in_traceback = True
            return True
        if self._ignored and not self._in_traceback:
            self._ignored = False  # no traceback came with it: the next one is not ignored
        if self._in_traceback:
            m = _EXCEPTION.match(text)
            if m:
                self._in_traceback = False
                if not self._ignored:
                    out.event(EventKind.ERROR, line, out.last_step, ts, text=text.strip()[:500])
                self._ignored = False
                return True
            if text.startswith((" ", "\t")):
                return True  # a frame
            # Neither a frame nor the exception: the traceback was cut short (the process was
            # killed while printing it). It ends here, or it would take every indented line of
            # the rest of the log, a restarted run's ` iteration` records among them.
            self._in_traceback = self._ignored = False
        if any(marker in text for marker in _MARKERS):
            out.event(EventKind.ERROR, line, out.last_step, ts, text=text.strip()[:500])
            return True
        if any(marker in text for marker in _EXITS):
            out.event(EventKind.RUN_END, line, out.last_step, ts, text=text.strip()[:200])
            return True
        return False

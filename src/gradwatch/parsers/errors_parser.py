"""Trainer errors, tracebacks and exits, in any format: they become `error` and `run_end` events.

A Python traceback is reported once, at its last line (the exception), which is the part people
need; CUDA/NCCL errors and Megatron's NaN checks are reported as they appear. A traceback after
`Exception ignored in: ...` is none: Python ignored it (a DataLoader's `__del__` at shutdown).
Exit messages tell a stall detector that silence after them is a finished job, not a hung one.

A traceback may follow a tqdm bar on its line, and its frames may have lost their indentation to
a launcher's prefix (srun `--label` pads and eats it): a frame is a `File "..."` line and the lines
indented deeper than it (its source, `^~` markers), or, where the indentation was eaten, the line
after it (unless that is the exception: a frame without source). One that the log ends in (the process
killed while printing it) is reported with its last frame; one that another line cuts short in
the middle of the log is not: that is what ranks printing at once make of theirs, Ctrl-C's among
them. `KeyboardInterrupt` and a launcher's SIGTERM are the run's end, not errors.
"""

from __future__ import annotations

import re

from gradwatch.events import EventKind
from gradwatch.parsers.base import ParseOutput, Parser

_TRACEBACK = "Traceback (most recent call last)"
_IGNORED = "Exception ignored in"
#: an exception line: a class named as exceptions are (or any class of a dotted module path), with
#: Ray's `(Cause)`, then `:` or the end: `RuntimeError: boom`, `torch._dynamo.exc.BackendCompilerFailed:
#: ...`, `StopIteration`; not `Warning: ...` or `Note: ...` from a line cutting a traceback short
_EXCEPTION = re.compile(
    r"^(?:(?:[A-Za-z_]\w*\.)+[A-Z]\w*|[A-Z]\w*(?:Error|Exception|Interrupt|Exit|Iteration|Failed|Failure|Group|Timeout))"
    r"(?:\([\w.]+\):\s|:(?:\s|$)|$)"
)
#: exceptions that end a run on purpose: Ctrl-C, and torchrun passing on a SIGTERM (scancel, a time limit)
_STOPS = ("KeyboardInterrupt", "SignalException")
_CARETS = re.compile(r"^[\s^~]+$")
#: srun `--label` pads its labels (` 3: `) once there are ten tasks or more; `clean` keeps them
_PADDED_LABEL = re.compile(r"^ +\d{1,5}: ?")
_MARKERS = (
    "Unexpected result nan",
    "found NaN in local",
    "Spiky loss",
    "CUDA error:",
    "NCCL error",
    "cudaError",
    "Watchdog caught collective operation timeout",
    "oom-kill event",  # slurmstepd: the kernel's OOM killer took a process of the job (no traceback)
    "exits with return code =",  # DeepSpeed's launcher: a rank died (it logs a clean exit otherwise)
    "failed (exitcode:",  # torchrun (torch.distributed.elastic): a worker died
)
_CLEAN_EXIT = "exits with return code = 0"
_EXITS = (
    "exiting program",  # Megatron: `[exiting program after N minutes]`, `exiting program at iteration N`
    "[after training is done]",  # Megatron
    "Training completed",  # HF Trainer
    "Execution finished",  # ALCF ezpz launcher
    "Job finished",
    "received SIGTERM, exiting",  # DeepSpeed's launcher, killed (a time limit, scancel)
    "DUE TO TIME LIMIT",  # slurmstepd: `*** JOB 123 ON nid01 CANCELLED AT ... DUE TO TIME LIMIT ***`
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
        self._last_frame = ""  # the traceback's latest `File "..."` line
        self._source_next = False  # the next line is that frame's source line, its indentation eaten
        self._frame_indent = 0  # how far that `File "` line is indented
        self._line = 0  # the traceback's latest line

    @property
    def collecting(self) -> bool:
        return self._in_traceback or self._ignored  # (the line after `Exception ignored in` too)

    def parse(self, text: str, line: int, ts: float | None, out: ParseOutput) -> bool:
        if text[:1] == " " and (m := _PADDED_LABEL.match(text)):
            text = text[m.end() :]
        if text.startswith(_IGNORED):
            self._ignored = True
            return True
        if _TRACEBACK in text:  # (after a tqdm bar on the same line, too)
            self._in_traceback, self._last_frame, self._source_next, self._line = True, "", False, line
            return True
        if self._ignored and not self._in_traceback:
            self._ignored = False  # no traceback came with it: the next one is not ignored
        if self._in_traceback:
            if self._frame(text):
                self._line = line
                return True
            self._in_traceback = False
            ignored, self._ignored = self._ignored, False
            if _EXCEPTION.match(text):
                if not ignored:
                    kind = EventKind.RUN_END if any(stop in text for stop in _STOPS) else EventKind.ERROR
                    out.event(kind, line, out.last_step, ts, text=text.strip()[:500])
                return True
            # Neither a frame nor the exception: the traceback was cut short (the process was
            # killed while printing it, or another rank's line came in between). It ends here,
            # or it would take every indented line of the rest of the log, a restarted run's
            # ` iteration` records among them.
        if any(marker in text for marker in _MARKERS) and _CLEAN_EXIT not in text:
            out.event(EventKind.ERROR, line, out.last_step, ts, text=text.strip()[:500])
            return True
        if any(marker in text for marker in _EXITS):
            out.event(EventKind.RUN_END, line, out.last_step, ts, text=text.strip()[:200])
            return True
        return False

    def flush(self, out: ParseOutput) -> None:
        """The log ends inside a traceback: the process died while printing it."""
        if self._in_traceback and not self._ignored:
            where = f" after {self._last_frame}" if self._last_frame else ""
            out.event(EventKind.ERROR, self._line, out.last_step, None, text=f"a traceback cut short{where}"[:500])
        self._in_traceback = self._ignored = False

    def _frame(self, text: str) -> bool:
        """Whether `text` is part of the traceback's frames (and note it): a `File "` line, then
        lines indented deeper (its source, `^~` markers), as Python prints them. A line indented
        less, or before any `File "`, is another process's (a Megatron record's one space)."""
        source_next, self._source_next = self._source_next, False
        stripped = text.lstrip()
        indent = len(text) - len(stripped)
        if stripped.startswith('File "'):
            self._last_frame, self._frame_indent = stripped.rstrip(), indent
            # unindented: a launcher's prefix ate the indentation, the source line's too
            self._source_next = indent == 0
            return True
        if source_next:  # the frame's source, unless it had none (`<frozen runpy>`): then the exception
            return indent == 0 and not _EXCEPTION.match(text)
        return (bool(self._last_frame) and indent > self._frame_indent) or bool(_CARETS.match(text))

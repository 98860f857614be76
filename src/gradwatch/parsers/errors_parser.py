"""Trainer errors, tracebacks and exits, in any format: they become `error` and `run_end` events.

A Python traceback is reported once, at its last line (the exception), which is the part people
need; the one-line reports of a crash or of the run's end (CUDA/NCCL errors, Megatron's NaN
checks, launchers, Slurm, shells: `crash_lines`) are reported as they appear. A traceback after
`Exception ignored in: ...` is none: Python ignored it (a DataLoader's `__del__` at shutdown).
Exit messages tell a stall detector that silence after them is a finished job, not a hung one.

A traceback may follow a tqdm bar on its line, as may Hydra's `Error executing job with
overrides: [...]` that comes before one, or a one-line error: the line is then left to the other
parsers too (the bar may be a record, whose step is the crash's). A traceback's frames may have
lost their indentation to a launcher's prefix (srun `--label` pads and eats it): a frame is a
`File "..."` line and the lines indented deeper than it (its source, `^~` markers), or, where the
indentation was eaten, the line after it (unless that is the exception: a frame without source).
One that the log ends in (the process killed while printing it) is reported with its last frame;
one that another line cuts short in the middle of the log is not: that is what ranks printing at
once make of theirs, Ctrl-C's among them. `KeyboardInterrupt` and a launcher's SIGTERM are the
run's end, not errors. An `error` event of a launcher or shell reporting a process's death has
`death` set in its data (`CrashLine.death`).
"""

from __future__ import annotations

import re

from gradwatch.events import EventKind
from gradwatch.parsers.base import ParseOutput, Parser
from gradwatch.parsers.crash_lines import KEYWORDS, classify

_TRACEBACK = "Traceback (most recent call last)"
#: Hydra's line before the traceback of a job that raised (often glued onto Lightning's bar)
_HYDRA = "Error executing job with overrides"
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
#: a tqdm bar's count and times: `| 450/1000 [10:00<12:00,  1.3s/it, loss=2.31]`, `450it [00:10, 45it/s]`
_BAR = re.compile(r"\d(?:/\d+|it) \[[^\[\]]*\]")


class ErrorParser(Parser):
    name = "errors"
    segment_safe = True
    scan = "|".join(re.escape(m) for m in (_TRACEBACK, _IGNORED, _HYDRA, *KEYWORDS))
    description = "Python tracebacks, trainer/CUDA/NCCL errors and exit messages in any log (events only)"
    auxiliary = True

    def __init__(self) -> None:
        self._in_traceback = False
        self._ignored = False  # the traceback under way is one Python ignored
        self._last_frame = ""  # the traceback's latest `File "..."` line
        self._source_next = False  # the next line is that frame's source line, its indentation eaten
        self._frame_indent = 0  # how far that `File "` line is indented
        self._line = 0  # the traceback's latest line
        self._opener = ""  # Hydra's line, where it opened the traceback under way (none came yet)

    @property
    def collecting(self) -> bool:
        return self._in_traceback or self._ignored  # (the line after `Exception ignored in` too)

    def parse(self, text: str, line: int, ts: float | None, out: ParseOutput) -> bool:
        if text[:1] == " " and (m := _PADDED_LABEL.match(text)):
            text = text[m.end() :]
        if text.startswith(_IGNORED):
            self._ignored = True
            return True
        at = text.find(_TRACEBACK)
        if at < 0:
            at = text.find(_HYDRA)
        if at >= 0:  # (after a tqdm bar on the same line, too)
            self._in_traceback, self._last_frame, self._source_next, self._line = True, "", False, line
            self._opener = "" if text.startswith(_TRACEBACK, at) else text[at:].strip()[:500]
            return _bar_end(text[:at]) == 0
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
        found = classify(text)
        if found is None:
            return False
        bar = _bar_end(text)
        death = {"death": True} if found.death else {}
        out.event(found.kind, line, out.last_step, ts, text=text[bar:].strip()[:500], **death)
        return bar == 0

    def flush(self, out: ParseOutput) -> None:
        """The log ends inside a traceback: the process died while printing it."""
        if self._in_traceback and not self._ignored:
            if self._last_frame:
                what = f"a traceback cut short after {self._last_frame}"
            else:
                what = self._opener or "a traceback cut short"
            out.event(EventKind.ERROR, self._line, out.last_step, None, text=what[:500])
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


def _bar_end(text: str) -> int:
    """Where the last tqdm bar in `text` ends, or 0: none."""
    end = 0
    for m in _BAR.finditer(text):
        end = m.end()
    return end

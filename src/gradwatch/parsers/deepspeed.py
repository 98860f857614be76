"""DeepSpeed engine lines: fp16 overflows and loss-scale changes, progress, pipeline steps.

These lines interleave with Megatron-DeepSpeed's and the HF Trainer's own lines, so this parser is
`auxiliary`: its progress lines are records only in a file where no main parser found any.
Overflow lines carry no step; they belong to the step being computed, one after the last logged.
"""

from __future__ import annotations

import contextlib
import re

import numpy as np

from gradwatch.events import EventKind, SkipCounts
from gradwatch.parsers._arrow import arrow, mask, numpy_of
from gradwatch.parsers._bytes import line_starts
from gradwatch.parsers._text import number
from gradwatch.parsers._tokens import numbers_at
from gradwatch.parsers.base import AuxLines, Block, ParseOutput, Parser
from gradwatch.parsers.keywords import line_array

_ATTEMPTED = re.compile(r"Attempted loss scale:\s*([\d.eE+-]+),\s*(?:reducing to\s*([\d.eE+-]+)|but hysteresis)")
_REDUCING = re.compile(r"Reducing dynamic loss scale from\s*([\d.eE+-]+)\s*to\s*([\d.eE+-]+)")
_INCREASING = re.compile(r"Increasing dynamic loss scale from\s*([\d.eE+-]+)\s*to\s*([\d.eE+-]+)")
_PROGRESS = re.compile(r"\bstep=(\d+), skipped=(\d+), lr=\[([^,\]]+)")
_PIPE_STEPS = re.compile(r"\bsteps: (\d+) loss: (\S+) .*?iter time \(s\): (\S+)")
_SAVING = re.compile(r"Saving model checkpoint: .*?global_step(\d+)")
#: the progress line as DeepSpeed's logger prints it, read for a whole block at once (RE2, on
#: lines without launcher prefixes or escapes): the logger's prefix; nothing before `step=`
#: can hold `] step=`, `, skipped=` or `, lr=`; counts exact as floats; and `lr=[` is followed by
#: what `_PROGRESS` needs
_PROGRESS_LINE = (
    r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\] \[[A-Z]+\] \[[\w.:-]*\] \[Rank \d+\] "
    r"step=\d{1,15}, skipped=\d{1,15}, lr=\[[^,\]\x1b\r\n][^\x1b\r\n]*\n?$"
)


class DeepSpeedParser(Parser):
    name = "deepspeed"
    segment_safe = True
    scan = r"verflow|loss scale|\bstep=\d|steps: \d|Saving model checkpoint"
    description = "DeepSpeed engine: OVERFLOW / loss-scale lines, `step=N, skipped=K`, pipeline `steps: N loss: X`"
    auxiliary = True

    def __init__(self) -> None:
        # FP16_Optimizer prints "Grad overflow", "Reducing ..." and "Overflow detected" for one
        # overflow (and every rank repeats them): count each (step, scale) once, until a record
        # (after a resume the replayed step may overflow again): (step, scale, the latest record's line)
        self._last_overflow: tuple[int | None, float, int] | None = None

    def _next_step(self, out: ParseOutput) -> int | None:
        return None if out.last_step is None else out.last_step + 1

    def carried(self, out: ParseOutput) -> tuple[object, ...] | None:
        """The overflow that a copy would repeat, if one was read since the latest record: it
        may lie before a segment's warm-up (a stretch of chatter), and a worker whose memory is
        older would count its copy again. (An older one is no longer repeated by anything.)"""
        memory = self._last_overflow
        if memory is None or len(memory) < 3 or memory[2] != out.last_record_line:
            return (None,)  # (a 2-tuple: pickled by an older gradwatch, and no longer repeated)
        return (memory[:2],)

    def parse(self, text: str, line: int, ts: float | None, out: ParseOutput) -> bool:
        if "verflow" in text or "loss scale" in text:
            try:
                return self._scale(text, line, ts, out)
            except ValueError:  # a garbled or cut scale such as `reducing to -`
                return False
        if "step=" in text and "skipped=" in text:
            m = _PROGRESS.search(text)
            if m:
                step, skipped = int(m.group(1)), int(m.group(2))
                metrics: dict[str, float] = {}
                with contextlib.suppress(ValueError):
                    metrics["lr"] = number(m.group(3))
                out.skip_count(line, step, skipped)
                if not out.counts.keys() - {self.name}:
                    out.record(self.name, step, line, ts, metrics)
                return True
        if "steps:" in text and "iter time" in text:
            m = _PIPE_STEPS.search(text)
            if m:
                try:
                    loss = number(m.group(2))
                    step_time = number(m.group(3))
                except ValueError:
                    return False
                if not out.counts.keys() - {self.name}:
                    nonfinite = [] if loss == loss and abs(loss) != float("inf") else ["loss"]
                    out.record(
                        self.name,
                        int(m.group(1)),
                        line,
                        ts,
                        {"loss": loss, "step_time_s": step_time},
                        nonfinite,
                    )
                return True
        if "Saving model checkpoint" in text:
            m = _SAVING.search(text)
            out.event(EventKind.CHECKPOINT_SAVE, line, int(m.group(1)) if m else out.last_step, ts)
            return True
        return False

    def aux_lines(self, block: Block, lines: np.ndarray, out: ParseOutput) -> AuxLines | None:
        """The progress lines among `lines` of a block, in a file whose records another parser
        writes (so that they are skip counters only): their step and skip count. A line with a
        character that is not ASCII (a `?` in `block.codes`) does not match: it goes line by line."""
        if not out.counts.keys() - {self.name}:
            return None
        _, pc = arrow()

        codes, newlines = block.codes, block.newlines
        taken = line_array(codes, newlines, lines)
        ok = numpy_of(pc.match_substring_regex(taken, _PROGRESS_LINE))
        ok &= ~numpy_of(pc.match_substring_regex(taken, "verflow|loss scale"))  # other branches
        index = lines[ok]
        if not len(index):
            return None
        starts = line_starts(newlines, index)
        taken = taken.filter(mask(ok))

        def find(word: str) -> np.ndarray:
            return starts + numpy_of(pc.find_substring(taken, word))

        step_at, skipped_at, lr_at = find("] step="), find(", skipped="), find(", lr=")
        tokens = np.column_stack([step_at + 7, skipped_at + 10]), np.column_stack([skipped_at, lr_at])
        values, read = numbers_at(codes, *tokens)
        found = AuxLines(index[read], {})
        found.data["step"], found.data["skipped"] = values.astype(np.int64).T
        return found

    def aux_events(self, found: AuxLines, linenos: np.ndarray, out: ParseOutput) -> None:
        out.skip_count_columns(SkipCounts(linenos.astype(np.int64), found.data["step"], found.data["skipped"]))

    def _scale(self, text: str, line: int, ts: float | None, out: ParseOutput) -> bool:
        if "already at minimum" in text:
            out.event(EventKind.SCALE_AT_MINIMUM, line, self._next_step(out), ts)
            return True
        m = _ATTEMPTED.search(text)
        if m:
            attempted = float(m.group(1))
            new = float(m.group(2)) if m.group(2) else attempted  # hysteresis: scale kept
            self._overflow(line, ts, out, attempted, new, hysteresis=m.group(2) is None)
            return True
        m = _REDUCING.search(text)
        if m:
            self._overflow(line, ts, out, float(m.group(1)), float(m.group(2)), hysteresis=False)
            return True
        m = _INCREASING.search(text)
        if m:
            out.event(
                EventKind.SCALE_INCREASE,
                line,
                self._next_step(out),
                ts,
                old=float(m.group(1)),
                new=float(m.group(2)),
            )
            return True
        # a non-fp16 overflow message, or the line announcing "Grad overflow on iteration N"
        return "OVERFLOW" in text or "Grad overflow" in text

    def _overflow(
        self,
        line: int,
        ts: float | None,
        out: ParseOutput,
        attempted: float,
        new: float,
        hysteresis: bool,
    ) -> None:
        step = self._next_step(out)
        key = (step, attempted, out.last_record_line)
        if key == self._last_overflow:
            return
        self._last_overflow = key
        out.event(EventKind.OVERFLOW, line, step, ts, attempted=attempted, new=new, hysteresis=hysteresis)

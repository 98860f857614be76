"""DeepSpeed engine lines: fp16 overflows and loss-scale changes, progress, throughput timers,
pipeline steps.

These lines interleave with Megatron-DeepSpeed's and the HF Trainer's own lines, so this parser is
`auxiliary`: its lines are records only in a file where no other parser found any (`stands_in`),
a log of nothing but DeepSpeed's lines: then progress lines are records of the learning rate,
timer lines of throughput, and overflows of the loss scale and the step they skipped.
Overflow lines carry no step; they belong to the step being computed, one after the last logged
(DeepSpeed's step counter counts skipped steps).
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
from gradwatch.parsers.fp16_scaler import Overflow, stands_in, write_overflow
from gradwatch.parsers.keywords import line_array

_ATTEMPTED = re.compile(r"Attempted loss scale:\s*([\d.eE+-]+),\s*(?:reducing to\s*([\d.eE+-]+)|but hysteresis)")
_REDUCING = re.compile(r"Reducing dynamic loss scale from\s*([\d.eE+-]+)\s*to\s*([\d.eE+-]+)")
_INCREASING = re.compile(r"Increasing dynamic loss scale from\s*([\d.eE+-]+)\s*to\s*([\d.eE+-]+)")
#: the progress counter (`hf_steps` reads it as this parser does)
PROGRESS = re.compile(r"\bstep=(\d+), skipped=(\d+), lr=\[([^,\]]+)")
_PIPE_STEPS = re.compile(r"\bsteps: (\d+) loss: (\S+) .*?iter time \(s\): (\S+)")
_SAVING = re.compile(r"Saving model checkpoint: .*?global_step(\d+)")
#: the throughput timer, as DeepSpeed prints it since 2022 (the current step's rate, and the
#: optimizer step) and before (`0/40, SamplesPerSec=`: the run's average, and a count of micro-steps
#: that starts again each epoch, no step of the trainer's)
_TIMER = re.compile(r"global_step=(\d+), RunningAvgSamplesPerSec=[^,]*, CurrSamplesPerSec=(?P<rate>[^,\s]+)")
_OLD_TIMER = re.compile(r"\] \d+/\d+, SamplesPerSec=(?P<rate>[^,\s]+)")
#: apex's and Megatron's FP16_Optimizer print this without DeepSpeed's tag: `fp16_scaler`'s line
_FP16_OPTIMIZER = "OVERFLOW! Skipping step"
#: the progress line as DeepSpeed's logger prints it, read for a whole block at once (RE2, on
#: lines without launcher prefixes or escapes): the logger's prefix; nothing before `step=`
#: can hold `] step=`, `, skipped=` or `, lr=`; counts exact as floats; and `lr=[` is followed by
#: what `PROGRESS` needs
_PROGRESS_LINE = (
    r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\] \[[A-Z]+\] \[[\w.:-]*\] \[Rank \d+\] "
    r"step=\d{1,15}, skipped=\d{1,15}, lr=\[[^,\]\x1b\r\n][^\x1b\r\n]*\n?$"
)
#: the lines this parser reads; where another parser writes the file's records, timer lines say
#: nothing, and the stream need not find them once it knows the file's format (`parse`)
_SCAN = r"verflow|loss scale|\bstep=\d|steps: \d|Saving model checkpoint|SamplesPerSec="
_SCAN_ALONGSIDE = _SCAN.removesuffix("|SamplesPerSec=")


class DeepSpeedParser(Parser):
    name = "deepspeed"
    segment_safe = True
    scan = _SCAN
    description = (
        "DeepSpeed engine: OVERFLOW / loss-scale lines, `step=N, skipped=K`, timers, pipeline `steps: N loss: X`"
    )
    auxiliary = True
    #: whether a `step=N, skipped=K` line was read: from then on the trainer's own cumulative count
    #: tells the skipped steps, and an overflow record adds none (a class default for older pickles)
    _counted = False

    def __init__(self) -> None:
        # FP16_Optimizer prints "Grad overflow", "Reducing ..." and "Overflow detected" for one
        # overflow (and every rank repeats them): count each once, until a record (after a resume
        # the replayed step may overflow again)
        self._last_overflow: Overflow | None = None

    def _next_step(self, out: ParseOutput) -> int | None:
        return None if out.last_step is None else out.last_step + 1

    def carried(self, out: ParseOutput) -> tuple[object, ...] | None:
        """The overflow that a copy would repeat, if one was read since the latest record: it
        may lie before a segment's warm-up (a stretch of chatter), and a worker whose memory is
        older would count its copy again. (An older one is no longer repeated by anything.)"""
        memory = self._last_overflow
        if not isinstance(memory, Overflow) or memory.record_line != out.last_record_line:
            return (None,)  # (a plain tuple: pickled by an older gradwatch, and no longer repeated)
        return (memory[:2],)

    def parse(self, text: str, line: int, ts: float | None, out: ParseOutput) -> bool:
        if self.scan is _SCAN and not stands_in(out):
            self.scan = _SCAN_ALONGSIDE  # type: ignore[misc]  # (taken when the format is known)
        if "verflow" in text or "loss scale" in text:
            try:
                return self._scale(text, line, ts, out)
            except ValueError:  # a garbled or cut scale such as `reducing to -`
                return False
        if "step=" in text and "skipped=" in text:
            m = PROGRESS.search(text)
            if m:
                step, skipped = int(m.group(1)), int(m.group(2))
                metrics: dict[str, float] = {}
                with contextlib.suppress(ValueError):
                    metrics["lr"] = number(m.group(3))
                out.skip_count(line, step, skipped)
                self._counted = True
                if stands_in(out):
                    out.record(self.name, step, line, ts, metrics)
                return True
        if "SamplesPerSec=" in text and self._timer(text, line, ts, out):
            return True
        if "steps:" in text and "iter time" in text:
            m = _PIPE_STEPS.search(text)
            if m:
                try:
                    loss = number(m.group(2))
                    step_time = number(m.group(3))
                except ValueError:
                    return False
                if stands_in(out):
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
        if stands_in(out):
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

    def _timer(self, text: str, line: int, ts: float | None, out: ParseOutput) -> bool:
        """Whether `text` is a timer line; where the stand-ins' records are the file's, it is a
        record of throughput (samples/s, as `tps`: only its changes count)."""
        step: int | None = None
        m = _TIMER.search(text)
        if m:
            step = int(m.group(1))
        else:
            m = _OLD_TIMER.search(text)
            if m is None:
                return False
        if stands_in(out):
            with contextlib.suppress(ValueError):
                out.record(self.name, step, line, ts, {"tps": number(m.group("rate"))})
        return True

    def _scale(self, text: str, line: int, ts: float | None, out: ParseOutput) -> bool:
        if _FP16_OPTIMIZER in text:
            return False
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
            step, new = self._next_step(out), float(m.group(2))
            out.event(EventKind.SCALE_INCREASE, line, step, ts, old=float(m.group(1)), new=new)
            if stands_in(out):
                out.record(self.name, step, line, ts, {"loss_scale": new})
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
        latest = self._last_overflow if isinstance(self._last_overflow, Overflow) else None
        self._last_overflow = write_overflow(
            out, self.name, latest, line, ts, self._next_step(out), attempted, new, hysteresis, not self._counted
        )

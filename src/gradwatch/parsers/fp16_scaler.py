"""fp16 loss-scaler lines of trainers that print no other word about it: apex amp, fairseq, and
NVIDIA's FP16_Optimizer (apex `fp16_utils`, Megatron-LM before its own optimizer):

    Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 16384.0    apex amp
    Rank 0 :: Gradient overflow.  Skipping step, reducing loss scale to 16384.0       NVIDIA BERT
    | WARNING: overflow detected, setting loss scale to: 0.25                         fairseq < 0.9
    NOTE: gradient overflow detected, ignoring gradient, setting loss scale to: 64.0  fairseq
    Minimum loss scale reached (0.0001). Your loss is probably exploding. ...         fairseq
    OVERFLOW! Skipping step. Attempted loss scale: 65536, reducing to 32768           FP16_Optimizer

Each overflow is an `overflow` event (DeepSpeed's own lines are `deepspeed`'s, which writes them
the same way, `write_overflow`). Like DeepSpeed's, the parser is auxiliary: these lines come inside
other trainers' logs, and where no other parser found a record (a log of nothing but overflows)
each overflow is also a record of the scale it left and of the step it skipped, so that the file
is a run the detectors judge.

Which step an overflow belongs to is the trainer's: apex and FP16_Optimizer skip the step being
computed, one after the last logged; fairseq does not count an update that overflowed
(`num_updates` stays), so its overflows belong to the last update logged.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from gradwatch.events import EventKind
from gradwatch.parsers.base import ParseOutput, Parser
from gradwatch.parsers.generic import GenericParser

_NUM = r"([\d.]+(?:[eE][+-]?\d+)?)"
#: apex amp; NVIDIA's BERT scripts (`Rank 0 :: Gradient overflow.  Skipping step, reducing ...`)
_APEX = re.compile(rf"Gradient overflow\.\s+Skipping step,.*?\b(?:loss scale to|[Ll]oss scale reduces to)\s*{_NUM}")
_FAIRSEQ = re.compile(rf"overflow detected, (?:ignoring gradient, )?setting loss scale to:?\s*{_NUM}")
_FAIRSEQ_MINIMUM = "Minimum loss scale reached"
_FP16_OPTIMIZER = re.compile(rf"OVERFLOW! Skipping step\. Attempted loss scale:\s*{_NUM},\s*reducing to\s*{_NUM}")

#: the auxiliary parsers whose records are a file's where no other parser found any
STAND_INS = frozenset({"deepspeed", "fp16_scaler"})


#: the parsers whose records do not make a file a trainer's: the stand-ins, and the generic reader,
#: whose records are the file's only where it is the format (`LogStream`)
NO_TRAINER = STAND_INS | {GenericParser.name}


def stands_in(out: ParseOutput) -> bool:
    """Whether the stand-ins' records are the file's so far: no trainer's parser has written one
    (the generic reader's `ppl:` lines in a DeepSpeed-Chat log do not count)."""
    return out.counts.keys() <= NO_TRAINER


class Overflow(NamedTuple):
    """The latest overflow a parser wrote, which the same overflow printed again (by every rank,
    or once per message of one scaler) repeats until a record comes: its scales, and the line of
    the latest record when it was written."""

    attempted: float | None
    new: float
    record_line: int


def write_overflow(
    out: ParseOutput,
    parser: str,
    latest: Overflow | None,
    line: int,
    ts: float | None,
    step: int | None,
    attempted: float | None,
    new: float,
    hysteresis: bool = False,
    skipped: bool = True,
) -> Overflow:
    """Write one overflow (unless it repeats `latest`) and return what a repeat would look like.

    `attempted` is None where the trainer prints only the new scale. Where the stand-ins' records
    are the file's, the overflow is a record too: its scale and, where `skipped`, the step it
    skipped (a parser that reads a cumulative skip counter of the trainer's counts none here).
    """
    if latest == Overflow(attempted, new, out.last_record_line):
        return latest
    out.event(EventKind.OVERFLOW, line, step, ts, attempted=attempted, new=new, hysteresis=hysteresis)
    if stands_in(out):
        metrics = {"loss_scale": new, "skipped": 1.0} if skipped else {"loss_scale": new}
        out.record(parser, step, line, ts, metrics)
    return Overflow(attempted, new, out.last_record_line)


class Fp16ScalerParser(Parser):
    name = "fp16_scaler"
    segment_safe = True
    scan = r"Gradient overflow|overflow detected|OVERFLOW! Skipping|Minimum loss scale"
    description = "fp16 loss-scaler lines of apex amp, fairseq and FP16_Optimizer (overflows, minimum scale)"
    auxiliary = True

    def __init__(self) -> None:
        self._latest: Overflow | None = None

    def carried(self, out: ParseOutput) -> tuple[object, ...] | None:
        """The overflow that a copy would repeat, if one was read since the latest record (see
        `DeepSpeedParser.carried`)."""
        latest = self._latest
        return (None,) if latest is None or latest.record_line != out.last_record_line else (latest[:2],)

    def parse(self, text: str, line: int, ts: float | None, out: ParseOutput) -> bool:
        try:
            return self._read(text, line, ts, out)
        except ValueError:  # a number cut short (`to: .`)
            return False

    def _read(self, text: str, line: int, ts: float | None, out: ParseOutput) -> bool:
        next_step = None if out.last_step is None else out.last_step + 1
        if "Gradient overflow" in text and (m := _APEX.search(text)):
            self._latest = write_overflow(out, self.name, self._latest, line, ts, next_step, None, float(m.group(1)))
            return True
        if "overflow detected" in text and (m := _FAIRSEQ.search(text)):
            new = float(m.group(1))
            self._latest = write_overflow(out, self.name, self._latest, line, ts, out.last_step, None, new)
            return True
        if "OVERFLOW! Skipping" in text and (m := _FP16_OPTIMIZER.search(text)):
            attempted, new = float(m.group(1)), float(m.group(2))
            self._latest = write_overflow(out, self.name, self._latest, line, ts, next_step, attempted, new)
            return True
        if _FAIRSEQ_MINIMUM in text:
            out.event(EventKind.SCALE_AT_MINIMUM, line, out.last_step, ts)
            return True
        return False

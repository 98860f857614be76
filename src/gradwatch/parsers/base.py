"""The parser contract: one instance per file and trainer family, fed one cleaned line at a time.

A parser looks at a line and either consumes it (returns True) or leaves it for the others. It
writes records and events into a `ParseOutput`. Multi-line records (OLMo, Composer) keep their
state in the parser between calls: `collecting` is True while a record is open, and the stream
offers the next lines to such a parser first. `flush` closes whatever is still open at the end.

Sniffing a file's format is counting: every line is offered to the parsers in registry order
(main parsers, then auxiliary ones) until one consumes it, and the file's format is the main parser
that recorded most records (`ParseOutput.counts`); after 20 records of one main parser only it and
the auxiliary parsers read on. A parser's "sniff score" is thus the records it wrote, so it must
consume only its own lines. `bulk_*` are gradwatch's fast path for its own parsers, not plugin API.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from gradwatch.events import Event, EventKind
from gradwatch.records import RecordBuilder

#: Steps are int64 in record batches; a larger number in a log is garbage, not a step.
MAX_STEP = 2**63 - 1


def _valid_step(step: int | None) -> int | None:
    """`step`, or None when it cannot be a training step (negative or beyond int64)."""
    return step if step is not None and 0 <= step <= MAX_STEP else None


@dataclass
class ParseOutput:
    """Where parsers put what they read; also the running facts parsers share (step, time)."""

    records: RecordBuilder = field(default_factory=RecordBuilder)
    events: list[Event] = field(default_factory=list)
    #: step of the latest record or progress line, so that events without a step can be placed
    last_step: int | None = None
    #: time of the latest timestamped line, whatever it was
    last_ts: float | None = None
    #: how many records each parser produced, to name the file's format
    counts: dict[str, int] = field(default_factory=dict)
    #: time of the latest record: its own timestamp, or else the first timestamped line after it
    last_step_ts: float | None = None
    step_ts_pending: bool = False

    def record(
        self,
        parser: str,
        step: int | None,
        line: int,
        ts: float | None,
        metrics: dict[str, float],
        nonfinite: list[str] | tuple[str, ...] = (),
    ) -> None:
        """Add one record that the parser named `parser` read at (1-based) `line`.

        `metrics` are keyed by canonical name (or one of the parser's `extra_metrics`); `nonfinite`
        names those the line printed as nan/inf. A step that cannot be one (negative, beyond int64)
        is recorded as unknown.
        """
        step = _valid_step(step)
        self.records.add(step, line, ts, metrics, nonfinite, parser)
        self.counts[parser] = self.counts.get(parser, 0) + 1
        if step is not None:
            self.last_step = step
        self.last_step_ts, self.step_ts_pending = ts, ts is None

    def record_columns(
        self,
        parser: str,
        steps: np.ndarray,
        lines: np.ndarray,
        ts: np.ndarray,
        metrics: dict[str, np.ndarray],
        nonfinite: np.ndarray,
    ) -> None:
        """Many records at once (the bulk path), in line order."""
        self.records.add_columns(steps, lines, ts, metrics, nonfinite, parser)
        self.counts[parser] = self.counts.get(parser, 0) + len(steps)
        known = steps[steps >= 0]
        if len(known):
            self.last_step = int(known[-1])
        last_ts = float(ts[-1])
        self.last_step_ts, self.step_ts_pending = (None, True) if last_ts != last_ts else (last_ts, False)

    def event(
        self,
        kind: EventKind,
        line: int,
        step: int | None = None,
        ts: float | None = None,
        **data: Any,
    ) -> None:
        self.events.append(Event(kind, line, _valid_step(step), ts if ts is not None else self.last_ts, data))


class Parser(ABC):
    """One trainer family's line shapes."""

    #: registry id, used by --format and in reports
    name: ClassVar[str]
    #: one line for `gradwatch formats`
    description: ClassVar[str]
    #: A regex that finds something in every line this parser may consume (while it is not
    #: collecting a multi-line record). The stream searches whole blocks with the union of
    #: these and hands only matching lines to the parsers: most lines of a log are noise.
    #: It is joined with the other parsers' into one flat alternation, so it must be a top-level
    #: alternation of simple pieces without anchors. None: the parser must see every line (slower).
    scan: ClassVar[str | None] = None
    #: True for parsers whose lines also appear inside other trainers' logs (DeepSpeed engine
    #: lines in a Megatron log): they never name the file's format unless nothing else matched
    auxiliary: ClassVar[bool] = False
    #: Metric names outside `records.METRICS` that this parser records: registering the parser
    #: makes each a float column of every batch (NaN where not logged), for a plugin's detector
    extra_metrics: ClassVar[tuple[str, ...]] = ()
    #: True when what the parser makes of a line depends only on the lines shortly before it
    #: (no counting from the start of the file): a large file may then be read in segments, in
    #: parallel, each parser starting a little before its segment (`gradwatch.segments`)
    segment_safe: ClassVar[bool] = False

    @property
    def collecting(self) -> bool:
        """True while a multi-line record is open and the next lines belong to it."""
        return False

    @abstractmethod
    def parse(self, text: str, line: int, ts: float | None, out: ParseOutput) -> bool:
        """Read one cleaned line; return True when it was this parser's line."""

    def flush(self, out: ParseOutput) -> None:  # noqa: B027 - optional hook
        """Close any record still open (end of input)."""

    def bulk_matches(self, text: str) -> list[re.Match[str]]:
        """Optional fast path: whole record lines of `text` this parser can read in bulk.

        Once a file's format is known, the stream asks its parser for these and hands them to
        `bulk_records` in one call instead of one `parse` per line. Default: none.
        """
        return []

    def can_bulk(self) -> bool:
        """Whether `bulk_matches` would find records now (cheap: asked after every record)."""
        return False

    def bulk_shape(self) -> object | None:
        """What `bulk_matches` matches now; a new object when that changes (e.g. a new template)."""
        return None

    def bulk_records(self, text: str, matches: list[re.Match[str]], linenos: list[int], out: ParseOutput) -> None:
        """Record the lines found by `bulk_matches` (only called when it returned some)."""
        raise NotImplementedError

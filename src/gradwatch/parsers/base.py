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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np

from gradwatch.events import Event, EventKind, SkipCountBuilder, SkipCounts
from gradwatch.parsers._arrow import arrow, numpy_of, strings
from gradwatch.parsers._bytes import line_starts
from gradwatch.parsers._text import clean
from gradwatch.parsers.keywords import line_array
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
    #: DeepSpeed's `step=N, skipped=K` counters (columns, not events: see `SkipCounts`)
    skip_counts: SkipCountBuilder = field(default_factory=SkipCountBuilder)
    #: step of the latest record or progress line, so that events without a step can be placed
    last_step: int | None = None
    #: time of the latest timestamped line, whatever it was
    last_ts: float | None = None
    #: how many records each parser produced, to name the file's format
    counts: dict[str, int] = field(default_factory=dict)
    #: time of the latest record: its own timestamp, or else the first timestamped line after it
    last_step_ts: float | None = None
    step_ts_pending: bool = False
    #: line of the latest record, or of the bulk record before a line read one by one: that a
    #: record came between two lines (numbered as this stream counts, so compared only within it)
    last_record_line: int = 0
    #: line of the last record that the latest `record_columns` wrote (a bulk reader may drop hits)
    last_bulk_line: int = 0

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
        self.last_record_line = max(self.last_record_line, line)
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
        if len(lines):
            self.last_bulk_line = int(lines[-1])
            self.last_record_line = max(self.last_record_line, self.last_bulk_line)
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

    def skip_count(self, line: int, step: int, skipped: int) -> None:
        """A cumulative skip counter (DeepSpeed's `step=N, skipped=K`); one beyond int64 is garbage."""
        if _valid_step(step) is not None and _valid_step(skipped) is not None:
            self.skip_counts.add(line, step, skipped)

    def skip_count_columns(self, counts: SkipCounts) -> None:
        """Many counters at once (the bulk path), in line order."""
        self.skip_counts.add_columns(counts)

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A state saved before skip counters were columns has none pending."""
        state.setdefault("skip_counts", SkipCountBuilder())
        self.__dict__.update(state)


@dataclass(frozen=True)
class Block:
    """Whole lines as the stream hands them to a bulk reader: the text, and one byte per
    character of it (positions in both agree) for readers that search at numpy speed."""

    text: str
    #: the text's bytes where it is ASCII; else its ASCII characters with `?` for each other
    #: one: a reader may accept only what is ASCII, and must treat `?` as possibly anything
    codes: np.ndarray
    #: positions of the text's newlines (it ends with one)
    newlines: np.ndarray
    #: whether `codes` are the text's own bytes
    ascii: bool = True

    def escaped_lines(self, holds: Callable[[str], bool], among: np.ndarray | None = None) -> np.ndarray:
        """The lines (indices, ascending; of all, or of those marked in the mask `among`) with an
        escape sequence where `holds` accepts a piece of the line as the per-line path reads it
        (split at carriage returns, cleaned): `clean` joins the text around an escape
        (`Continuing training\x1b[0m from`), which a search of the raw text cannot see."""
        if "\x1b" not in self.text:
            return np.zeros(0, dtype=np.int64)
        _, pc = arrow()

        lines = np.arange(len(self.newlines)) if among is None else np.flatnonzero(among)
        escape = pc.match_substring(line_array(self.codes, self.newlines, lines), "\x1b")
        lines = lines[numpy_of(escape)]
        starts = line_starts(self.newlines, lines).tolist()
        text = self.text
        keep = [
            any(holds(clean(piece)) for piece in text[a:b].split("\r"))
            for a, b in zip(starts, self.newlines[lines].tolist(), strict=True)
        ]
        return lines[np.array(keep, dtype=bool)] if keep else lines


class Hits(Protocol):
    """The record lines a bulk reader found in a block, in order (`Parser.bulk_matches`)."""

    def __len__(self) -> int: ...

    @property
    def starts(self) -> list[int]:
        """Where each hit begins in the block's text (ascending)."""
        ...

    def step(self, k: int) -> int:
        """The step of hit `k`: the stream tells it to the lines read one by one after it."""
        ...

    @property
    def spans(self) -> np.ndarray | None:
        """How many lines each hit covers, from the line it begins on (None: one line each)."""
        ...

    def subset(self, keep: list[int]) -> Hits:
        """The hits at these indices (ascending): those the stream hands back to be recorded."""
        ...


class Matches(list[re.Match[str]]):
    """Regex matches of record lines as `Hits`: group 1 of each is its step."""

    spans = None

    @property
    def starts(self) -> list[int]:
        return [m.start() for m in self]

    def step(self, k: int) -> int:
        return int(self[k].group(1))

    def subset(self, keep: list[int]) -> Matches:
        return Matches(self[k] for k in keep)


@dataclass
class TableHits:
    """Bulk record lines of a block as a table (`Hits`): where each hit begins and where its
    line starts, its step, and its numbers (what each column holds is the reader's)."""

    at: np.ndarray
    line_starts: np.ndarray
    steps: np.ndarray
    values: np.ndarray

    spans = None

    @staticmethod
    def empty(width: int) -> TableHits:
        none = np.zeros(0, dtype=np.int64)
        return TableHits(none, none, none, np.zeros((0, width)))

    def merged(self, other: TableHits) -> TableHits:
        """Both tables' hits, in text order."""
        both = TableHits(*(np.concatenate([a, b]) for a, b in zip(self.fields(), other.fields(), strict=True)))
        return both.subset(np.argsort(both.at, kind="stable"))

    def fields(self) -> tuple[np.ndarray, ...]:
        return self.at, self.line_starts, self.steps, self.values

    def __len__(self) -> int:
        return len(self.at)

    @property
    def starts(self) -> list[int]:
        return self.at.tolist()  # type: ignore[no-any-return]

    def step(self, k: int) -> int:
        return int(self.steps[k])

    def subset(self, keep: list[int] | np.ndarray) -> TableHits:
        index = np.asarray(keep, dtype=np.int64)  # once, not once per field
        return TableHits(*(a[index] for a in self.fields()))


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
    #: True for the generic reader: offered only what every other parser left, its records the
    #: file's only where no trainer's own parser found one; once another parser's records lock
    #: the file's format it reads no more (it is also `auxiliary`)
    fallback: ClassVar[bool] = False
    #: how the parser read the file, where it reads several shapes (the generic reader's layout
    #: and step counter), for `check` and reports; None: its name says it all
    layout: str | None = None
    #: Metric names outside `records.METRICS` that this parser records: registering the parser
    #: makes each a float column of every batch (NaN where not logged), for a plugin's detector
    extra_metrics: ClassVar[tuple[str, ...]] = ()
    #: True when what the parser makes of a line depends only on the lines shortly before it
    #: and on the facts the stream checks at every segment (`LogStream.carried`: the latest
    #: step, the clock, an open record): a large file may then be read in segments, in
    #: parallel, each parser starting a little before its segment (`gradwatch.segments`)
    segment_safe: ClassVar[bool] = False

    def carried(self, out: ParseOutput) -> tuple[object, ...] | None:
        """What the parser carries to the lines ahead from further back than the lines shortly
        before them (a step counted on from the start of the file, a reference record), or None
        (the default): nothing, or, for a parser that is not `segment_safe`, it cannot say. A
        file is read in segments where every parser is safe or says this: a worker guesses it
        (`guess`), and its segment is kept only where that is what the segment before ended
        with; else the segment is read in order (`gradwatch.segments`)."""
        return None

    def guess(self, text: str, out: ParseOutput) -> None:  # noqa: B027 - optional hook
        """A worker is about to read `text`, the lines just before its segment: where reading them
        cannot tell what `carried` says, guess it from them (a tqdm bar's count, for a step)."""

    def hint(self) -> object | None:
        """What a guess further on in the file may go by, of the lines this parser read (HF
        Trainer: the count and step of the latest resume), or None (the default): nothing. It
        goes to the same parser of a worker's stream (`take_hint`), which started from the
        file's head, before its `guess`; it may make a guess right, never a result different."""
        return None

    def take_hint(self, hint: object) -> None:  # noqa: B027 - optional hook
        """Before `guess`: what `hint` said, in a stream that read further than this one."""

    @property
    def collecting(self) -> bool:
        """True while a multi-line record is open and the next lines belong to it."""
        return False

    @abstractmethod
    def parse(self, text: str, line: int, ts: float | None, out: ParseOutput) -> bool:
        """Read one cleaned line; return True when it was this parser's line."""

    def flush(self, out: ParseOutput) -> None:  # noqa: B027 - optional hook
        """Close any record still open (end of input)."""

    def bulk_matches(self, block: Block) -> Hits:
        """Optional fast path: whole record lines of `block` this parser can read in bulk.

        Once a file's format is known, the stream asks its parser for these and hands them to
        `bulk_records` in one call instead of one `parse` per line. Default: none.
        """
        return Matches()

    def can_bulk(self) -> bool:
        """Whether `bulk_matches` would find records now (cheap: asked after every record)."""
        return False

    def bulk_shape(self) -> object | None:
        """What `bulk_matches` matches now; a new object when that changes (e.g. a new template)."""
        return None

    def bulk_records(self, text: str, hits: Hits, linenos: np.ndarray, out: ParseOutput) -> None:
        """Record the lines found by `bulk_matches` (only called when it returned some)."""
        raise NotImplementedError

    def bulk_close(self, out: ParseOutput) -> bool:
        """A line read one by one while this parser's multi-line record is open is the first line
        of one of its bulk hits: close the record as reading that line would, and return True
        (the line is then read in bulk). False (default): the hit is read one by one."""
        return False

    def bulk_passed(self, hits: Hits, k: int) -> None:  # noqa: B027 - optional hook
        """The next line offered one by one comes after bulk hit `k`, the latest record before it,
        which is recorded only when the block ends: a parser that compares a record with the
        one before it (Megatron's rank copies) learns of it here."""

    def aux_lines(self, block: Block, lines: np.ndarray, out: ParseOutput) -> AuxLines | None:
        """Optional fast path for an auxiliary parser's frequent lines (DeepSpeed's progress): of
        the block's candidate `lines` (indices, ascending), those it reads all at once.

        Only lines whose reading depends on nothing but the line qualify, and only lines that
        no parser ahead of this one would take (the stream checks their keywords). The stream
        leaves them out of the per-line path, except where a multi-line record is open, and
        hands the rest to `aux_events`, whose events it puts in line order. Default: none.
        """
        return None

    def aux_events(self, found: AuxLines, linenos: np.ndarray, out: ParseOutput) -> None:
        """Write the events of the lines `found` (by `aux_lines`), numbered `linenos`."""
        raise NotImplementedError


@dataclass
class AuxLines:
    """Lines an auxiliary parser reads for a whole block: their indices in the block, and per
    line what it needs to write their events (`Parser.aux_lines`)."""

    lines: np.ndarray
    data: dict[str, np.ndarray]

    def subset(self, keep: np.ndarray) -> AuxLines:
        return AuxLines(self.lines[keep], {name: values[keep] for name, values in self.data.items()})


def number_table(tokens: list[str], rows: int, *, nan: str = "", drop: str = "") -> np.ndarray:
    """The numbers `tokens` as `rows` rows, converted in one C call (bulk readers convert all
    values of a block at once) by Arrow, which reads a number exactly as `float()` does (see
    `_tokens`). `nan`: a word that stands for a value not logged (`None`, `null`); `drop`: a
    character to remove first (thousands separators). The tokens must be numbers (the bulk
    regexes admit nothing else): anything else raises ValueError."""
    pa, pc = arrow()

    values = strings(tokens)
    if nan:
        values = pc.replace_substring(values, nan, "nan")
    if drop:
        values = pc.replace_substring(values, drop, "")
    try:
        table = numpy_of(pc.cast(values, pa.float64()))
    except pa.ArrowInvalid as e:
        raise ValueError(str(e)) from None
    return table.reshape(rows, -1)


class BulkTrack:
    """What a bulk reader whose records depend on earlier ones must know of the per-line calls.

    The stream records a block's bulk matches only after the lines it offers one by one, and such a
    line learns of the bulk records before it only through `out.last_step` (group 1 of the latest
    match). Hence, per file:

    - `locked`: the stream now offers lines only to this parser and the auxiliary ones (its
      `LOCK_AFTER_RECORDS`th record). Only then may it read in bulk, and only then is every record
      its own, so `out.last_step` at a line read one by one is the step of its own latest record,
      in the plain path as in the fast one.
    - `line`: the line of its latest per-line call. A flushed bulk match after it is newer than
      anything read one by one, so the state it leaves is the parser's state.
    - `shape`: what `bulk_shape` returns. A reader hands out matches only up to the first line that
      must be read one by one and may change its state (a cut). Once a record read one by one has
      passed it, a new token makes the stream search the rest of the block again.
    """

    def __init__(self) -> None:
        from gradwatch.parsers.stream import LOCK_AFTER_RECORDS  # not at module level: stream imports us

        self._lock_after = LOCK_AFTER_RECORDS
        self.locked = False
        self.line = 0
        self.shape: object | None = None
        self._retry = False

    def seen(self, line: int) -> None:
        """A per-line call begins."""
        self.line = line

    def count(self, name: str, out: ParseOutput) -> None:
        """After a call or a bulk chunk: is the file locked to the parser `name` now? From then on
        the rest of the block may be read in bulk."""
        if not self.locked and out.counts.get(name, 0) >= self._lock_after:
            self.locked = True
            self.changed()

    def newest(self, linenos: np.ndarray) -> bool:
        """Whether the last of these bulk matches comes after the latest per-line call."""
        return bool(linenos[-1] > self.line)

    def handed(self, matches: int, retry: bool) -> None:
        """`bulk_matches` handed out `matches`; `retry`: it stopped before record lines of its shape,
        which a per-line record may make readable in bulk again."""
        self._retry = retry
        if not matches:
            self.shape = None  # nothing to search for again unless a record passes the cut
        elif self.shape is None:
            self.shape = object()

    def changed(self) -> None:
        """What the bulk reader matches changed (a new template): search the rest of the block again."""
        self.shape = object()

    def passed(self) -> None:
        """A record read one by one changed the parser's state: past a cut, search again."""
        if self._retry:
            self._retry = False
            self.changed()

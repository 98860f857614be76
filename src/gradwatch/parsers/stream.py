"""Bytes in, record batches out: line splitting, cleaning and dispatch to the parsers of one file.

`LogStream` is fed chunks of any size (a 4 KiB append or a 64 MiB block of an archive). It keeps a
partial last line until its newline arrives, so results never depend on where chunks were cut.
Each line is cleaned of launcher prefixes and ANSI escapes, split at carriage returns (tqdm), and
offered to the parsers: first to one that has a multi-line record open, then to all in order.
"""

from __future__ import annotations

import copy
import dataclasses
import heapq
import pickle
import re
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from itertools import accumulate, compress
from typing import TYPE_CHECKING

import numpy as np

from gradwatch.events import Event, EventKind, SkipCounts
from gradwatch.parsers._arrow import arrow, numpy_of
from gradwatch.parsers._bytes import line_starts
from gradwatch.parsers._text import MAX_DIGITS, PREFIXES, clean, holds_long_number, timestamp
from gradwatch.parsers.base import AuxLines, Block, Hits, Matches, ParseOutput, Parser
from gradwatch.parsers.keywords import Keywords, line_array
from gradwatch.records import RecordBuilder

if TYPE_CHECKING:
    import pandas as pd

#: Longer lines are cut to this (`_cut_line`; each cut reported at its line): a 50 MB line of
#: garbage must not hold the whole file in memory.
MAX_LINE_BYTES = 1 << 20
#: Until a main parser has produced a record, output is held back for up to this many lines, so
#: that DeepSpeed progress lines printed before a trainer's first record do not become records.
UNDECIDED_HOLD_LINES = 5000
#: Records of one main parser after which a file's format is taken as known (see _lock_format).
LOCK_AFTER_RECORDS = 20
#: How often one block may be searched again after the shape of its records changed.
_MAX_RESCANS = 8


@dataclass(kw_only=True)
class BatchFacts:
    """What one stretch of a file said besides its records: events, and the clock as the log
    showed it. A worker sends these beside its records (numpy columns): only the main process,
    which runs the detectors, builds frames, and only where a reader asks for one."""

    events: list[Event] = field(default_factory=list)
    #: time of the latest timestamped line (any line), for stall detection in archived logs
    last_ts: float | None = None
    #: time of the latest record (or of the first timestamped line after it)
    last_step_ts: float | None = None
    #: step of the latest record
    last_step: int | None = None
    path: str = ""
    #: DeepSpeed's cumulative skip counters, in line order
    skip_counts: SkipCounts = field(default_factory=SkipCounts.empty)

    def framed(self, records: pd.DataFrame) -> Batch:
        """The batch of these facts and `records`."""
        return Batch(records, **{f.name: getattr(self, f.name) for f in dataclasses.fields(BatchFacts)})


@dataclass
class Batch(BatchFacts):
    """What one stretch of a file said: records, events, and the clock as the log showed it."""

    records: pd.DataFrame


class LogStream:
    """Parses one file incrementally with a fixed set of parsers."""

    def __init__(self, parsers: list[Parser], path: str = "", stand_ins: frozenset[str] | None = None) -> None:
        """`stand_ins`: the auxiliary parsers whose records are the file's where no main parser
        found any (a DeepSpeed-only log); None: every one. None of them where `--format` named
        a trainer, only the named one where it named an auxiliary parser."""
        self.path = path
        self._stand_ins = stand_ins
        self.parsers = parsers
        self.out = ParseOutput()
        self.lines = 0
        self.bytes = 0
        self._partial = b""
        self._closed = False
        self._aux = frozenset(p.name for p in parsers if p.auxiliary)
        self._fallbacks = frozenset(p.name for p in parsers if p.fallback)
        self._scan = _keywords(parsers)
        self._active = parsers  # the parsers lines are offered to (see _lock_format)
        self._locked = False
        self._collectors = [p for p in parsers if type(p).collecting is not Parser.collecting]
        self._pending_from: int | None = None
        #: auxiliary parsers that read their frequent lines for a whole block at once, with the
        #: keywords of the parsers ahead of them (set when the format is locked)
        self._aux_readers: list[tuple[Parser, Keywords | None]] = []

    @property
    def format(self) -> str | None:
        """The parser that produced most records (main parsers before auxiliary ones)."""
        main = {p.name for p in self.parsers if not p.auxiliary}
        left_out = self._left_out()
        counts = {n: c for n, c in self.out.counts.items() if n in main or n not in left_out}
        if not counts:
            return None
        ranked = sorted(counts, key=lambda n: (n in main, counts[n]), reverse=True)
        return ranked[0]

    @property
    def layout(self) -> str | None:
        """How the format's parser read the file, where it says (`Parser.layout`)."""
        fmt = self.format
        return next((p.layout for p in self.parsers if p.name == fmt), None)

    @property
    def format_text(self) -> str:
        """The format as people read it (`format_text`)."""
        return format_text(self.format, self.layout)

    @property
    def format_locked(self) -> bool:
        """Whether the file's format is known (only its parser and the auxiliary ones read on)."""
        return self._locked

    @property
    def collecting(self) -> bool:
        """Whether a multi-line record is open."""
        return self._collecting()

    @property
    def has_partial_line(self) -> bool:
        return bool(self._partial)

    @property
    def segment_safe(self) -> bool:
        """Whether every parser reading on may start in the middle of the file: it needs only the
        lines shortly before (`Parser.segment_safe`), or it says what else it needs (`carried`)."""
        return all(p.segment_safe or p.carried(self.out) is not None for p in self._active)

    def carried(self) -> tuple[object, ...]:
        """What the lines ahead may take from further back than a segment's warm-up reaches:
        per parser reading on, what it says it carries (`Parser.carried`) and whether a
        multi-line record of its is open; the step of the latest record, which events and
        parsers' own memories are keyed by (the overflow a rank copy repeats, the iteration
        another rank printed); the log's clock (its last time, the latest record's time and
        whether that is still to come). A worker's segment is kept only where this is what
        the segment before ended with (`gradwatch.segments`): a warm-up without a record
        (a long stretch of NCCL lines, a crash dump) leaves the state of the head instead."""
        out = self.out
        return (
            tuple(p.carried(out) for p in self._active),
            tuple(p.collecting for p in self._collectors),
            (out.last_step, out.last_ts, out.last_step_ts, out.step_ts_pending),
        )

    def snapshot(self) -> bytes:
        """The stream pickled as it stands, without what it parsed that nobody took yet: for a
        worker to go on from (`gradwatch.segments`)."""
        bare = copy.copy(self)
        skip_counts = self.out.skip_counts.emptied()
        bare.out = dataclasses.replace(self.out, records=RecordBuilder(), events=[], skip_counts=skip_counts)
        return pickle.dumps(bare)

    def hints(self) -> dict[str, object]:
        """What the parsers tell a guess further on of the lines read (`Parser.hint`), by name."""
        return {parser.name: hint for parser in self._active if (hint := parser.hint()) is not None}

    def guess(self, text: str, hints: dict[str, object] | None = None) -> None:
        """Before reading `text`, a stretch of lines before a segment: let each parser guess what
        it carries from further back (`Parser.guess`), first told `hints`: what the parsers of
        a stream that read further than this one say (`hints`)."""
        for parser in self._active:
            if hints and parser.name in hints:
                parser.take_hint(hints[parser.name])
            parser.guess(text, self.out)

    def feed(self, data: bytes) -> None:
        self.bytes += len(data)
        buf = self._partial + data if self._partial else data
        cut = buf.rfind(b"\n")
        if cut < 0:
            self._hold(buf)
            return
        self._partial = b""
        if _all_lines_short(buf, cut + 1):
            self._parse_block(memoryview(buf)[: cut + 1])  # (a view: a 4 MiB chunk is not copied)
        else:
            self._parse_cut(buf[: cut + 1])
        if cut + 1 < len(buf):
            self._hold(buf[cut + 1 :])

    def close(self) -> None:
        """End of input: parse a last line that never got its newline, close open records."""
        if self._closed:
            return
        if self._partial:
            tail, self._partial = self._partial, b""
            self._parse_cut(tail + b"\n")
        for p in self.parsers:
            p.flush(self.out)
        self._closed = True

    @property
    def _main_seen(self) -> bool:
        return any(name not in self._aux for name in self.out.counts)

    def take(self) -> Batch:
        """Everything parsed since the last call (held back while the format is undecided).

        Auxiliary records (DeepSpeed progress) are kept only in a file where no main parser found
        a record: in a Megatron-DeepSpeed log they would duplicate Megatron's own records.
        """
        facts, drop = self._take_facts()
        return facts.framed(RecordBuilder.empty() if drop is None else self.out.records.take(drop))

    def take_columns(self) -> tuple[BatchFacts, dict[str, np.ndarray] | None]:
        """`take` with the records as numpy columns (None: no records), no frame built: what a
        worker sends."""
        facts, drop = self._take_facts()
        return facts, None if drop is None else self.out.records.take_columns(drop)

    def _take_facts(self) -> tuple[BatchFacts, frozenset[str] | None]:
        """The batch's facts, and the parsers whose records to leave out (None: no records are
        taken, the format is undecided)."""
        out = self.out
        main_seen = self._main_seen
        if not (main_seen or self._closed or self._locked or self.lines >= UNDECIDED_HOLD_LINES):
            return BatchFacts(path=self.path), None
        events, out.events = out.events, []
        skips = out.skip_counts.take()
        facts = BatchFacts(
            events=events,
            last_ts=out.last_ts,
            last_step_ts=out.last_step_ts,
            last_step=out.last_step,
            path=self.path,
            skip_counts=skips,
        )
        return facts, self._aux if main_seen else self._left_out() | self._fallbacks_left_out()

    def _left_out(self) -> frozenset[str]:
        """The auxiliary parsers whose records are never the file's while no main parser found any."""
        return frozenset() if self._stand_ins is None else self._aux - self._stand_ins

    def _fallbacks_left_out(self) -> frozenset[str]:
        """The generic reader's records are the file's only where it is the file's format: beside
        the records of an auxiliary parser that found more (a DeepSpeed-only log) they would
        mix two counts of steps (DeepSpeed-Chat's per-epoch `ppl:` lines among global steps)."""
        fmt = self.format
        return frozenset(name for name in self._fallbacks if name != fmt)

    def _hold(self, partial: bytes) -> None:
        """Keep what is needed of a line whose newline has not come, to cut it as the whole line
        would be cut (`_cut_line`), whatever comes before its newline: at most two bytes more
        than `MAX_LINE_BYTES`."""
        if len(partial) > MAX_LINE_BYTES + 1:
            # a `\r` at its end may be a Windows line end: kept apart, as `_cut_line` does
            body, end = (partial[:-1], b"\r") if partial.endswith(b"\r") else (partial, b"")
            last = body.rfind(b"\r")
            if last < 0:  # its start is what is kept, unless a redraw comes
                body = body[: MAX_LINE_BYTES + 1]
            elif len(body) - last - 1 > MAX_LINE_BYTES:  # its last piece is too long already
                body = body[last : last + MAX_LINE_BYTES + 2]  # (from its `\r`)
            else:  # (the pieces kept begin within its last bytes)
                body = body[-(MAX_LINE_BYTES + 1) :]
            partial = body + end
        self._partial = partial

    def _parse_cut(self, data: bytes) -> None:
        """Parse whole lines, each longer than `MAX_LINE_BYTES` cut (`_cut_line`), with a
        PARSE_WARNING at its line: wherever chunks were cut, and whichever worker read it."""
        codes = np.frombuffer(data, dtype=np.uint8)
        ends = np.flatnonzero(codes == 10)
        starts = np.concatenate([[0], ends[:-1] + 1])
        kept: list[bytes] = []
        cuts: list[Event] = []
        pos = 0
        for k in np.flatnonzero(ends - starts > MAX_LINE_BYTES).tolist():
            kept += [data[pos : int(starts[k])], _cut_line(data[int(starts[k]) : int(ends[k])])]
            pos = int(ends[k])  # (from its newline on)
            text = f"line longer than {MAX_LINE_BYTES} bytes: read in part"
            cuts.append(Event(EventKind.PARSE_WARNING, self.lines + 1 + k, data={"text": text}))
        events_before = len(self.out.events)
        self._parse_block(b"".join([*kept, data[pos:]]) if cuts else data)
        events = self.out.events
        events[events_before:] = heapq.merge(events[events_before:], cuts, key=_line_of)

    def _parse_block(self, data: bytes | memoryview) -> None:
        text, codes, ascii_only = _decoded(data)
        newlines = np.flatnonzero(codes == 10)  # one pass, for line numbers and for the clock
        first = self.lines + 1
        self.lines += len(newlines)
        if self._scan is None:
            self._every_line(text, first)
        else:
            self._candidate_lines(Block(text, codes, newlines, ascii_only), first)
        self._track_time(text, newlines, codes, ascii_only)

    def _every_line(self, text: str, first: int) -> None:
        """Slow path, for parsers that must see every line (a user regex without a literal)."""
        lines = text.split("\n")
        lines.pop()  # the block ends with a newline: the last piece is empty
        parse = self._parse_line
        out = self.out
        end = -1  # where the line read last ends
        for offset, raw in enumerate(lines):
            start, end = end + 1, end + len(raw) + 1
            if raw:
                before = out.records.added
                parse(raw, first + offset)
                if out.records.added != before:
                    self._wait_for_time(start, end, first + offset)

    def _candidate_lines(
        self, block: Block, lineno: int, depth: int = 0, base: int = 0, lock_tried: bool = False
    ) -> None:
        """Fast path: search the whole block for lines any parser could want, parse only those.

        While a parser collects a multi-line record (OLMo, Composer, a traceback) every line is
        offered, because continuation lines carry no keyword of their own. Once the file's main
        parser is known and offers a bulk reader, its ordinary record lines are read in one go
        (`Parser.bulk_matches`); the other candidate lines still go one by one, in order, each
        seeing the step of the last record before it. When a record line read one by one changes
        what the bulk reader would match (the first records of a run, fp16 calibration records
        without a grad norm), the rest of the block is read again the fast way: `base` is where that
        rest begins in the block `_track_time` reads (the positions it is told are that block's).
        So it is where the bulk records before a line read one by one lock the file's format, once
        a block (`lock_tried`; some may be ranks' copies, which do not count): without taking one
        of the rescans (`depth`) that the changes of shape may need.
        """
        text = block.text
        first = lineno  # the number of the block's first line
        bulk_parser = self._main_parser()
        hits = bulk_parser.bulk_matches(block) if bulk_parser is not None else Matches()
        shape = bulk_parser.bulk_shape() if hits and bulk_parser is not None else None
        starts, ends, linenos, covered = _line_bounds(block.newlines, hits.starts, hits.spans, lineno)
        taken = [True] * len(hits)
        i, n_bulk = 0, len(hits)  # the next bulk record
        last_line_record = -1  # position of the last record parsed line by line
        last_line_step = -1  # position of the last line read one by one that set the step
        out = self.out
        pos = 0  # everything before this position has been handled
        candidates, lines = self._outside(block, starts, ends, covered)
        aux = _NO_AUX
        if lines is not None and self._aux_readers:
            aux = self._aux_lines(block, lines, lineno)
            if aux.starts:  # read all at once, after the loop: not candidates
                lines = lines[~np.isin(lines, aux.lines)]
                candidates = iter(line_starts(block.newlines, lines).tolist())
        open_record = self._collecting()  # a multi-line record left open by the previous block
        while True:
            if open_record:
                start, open_record = 0, False
            else:
                found = next(candidates, -1)
                while 0 <= found < pos:
                    found = next(candidates, -1)
                if found < 0:
                    break
                i = bisect_left(ends, found, i)  # the first bulk record not ending before it
                start = text.rfind("\n", 0, found) + 1
                if i and not lock_tried and self._locked_by(bulk_parser, i):  # (at most `i` records before)
                    done = [k for k in range(i) if taken[k]]
                    # (bulk records do it, as their lines would one by one; with none before the
                    # line, the format is not locked here, though enough records may be read)
                    if done and self._locked_by(bulk_parser, len(done)):
                        # the records before this line lock the file's format, as read one by one
                        # they would have: record them, then read on from here with it locked
                        read_one_by_one = (last_line_record, last_line_step)
                        self._flush_bulk(bulk_parser, text, hits, linenos, starts, done, read_one_by_one, base)
                        self._finish_aux(aux, start)
                        lineno = first + int(np.searchsorted(block.newlines, start))
                        self._candidate_lines(_rest(block, start), lineno, depth, base + start, lock_tried=True)
                        return
            new_record = False
            while True:  # this line, then every line while a multi-line record is open
                end = text.find("\n", start)
                if start != pos:  # a jump to the next candidate: its number from the newlines, not a count
                    lineno = first + int(np.searchsorted(block.newlines, start))
                if i < n_bulk and starts[i] == start:
                    before = out.records.added
                    if bulk_parser is not None and self._closes_at_hit(bulk_parser):
                        if out.records.added != before:  # the record it closed ends before this line
                            last_line_record = last_line_step = start - 1
                            new_record = True
                            self._wait_for_time(base + start, base + end, lineno)
                        break
                    taken[i] = False  # a bulk-shaped line inside a multi-line record
                    i += 1
                if i and taken[i - 1] and bulk_parser is not None:
                    out.last_record_line = max(out.last_record_line, int(linenos[i - 1]))
                    if last_line_step < starts[i - 1]:
                        out.last_step = hits.step(i - 1)
                    if last_line_record < starts[i - 1]:
                        bulk_parser.bulk_passed(hits, i - 1)
                if aux.starts and start in aux.starts:
                    aux.inside.add(start)  # a line of a multi-line record: read one by one
                before, step_before = out.records.added, out.last_step
                if end > start:
                    self._write_aux(aux, start)
                    self._parse_line(text[start:end], lineno)
                if out.records.added != before:
                    last_line_record, new_record = start, True
                    self._wait_for_time(base + start, base + end, lineno)
                if out.records.added != before or out.last_step != step_before:
                    last_line_step = start
                pos = start = end + 1
                lineno += 1
                if start >= len(text) or not self._collecting() or (new_record and self._reshaped(shape, depth)):
                    break  # (a multi-line record still open when reshaped: the search of the rest goes on with it)
            if not new_record or pos >= len(text) or not self._reshaped(shape, depth):
                continue
            # a record read one by one changed what the bulk reader matches: read the rest again
            done = [k for k in range(i) if taken[k] and starts[k] < pos]
            self._flush_bulk(bulk_parser, text, hits, linenos, starts, done, (last_line_record, last_line_step), base)
            self._finish_aux(aux, pos)
            self._candidate_lines(_rest(block, pos), lineno, depth + 1, base + pos, lock_tried)
            return
        done = list(compress(range(len(taken)), taken))
        self._flush_bulk(bulk_parser, text, hits, linenos, starts, done, (last_line_record, last_line_step), base)
        self._finish_aux(aux, len(text))

    def _aux_lines(self, block: Block, lines: np.ndarray, first: int) -> _AuxRound:
        """Of the candidate `lines` (indices), those that auxiliary parsers read all at once
        (`Parser.aux_lines`): the ones without a keyword of a parser ahead, which would be
        offered them first. The block's first line is number `first`."""
        found: list[tuple[Parser, AuxLines, np.ndarray]] = []
        newlines = block.newlines
        left = lines
        for parser, ahead in self._aux_readers:
            free = left
            if ahead is not None:
                theirs = ahead.lines(block.codes, newlines, left, ascii_only=block.ascii)
                if theirs is None:
                    continue  # RE2 cannot tell which: every line goes to the parsers
                free = left[~np.isin(left, theirs)]
            mine = parser.aux_lines(block, free, self.out) if len(free) else None
            if mine is not None and len(mine.lines):
                found.append((parser, mine, line_starts(newlines, mine.lines)))
                left = left[~np.isin(left, mine.lines)]
        if not found:
            return _NO_AUX
        taken = np.concatenate([f.lines for _, f, _ in found])
        starts = dict.fromkeys(np.concatenate([s for _, _, s in found]).tolist())
        return _AuxRound(found, taken, starts, set(), first, len(self.out.events), [0] * len(found), [])

    def _write_aux(self, aux: _AuxRound, limit: int) -> None:
        """Write what the lines read all at once that start before `limit` (and that no
        multi-line record took) say, but for those written already: before each line read one by
        one, so that it finds DeepSpeed's counters before it in `out.skip_counts`, in line order,
        as the plain path leaves them (an HF Trainer dict takes its step from the latest). Their
        events are kept apart until `_finish_aux`."""
        if not aux.starts:
            return
        out = self.out
        for k, (parser, found, starts) in enumerate(aux.found):
            begin, end = aux.written[k], int(np.searchsorted(starts, limit))
            if end <= begin:
                continue
            aux.written[k] = end
            keep = np.zeros(len(starts), dtype=bool)
            keep[begin:end] = [s not in aux.inside for s in starts[begin:end].tolist()]
            if keep.any():
                written = len(out.events)
                parser.aux_events(found.subset(keep), aux.first + found.lines[keep], out)
                aux.events += out.events[written:]
                del out.events[written:]

    def _finish_aux(self, aux: _AuxRound, limit: int) -> None:
        """Write the rest of what the lines read all at once that start before `limit` say, and
        merge their events by line into those the block's other lines wrote."""
        if not aux.starts:
            return
        self._write_aux(aux, limit)
        events = self.out.events
        read_at_once = sorted(aux.events, key=_line_of)
        # merged by line, each list in its own order (a parser may write an event after a later line's)
        events[aux.events_before :] = heapq.merge(events[aux.events_before :], read_at_once, key=_line_of)

    def _flush_bulk(
        self,
        parser: Parser | None,
        text: str,
        hits: Hits,
        linenos: np.ndarray,
        starts: list[int],
        done: list[int],
        read_one_by_one: tuple[int, int],
        base: int,
    ) -> None:
        """Record the bulk hits `done` (indices), keeping the facts of later lines read one by one:
        `read_one_by_one` holds where the last one that wrote a record, and the last one that set
        the step (a record, or OLMo's marker of a record still open), begin; `text` begins at `base`
        of the block `_track_time` reads. "Later" is after the last hit the parser recorded: it
        may drop some (another rank's copy of a record)."""
        if not done or parser is None:
            return
        out = self.out
        saved = (out.last_step, out.last_step_ts, out.step_ts_pending)
        if len(done) < len(hits):  # (else all of them: indices are distinct and ascending)
            hits, linenos = hits.subset(done), linenos[done]
        added = out.records.added
        parser.bulk_records(text, hits, linenos, out)
        if not self._locked and out.counts.get(parser.name, 0) >= LOCK_AFTER_RECORDS:
            self._lock_format(parser)
        if out.records.added == added:
            return  # no record written: the facts are those of the lines before
        last_hit = starts[done[int(np.searchsorted(linenos, out.last_bulk_line))]]
        last_record, last_step = (at > last_hit for at in read_one_by_one)
        if last_step:
            out.last_step = saved[0]
        if last_record:
            out.last_step_ts, out.step_ts_pending = saved[1:]
        elif out.step_ts_pending:
            self._pending_from = base + text.find("\n", last_hit) + 1

    def _outside(
        self, block: Block, starts: list[int], ends: list[int], covered: np.ndarray
    ) -> tuple[Iterator[int], np.ndarray | None]:
        """Positions of candidate keywords in `block`, outside the bulk records (at `starts` to
        `ends`, on the lines `covered`: their indices in the block), and the indices of their
        lines where these are known.

        Where RE2 reads the keywords as `re` does (`Keywords.lines`), the lines with a keyword are
        found at once: among the lines outside the bulk records where those are more than an
        eighth of the lines (a fifth less work for Megatron, whose records are half the lines and
        most bytes; 6x less for OLMo's many short record lines), else among all, the bulk lines
        taken out after. Otherwise the text between bulk records is searched as one joined string
        (one search in C per keyword, instead of one per record); positions are mapped back.
        Either way the lines with an escape sequence whose keyword only cleaning shows are added
        (`Block.escaped_lines`).
        """
        scan = self._scan
        assert scan is not None
        text = block.text
        newlines = block.newlines
        outside = np.ones(len(newlines), dtype=bool)
        outside[covered] = False
        if 8 * len(covered) > len(newlines):
            found = scan.lines(block.codes, newlines, np.flatnonzero(outside), ascii_only=block.ascii)
        else:
            found = scan.lines(block.codes, newlines, ascii_only=block.ascii)
            if found is not None:
                found = found[~np.isin(found, covered)]
        if found is not None:
            unseen = outside.copy()
            unseen[found] = False
            escaped = block.escaped_lines(scan.holds, unseen)
            found = np.union1d(found, escaped) if len(escaped) else found
            return iter(line_starts(newlines, found).tolist()), found
        escaped_starts = line_starts(newlines, block.escaped_lines(scan.holds, outside)).tolist()
        if not starts:
            return heapq.merge(scan.positions(text), escaped_starts), None
        piece_starts = [0, *(e + 1 for e in ends)]  # where each stretch between records begins
        pieces = [text[a:b] for a, b in zip(piece_starts, [*starts, len(text)], strict=True)]
        joined_starts = list(accumulate((len(p) for p in pieces), initial=0))
        gaps = "".join(pieces)

        def positions() -> Iterator[int]:
            for g in scan.positions(gaps):
                k = bisect_right(joined_starts, g) - 1
                yield piece_starts[k] + g - joined_starts[k]

        return heapq.merge(positions(), escaped_starts), None

    def _main_parser(self) -> Parser | None:
        """The file's main parser, once it has produced records."""
        counts = self.out.counts
        for p in self.parsers:
            if not p.auxiliary and counts.get(p.name):
                return p
        return None

    def _reshaped(self, shape: object | None, depth: int) -> bool:
        """Whether what the bulk reader matches is no longer `shape` (also when it can no longer
        match), and the rest of the block may still be searched again."""
        main = self._main_parser()
        return depth < _MAX_RESCANS and main is not None and main.bulk_shape() is not shape

    def _locked_by(self, parser: Parser | None, hits: int) -> bool:
        """Whether `hits` more records of `parser`, the main parser reading in bulk, lock the
        file's format (`_maybe_lock`)."""
        if self._locked or parser is None:
            return False
        return self.out.counts.get(parser.name, 0) + hits >= LOCK_AFTER_RECORDS

    def _closes_at_hit(self, parser: Parser) -> bool:
        """Whether a line read one by one that reached a bulk hit of `parser` ends there: when
        the record open is the parser's own, which its next record always closes (it is closed
        here, `Parser.bulk_close`), rather than another parser's (a traceback), which may go on."""
        if not parser.collecting:
            return False
        if any(p.collecting for p in self._collectors if p is not parser):
            return False
        return parser.bulk_close(self.out)

    def _collecting(self) -> bool:
        for p in self._collectors:  # noqa: SIM110 - a loop, not any(): asked once per line
            if p.collecting:
                return True
        return False

    def _wait_for_time(self, start: int, end: int, lineno: int) -> None:
        """A record was written while the line `lineno` (from `start` to its newline at `end`, in
        the block `_track_time` reads) was read: where that record has no time of its own, the
        first dated line after it is searched for from the line after this one, or from this one
        where the record ended before it (a multi-line record, closed by the line after its last)."""
        out = self.out
        if out.step_ts_pending:
            self._pending_from = start if out.last_record_line < lineno else end + 1

    def _track_time(self, text: str, newlines: np.ndarray, codes: np.ndarray, ascii_only: bool) -> None:
        """Clock facts of a block's lines, whichever way each was read: the latest time, and a
        record's time.

        A record without its own timestamp takes the time of the first timestamped line after it
        (from `_pending_from`, just after the latest record); the log's "now" is its last
        timestamped line, whatever kind of line that is. Both are read here, after the block, by
        one rule for every line: so they do not depend on where blocks are cut, nor on whether
        a line was read one by one, in bulk, or skipped.
        """
        out = self.out
        dated = _DatedLines(text, codes, newlines, ascii_only)
        if out.step_ts_pending and self._pending_from is not None:
            ts = dated.first_time(self._pending_from)
            if ts is not None:
                out.last_step_ts, out.step_ts_pending = ts, False
        self._pending_from = 0 if out.step_ts_pending else None
        last = dated.last_time()
        if last is not None:
            out.last_ts = last

    def _parse_line(self, raw: str, lineno: int) -> None:
        if "\r" in raw:  # tqdm redraws: each piece is a line of its own, same line number
            for piece in raw.split("\r"):
                if piece.strip():
                    self._parse_piece(piece, lineno)
        else:
            self._parse_piece(raw, lineno)

    def _parse_piece(self, raw: str, lineno: int) -> None:
        if len(raw) > MAX_DIGITS and holds_long_number(raw):  # (no parser may meet such a number)
            text = f"more than {MAX_DIGITS} digits in a row: line not read"
            self.out.event(EventKind.PARSE_WARNING, lineno, text=text)
            return
        text = clean(raw)
        out = self.out
        ts = timestamp(text)
        active = self._active
        for p in active:
            if p.collecting:
                if p.parse(text, lineno, ts, out):
                    self._maybe_lock(p)  # a multi-line record ends when its parser reads on
                    return
                break
        for p in active:
            if p.parse(text, lineno, ts, out):
                self._maybe_lock(p)
                return

    def _maybe_lock(self, parser: Parser) -> None:
        if self._locked or self.out.counts.get(parser.name, 0) < LOCK_AFTER_RECORDS:
            return
        if not parser.auxiliary or (parser.fallback and self.format == parser.name):
            self._lock_format(parser)

    def _lock_format(self, main: Parser) -> None:
        """The file's format is known: from now on only its parser and the auxiliary ones read.

        Fewer parsers per line and a shorter keyword search; another trainer's lines later in the
        same file are not read (a file holds one run). The generic reader (`Parser.fallback`)
        reads no more once a trainer's parser locks the file; where it locks the file itself,
        it stays last, behind the auxiliary parsers whose lines it would otherwise take.
        """
        self._locked = True
        auxiliary = [p for p in self.parsers if p.auxiliary and not p.fallback]
        self._active = [*auxiliary, main] if main.fallback else [main, *auxiliary]
        self._collectors = [p for p in self._active if type(p).collecting is not Parser.collecting]
        self._aux_readers = []
        for k, parser in enumerate(self._active):
            if type(parser).aux_lines is not Parser.aux_lines:
                scans = [p.scan for p in self._active[:k] if p.scan]
                self._aux_readers.append((parser, Keywords(scans) if scans else None))
        if self._scan is not None:
            self._scan = _keywords(self._active)


@dataclass
class _AuxRound:
    """The lines of one block that auxiliary parsers read all at once (`LogStream._aux_lines`)."""

    found: list[tuple[Parser, AuxLines, np.ndarray]]  # with where each line starts
    lines: np.ndarray  # their indices, all parsers'
    starts: dict[int, None]  # where they start (a dict: fast membership, in order)
    inside: set[int]  # starts of those that a multi-line record took, read one by one
    first: int  # number of the block's first line
    events_before: int  # events written before the block
    written: list[int]  # per parser of `found`: how many of its lines are written (`_write_aux`)
    events: list[Event]  # the events they wrote, merged into the block's at the end


def format_text(fmt: str | None, layout: str | None) -> str:
    """A file's format as people read it: with the layout where the parser says one
    (`generic (`key value`, step from `Iter`)`)."""
    name = fmt or "?"
    return f"{name} ({layout})" if layout else name


def _line_of(event: Event) -> int:
    return event.line


_NO_AUX = _AuxRound([], np.zeros(0, dtype=np.int64), {}, set(), 0, 0, [], [])


def _rest(block: Block, pos: int) -> Block:
    """The lines of `block` from `pos` (a line start) on."""
    newlines = block.newlines
    return Block(block.text[pos:], block.codes[pos:], newlines[newlines >= pos] - pos, block.ascii)


def _cut_line(line: bytes) -> bytes:
    """A line (without its newline) longer than `MAX_LINE_BYTES`, cut to at most that.

    A line of tqdm's redraws (pieces after `\r`, each read as a line, HF Trainer's dict after
    the last bar) keeps its last whole pieces that fit, or else the start of its last piece: the
    newest is what counts. Any other line keeps its start. A `\r` that ends the line (Windows'
    line end) is no redraw: it is dropped first."""
    line = line.removesuffix(b"\r")
    if len(line) <= MAX_LINE_BYTES:
        return line
    fits = line.find(b"\r", len(line) - MAX_LINE_BYTES - 1)
    if fits >= 0:
        return line[fits + 1 :]
    start = line.rfind(b"\r") + 1
    return line[start : start + MAX_LINE_BYTES]


def _all_lines_short(data: bytes, end: int) -> bool:
    """Whether no line of `data[:end]` (whole lines) is longer than `MAX_LINE_BYTES`: every
    stretch of half of that holds a newline (a longer line holds one such stretch without),
    a handful of searches that stop at the first newline."""
    half = MAX_LINE_BYTES // 2
    return all(data.find(b"\n", at, min(at + half, end)) >= 0 for at in range(0, end, half))


def _decoded(data: bytes | memoryview) -> tuple[str, np.ndarray, bool]:
    """A block's text, a byte per character of it (`?` for each one that is not ASCII, see
    Block), and whether it is ASCII."""
    try:
        text = str(data, "utf-8")  # (as fast as ASCII's decoder where it is ASCII, and it says so)
    except UnicodeDecodeError:
        text = str(data, "utf-8", errors="replace")
    else:
        if text.isascii():  # (a flag of the string: no second pass)
            return text, np.frombuffer(data, dtype=np.uint8), True
    # (tqdm's bars: 37 ms a 16 MB HF block, against 42 for dropping the continuation bytes of
    # valid UTF-8 in numpy; ASCII's decoder tried first failed a pass over it, then copied it)
    return text, np.frombuffer(text.encode("ascii", errors="replace"), dtype=np.uint8), False


def _line_bounds(
    newlines: np.ndarray, positions: list[int], spans: np.ndarray | None, first: int
) -> tuple[list[int], list[int], np.ndarray, np.ndarray]:
    """For hits at `positions` (ascending) covering `spans` lines each (None: one) in a text with
    these `newlines` that ends with one and begins with line number `first`: where each hit's
    first line starts, where its last line ends (its newline), the number of its first line, and
    the indices of all the lines the hits cover. A vectorised lookup, not a search per position.
    """
    if not positions:
        none = np.zeros(0, dtype=np.int64)
        return [], [], none, none
    index = np.searchsorted(newlines, np.array(positions, dtype=np.int64))  # the newline ending each line
    starts = np.where(index > 0, newlines[np.maximum(index - 1, 0)] + 1, 0)
    last = index if spans is None else index + spans - 1
    covered = index if spans is None else np.repeat(index - np.cumsum(spans) + spans, spans) + np.arange(spans.sum())
    return starts.tolist(), newlines[last].tolist(), index + first, covered


def _keywords(parsers: list[Parser]) -> Keywords | None:
    """The parsers' keywords, or None when a parser must see every line."""
    scans = [p.scan for p in parsers]
    if any(s is None for s in scans):
        return None
    return Keywords([s for s in scans if s])


# A line that starts with a date and time: after colour codes, launcher prefixes (those `clean`
# strips), one space (Megatron-LM's timed lines) and a logger's tag (torchtitan's, NeMo's), as
# `_line_time` reads it. Every line a parser takes a time from for the log's clock is one, but
# for a dated piece after a tqdm bar and `\r` (the line's own start is the bar).
_TAGS = r"\[titan\] |\[NeMo [A-Z] "
_COLOURS = r"(?:\x1b\[[0-9;]*m)*"  # a logger's colour codes before it all (NeMo's on a terminal)
_TS_LINE = re.compile(rf"^{_COLOURS}(?:{PREFIXES})? ?(?:{_TAGS})?\[?\d{{4}}-\d\d-\d\d[ T_-]\d\d:?\d\d:?\d\d", re.M)
#: the loggers' tags before a time (`_TS_LINE`), after a space or not
_TAG = re.compile(rf" ?(?:{_TAGS})")


def _dated_lines(newlines: np.ndarray, codes: np.ndarray) -> list[int]:
    """Starts of the lines of a block (`codes`, a byte per character; it ends with a newline)
    that may begin with a date.

    Such a line begins with a digit or `[` (a date, a launcher prefix or a tag before one), `n` or
    `(` (LUMI's and Ray's prefixes), an escape (a colour), `?` (which may stand for a digit of
    another script), or ` [` (Megatron-LM's time): found from the newlines at numpy speed, so
    that a block without dates (JSON lines) costs no regex scan. (A date right after a space is
    taken by `_TS_LINE` but not looked for: no trainer prints one, and tqdm's bars begin so:
    ` 10%|`.)
    """
    starts = np.concatenate([[0], newlines[:-1] + 1])
    first = codes[starts]
    maybe = np.isin(first, _MAY_BEGIN_A_DATED_LINE)
    spaced = np.flatnonzero(first == ord(" "))
    maybe[spaced] = codes[np.minimum(starts[spaced] + 1, len(codes) - 1)] == ord("[")
    return starts[maybe].tolist()


#: the characters a dated line (`_TS_LINE`) may begin with, but a space
_MAY_BEGIN_A_DATED_LINE = np.frombuffer(b"[?n(0123456789\x1b", dtype=np.uint8)


def _line_time(text: str, start: int) -> float | None:
    """The time of the line at `start`, where it begins with a date and time that is one."""
    if not _TS_LINE.match(text, start):
        return None
    end = text.find("\n", start)
    line = clean(text[start : end if end >= 0 else None])
    tag = _TAG.match(line)
    return timestamp(line[tag.end() :] if tag else line)


@dataclass
class _DatedLines:
    """The lines of a block (`text`; `codes`, a byte per character; `newlines`) that may begin
    with a date (`starts`, `_dated_lines`), read for their times.

    The time wanted is usually on one of the first or last few of them: those are read one by
    one. Where none of those has one (NCCL chatter, a traceback, LUMI's NCCL lines, which begin
    as its launcher prefix does), RE2 picks the dated lines at once, and only those are read: a
    Python match per line over a block of such lines cost more than reading the block.
    """

    text: str
    codes: np.ndarray
    newlines: np.ndarray
    ascii_only: bool
    starts: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.starts = _dated_lines(self.newlines, self.codes)

    def first_time(self, pos: int) -> float | None:
        """The time of the first line from `pos` on that begins with a readable date and time."""
        at = bisect_left(self.starts, pos)
        found = next(self._times(self.starts[at : at + _LINES_TRIED]), None)
        if found is not None or at + _LINES_TRIED >= len(self.starts):
            return found
        picked = self._picked
        return next(self._times(picked[bisect_left(picked, pos) :]), None)

    def last_time(self) -> float | None:
        """The time of the last line that begins with a readable date and time."""
        found = next(self._times(reversed(self.starts[-_LINES_TRIED:])), None)
        if found is not None or len(self.starts) <= _LINES_TRIED:
            return found
        return next(self._times(reversed(self._picked)), None)

    def _times(self, starts: Iterable[int]) -> Iterator[float]:
        """The times of the lines at `starts` that have one, in that order."""
        for start in starts:
            ts = _line_time(self.text, start)
            if ts is not None:
                yield ts

    @cached_property
    def _picked(self) -> list[int]:
        """The lines `_TS_LINE` takes, found by RE2 at once (where the block is not ASCII, more:
        a `?` of `codes` may be any character)."""
        _, pc = arrow()
        index = np.searchsorted(self.newlines, np.array(self.starts, dtype=np.int64))  # their lines
        pattern = _TS_LINE_RE2 if self.ascii_only else _TS_LINE_SHADOW
        taken = pc.match_substring_regex(line_array(self.codes, self.newlines, index), pattern)
        return [self.starts[i] for i in np.flatnonzero(numpy_of(taken)).tolist()]


#: how many of the lines nearest where a time is wanted `_DatedLines` reads before it asks RE2
_LINES_TRIED = 8
#: `\s` as `re` reads it on ASCII text (RE2's leaves out \v and \x1c-\x1f)
_SPACE = r"[\t\n\x0b\x0c\r\x1c-\x1f ]"
#: `_TS_LINE` for RE2 over one line of an ASCII block: the same lines (a line that `re` takes
#: only by reading on into the next one has no time of its own: not missed)
_TS_LINE_RE2 = _TS_LINE.pattern.replace(r"\s", _SPACE)
#: and over one line of another block's `codes`, where `?` stands for each character that is
#: not ASCII: `\d`, `\w` and `\s` (which take some of those) take `?` too, a superset
_TS_LINE_SHADOW = (
    _TS_LINE.pattern.replace(r"[\d.]", "[0-9?.]")
    .replace(r"[\w.-]", r"[\w?.-]")
    .replace(r"\d", "[0-9?]")
    .replace(r"\s", _SPACE[:-1] + "?]")
)

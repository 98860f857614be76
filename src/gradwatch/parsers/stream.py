"""Bytes in, record batches out: line splitting, cleaning and dispatch to the parsers of one file.

`LogStream` is fed chunks of any size (a 4 KiB append or a 64 MiB block of an archive). It keeps a
partial last line until its newline arrives, so results never depend on where chunks were cut.
Each line is cleaned of launcher prefixes and ANSI escapes, split at carriage returns (tqdm), and
offered to the parsers: first to one that has a multi-line record open, then to all in order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from gradwatch.events import Event, EventKind
from gradwatch.parsers._text import clean, timestamp
from gradwatch.parsers.base import ParseOutput, Parser

#: Longer lines are cut here (the rest is dropped and reported once): a 50 MB line of garbage
#: must not hold the whole file in memory.
MAX_LINE_BYTES = 1 << 20
#: Until a main parser has produced a record, output is held back for up to this many lines, so
#: that DeepSpeed progress lines printed before a trainer's first record do not become records.
UNDECIDED_HOLD_LINES = 5000


@dataclass
class Batch:
    """What one stretch of a file said: records, events, and the clock as the log showed it."""

    records: pd.DataFrame
    events: list[Event] = field(default_factory=list)
    #: time of the latest timestamped line (any line), for stall detection in archived logs
    last_ts: float | None = None
    #: time of the latest record (or of the first timestamped line after it)
    last_step_ts: float | None = None
    #: step of the latest record
    last_step: int | None = None
    path: str = ""


class LogStream:
    """Parses one file incrementally with a fixed set of parsers."""

    def __init__(self, parsers: list[Parser], path: str = "") -> None:
        self.path = path
        self.parsers = parsers
        self.out = ParseOutput()
        self.lines = 0
        self.bytes = 0
        self._partial = b""
        self._overlong = False
        self._closed = False
        self._aux = frozenset(p.name for p in parsers if p.auxiliary)

    @property
    def format(self) -> str | None:
        """The parser that produced most records (main parsers before auxiliary ones)."""
        counts = self.out.counts
        if not counts:
            return None
        main = {p.name for p in self.parsers if not p.auxiliary}
        ranked = sorted(counts, key=lambda n: (n in main, counts[n]), reverse=True)
        return ranked[0]

    def feed(self, data: bytes) -> None:
        self.bytes += len(data)
        buf = self._partial + data if self._partial else data
        cut = buf.rfind(b"\n")
        if cut < 0:
            self._hold(buf)
            return
        self._partial = b""
        self._parse_block(buf[: cut + 1])
        if cut + 1 < len(buf):
            self._hold(buf[cut + 1 :])

    def close(self) -> None:
        """End of input: parse a last line that never got its newline, close open records."""
        if self._partial:
            tail, self._partial = self._partial, b""
            self._parse_block(tail + b"\n")
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
        main_seen = self._main_seen
        out = self.out
        if not (main_seen or self._closed or self.lines >= UNDECIDED_HOLD_LINES):
            return Batch(out.records.take_none(), path=self.path)
        events, out.events = out.events, []
        records = out.records.take(self._aux if main_seen else frozenset())
        return Batch(records, events, out.last_ts, out.last_step_ts, out.last_step, self.path)

    def _hold(self, partial: bytes) -> None:
        if len(partial) > MAX_LINE_BYTES:
            if not self._overlong:
                self._overlong = True
                self.out.event(
                    EventKind.PARSE_WARNING,
                    self.lines + 1,
                    None,
                    None,
                    text=f"line longer than {MAX_LINE_BYTES} bytes: cut there",
                )
            partial = partial[:MAX_LINE_BYTES]
        self._partial = partial

    def _parse_block(self, block: bytes) -> None:
        text = block.decode("utf-8", errors="replace")
        lines = text.split("\n")
        lines.pop()  # the block ends with a newline: the last piece is empty
        first = self.lines + 1
        self.lines += len(lines)
        parse = self._parse_line
        for offset, raw in enumerate(lines):
            if not raw:
                continue
            if "\r" in raw:
                for piece in raw.split("\r"):
                    if piece.strip():
                        parse(piece, first + offset)
            else:
                parse(raw, first + offset)

    def _parse_line(self, raw: str, lineno: int) -> None:
        text = clean(raw)
        out = self.out
        ts = timestamp(text)
        if ts is not None:
            out.last_ts = ts
            if out.step_ts_pending:
                out.last_step_ts, out.step_ts_pending = ts, False
        for p in self.parsers:
            if p.collecting:
                if p.parse(text, lineno, ts, out):
                    return
                break
        for p in self.parsers:
            if p.parse(text, lineno, ts, out):
                return

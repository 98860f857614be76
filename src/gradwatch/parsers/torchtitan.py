"""torchtitan: one metrics line per logged step, printed by every rank.

Line shapes covered (torchtitan `components/metrics.py`, `components/checkpoint.py`, `train.py`):

    [titan] 2026-05-18 16:04:50,821 - root - INFO - step: 18  loss:  3.54399  grad_norm:  0.7675
        memory:  9.46GiB(64.99%)  tps: 7,322  tflops: 0.52  mfu: 0.17%     (one line in the log)
    2025-02-03 13:39:06,055 - root - INFO - step:  1  loss: 12.2384  memory: ...  mfu: N/A
    [titan] ... - validate step: 100  loss: 3.1234  memory: ...  tps: ...
    Loading the checkpoint at step 400.  /  Loading the checkpoint from <id>.
    Training starts at step 401.
    Finished saving the checkpoint (or staging if async is enabled)in 1.23 seconds.

ANSI colours and `[rankN]:` prefixes are removed by `clean()`. The same step printed by several
ranks one after the other becomes one record. `mfu` is kept in percent as printed; `N/A` is not
logged. The memory field (max reserved) has no canonical metric and is not read; validation
records carry only `val_loss`. In a line cut before its `mfu` field the last value is not read.

Bulk path: once the file is locked to this parser, metrics lines of the usual form (the `[titan]`
tag, an optional `[rankN]:` prefix, torchtitan's own colours, plain numbers) are read in bulk,
found by their layout (`torchtitan_rows`: the fixed text between the values, measured on the
first such line) at numpy speed, the few lines it does not fit by a regex; the layout takes only
lines the regex takes and reads them alike. Copies from other ranks are dropped there too.
Lines read one by one in between learn of the bulk records before them from `out.last_step` (the
stream sets it from the latest hit): its step is looked up among the block's hits, which gives
this parser's last step and the time the stream's `last_ts` would have had. For that the steps
of the hits must be distinct and rising, so the hits stop at the first line that could break
it: another metrics line, a mismatched validation, a checkpoint load.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import numpy as np

from gradwatch.events import EventKind
from gradwatch.parsers._bytes import line_starts
from gradwatch.parsers._text import clean, is_nonfinite, number, timestamp, timestamps
from gradwatch.parsers.base import Block, BulkTrack, Hits, ParseOutput, Parser, TableHits, number_table
from gradwatch.parsers.torchtitan_rows import (
    GROUPED,
    HEAD,
    MEMORY,
    METRICS,
    MFU,
    NUMBER,
    STEP,
    Layout,
    find,
    step_lines,
)

_STEP = re.compile(r"(?:\b(validate)\s+)?\bstep:\s*(\d{1,18})\s+loss:\s*(\S+)")
_FIELDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("grad_norm", re.compile(r"\bgrad_norm:\s*(\S+)")),
    ("tps", re.compile(r"\btps:\s*([\d,.]+|nan|inf)")),
    ("tflops", re.compile(r"\btflops:\s*([\d,.]+|nan|inf)")),
    ("mfu", re.compile(r"\bmfu:\s*([\d.]+|nan|inf)%")),
)
_LOAD_AT = re.compile(r"Loading the checkpoint at step (\d{1,18})\b")
_LOAD_FROM = re.compile(r"Loading the checkpoint from (.+?)\.?\s*$")
_STARTS = re.compile(r"Training starts at step (\d{1,18})\b")

# Bulk path: a metrics line as torchtitan prints it, group 1 the step (looked ahead to: it comes
# after the time), then the seven numbers of the time, then the metrics' values (`METRICS`); the
# values' grammars are those `torchtitan_rows` checks.
_C = r"(?:\x1b\[[\d;]*m)?"  # torchtitan's colour code before a field
_TIME = r"(\d{4})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d),(\d{3})"
_INFO = r" - [\w.]+ - INFO - " + _C + "step: +"
_BULK_LINE = re.compile(
    rf"^(?={HEAD}{_TIME.replace('(', '(?:')}{_INFO}({STEP}) ){HEAD}{_TIME}{_INFO}\d+ +"
    rf"{_C}loss: +({NUMBER}) +(?:{_C}grad_norm: +({NUMBER}) +)?{_C}memory: +{MEMORY} +"
    rf"{_C}tps: +({GROUPED}) +{_C}tflops: +({GROUPED}) +{_C}mfu: +{MFU}{_C}[ \t\r]*$",
    re.M | re.ASCII,
)
_LOADS = ("Loading the checkpoint", "Training starts")
_WIDTH = 1 + len(METRICS)  # the numbers of a hit: its time, then the METRICS


def _none() -> np.ndarray:
    return np.zeros(0, dtype=np.int64)


@dataclass
class _Round:
    """The bulk hits handed out for the block being read, for the lines read one by one in it."""

    hits: TableHits = field(default_factory=lambda: TableHits.empty(_WIDTH))
    #: where the non-copies are in `hits`, their steps (rising) and times
    fresh: np.ndarray = field(default_factory=_none)
    steps: np.ndarray = field(default_factory=_none)
    times: np.ndarray = field(default_factory=lambda: np.zeros(0))
    #: where the hits that repeat the step before them begin (ascending)
    copies: np.ndarray = field(default_factory=_none)
    #: the step of the latest hit a per-line call took into account
    applied: int = -1


def _of_matches(matches: list[re.Match[str]]) -> TableHits:
    """Metrics lines the bulk regex found, every number converted in one call."""
    if not matches:
        return TableHits.empty(_WIDTH)
    tokens = list(chain.from_iterable(m.groups("nan") for m in matches))  # nan: not logged
    table = number_table(tokens, len(matches), drop=",")
    at = np.array([m.start() for m in matches], dtype=np.int64)  # a line start: the regex begins with ^
    values = np.column_stack([timestamps(table[:, 1:8]), table[:, 8:]])
    return TableHits(at, at, table[:, 0].astype(np.int64), values)


class TorchtitanParser(Parser):
    name = "torchtitan"
    segment_safe = True
    scan = r"step:|checkpoint|Training starts"
    description = "torchtitan `step: N  loss: X  grad_norm: ...  tps: ...  mfu: ...%` lines"
    #: the metrics lines' layout, once measured (a class default, so that parsers pickled in
    #: older scan states have it)
    _layout: Layout | None = None

    def __init__(self) -> None:
        self._last_step: int | None = None  # of the previous training record (rank dedupe)
        self._last_val_step: int | None = None
        self._last_load: int | None = None
        self._loading: str | None = None
        self._last_save: int | None = None
        self._bulk = BulkTrack()
        self._seen: int | None = None  # out.last_step after the latest per-line call or bulk chunk
        self._round = _Round()
        self._layout = None

    def __getstate__(self) -> dict[str, Any]:
        """Without the block's hits: `scan` and `check --jobs` pickle parsers between blocks."""
        state = self.__dict__.copy()
        del state["_round"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._round = _Round()  # an older state's may be of another shape

    def parse(self, text: str, line: int, ts: float | None, out: ParseOutput) -> bool:
        self._bulk.seen(line)
        self._catch_up(out)
        took = self._parse(text, line, ts, out)
        self._seen = out.last_step
        self._bulk.count(self.name, out)
        return took

    def _catch_up(self, out: ParseOutput) -> None:
        """Take the latest bulk record before this line into account, as reading it would have:
        its step is the last step, its time the latest time (`out.last_step` names it)."""
        step, done = out.last_step, self._round
        if step is None or step <= done.applied:
            return
        k = int(np.searchsorted(done.steps, step))
        if k == len(done.steps) or done.steps[k] != step:
            return
        done.applied = self._last_step = step
        if not np.isnan(done.times[k]):  # as `_ts` reads the line's time
            out.last_ts = float(done.times[k])

    def _parse(self, text: str, line: int, ts: float | None, out: ParseOutput) -> bool:
        if "step:" in text and "loss:" in text:
            return self._metrics(text, line, ts, out)
        if "checkpoint" in text or "Training starts" in text:
            return self._checkpoint(text, line, self._ts(text, ts, out), out)
        return False

    @staticmethod
    def _ts(text: str, ts: float | None, out: ParseOutput) -> float | None:
        """The time after the `[titan] ` tag, which hides it from the stream's timestamp()."""
        if ts is None and text.startswith("[titan] "):
            ts = timestamp(text[8:])
            if ts is not None:
                out.last_ts = ts
        return ts

    def _metrics(self, text: str, line: int, ts: float | None, out: ParseOutput) -> bool:
        m = _STEP.search(text)
        if m is None:
            return False
        validate, step = m.group(1) is not None, int(m.group(2))
        if step == (self._last_val_step if validate else self._last_step):
            return True  # the same step from another rank
        ts = self._ts(text, ts, out)
        metrics: dict[str, float] = {}
        try:
            metrics["val_loss" if validate else "loss"] = number(m.group(3))
        except ValueError:
            return False
        rest = "" if validate else text[m.end() :].rstrip()  # eval tps is not training tps
        # a complete line ends with the mfu field; in a cut one the last value may be cut too
        complete = rest.endswith(("%", "N/A"))
        for name, pattern in _FIELDS:
            f = pattern.search(rest)
            if f is None or (not complete and f.end() == len(rest)):
                continue
            try:
                metrics[name] = number(f.group(1))
            except ValueError:
                continue
        nonfinite = [k for k, v in metrics.items() if is_nonfinite(v)]
        out.record(self.name, step, line, ts, metrics, nonfinite)
        if validate:
            self._last_val_step = step
            out.event(EventKind.VALIDATION, line, step, ts, val_loss=metrics["val_loss"])
        else:
            self._last_step = step
            self._bulk.passed()
        return True

    def _checkpoint(self, text: str, line: int, ts: float | None, out: ParseOutput) -> bool:
        m = _LOAD_AT.search(text)
        if m:
            self._load(int(m.group(1)), None, line, ts, out)
            return True
        m = _LOAD_FROM.search(text)
        if m:
            self._loading = m.group(1)
            return True
        m = _STARTS.search(text)
        if m:
            start = int(m.group(1))
            if self._loading is not None or start > 1:
                self._load(start - 1, self._loading, line, ts, out)
            self._loading = None
            return True
        if "Finished saving the checkpoint" in text:
            step = out.last_step
            if step is None or step != self._last_save:
                self._last_save = step
                out.event(EventKind.CHECKPOINT_SAVE, line, step, ts)
            return True
        return "Finished loading the checkpoint" in text

    def _load(self, step: int, path: str | None, line: int, ts: float | None, out: ParseOutput) -> None:
        """One load event per resume, though every rank prints the lines."""
        if step == self._last_load:
            return
        self._last_load = step
        self._last_step = self._last_val_step = None  # the resumed run may repeat a step
        data: dict[str, object] = {"iteration": step}
        if path is not None:
            data["path"] = path
        out.event(EventKind.CHECKPOINT_LOAD, line, step, ts, **data)

    def can_bulk(self) -> bool:
        return self._bulk.locked

    def bulk_shape(self) -> object | None:
        return self._bulk.shape if self.can_bulk() else None

    def bulk_matches(self, block: Block) -> TableHits:
        """Metrics lines of the usual form, up to the first line that must be read one by one and
        could change the last step, and while the new steps rise (the bulk path; see LogStream)."""
        colons = np.flatnonzero(block.codes == ord(":"))
        hits = self._find(block, colons) if self.can_bulk() else TableHits.empty(_WIDTH)
        cut = self._cut(block, hits, colons)
        steps = hits.steps[:cut]
        previous = np.concatenate([[-1 if self._last_step is None else self._last_step], steps[:-1]])
        fresh = np.flatnonzero(steps != previous)
        floor = max((s for s in (self._seen, self._last_step) if s is not None), default=-1)
        rising = steps[fresh] > np.concatenate([[floor], steps[fresh][:-1]])
        stop = cut if rising.all() else int(fresh[np.argmin(rising)])
        fresh = fresh[fresh < stop]
        copies = hits.at[np.flatnonzero(steps[:stop] == previous[:stop])]
        taken = hits.subset(np.arange(stop))
        self._round = _Round(taken, fresh, steps[fresh], taken.values[fresh, 0], copies, floor)
        self._bulk.handed(stop, retry=stop < len(hits))
        return taken

    def _find(self, block: Block, colons: np.ndarray) -> TableHits:
        """The block's metrics lines that the bulk regex matches: found by their layout (measured
        on the first of them, again when most lines no longer fit it), the rest by the regex."""
        text = block.text
        if self._layout is None:
            first = _BULK_LINE.search(text)
            if first is None:
                return TableHits.empty(_WIDTH)
            self._layout = Layout.of(first.group())
        rows = find(self._layout, block.codes, block.newlines, colons)
        hits = TableHits(rows.line_starts, rows.line_starts, rows.steps, rows.values)
        odd = [m for start, end in rows.odd if (m := _BULK_LINE.search(text, start, end)) is not None]
        if len(odd) > len(hits):
            self._layout = Layout.of(odd[0].group())
        return hits.merged(_of_matches(odd)) if odd else hits

    def _cut(self, block: Block, hits: TableHits, colons: np.ndarray) -> int:
        """How many of the `hits` come before the first line that must be read one by one and
        could change the last step: a load, another metrics line, or a validation line of
        another step than the training line before it."""
        text = block.text
        loads = [i for i in (text.find(w) for w in _LOADS) if i >= 0]
        cut = int(np.searchsorted(hits.at, min(loads))) if loads else len(hits)
        taken = hits.line_starts[:cut]
        lines = step_lines(block.codes, block.newlines, colons)
        if len(lines) == cut:  # each hit holds one `step:`: these are all
            return cut
        starts = line_starts(block.newlines, lines)
        before = np.searchsorted(taken, starts)
        other = before == len(taken)
        other[~other] = taken[before[~other]] != starts[~other]
        ends = block.newlines[lines[other]]
        for start, end, k in zip(starts[other].tolist(), ends.tolist(), before[other].tolist(), strict=True):
            m = _STEP.search(clean(text[start:end]))
            previous = int(hits.steps[k - 1]) if k else self._last_step
            if m is None or m.group(1) is None or int(m.group(2)) != previous:
                return k
        return cut

    def bulk_records(self, text: str, hits: Hits, linenos: np.ndarray, out: ParseOutput) -> None:
        """Bulk lines as one columnar chunk, copies from other ranks dropped."""
        assert isinstance(hits, TableHits)
        table, steps = hits.values, hits.steps
        ts = table[:, 0]
        copies = self._round.copies
        fresh = ~np.isin(hits.at, copies) if len(copies) else np.ones(len(hits), dtype=bool)
        metrics = {name: table[fresh, 1 + j] for j, name in enumerate(METRICS)}
        lines = linenos[fresh]
        if len(lines):
            nonfinite = np.full(len(lines), "", dtype=object)  # no nan or inf in a bulk line
            out.record_columns(self.name, steps[fresh], lines, ts[fresh], metrics, nonfinite)
        self._bulk.count(self.name, out)
        if self._bulk.newest(linenos):
            self._last_step = self._seen = int(steps[-1])
            timed = np.flatnonzero(fresh & ~np.isnan(ts))
            if len(timed) and linenos[timed[-1]] > self._bulk.line:
                out.last_ts = float(ts[timed[-1]])

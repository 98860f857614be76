"""OLMo and OLMo-core console metrics: a `[step=N/M,...]` marker, then indented `key=value` lines.

Line shapes covered:

    2024-08-06 10:00:05.520 host:0  olmo.train:908  INFO    [step=2/739328,epoch=0]
        optim/total_grad_norm=0.0002
        train/CrossEntropyLoss=1.7872662283480167e-06
        throughput/total_tokens=2,097,152
    [2025-02-20 15:18:04] INFO     [olmo_core...console_logger:62, rank=0] [step=1/7,epoch=1]
        train/CE loss=11.03
        optim/LR (group 0)=1.00E-05

The record ends at the next line that is not a metric line; that line is left for the other
parsers. OLMo-core adds `,eta=...` to the marker when known, and prints bare markers between
metric intervals: they produce no record. Numbers follow OLMo's `format_float` (thousands commas,
`str()` below 1e-4, `nan`). A launcher prefix such as srun's `0:     ` swallows the indentation,
so an unindented `group/name=value` line also continues a record.

Bulk path: once the file is locked to this parser, records of a shape read one by one before
(the same indented keys in the same order) are found and read for a whole block at once
(`olmo_rows`); up to `_LAYOUTS` shapes are remembered, as runs alternate a few.

Checkpoint lines (OLMo `olmo/train.py`, OLMo-core `trainer.py`/checkpointer callback):
`Loading checkpoint from <path>...` (remembered), `Will resume training from step N, epoch E`
(load event with the step), `Checkpoint successfully loaded` (load event when no step was given),
`Checkpoint saved to <path>` and `Saving checkpoint for step N to '<path>'...` (save events).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from gradwatch.events import EventKind
from gradwatch.parsers._text import is_nonfinite, number
from gradwatch.parsers.base import Block, BulkTrack, Hits, ParseOutput, Parser
from gradwatch.parsers.olmo_rows import Layout, Records, find

# `[step=N/M]` (early OLMo), `,epoch=E`, OLMo-core `,eta=...`; rich's handler may add `file.py:123`
_MARKER = re.compile(r"\[step=(\d{1,18})/(?:\d+|\?+|None)(?:,epoch=\d+)?(?:,eta=[^\]]*)?\]\s*(?:[\w.-]+:\d+\s*)?$")
# an unindented continuation (indentation eaten by a launcher prefix): `group/name=value`
_BARE_METRIC = re.compile(r"^[A-Za-z][\w ().-]*/[^=]*=\S+\s*$")
_RESUME = re.compile(r"Will resume training from step (\d{1,18})\b")
_SAVE_STEP = re.compile(r"Saving checkpoint for step (\d{1,18}) to '?([^']*?)'?(?:\.\.\.)?\s*$")
_LOADING = re.compile(r"Loading checkpoint from '?(.*?)'?\.\.\.\s*$")
_SAVED = re.compile(r"Checkpoint saved to (\S+)")

# lower-cased key without spaces/underscores -> canonical metric
_KEYS: dict[str, str] = {
    "train/crossentropyloss": "loss",
    "train/celoss": "loss",
    "optim/totalgradnorm": "grad_norm",
    "train/zloss": "z_loss",
    "train/perplexity": "ppl",
    "train/ppl": "ppl",
    "throughput/totaltokens": "tokens",
    "throughput/device/tokenspersecond": "tps",
    "throughput/device/tps": "tps",
    "optim/stepskipped": "skipped",
}


#: record shapes remembered for the bulk path, the latest first
_LAYOUTS = 4


def _key(name: str) -> str:
    return name.strip().lower().replace(" ", "").replace("_", "")


def _canonical(key: str) -> str | None:
    k = _key(key)
    canonical = _KEYS.get(k)
    if canonical is None and k.startswith("optim/lr"):
        canonical = "lr"
    return canonical


@dataclass
class _Record:
    """The record being read line by line, and the shape of its metric lines so far."""

    step: int
    line: int
    ts: float | None
    metrics: dict[str, float] = field(default_factory=dict)
    nonfinite: list[str] = field(default_factory=list)
    #: each metric line up to its `=` (None once a line has no shape the bulk path can search)
    keys: list[str] | None = field(default_factory=list)

    def layout(self) -> Layout | None:
        """This record's shape for the bulk path, if it has one."""
        if not self.keys or not self.metrics:
            return None
        read: dict[str, int] = {}
        for j, key in enumerate(self.keys):
            canonical = _canonical(key[:-1])
            if canonical is not None:
                read.setdefault(canonical, j)
        return Layout(tuple(k.encode() for k in self.keys), tuple((j, name) for name, j in read.items()))


class OlmoParser(Parser):
    name = "olmo"
    segment_safe = True
    scan = r"\[step=|heckpoint|resume training"
    description = "OLMo / OLMo-core `[step=N/M,epoch=E]` marker + indented `key=value` metric lines"

    def __init__(self) -> None:
        self._open: _Record | None = None
        self._loading: str | None = None  # path of a `Loading checkpoint from` not yet resolved
        self._last_save: int | None = None
        self._layouts: list[Layout] = []  # the latest first
        self._bulk = BulkTrack()

    def __setstate__(self, state: dict[str, object]) -> None:
        """A parser pickled in a scan state before the bulk path existed: its open record was a
        tuple, and it knew no shapes."""
        opened = state.get("_open")
        if isinstance(opened, tuple):
            step, line, ts, metrics, nonfinite = opened
            state["_open"] = _Record(step, line, ts, metrics, nonfinite, keys=None)
        state.setdefault("_layouts", [])
        state.setdefault("_bulk", BulkTrack())
        self.__dict__.update(state)

    @property
    def collecting(self) -> bool:
        return self._open is not None

    def parse(self, text: str, line: int, ts: float | None, out: ParseOutput) -> bool:
        if self._open is not None:
            if "=" in text and self._metric_line(text):
                return True
            self.flush(out)
        if "[step=" in text:
            m = _MARKER.search(text)
            if m is None:
                return False
            step = int(m.group(1))
            self._open = _Record(step, line, ts)
            out.last_step = step
            return True
        if "heckpoint" in text or "resume training" in text:
            return self._checkpoint(text, line, ts, out)
        return False

    def _metric_line(self, text: str) -> bool:
        """Add one `key=value` line to the open record; False when the line is not one."""
        record = self._open
        assert record is not None
        if not text[:1].isspace() and _BARE_METRIC.match(text) is None:
            return False
        key, sep, value = text.strip().partition("=")
        if not sep or not key:
            return False
        if record.keys is not None:
            if text[:1].isspace() and text.isascii() and "\0" not in text:
                record.keys.append(text[: text.index("=") + 1])
            else:
                record.keys = None
        canonical = _canonical(key)
        if canonical is not None and canonical not in record.metrics:
            try:
                v = number(value)
            except ValueError:
                return True  # a metric line whose value we do not read (e.g. a duration)
            record.metrics[canonical] = v
            if is_nonfinite(v):
                record.nonfinite.append(canonical)
        return True

    def flush(self, out: ParseOutput) -> None:
        record = self._open
        if record is None:
            return
        self._open = None
        if record.metrics:  # a bare marker (no metric lines) is progress, not a record
            out.record(self.name, record.step, record.line, record.ts, record.metrics, record.nonfinite)
            self._learn(record.layout())
            self._bulk.count(self.name, out)

    def _learn(self, layout: Layout | None) -> None:
        """Remember the shape of a record read one by one; a new one is searched for at once."""
        if layout is None or layout in self._layouts[:1]:
            return
        known = layout in self._layouts
        self._layouts = [layout, *(other for other in self._layouts if other != layout)][:_LAYOUTS]
        if not known:
            self._bulk.changed()

    def can_bulk(self) -> bool:
        return self._bulk.locked and bool(self._layouts)

    def bulk_shape(self) -> object | None:
        return self._bulk.shape if self.can_bulk() else None

    def bulk_matches(self, block: Block) -> Records:
        """Records of a known shape (the bulk path; see LogStream and `olmo_rows`)."""
        if not self.can_bulk():
            return Records.empty(())
        controls = "\x1b" in block.text or "\r" in block.text
        found = find(self._layouts, block.codes, block.newlines, block.ascii, controls)
        self._bulk.handed(len(found), retry=False)
        return found

    def bulk_close(self, out: ParseOutput) -> bool:
        self.flush(out)  # a bulk record's marker is no metric line: it ends the open record
        return True

    def bulk_records(self, text: str, hits: Hits, linenos: np.ndarray, out: ParseOutput) -> None:
        assert isinstance(hits, Records)
        out.record_columns(self.name, hits.steps, linenos, hits.ts, hits.values, hits.nonfinite)
        self._bulk.count(self.name, out)

    def _checkpoint(self, text: str, line: int, ts: float | None, out: ParseOutput) -> bool:
        m = _RESUME.search(text)
        if m:
            step = int(m.group(1))
            out.event(EventKind.CHECKPOINT_LOAD, line, step, ts, iteration=step, path=self._loading)
            self._loading = None
            return True
        if "Loading checkpoint from" in text:
            m = _LOADING.search(text)
            if m is None:  # no trailing `...`: Composer's line, not ours
                return False
            self._loading = m.group(1)
            return True
        if "Checkpoint successfully loaded" in text:
            if self._loading is not None:  # OLMo: no step was printed
                out.event(EventKind.CHECKPOINT_LOAD, line, out.last_step, ts, path=self._loading)
                self._loading = None
            return True
        m = _SAVE_STEP.search(text)
        if m:
            step = int(m.group(1))
            self._last_save = step
            out.event(EventKind.CHECKPOINT_SAVE, line, step, ts, path=m.group(2))
            return True
        m = _SAVED.search(text)
        if m:
            if self._last_save is None:  # not already reported by `Saving checkpoint for step N`
                out.event(EventKind.CHECKPOINT_SAVE, line, out.last_step, ts, path=m.group(1))
            self._last_save = None
            return True
        return False

"""What a snapshot shows around an alert: the recent raw lines, records and events of one file.

Kept only with --snapshot-dir (`sinks/snapshot.py` attaches it to a `FileCheck`), and cheap even
then, because alerts are rare and chunks are large: per chunk it counts newlines and, before the
next chunk, keeps the raw bytes of the last few lines; a chunk is split into lines only when an
alert asks for lines from it. Records keep the last batches (joined only when an alert asks), events
the last few. Everything is a plain attribute, so a scan's pickled `FileCheck` carries the context
into the next scan (the current chunk is folded away first).
"""

from __future__ import annotations

from collections import deque
from itertools import chain
from typing import Any

import numpy as np
import pandas as pd

from gradwatch.config import SnapshotConfig
from gradwatch.events import Event
from gradwatch.parsers.stream import Batch

__all__ = ["Evidence"]

#: A raw line cut at `max_line_chars` ends with this.
CUT_MARK = " [...line cut]"


class Evidence:
    """Recent raw lines (with their numbers), records and events of one file."""

    def __init__(self, config: SnapshotConfig, next_line: int = 1) -> None:
        """`next_line`: the number of the next line fed (a scan resumed in the middle of a file)."""
        self.config = config
        #: complete lines seen so far (newlines fed), the current chunk included
        self.line_count = next_line - 1
        self._keep_lines = config.lines_before + config.lines_after
        self._keep_bytes = (self._keep_lines + 1) * config.max_line_chars * 4  # UTF-8: at most 4 bytes a character
        self._kept = b""  # the last lines before the current chunk
        self._chunk = b""
        self._text: bytes | None = None  # _kept + _chunk, joined when an alert first asks for lines
        self._ends: np.ndarray | None = None  # positions of the newlines in _text
        self._frames: deque[pd.DataFrame] = deque()  # the last batches before the current one ...
        self._rows = 0  # ... and their rows: no fewer than config.records when there were as many
        self._batch: pd.DataFrame | None = None
        self._events: deque[Event] = deque(maxlen=config.events)
        self._batch_events: list[Event] = []

    # ---- fed by FileCheck -----------------------------------------------------------------------
    def data(self, chunk: bytes) -> None:
        """The next raw bytes of the file, before they are parsed."""
        self._fold()
        self._chunk = chunk
        self.line_count += chunk.count(b"\n")

    def batch(self, batch: Batch) -> None:
        """The next parsed batch, before the detectors see it."""
        self._roll()
        self._batch, self._batch_events = batch.records, batch.events

    # ---- asked by the snapshot writer -----------------------------------------------------------
    def raw_lines(self, first: int, last: int) -> list[tuple[int, str]]:
        """Lines `first`..`last` (numbers from 1) that are still held, an unfinished last line included."""
        if self._text is None or self._ends is None:
            self._text = self._kept + self._chunk
            self._ends = np.flatnonzero(np.frombuffer(self._text, dtype=np.uint8) == 0x0A)
        text, ends = self._text, self._ends
        top = self.line_count - len(ends) + 1  # the number of the first line held
        out: list[tuple[int, str]] = []
        for n in range(max(first, top), min(last, self.line_count + 1) + 1):
            i = n - top
            start = 0 if i == 0 else int(ends[i - 1]) + 1
            end = int(ends[i]) if i < len(ends) else len(text)  # past the last newline: the unfinished line
            if start == end == len(text):
                break
            out.append((n, self._cut(text[start:end])))
        return out

    def records(self, line: int | None) -> pd.DataFrame | None:
        """The last `config.records` records up to `line` (None: all so far); None when there are none."""
        current = self._batch
        if current is not None and line is not None:
            current = current[current["line"] <= line]
        frames = [f for f in (*self._frames, current) if f is not None and len(f)]
        if not frames or not self.config.records:
            return None
        joined = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
        return joined.tail(self.config.records)

    def events(self, line: int | None) -> list[Event]:
        """The last `config.events` events up to `line` (None: all so far)."""
        current = (e for e in self._batch_events if line is None or e.line <= line)
        return list(deque(chain(self._events, current), maxlen=self.config.events))

    # ---- keeping it small -----------------------------------------------------------------------
    def _fold(self) -> None:
        """Keep only the raw bytes of the last lines (and the unfinished one) of what was fed."""
        chunk, self._chunk = self._chunk, b""
        self._text = self._ends = None
        if not chunk:
            return
        start = _last_lines_start(chunk, self._keep_lines)
        if start:
            kept = chunk[start:]
        else:  # the chunk holds fewer lines than are kept: some of the older ones stay
            joined = self._kept + chunk
            kept = joined[_last_lines_start(joined, self._keep_lines) :]
        self._kept = kept[-self._keep_bytes :] if len(kept) > self._keep_bytes else kept

    def _roll(self) -> None:
        """Move the current batch into the kept batches (dropping those no longer needed) and events."""
        batch, self._batch = self._batch, None
        if batch is not None and len(batch):
            self._frames.append(batch)
            self._rows += len(batch)
            while self._frames and self._rows - len(self._frames[0]) >= self.config.records:
                self._rows -= len(self._frames.popleft())
        self._events.extend(self._batch_events)
        self._batch_events = []

    def _cut(self, raw: bytes) -> str:
        limit = self.config.max_line_chars
        text = raw[: limit * 4].decode("utf-8", errors="replace")
        return text if len(text) <= limit else text[:limit] + CUT_MARK

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (a scan's state) without the current chunk: only what the next scan needs."""
        self._fold()
        self._roll()
        if len(self._frames) > 1 or self._rows > self.config.records:
            kept = pd.concat(self._frames, ignore_index=True).tail(self.config.records)
            self._frames, self._rows = deque([kept]), len(kept)
        return self.__dict__.copy()


def _last_lines_start(buf: bytes, n: int) -> int:
    """Where the last `n` complete lines of `buf`, and its unfinished end, begin; 0 when it holds fewer."""
    pos = len(buf)
    for _ in range(n + 1):
        pos = buf.rfind(b"\n", 0, pos)
        if pos < 0:
            return 0
    return pos + 1

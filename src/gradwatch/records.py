"""The record schema: one row per logged training step, canonical names whatever the trainer said.

Parsers fill a `RecordBuilder`; the pipeline hands detectors pandas DataFrames with the columns in
`COLUMNS`, then the `EXTRA_METRICS` that plugin parsers declared (none without plugins). A metric
that a line did not log is NaN. A metric that the line printed as nan/inf, or a loss that Megatron
*omitted* because it was NaN, is listed in the `nonfinite` column (comma-separated names), so that
detectors can tell "not logged" from "blew up".
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

#: Canonical metric names, in the order reports show them.
METRICS: tuple[str, ...] = (
    "loss",
    "grad_norm",
    "loss_scale",
    "lr",
    "logit_norm",
    "z_loss",
    "ppl",
    "skipped",
    "nan_count",
    "step_time_s",
    "tokens",
    "samples",
    "tflops",
    "tps",
    "mfu",
    "val_loss",
)

#: Every column of a record batch. `ts` is seconds since the epoch (NaN when the line had no time).
COLUMNS: tuple[str, ...] = ("step", *METRICS, "ts", "line", "nonfinite")

_METRIC_SET = frozenset(METRICS)

#: Metrics outside the canonical schema that a registered parser declared (`Parser.extra_metrics`),
#: e.g. a lab's own attention-logit maximum: float columns after `COLUMNS` in every batch.
EXTRA_METRICS: list[str] = []


def declare_extra_metrics(names: Iterable[str]) -> None:
    """Make `names` columns of every batch from now on (the parser registry calls this)."""
    for name in names:
        if name not in EXTRA_METRICS:
            EXTRA_METRICS.append(name)


def is_metric(name: str) -> bool:
    return name in _METRIC_SET


class RecordBuilder:
    """Collects records column by column: cheap to append to, turned into a DataFrame per batch.

    A metric column is created when a record first logs it and padded with NaN for the records
    that did not log it, so a batch costs one list append per logged value.
    """

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._chunks: list[pd.DataFrame] = []
        self._n = 0
        self._cols: dict[str, list[float]] = {}
        self._step: list[int] = []
        self._line: list[int] = []
        self._ts: list[float] = []
        self._nonfinite: list[str] = []
        self._source: list[str] = []

    def add(
        self,
        step: int | None,
        line: int,
        ts: float | None,
        metrics: dict[str, float],
        nonfinite: Iterable[str] = (),
        source: str = "",
    ) -> None:
        n = self._n
        cols = self._cols
        for name, value in metrics.items():
            col = cols.get(name)
            if col is None:
                col = cols[name] = []
            if len(col) < n:
                col.extend([math.nan] * (n - len(col)))
            col.append(value)
        self._step.append(-1 if step is None else step)
        self._line.append(line)
        self._ts.append(math.nan if ts is None else ts)
        self._nonfinite.append(",".join(nonfinite) if nonfinite else "")
        self._source.append(source)
        self._n = n + 1

    def add_columns(
        self,
        steps: np.ndarray,
        lines: np.ndarray,
        ts: np.ndarray,
        metrics: dict[str, np.ndarray],
        nonfinite: np.ndarray,
        source: str,
    ) -> None:
        """Many records at once, as columns (the parsers' bulk path)."""
        n = len(steps)
        data: dict[str, Any] = {"step": steps}
        for name in METRICS:
            col = metrics.get(name)
            data[name] = np.full(n, np.nan) if col is None else col
        data["ts"], data["line"], data["nonfinite"] = ts, lines, nonfinite
        frame = pd.DataFrame(data, columns=list(COLUMNS))
        frame["source"] = source
        if self._n:
            self._chunks.append(self._rows_frame())
        self._chunks.append(frame)

    def __len__(self) -> int:
        return self._n + sum(len(c) for c in self._chunks)

    def take(self, drop_sources: frozenset[str] = frozenset()) -> pd.DataFrame:
        """Return the collected rows as a batch, in line order, and start a new one.

        Rows written by a parser in `drop_sources` are left out (see `LogStream.take`).
        """
        if self._chunks:
            parts = [*self._chunks, self._rows_frame()] if self._n else self._chunks
            frame = pd.concat(parts, ignore_index=True)
            self._reset()
            if not frame["line"].is_monotonic_increasing:
                frame = frame.sort_values("line", kind="stable", ignore_index=True)
        else:
            frame = self._rows_frame()
            self._reset()
        if drop_sources and len(frame):
            keep = ~frame["source"].isin(drop_sources)
            if not keep.all():
                frame = frame[keep].reset_index(drop=True)
        frame = frame.drop(columns="source")
        frame["nonfinite"] = frame["nonfinite"].astype(object)  # not pandas' str dtype: one dtype always
        for name in EXTRA_METRICS:
            if name not in frame.columns:  # the bulk path writes canonical columns only
                frame[name] = np.nan
        return frame

    def _rows_frame(self) -> pd.DataFrame:
        """The row-by-row records as a frame (with their source column); empties the row buffer."""
        n = self._n
        data: dict[str, Any] = {"step": np.array(self._step, dtype=np.int64)}
        for name in (*METRICS, *EXTRA_METRICS):
            col = self._cols.get(name)
            if col is None:
                data[name] = np.full(n, np.nan)
            else:
                if len(col) < n:
                    col.extend([math.nan] * (n - len(col)))
                data[name] = np.array(col, dtype=np.float64)
        data["ts"] = np.array(self._ts, dtype=np.float64)
        data["line"] = np.array(self._line, dtype=np.int64)
        data["nonfinite"] = np.array(self._nonfinite, dtype=object)
        frame = pd.DataFrame(data, columns=[*COLUMNS, *EXTRA_METRICS])
        frame["source"] = np.array(self._source, dtype=object)
        chunks = self._chunks
        self._reset()
        self._chunks = chunks
        return frame

    @staticmethod
    def empty() -> pd.DataFrame:
        """An empty batch with the canonical columns."""
        return RecordBuilder().take()

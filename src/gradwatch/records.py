"""The record schema: one row per logged training step, canonical names whatever the trainer said.

Parsers fill a `RecordBuilder`; the pipeline hands detectors pandas DataFrames with exactly the
columns in `COLUMNS`. A metric that a line did not log is NaN. A metric that the line printed as
nan/inf, or a loss that Megatron *omitted* because it was NaN, is listed in the `nonfinite` column
(comma-separated names), so that detectors can tell "not logged" from "blew up".
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
        self._n = 0
        self._cols: dict[str, list[float]] = {}
        self._step: list[int] = []
        self._line: list[int] = []
        self._ts: list[float] = []
        self._nonfinite: list[str] = []
        self._source: list[str] = []

    def add(self, step: int | None, line: int, ts: float | None, metrics: dict[str, float],
            nonfinite: Iterable[str] = (), source: str = "") -> None:
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

    def __len__(self) -> int:
        return self._n

    def take(self, drop_sources: frozenset[str] = frozenset()) -> pd.DataFrame:
        """Return the collected rows as a batch and start a new one.

        Rows written by a parser in `drop_sources` are left out (see `LogStream.take`).
        """
        n = self._n
        data: dict[str, Any] = {"step": np.array(self._step, dtype=np.int64)}
        for name in METRICS:
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
        keep = None
        if drop_sources and n:
            keep = np.fromiter((s not in drop_sources for s in self._source), dtype=bool, count=n)
        self._reset()
        frame = pd.DataFrame(data, columns=list(COLUMNS))
        if keep is not None and not keep.all():
            frame = frame[keep].reset_index(drop=True)
        return frame

    @staticmethod
    def empty() -> pd.DataFrame:
        """An empty batch with the canonical columns."""
        return RecordBuilder().take()

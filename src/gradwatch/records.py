"""The record schema: one row per logged training step, canonical names whatever the trainer said.

Parsers fill a `RecordBuilder`; the pipeline hands detectors pandas DataFrames with exactly the
columns in `COLUMNS`. A metric that a line did not log is NaN. A metric that the line printed as
nan/inf, or a loss that Megatron *omitted* because it was NaN, is listed in the `nonfinite` column
(comma-separated names), so that detectors can tell "not logged" from "blew up".
"""

from __future__ import annotations

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
    """Collects records column by column; cheap to append to, turned into a DataFrame per batch."""

    def __init__(self) -> None:
        self._rows: list[dict[str, Any]] = []

    def add(
        self,
        step: int | None,
        line: int,
        ts: float | None,
        metrics: dict[str, float],
        nonfinite: Iterable[str] = (),
        source: str = "",
    ) -> None:
        row: dict[str, Any] = dict(metrics)
        row["source"] = source
        row["step"] = step
        row["line"] = line
        row["ts"] = ts
        row["nonfinite"] = ",".join(nonfinite)
        self._rows.append(row)

    def __len__(self) -> int:
        return len(self._rows)

    @property
    def last_step(self) -> int | None:
        for row in reversed(self._rows):
            if row["step"] is not None:
                return int(row["step"])
        return None

    def take(self, drop_sources: frozenset[str] = frozenset()) -> pd.DataFrame:
        """Return the collected rows as a batch and start a new one.

        Rows written by a parser in `drop_sources` are left out (see `LogStream.take`).
        """
        rows, self._rows = self._rows, []
        if drop_sources:
            rows = [r for r in rows if r["source"] not in drop_sources]
        return to_frame(rows)

    def take_none(self) -> pd.DataFrame:
        """An empty batch; the collected rows stay for a later `take`."""
        return to_frame([])


def empty_frame() -> pd.DataFrame:
    return to_frame([])


def to_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Build a batch with the canonical columns and dtypes from row dicts."""
    n = len(rows)
    data: dict[str, Any] = {}
    step = np.full(n, -1, dtype=np.int64)
    for i, row in enumerate(rows):
        s = row.get("step")
        if s is not None:
            step[i] = s
    data["step"] = step
    for name in (*METRICS, "ts"):
        col = np.full(n, np.nan)
        for i, row in enumerate(rows):
            v = row.get(name)
            if v is not None:
                col[i] = v
        data[name] = col
    data["line"] = np.fromiter((row["line"] for row in rows), dtype=np.int64, count=n)
    data["nonfinite"] = pd.Series([row["nonfinite"] for row in rows], dtype=object)
    return pd.DataFrame(data, columns=list(COLUMNS))

"""What `gradwatch export` writes of one batch: its records, and the fp16 scaler's lines as rows.

A trainer that prints its own records (Megatron-DeepSpeed, the HF Trainer under DeepSpeed) tells
of overflows, loss-scale increases and DeepSpeed's `step=N, skipped=K` counters in lines the
detectors read as events (`EventKind.OVERFLOW`, `SCALE_INCREASE`, `SkipCounts`), not as records.
An export of the records alone would lose them, so each is a row at its own line: `loss_scale`
(the scale it left), `overflow` 1 (the fp16 scaler skipped that step), `skipped_total` (DeepSpeed's
count of the steps skipped so far). Where the line is a record already (a log of nothing but
DeepSpeed's lines, whose overflows are its records), that record's row gets the cells.

A cell is "not logged" (`RecordTable.missing`) where its value is NaN and the record does not
list the metric in `nonfinite` (a nan the log printed, or the loss Megatron leaves out of a NaN
step, is a value: nan), and where there is no step or no scaler line.
"""

from __future__ import annotations

import numpy as np

from gradwatch import records
from gradwatch.events import EventKind
from gradwatch.parsers.stream import BatchFacts
from gradwatch.sinks.records_file import RecordTable

__all__ = ["ExportRows"]

#: the events that tell a loss scale, and whether each is an overflow
_SCALE_EVENTS = {EventKind.OVERFLOW: True, EventKind.SCALE_INCREASE: False}


class ExportRows:
    """A file's batches as rows to write, one batch after the other. DeepSpeed prints its skip
    counter at every step: it goes into the record of its line, and is a row of its own only
    where the count changed (the first, and after each skip), not a second row per step."""

    def __init__(self) -> None:
        self._skipped: int | None = None  # the count of the latest counter, in the batches before

    def table(self, facts: BatchFacts, data: dict[str, np.ndarray] | None) -> tuple[RecordTable, int]:
        """The batch's rows in line order (records and scaler lines), and how many are records."""
        built = records.columns_of(data or {}).arrays
        n_records = len(built["line"])
        columns = {name: built[name] for name in records.COLUMNS}
        # the scaler's columns after the canonical ones, the metrics plugins declare still last
        columns["overflow"] = np.zeros(n_records, dtype=np.int64)
        columns["skipped_total"] = np.full(n_records, -1, dtype=np.int64)
        columns |= {name: built[name] for name in records.EXTRA_METRICS}
        scaler = self._scaler_rows(facts)
        if len(scaler["line"]):
            columns = _merged(columns, scaler)
        missing = {name: np.isnan(col) for name, col in columns.items() if col.dtype.kind == "f"}
        for row in np.flatnonzero(columns["nonfinite"] != "").tolist():
            for name in columns["nonfinite"][row].split(","):
                if name in missing:
                    missing[name][row] = False  # printed as nan: a value
        missing["step"] = columns["step"] < 0
        missing["overflow"] = columns["overflow"] == 0
        missing["skipped_total"] = columns["skipped_total"] < 0
        return RecordTable(columns, missing), n_records

    def _scaler_rows(self, facts: BatchFacts) -> dict[str, np.ndarray]:
        """The scaler's lines of a batch as columns: line, step (-1: none), ts, loss_scale,
        overflow (1 or 0), skipped_total (-1: none), and `alone` (a row even off a record's line)."""
        events = [e for e in facts.events if e.kind in _SCALE_EVENTS and isinstance(e.data.get("new"), float)]
        counts = facts.skip_counts
        n = len(counts)
        before = np.concatenate([[-1 if self._skipped is None else self._skipped], counts.skipped[:-1]])
        if n:
            self._skipped = int(counts.skipped[-1])
        return {
            "line": np.concatenate([np.array([e.line for e in events], dtype=np.int64), counts.line]),
            "step": np.concatenate([np.array([_or(e.step, -1) for e in events], dtype=np.int64), counts.step]),
            "ts": np.concatenate([np.array([_or(e.ts, np.nan) for e in events], dtype=np.float64), np.full(n, np.nan)]),
            "loss_scale": np.concatenate(
                [np.array([e.data["new"] for e in events], dtype=np.float64), np.full(n, np.nan)]
            ),
            "overflow": np.concatenate(
                [np.array([_SCALE_EVENTS[e.kind] for e in events], dtype=np.int64), np.zeros(n, dtype=np.int64)]
            ),
            "skipped_total": np.concatenate([np.full(len(events), -1, dtype=np.int64), counts.skipped]),
            "alone": np.concatenate([np.ones(len(events), dtype=bool), counts.skipped != before]),
        }


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


def _merged(columns: dict[str, np.ndarray], scaler: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The records with the scaler's lines: on a record's own line, in its cells (a loss scale
    it logged is kept); elsewhere, rows of their own where `alone`; all in line order."""
    columns = {name: col.copy() for name, col in columns.items()}
    lines = columns["line"]
    own = np.zeros(len(scaler["line"]), dtype=bool)
    if len(lines):
        order = np.argsort(lines, kind="stable")
        at = order[np.searchsorted(lines, scaler["line"], sorter=order).clip(max=len(lines) - 1)]
        own = lines[at] == scaler["line"]
        rows = at[own]
        scale = columns["loss_scale"]
        scale[rows] = np.where(np.isnan(scale[rows]), scaler["loss_scale"][own], scale[rows])
        columns["overflow"][rows] = scaler["overflow"][own]
        columns["skipped_total"][rows] = scaler["skipped_total"][own]
    new = ~own & scaler["alone"]
    if not new.any():
        return columns
    k = int(new.sum())
    added = {name: col[new] for name, col in scaler.items()}
    for name, col in columns.items():
        if name not in added:
            added[name] = np.full(k, "", dtype=object) if col.dtype == object else np.full(k, np.nan)
    joined = {name: np.concatenate([col, added[name].astype(col.dtype, copy=False)]) for name, col in columns.items()}
    by_line = np.argsort(joined["line"], kind="stable")
    return {name: col[by_line] for name, col in joined.items()}

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
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
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
    that did not log it, so a batch costs one list append per logged value. Bulk chunks stay numpy
    columns; chunks are joined, ordered and filtered as numpy arrays and the DataFrame is built
    once, in `take`: a live tail takes a batch of one record many times a second, and every pandas
    step on a frame costs more than the record itself.
    """

    #: records added since the builder was made (never reset): a cheap "did a record come?"
    #: (a class default, so that builders pickled in older scan states have it)
    added = 0

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._chunks: list[_Chunk] = []
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
        self.added += 1

    def add_columns(
        self,
        steps: np.ndarray,
        lines: np.ndarray,
        ts: np.ndarray,
        metrics: dict[str, np.ndarray],
        nonfinite: np.ndarray,
        source: str,
    ) -> None:
        """Many records at once, as columns (the parsers' bulk path); canonical metrics only."""
        data = {"step": steps, **{name: metrics[name] for name in METRICS if name in metrics}}
        data["ts"], data["line"], data["nonfinite"] = ts, lines, nonfinite
        if self._n:
            self._chunks.append(self._rows_chunk())
        self._chunks.append(_Chunk(data, len(steps), source))
        self.added += len(steps)

    def __len__(self) -> int:
        return self._n + sum(c.rows for c in self._chunks)

    def take(self, drop_sources: frozenset[str] = frozenset()) -> pd.DataFrame:
        """Return the collected rows as a batch, in line order, and start a new one.

        Rows written by a parser in `drop_sources` are left out (see `LogStream.take`).
        """
        data = self.take_columns(drop_sources)
        return _empty().frame if data is None else columns_of(data).frame

    def take_columns(self, drop_sources: frozenset[str] = frozenset()) -> dict[str, np.ndarray] | None:
        """`take`'s rows as numpy columns, no frame built (None: no rows)."""
        bulk = bool(self._chunks)  # row-by-row records come in line order; chunks may interleave
        chunks = [*self._chunks, self._rows_chunk()] if self._n else self._chunks
        self._reset()
        kept = [c.without(drop_sources) for c in chunks]
        data = _joined([c for c in kept if c.rows])
        if data is not None and bulk and (np.diff(data["line"]) < 0).any():
            order = np.argsort(data["line"], kind="stable")
            data = {name: col[order] for name, col in data.items()}
        return data

    def _rows_chunk(self) -> _Chunk:
        """The row-by-row records as a chunk; empties the row buffer."""
        n = self._n
        data: dict[str, np.ndarray] = {"step": np.array(self._step, dtype=np.int64)}
        for name, col in self._cols.items():
            if len(col) < n:
                col.extend([math.nan] * (n - len(col)))
            data[name] = np.array(col, dtype=np.float64)
        data["ts"] = np.array(self._ts, dtype=np.float64)
        data["line"] = np.array(self._line, dtype=np.int64)
        data["nonfinite"] = np.array(self._nonfinite, dtype=object)
        chunk = _Chunk(data, n, self._source)
        chunks = self._chunks
        self._reset()
        self._chunks = chunks
        return chunk

    @staticmethod
    def empty() -> pd.DataFrame:
        """An empty batch with the canonical columns (and the declared extra metrics)."""
        return _empty().frame


@dataclass
class _Chunk:
    """Records as numpy columns (a bulk chunk, or the row-by-row records), with their parser(s)."""

    columns: dict[str, np.ndarray]
    rows: int
    #: the parser that wrote each row, or one name for the whole chunk
    sources: list[str] | str

    def without(self, drop: frozenset[str]) -> _Chunk:
        """The rows not written by a parser in `drop`."""
        if not drop:
            return self
        if isinstance(self.sources, str):
            return _Chunk({}, 0, "") if self.sources in drop else self
        keep = np.array([s not in drop for s in self.sources], dtype=bool)
        if keep.all():
            return self
        return _Chunk({name: col[keep] for name, col in self.columns.items()}, int(keep.sum()), "")


def _joined(chunks: list[_Chunk]) -> dict[str, np.ndarray] | None:
    """The chunks' rows as one set of columns (NaN where a chunk lacks a metric); None if no rows."""
    if not chunks:
        return None
    if len(chunks) == 1:
        return chunks[0].columns
    data: dict[str, np.ndarray] = {}
    for name in (*COLUMNS, *EXTRA_METRICS):
        parts = [c.columns.get(name) for c in chunks]
        if all(p is None for p in parts):
            continue
        filled = [np.full(c.rows, np.nan) if p is None else p for c, p in zip(chunks, parts, strict=True)]
        data[name] = np.concatenate(filled)
    return data


def logged_columns(data: dict[str, np.ndarray] | None) -> dict[str, np.ndarray]:
    """A batch's columns (`RecordBuilder.take_columns`) as its frame would hold them, less the
    metrics it has no value of: what `columns_of` needs to build the batch's frame (a worker's
    batch travels to the main process so, at half the size or less: a format logs a few of the
    metrics, and no frame is built for it in the worker)."""
    data = data or {}
    logged: dict[str, np.ndarray] = {}
    for name in (*COLUMNS, *EXTRA_METRICS):
        col = _as_built(name, data.get(name))
        if col is not None and (name in _KEYS or not np.isnan(col).all()):
            logged[name] = col
    return logged


#: the columns every batch has, whatever it logged, and their types (`ts` is as a metric: a
#: batch without times is NaN there, as where it has none)
_KEYS = {"step": np.int64, "line": np.int64, "nonfinite": object}


def _as_built(name: str, col: np.ndarray | None) -> np.ndarray | None:
    """A column as the batch frame holds it: the `_KEYS` columns of their types (empty where
    missing: no rows); a metric as it is (None: not logged)."""
    kind = _KEYS.get(name)
    if kind is None:
        return col
    return np.zeros(0, dtype=kind) if col is None else col.astype(kind, copy=False)


def columns_of(data: dict[str, np.ndarray]) -> Columns:
    """The batch of these columns (`logged_columns`; a metric not among them is NaN) as numpy
    arrays, its DataFrame built when a reader first asks for it (`Columns.frame`)."""
    n = len(data["line"]) if "line" in data else 0
    not_logged = np.full(n, np.nan)  # one for every metric missing: pandas copies it into its block
    arrays: dict[str, np.ndarray] = {}
    for name in (*COLUMNS, *EXTRA_METRICS):
        col = _as_built(name, data.get(name))
        arrays[name] = not_logged if col is None else col
    return Columns(None, arrays)


def _frame(arrays: dict[str, np.ndarray]) -> pd.DataFrame:
    """The batch's DataFrame (`COLUMNS`, then `EXTRA_METRICS`) of all its columns.

    `nonfinite` goes in as an object Series: pandas >= 3 would make the plain array its `str`
    dtype, and one dtype always is what readers of the column expect.
    """
    import pandas as pd  # here, not at the top: a check whose readers all take columns needs no frame

    return pd.DataFrame({**arrays, "nonfinite": pd.Series(arrays["nonfinite"], dtype=object, copy=False)})


def _empty() -> Columns:
    """An empty batch: a frame of its own (the caller may add columns), copied from a template."""
    names = (*COLUMNS, *EXTRA_METRICS)
    template = _EMPTY.get(names)
    if template is None:
        template = _EMPTY[names] = columns_of({})
    return Columns(template.frame.copy(deep=False), template.arrays)


#: Empty batches by their column names: building a frame costs more than copying one.
_EMPTY: dict[tuple[str, ...], Columns] = {}


class Columns:
    """The columns of one record batch as numpy arrays, and its DataFrame.

    A live tail's batch holds a record or two, and a dozen detectors read the same few columns of
    it: pandas' column access costs more than their arithmetic, so the arrays are shared. They
    are read-only views, so that no reader changes what the next one sees. Either the frame is
    given, and each column is taken out of it once, when first read; or (`frame` None) `arrays`
    holds every column, and the frame is built when first asked for: the built-in detectors
    read columns only, and a `check` builds no frame and does not import pandas.
    """

    #: `flagged`'s answer, once asked
    _flagged: np.ndarray | None = None

    def __init__(self, frame: pd.DataFrame | None, arrays: dict[str, np.ndarray] | None = None) -> None:
        self._frame = frame
        self.arrays: dict[str, np.ndarray] = {}
        for name, col in (arrays or {}).items():
            self._keep(name, col)

    @property
    def frame(self) -> pd.DataFrame:
        if self._frame is None:
            self._frame = _frame(self.arrays)
        return self._frame

    def __getitem__(self, name: str) -> np.ndarray:
        col = self.arrays.get(name)
        if col is None:
            if self._frame is None:
                raise KeyError(name)
            col = self._keep(name, self._frame[name].to_numpy())
        return col

    def _keep(self, name: str, col: np.ndarray) -> np.ndarray:
        view = col.view()
        view.flags.writeable = False
        self.arrays[name] = view
        return view

    def __contains__(self, name: str) -> bool:
        return name in self.arrays if self._frame is None else name in self._frame.columns

    def __len__(self) -> int:
        return len(self.arrays["line"]) if self._frame is None else len(self._frame)

    def flagged(self) -> np.ndarray:
        """Per record, whether it logged a non-finite value (`nonfinite` not empty): worked out
        once a batch, as several detectors ask (a comparison of Python strings, 20 ns a record)."""
        if self._flagged is None:
            self._flagged = np.asarray(self["nonfinite"] != "")
            self._flagged.flags.writeable = False
        return self._flagged

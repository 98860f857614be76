"""Records as a file (`gradwatch export`): CSV, JSON lines or Parquet, written batch by batch, so
that memory does not grow with the log.

Every float is written exactly: as Python's `repr`, the shortest text that reads back as the same
double (`9.774074342405685e-06`, `1e-12`), never rounded to a number of digits. A cell tells a
value the log printed as nan or inf from one it did not log: CSV writes `nan`, `inf`, `-inf`
against an empty cell; JSON lines the strings `"nan"`, `"inf"`, `"-inf"` (JSON has no such
numbers; gradwatch's own `jsonl` reader takes them back) against `null`; Parquet NaN and
infinities against null.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

import numpy as np

from gradwatch.parsers._arrow import arrow, strings

__all__ = ["SUFFIXES", "RecordTable", "RecordsFile", "open_records_file"]

#: the output types, by the `--out` file's suffix
SUFFIXES = (".csv", ".jsonl", ".parquet")
#: rows a Parquet row group holds at least (but the last): the stream's batches are often small
_ROW_GROUP = 65_536


@dataclass
class RecordTable:
    """Rows to write: columns in their order (float, int64, or `str` objects) and, per column that
    may lack a value, where it does (not logged: an empty cell, null)."""

    columns: dict[str, np.ndarray]
    missing: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(next(iter(self.columns.values()))) if self.columns else 0


class RecordsFile:
    """An output file that tables are appended to; created at the first write, so that a log
    without records leaves no file (nor an older one overwritten)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rows = 0

    def write(self, table: RecordTable) -> None:
        if len(table):
            self._write(table)
            self.rows += len(table)

    def _write(self, table: RecordTable) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Write what is held back (the last Parquet row group) and close the file."""

    def __enter__(self) -> RecordsFile:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


class _TextFile(RecordsFile):
    """CSV or JSON lines: each table's cells as text, appended to the file at once."""

    _fh: TextIO | None = None

    def _open(self) -> TextIO:
        if self._fh is None:
            self._fh = open(self.path, "w", encoding="utf-8", newline="")  # noqa: SIM115 - closed in close()
        return self._fh

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()


class _CsvFile(_TextFile):
    def _write(self, table: RecordTable) -> None:
        fh = self._open()
        writer = csv.writer(fh, lineterminator="\n")
        if self.rows == 0:
            writer.writerow(table.columns)
        cells = [_cells(col, table.missing.get(name), as_json=False) for name, col in table.columns.items()]
        writer.writerows(zip(*cells, strict=True))


class _JsonLinesFile(_TextFile):
    _template = ""

    def _write(self, table: RecordTable) -> None:
        fh = self._open()
        if not self._template:
            # one `%s` per value, the keys escaped once (a plugin's metric may be named anything)
            self._template = "{" + ",".join(f"{json.dumps(name)}:%s" for name in table.columns) + "}\n"
        cells = [_cells(col, table.missing.get(name), as_json=True) for name, col in table.columns.items()]
        template = self._template
        fh.writelines(template % row for row in zip(*cells, strict=True))


class _ParquetFile(RecordsFile):
    """Parquet through pyarrow, a row group per `_ROW_GROUP` rows: the schema is the first table's."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self._writer: Any = None
        self._held: list[Any] = []
        self._held_rows = 0

    def _write(self, table: RecordTable) -> None:
        pa, _ = arrow()
        arrays = {name: _arrow_column(pa, col, table.missing.get(name)) for name, col in table.columns.items()}
        self._held.append(pa.table(arrays))
        self._held_rows += len(table)
        if self._held_rows >= _ROW_GROUP:
            self._flush()

    def _flush(self) -> None:
        if not self._held:
            return
        pa, _ = arrow()
        import pyarrow.parquet as pq

        joined = pa.concat_tables(self._held)
        self._held, self._held_rows = [], 0
        if self._writer is None:
            self._writer = pq.ParquetWriter(self.path, joined.schema)
        self._writer.write_table(joined)

    def close(self) -> None:
        try:
            self._flush()
        finally:
            if self._writer is not None:
                self._writer.close()
                self._writer = None


def open_records_file(path: Path) -> RecordsFile:
    """The writer for `path`'s suffix (one of `SUFFIXES`)."""
    kinds: dict[str, type[RecordsFile]] = {".csv": _CsvFile, ".jsonl": _JsonLinesFile, ".parquet": _ParquetFile}
    return kinds[path.suffix.lower()](path)


def _cells(col: np.ndarray, missing: np.ndarray | None, as_json: bool) -> Iterable[str]:
    """One column's cells as text: floats as their `repr`, integers in decimal, strings as they
    are; where the column has no value, an empty cell (JSON: null). JSON quotes strings and the
    non-finite floats (`"nan"`), CSV writes those as Python does (`nan`, `inf`, `-inf`)."""
    if missing is not None and missing.all():
        return repeat("null" if as_json else "", len(col))
    if col.dtype == object:
        if not as_json:
            return col.tolist()  # type: ignore[no-any-return]
        quoted: dict[str, str] = {}
        return [quoted.get(s) or quoted.setdefault(s, json.dumps(s)) for s in col.tolist()]
    text = float.__repr__ if col.dtype.kind == "f" else int.__repr__
    quote = as_json and col.dtype.kind == "f" and not np.isfinite(col).all()
    if (missing is None or not missing.any()) and not quote:
        return list(map(text, col.tolist()))  # (most columns: every row logs it, or none)
    shown = np.ones(len(col), dtype=bool) if missing is None else ~missing
    cells = np.full(len(col), "null" if as_json else "", dtype=object)
    cells[shown] = list(map(text, col[shown].tolist()))
    if quote:
        quoted_at = shown & ~np.isfinite(col)
        cells[quoted_at] = [f'"{cell}"' for cell in cells[quoted_at].tolist()]
    return cells.tolist()  # type: ignore[no-any-return]


def _arrow_column(pa: Any, col: np.ndarray, missing: np.ndarray | None) -> Any:
    """A column as an Arrow array, null where it has no value (NaN and infinities stay values);
    built over its buffers, as `_arrow`'s helpers do: `pa.array` would import pandas for nothing."""
    if col.dtype == object:
        return strings(col.tolist())
    kind = pa.float64() if col.dtype.kind == "f" else pa.int64()
    values = pa.py_buffer(np.ascontiguousarray(col, dtype=np.float64 if col.dtype.kind == "f" else np.int64))
    if missing is None or not missing.any():
        return pa.Array.from_buffers(kind, len(col), [None, values], null_count=0)
    valid = pa.py_buffer(np.packbits(~missing, bitorder="little"))
    return pa.Array.from_buffers(kind, len(col), [valid, values], null_count=int(missing.sum()))

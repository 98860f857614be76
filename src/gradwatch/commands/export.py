"""`gradwatch export`: the parsed records of one log, as CSV, JSON lines or Parquet; or what the
run was told at each start (its `config` events), as JSON lines."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from gradwatch.config import Settings
from gradwatch.errors import InputError, UsageError
from gradwatch.events import Event, EventKind
from gradwatch.export_rows import ExportRows
from gradwatch.parsers.stream import BatchFacts, LogStream
from gradwatch.pipeline import new_stream, no_format_message
from gradwatch.sinks.records_file import SUFFIXES, RecordTable, open_records_file
from gradwatch.sources.stdin import read_log


def run_export(path: str, out_path: str, settings: Settings, fmt: str | None, configs: bool = False) -> tuple[int, str]:
    """Write the records of `path` to `out_path` (`configs`: its config events instead); return
    how many rows, and how they were read (the format, with its layout where the parser says one).
    A named pipe is read as a stream, to its end."""
    if path == "-" or Path(path).is_dir():
        what = "standard input" if path == "-" else f"{path}, a directory"
        raise UsageError(f"export reads one log file, not {what}")
    suffix = Path(out_path).suffix.lower()
    if suffix not in SUFFIXES:
        raise UsageError(f"--out {out_path}: unknown type {suffix or '(none)'}; use {', '.join(SUFFIXES)}")
    if configs and suffix != ".jsonl":
        raise UsageError(f"--out {out_path}: --configs writes JSON lines; use a .jsonl file")
    stream = new_stream(settings, fmt, path)
    reading = _Reading(stream, Path(path))
    if configs:
        found = [e for facts, _ in reading for e in facts.events if e.kind is EventKind.CONFIG]
        return _write_configs(found, out_path, reading.cut_short), stream.format_text
    rows = _write_records(reading, Path(out_path))
    if rows == 0:
        raise reading.cut_short or InputError(no_format_message(Path(path), stream.lines, fmt))
    if reading.cut_short is not None:
        raise InputError(f"{reading.cut_short} (wrote its {rows:,} record{'s' if rows != 1 else ''} to {out_path})")
    return rows, stream.format_text


class _Reading:
    """A file's batches as the stream yields them, chunk by chunk, then the rest at its end. A
    damaged gzip ends the chunks early: the error is kept in `cut_short`, and what came before it
    is still written."""

    def __init__(self, stream: LogStream, path: Path) -> None:
        self.stream = stream
        self.path = path
        self.cut_short: InputError | None = None

    def __iter__(self) -> Iterator[tuple[BatchFacts, dict[str, np.ndarray] | None]]:
        try:
            for chunk in read_log(self.path):
                self.stream.feed(chunk)
                yield self.stream.take_columns()
        except InputError as e:
            self.cut_short = e
        self.stream.close()
        yield self.stream.take_columns()


def _write_records(reading: _Reading, out_path: Path) -> int:
    """Write each batch's rows as it comes (`ExportRows`); return how many. Rows of the
    scaler's lines that come before any record are held until one comes: a file without records
    is no export (it is an error, and no file is written)."""
    held: list[RecordTable] = []
    batch_rows = ExportRows()
    try:
        with open_records_file(out_path) as out:
            for facts, data in reading:
                table, n_records = batch_rows.table(facts, data)
                if out.rows == 0 and n_records == 0:
                    held.append(table)
                    continue
                for earlier in held:
                    out.write(earlier)
                held = []
                out.write(table)
            return out.rows
    except OSError as e:
        raise UsageError(f"cannot write {out_path}: {e.strerror or e}") from None


def _write_configs(events: list[Event], out_path: str, cut_short: InputError | None) -> int:
    """One JSON line per config event: where it is, which block, its canonical and raw keys. A log
    without a configuration block gives an empty file (unless it could not be read at all)."""
    if not events and cut_short is not None:
        raise cut_short
    lines = (
        json.dumps({"line": e.line, "step": e.step, "ts": e.ts, **_ordered(e.data)}, allow_nan=False) + "\n"
        for e in events
    )
    try:
        with open(out_path, "w", encoding="utf-8") as fh:
            fh.writelines(lines)
    except OSError as e:
        raise UsageError(f"cannot write {out_path}: {e.strerror or e}") from None
    if cut_short is not None:
        n = len(events)
        raise InputError(f"{cut_short} (wrote its {n:,} config{'s' if n != 1 else ''} to {out_path})")
    return len(events)


def _ordered(data: dict[str, object]) -> dict[str, object]:
    """The event's data with the block's name first and its raw keys last (as a reader scans it)."""
    return {"source": data.get("source"), "config": data.get("config"), "raw": data.get("raw")}

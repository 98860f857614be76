"""`gradwatch export`: the parsed records of one log, as CSV, JSON lines or Parquet; or what the
run was told at each start (its `config` events), as JSON lines."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from gradwatch.config import Settings
from gradwatch.errors import InputError, UsageError
from gradwatch.events import Event, EventKind
from gradwatch.pipeline import new_stream, no_format_message
from gradwatch.sources.archive import read_chunks

SUFFIXES = (".csv", ".jsonl", ".parquet")


def run_export(path: str, out_path: str, settings: Settings, fmt: str | None, configs: bool = False) -> tuple[int, str]:
    """Write the records of `path` to `out_path` (`configs`: its config events instead); return
    how many, and how they were read (the format, with its layout where the parser says one)."""
    if path == "-" or Path(path).is_dir():
        what = "standard input" if path == "-" else f"{path}, a directory"
        raise UsageError(f"export reads one log file, not {what}")
    suffix = Path(out_path).suffix.lower()
    if suffix not in SUFFIXES:
        raise UsageError(f"--out {out_path}: unknown type {suffix or '(none)'}; use {', '.join(SUFFIXES)}")
    if configs and suffix != ".jsonl":
        raise UsageError(f"--out {out_path}: --configs writes JSON lines; use a .jsonl file")
    stream = new_stream(settings, fmt, path)
    frames: list[pd.DataFrame] = []
    events: list[Event] = []
    cut_short: InputError | None = None  # a damaged gzip: what came before it is still written
    try:
        for chunk in read_chunks(Path(path)):
            stream.feed(chunk)
            taken = stream.take()
            frames.append(taken.records)
            events += taken.events
    except InputError as e:
        cut_short = e
    stream.close()
    taken = stream.take()
    frames.append(taken.records)
    if configs:
        found = [e for e in [*events, *taken.events] if e.kind is EventKind.CONFIG]
        return _write_configs(found, out_path, cut_short), stream.format_text
    records = pd.concat(frames, ignore_index=True)
    if records.empty:
        raise cut_short or InputError(no_format_message(Path(path), stream.lines, fmt))
    records["step"] = records["step"].astype("Int64").mask(records["step"] < 0)
    try:
        if suffix == ".csv":
            records.to_csv(out_path, index=False)
        elif suffix == ".jsonl":
            records.to_json(out_path, orient="records", lines=True)
        else:
            records.to_parquet(out_path, index=False)
    except OSError as e:
        raise UsageError(f"cannot write {out_path}: {e.strerror or e}") from None
    if cut_short is not None:
        n = len(records)
        raise InputError(f"{cut_short} (wrote its {n:,} record{'s' if n != 1 else ''} to {out_path})")
    return len(records), stream.format_text


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

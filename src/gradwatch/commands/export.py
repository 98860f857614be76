"""`gradwatch export`: the parsed records of one log, as CSV, JSON lines or Parquet."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from gradwatch.config import Settings
from gradwatch.errors import InputError, UsageError
from gradwatch.pipeline import new_stream, no_format_message
from gradwatch.sources.archive import read_chunks

SUFFIXES = (".csv", ".jsonl", ".parquet")


def run_export(path: str, out_path: str, settings: Settings, fmt: str | None) -> tuple[int, str]:
    """Write the records of `path` to `out_path`; return how many, and how they were read (the
    format, with its layout where the parser says one)."""
    if path == "-" or Path(path).is_dir():
        what = "standard input" if path == "-" else f"{path}, a directory"
        raise UsageError(f"export reads one log file, not {what}")
    suffix = Path(out_path).suffix.lower()
    if suffix not in SUFFIXES:
        raise UsageError(f"--out {out_path}: unknown type {suffix or '(none)'}; use {', '.join(SUFFIXES)}")
    stream = new_stream(settings, fmt, path)
    frames: list[pd.DataFrame] = []
    cut_short: InputError | None = None  # a damaged gzip: what came before it is still written
    try:
        for chunk in read_chunks(Path(path)):
            stream.feed(chunk)
            frames.append(stream.take().records)
    except InputError as e:
        cut_short = e
    stream.close()
    frames.append(stream.take().records)
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

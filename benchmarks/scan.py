"""Benchmark: `gradwatch scan` on a large growing log vs a full `check` of it, one command.

    .venv/bin/python benchmarks/scan.py [--size-mb 200] [--append-kb 1024]

Generates a Megatron-DeepSpeed run of about SIZE MB plus APPEND KB more of the same run (once,
into benchmarks/data/, git-ignored), then times on the SIZE MB part: a full check, a first scan
(reads everything and saves the state), a scan with nothing new; then appends the rest and times
the scan that reads only the append. Scans run in-process (`run_scan`, state lock and state file
included); the last line adds a whole `gradwatch scan` process, interpreter start-up included.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from gradwatch import config
from gradwatch.commands.scan import ScanOptions, run_scan
from gradwatch.pipeline import check_path
from gradwatch.synth import RunSpec, write_sized

DATA = Path(__file__).resolve().parent / "data"
T = TypeVar("T")


def timed(what: str, fn: Callable[[], T]) -> T:
    start = time.perf_counter()
    result = fn()
    print(f"{what:<44} {time.perf_counter() - start:8.3f} s")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=200)
    parser.add_argument("--append-kb", type=int, default=1024)
    args = parser.parse_args()
    source = DATA / f"megatron-ds-scan-{args.size_mb}mb-{args.append_kb}kb.log"
    if not source.exists():
        DATA.mkdir(exist_ok=True)
        timed(
            f"generate {source.name}",
            lambda: write_sized(source, RunSpec(), args.size_mb * 1_000_000 + args.append_kb * 1000),
        )
    data = source.read_bytes()
    cut = data.rindex(b"\n", 0, args.size_mb * 1_000_000) + 1
    settings = config.load()
    with tempfile.TemporaryDirectory() as tmp:
        log, state = Path(tmp) / "run.log", Path(tmp) / "state.json"
        log.write_bytes(data[:cut])
        options = ScanOptions(state=state)

        def scan() -> None:
            run_scan([str(log)], settings, options, warn=print)

        print(f"log {cut / 1e6:.0f} MB, then {(len(data) - cut) / 1e3:.0f} KB appended")
        timed("check (whole file)", lambda: check_path(log, settings))
        timed("scan, first (whole file, state saved)", scan)
        timed("scan, nothing new", scan)
        with open(log, "ab") as fh:
            fh.write(data[cut:])
        timed(f"scan after a {(len(data) - cut) / 1e3:.0f} KB append", scan)
        print(f"state file {state.stat().st_size / 1e3:.0f} KB")
        cmd = [sys.executable, "-m", "gradwatch", "scan", str(log), "--state", str(state)]
        timed("`gradwatch scan` process, nothing new", lambda: subprocess.run(cmd, capture_output=True, check=False))


if __name__ == "__main__":
    main()

"""Benchmark: a log whose step goes back at every record, against `cat` of the same file.

    .venv/bin/python benchmarks/restarts.py [--records 50000] [--every 1] [--chunks 2000] [--repeat 1]

The bad-input fuzzer's slowest rounds (issue 27) were logs that restart their steps tens of
thousands of times (a job replaying from a checkpoint again and again): here one resume every
`--every` records, 50,000 records in 3.4 MB (`tests.test_bad_input_corpus.restarting_log`, also a
case of that corpus). Times `cat` and `gradwatch check` on the same warm file (child processes,
best of `--repeat`), then feeds the file to one file's parsers and detectors in this process in
`--chunks` pieces, as the fuzzer and `tail` feed it, and prints the CPU time of the detectors
that took the most. Every detector that starts over at a resume does some work per resume, so
the times should grow linearly with `--records`: double it to check.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.throughput import GRADWATCH, best  # noqa: E402
from gradwatch import config  # noqa: E402
from gradwatch.alerts import Alert  # noqa: E402
from gradwatch.parsers.stream import Batch  # noqa: E402
from gradwatch.pipeline import FileCheck  # noqa: E402
from tests.test_bad_input_corpus import restarting_log  # noqa: E402


def fed_in_chunks(path: Path, chunks: int) -> tuple[float, dict[str, float]]:
    """CPU seconds to feed `path` to a FileCheck in `chunks` pieces, and each detector's share."""
    data = path.read_bytes()
    check = FileCheck(str(path), config.load())
    spent: dict[str, float] = collections.defaultdict(float)
    for det in check.detectors:

        def timed(batch: Batch, update: Callable[[Batch], list[Alert]] = det.update, name: str = det.id) -> list[Alert]:
            start = time.process_time()
            try:
                return update(batch)
            finally:
                spent[name] += time.process_time() - start

        det.update = timed  # type: ignore[method-assign]
    size = len(data) // chunks + 1
    start = time.process_time()
    for pos in range(0, len(data), size):
        check.feed(data[pos : pos + size])
    check.close()
    return time.process_time() - start, spent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=50_000)
    ap.add_argument("--every", type=int, default=1, help="records between two resumes")
    ap.add_argument("--chunks", type=int, default=2000, help="pieces the in-process feed is cut into")
    ap.add_argument("--repeat", type=int, default=1, help="runs of cat and check; the best is shown")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as work:
        log = Path(work) / "restarts.log"
        log.write_text(restarting_log(args.records, args.every))
        mb = log.stat().st_size / 1e6
        print(f"{args.records:,} records, a resume every {args.every}, {mb:.1f} MB")
        cat, _, _ = best(["cat", str(log)], args.repeat)
        check, peak, code = best([*GRADWATCH, "check", "--output", "json", str(log)], args.repeat)
        print(f"{'cat':<28} {cat:>8.2f} s")
        print(f"{'gradwatch check':<28} {check:>8.2f} s   peak RSS {peak:,.0f} MB, exit {code}")
        cpu, spent = fed_in_chunks(log, args.chunks)
        print(f"{f'fed in {args.chunks:,} chunks':<28} {cpu:>8.2f} s CPU, of which:")
        for name, seconds in sorted(spent.items(), key=lambda kv: -kv[1])[:4]:
            print(f"  {name:<26} {seconds:>8.2f} s")


if __name__ == "__main__":
    main()

"""Lines lost and doubled through many rotations, by `gradwatch tail` (inotify and polling) or `scan`.

    python benchmarks/rotation_stress.py [--seconds 20] [--rate 2000] [--kinds rename,create,...]
    python benchmarks/rotation_stress.py --scan [--seconds 15]

The long run of tests/test_rotation_stress.py and tests/test_scan_rotation_stress.py (see
tests/rotation_harness.py for how each kind of rotation is done and how lines are counted): a
writer process appends Megatron iteration lines at `--rate` lines/s for `--seconds` while the log
is rotated every ~1.2 s. A `gradwatch tail` subprocess follows it, or with `--scan`, a `gradwatch
scan --state` runs after each rotation as cron would, once on the log's path and once on a glob
that matches the rotated files too (`log*`). Prints, per kind and reader, the rotations done, the
lines written, those still on disk at the end, those read, and how many of them were lost, read
twice or never written.

Target (issue 27): 0 lost and 0 doubled for every kind and reader; for copytruncate, the lines
written between logrotate's copy and its truncate are not on disk and not counted.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.rotation_harness import HEADER, KINDS, SCAN_KINDS, Result, scan_stress, stress  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="how long the writer writes, per run")
    ap.add_argument("--rate", type=float, default=2000.0, help="lines per second")
    ap.add_argument("--scan", action="store_true", help="read with `gradwatch scan` (as cron would), not `tail`")
    ap.add_argument("--kinds", help="comma-separated, of: " + ", ".join(SCAN_KINDS) + " (default: all)")
    args = ap.parse_args()
    kinds = args.kinds.split(",") if args.kinds else SCAN_KINDS if args.scan else KINDS
    runs: list[Callable[[Path, str], Result]]
    if args.scan:
        runs = [
            lambda work, kind, pattern=pattern: scan_stress(
                work, kind, rate=args.rate, seconds=args.seconds, pattern=pattern
            )
            for pattern in ("", "*")
        ]
    else:
        runs = [
            lambda work, kind, poll=poll: stress(work, kind, poll, rate=args.rate, seconds=args.seconds, every=0.3)
            for poll in (False, True)
        ]
    print(HEADER)
    failed = False
    for kind in kinds:
        for run in runs:
            with tempfile.TemporaryDirectory() as work:
                result = run(Path(work), kind)
            print(result.row(), flush=True)
            failed |= bool(result.lost or result.doubled or result.extra)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

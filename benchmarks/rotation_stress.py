"""Lines lost and doubled by `gradwatch tail` through many rotations, with inotify and with polling.

    python benchmarks/rotation_stress.py [--seconds 20] [--rate 2000] [--kinds rename,create,...]

The long run of tests/test_rotation_stress.py (see tests/rotation_harness.py for how each kind of
rotation is done and how lines are counted): a writer process appends Megatron iteration lines
at `--rate` lines/s for `--seconds` while the log is rotated every ~1.2 s, and a `gradwatch tail`
subprocess follows it. Prints, per kind and way of following, the rotations done, the lines
written, those still on disk at the end, those read, and how many of them were lost, read twice
or never written.

Target (issue 27): 0 lost and 0 doubled for every kind, inotify and polling; for copytruncate,
the lines written between logrotate's copy and its truncate are not on disk and not counted.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.rotation_harness import HEADER, KINDS, stress  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="how long the writer writes, per run")
    ap.add_argument("--rate", type=float, default=2000.0, help="lines per second")
    ap.add_argument("--kinds", default=",".join(KINDS), help="comma-separated, of: " + ", ".join(KINDS))
    args = ap.parse_args()
    print(HEADER)
    failed = False
    for kind in args.kinds.split(","):
        for poll in (False, True):
            with tempfile.TemporaryDirectory() as work:
                result = stress(Path(work), kind, poll, rate=args.rate, seconds=args.seconds, every=0.3)
            print(result.row(), flush=True)
            failed |= bool(result.lost or result.doubled or result.extra)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

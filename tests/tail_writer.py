"""A trainer stand-in for the tail tests: appends Megatron-DeepSpeed lines to a log as a job would.

Run as a script (a real writer process beside a real `gradwatch tail`):

    python tests/tail_writer.py LOG --first 1000 --count 300 --rate 200 --spike 1250 --rotate-every 100

Each line is flushed on its own. `--spike STEP` multiplies that step's grad norm by 50; with
`--rotate-every N` the log is renamed to LOG.1, LOG.2, ... after every N lines and a new LOG is
started, the way logrotate's `create` mode does it.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Collection

#: Steps start high so that spikes are past the detectors' start-up allowance (100 steps).
FIRST_STEP = 1000


def megatron_line(step: int, spike: bool = False, total: int = 100_000, text: str = "") -> str:
    """One `iteration N/TOTAL | ...` record (formats.md section 1); a spike is grad norm x50."""
    grad_norm = (1.0 + 0.01 * (step % 7)) * (50 if spike else 1)
    return (
        f" iteration {step:8d}/{total:8d} | consumed samples: {step * 2048:12d} | "
        f"elapsed time per iteration (ms): 1000.0 | learning rate: 1.000E-04 | global batch size:  2048 | "
        f"lm loss: {5.0 - step * 1e-5:.6E} | loss scale: 65536.0 | grad norm: {grad_norm:.3f} | num zeros: 0.0 | "
        f"number of skipped iterations:   0 | number of nan iterations:   0 |{text}\n"
    )


def write_lines(path: str, first: int, count: int, spikes: Collection[int] = (), total: int = 100_000) -> None:
    """Append `count` records at once (for history written before tail starts)."""
    with open(path, "a", encoding="utf-8") as fh:
        fh.writelines(megatron_line(s, s in spikes, total) for s in range(first, first + count))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("--first", type=int, default=FIRST_STEP)
    ap.add_argument("--count", type=int, required=True)
    ap.add_argument("--rate", type=float, default=100.0, help="lines per second")
    ap.add_argument("--spike", type=int, action="append", default=[])
    ap.add_argument("--rotate-every", type=int, default=0)
    args = ap.parse_args()
    fh = open(args.log, "a", encoding="utf-8")  # noqa: SIM115 - reopened at each rotation
    rotations = 0
    start = time.monotonic()
    for i in range(args.count):
        if args.rotate_every and i and i % args.rotate_every == 0:
            fh.close()
            rotations += 1
            os.rename(args.log, f"{args.log}.{rotations}")
            fh = open(args.log, "a", encoding="utf-8")  # noqa: SIM115
        step = args.first + i
        fh.write(megatron_line(step, step in args.spike))
        fh.flush()
        time.sleep(max(0.0, start + (i + 1) / args.rate - time.monotonic()))
    fh.close()


if __name__ == "__main__":
    main()

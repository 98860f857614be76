"""Stress: SIGKILL `gradwatch scan` at random points of its webhook delivery, then lose its state.

    .venv/bin/python benchmarks/notify_kill.py [--kills 50] [--incidents 100] [--seed 27]

A log with INCIDENTS isolated grad-norm spikes (two notes each: opened, ended) is scanned by real
`gradwatch scan --webhook` processes against a local receiver that pauses 0.1 s before each
answer; each scan is killed once the receiver has read a random 1-3 of its POSTs, plus a random
part of a pause (tests/scan_killer.py), KILLS times; then a clean scan delivers what is owed.
Then the state file is damaged, replaced by another format version and deleted in turn, each
followed by a scan that reads every log again from its start. Prints, against the target of
issue 27 (0 lost; at most one duplicate per kill: "max per kill" counts the POSTs a killed scan
got to the receiver that its journal does not list; 0 duplicates after a lost state):

    kills  notes  received  lost  duplicates  max per kill  seconds
    after a damaged state: N sent again ...
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.scan_killer import kill_during_delivery, run_scan, write_incidents  # noqa: E402
from tests.webhook_server import Receiver  # noqa: E402

DAMAGES = {"a damaged state": b"\x00garbage{", "another format version": b'{"version": 999}', "a deleted state": None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=50)
    parser.add_argument("--incidents", type=int, default=100)
    parser.add_argument("--seed", type=int, default=27)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        log = work / "run.log"
        write_incidents(log, args.incidents)
        result = kill_during_delivery(log, work, args.kills, random.Random(args.seed))
        per_kill = max(result.unjournaled, default=0)
        heads = ("kills", "notes", "received", "lost", "duplicates", "max per kill", "seconds")
        print(" ".join(f"{h:>{w}}" for h, w in zip(heads, (5, 6, 9, 5, 11, 13, 8), strict=True)))
        print(
            f"{result.kills:>5} {len(result.expected):>6} {sum(result.received.values()):>9} {result.lost:>5} "
            f"{result.duplicates:>11} {per_kill:>13} {result.seconds:>8.1f}"
        )
        ok = result.lost == 0 and per_kill <= 1 and result.duplicates <= result.kills and result.kills == args.kills
        state = work / "state.json"
        for what, damage in DAMAGES.items():
            receiver = Receiver()
            try:
                if damage is None:
                    state.unlink()
                else:
                    state.write_bytes(damage)
                run_scan(log, state, receiver.url)
                again = len(receiver.posts)
            finally:
                receiver.close()
            print(f"after {what}: {again} notes sent again (target 0)")
            ok = ok and again == 0
        print("target met" if ok else "TARGET MISSED")
        sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

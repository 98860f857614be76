"""SIGKILL `gradwatch scan` at random points of its notification delivery, and count what arrived.

Used by tests/test_notify_kill.py (a few kills) and benchmarks/notify_kill.py (50 and more). A log
with `incidents` grad-norm spikes far apart gives two notes per incident (opened, ended); each
killed scan is a real `gradwatch scan --webhook` process, killed once the receiver (which pauses
before each answer) has taken a random 1-3 of its POSTs, plus a random part of a pause: so kills
land while a POST waits for its answer, between two POSTs, and while the journal is written.
Then one clean scan delivers what is owed. A receiver's count is what a real one would see:
every POST it read in full, by idempotency key.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import gradwatch_cmd
from tests.tail_writer import FIRST_STEP, megatron_line
from tests.webhook_server import Receiver

#: Steps between two spikes: each spike is an incident that opens and ends before the next.
SPIKE_EVERY = 150


def write_incidents(path: Path, incidents: int) -> None:
    """A Megatron log with `incidents` isolated grad-norm spikes."""
    spikes = {FIRST_STEP + 200 + SPIKE_EVERY * i for i in range(incidents)}
    with open(path, "w") as fh:
        for step in range(FIRST_STEP, FIRST_STEP + 200 + SPIKE_EVERY * incidents + 100):
            fh.write(megatron_line(step, step in spikes))


def scan_cmd(log: Path, state: Path, url: str) -> list[str]:
    return [*gradwatch_cmd(), "scan", str(log), "--state", str(state), "--webhook", url, "--output", "json"]


def run_scan(log: Path, state: Path, url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(scan_cmd(log, state, url), capture_output=True, text=True, timeout=300)


@dataclass
class KillResult:
    kills: int  #: scans killed while delivering
    expected: set[str]  #: idempotency keys a clean scan of the log sends
    received: Counter[str]  #: idempotency keys the receiver read, with how often
    #: per kill: the POSTs the killed scan got to the receiver that its journal does not list
    #: (what the next scan sends again)
    unjournaled: list[int]
    seconds: float

    @property
    def lost(self) -> int:
        return len(self.expected - set(self.received))

    @property
    def duplicates(self) -> int:
        return sum(n - 1 for n in self.received.values())


def expected_keys(log: Path, work: Path) -> set[str]:
    """The idempotency keys of a clean scan of `log` (its own state, its own receiver)."""
    reference = Receiver()
    try:
        p = run_scan(log, work / "reference.json", reference.url)
        assert p.returncode in (0, 1) and "Traceback" not in p.stderr, p.stderr
        keys = reference.received_keys()
    finally:
        reference.close()
    assert len(keys) == len(set(keys)) and None not in keys
    return {k for k in keys if k is not None}


def kill_during_delivery(log: Path, work: Path, kills: int, rng: random.Random, pause_s: float = 0.1) -> KillResult:
    """`kills` scans of `log` killed mid-delivery, then a clean one; what the receiver got."""
    started = time.monotonic()
    expected = expected_keys(log, work)
    state = work / "state.json"
    receiver = Receiver(delay_s=pause_s)
    killed, unjournaled = 0, []
    try:
        while killed < kills:
            before = len(receiver.posts)
            wanted = before + rng.randint(1, 3)
            victim = subprocess.Popen(
                scan_cmd(log, state, receiver.url), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
            )
            while len(receiver.posts) < wanted and victim.poll() is None:
                time.sleep(0.005)
            time.sleep(rng.uniform(0, pause_s * 1.5))
            if victim.poll() is None:
                victim.send_signal(signal.SIGKILL)
                killed += 1
            _, err = victim.communicate()
            assert b"Traceback" not in err, err.decode()
            journaled = journal_keys(state)
            killed_posts = [p.key for p in receiver.posts[before:]]
            unjournaled.append(sum(k not in journaled for k in killed_posts))
            if len(receiver.posts) == before:
                break  # nothing was owed any more: the log has too few incidents for more kills
        receiver.delay_s = 0.0
        final = run_scan(log, state, receiver.url)
        assert final.returncode in (0, 1) and "Traceback" not in final.stderr, final.stderr
        received = Counter(k for k in receiver.received_keys() if k is not None)
    finally:
        receiver.close()
    return KillResult(killed, expected, received, unjournaled, time.monotonic() - started)


def journal_keys(state: Path) -> set[str]:
    """The idempotency keys of the notes the journal beside `state` lists as delivered."""
    journal = state.with_name(state.name + ".journal")
    if not journal.exists():
        return set()
    return {json.loads(line)["idempotency_key"] for line in journal.read_text().splitlines()}

"""Notifications survive crashes: SIGKILL `gradwatch scan` mid-delivery, lose the state file.

Real `gradwatch scan --webhook` processes against a real HTTP receiver (tests/webhook_server.py),
killed at random points of the delivery (tests/scan_killer.py); benchmarks/notify_kill.py runs
the same with 50 kills and more. What a receiver counts is every POST it read, by idempotency key.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from tests.scan_killer import expected_keys, kill_during_delivery, run_scan, write_incidents
from tests.webhook_server import Receiver


def test_random_sigkills_during_delivery_lose_nothing_and_repeat_at_most_one_note_per_kill(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    write_incidents(log, 20)
    result = kill_during_delivery(log, tmp_path, kills=10, rng=random.Random(27))
    assert result.kills == 10
    assert len(result.expected) == 40  # each incident opened and ended
    assert result.lost == 0, sorted(result.expected - set(result.received))
    assert set(result.received) == result.expected
    assert result.duplicates <= result.kills, result.received.most_common(5)
    assert max(result.unjournaled) <= 1, result.unjournaled  # each kill: at most the POST in flight


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(b"\x00garbage{", id="damaged"),
        pytest.param(b'{"version": 999}', id="another-format"),
        pytest.param(None, id="deleted"),
    ],
)
def test_a_lost_state_sends_nothing_again_and_what_was_owed_exactly_once(tmp_path: Path, damage: bytes | None) -> None:
    """A first scan delivers half of the notes (the receiver fails the rest: they stay owed);
    then the state is damaged, of another format or deleted: every log is read again from its
    start and every incident update comes up again, but the journal says what was delivered."""
    log, state, whole = tmp_path / "run.log", tmp_path / "state.json", tmp_path / "whole.log"
    write_incidents(whole, 8)
    log.write_bytes(whole.read_bytes())
    expected = expected_keys(log, tmp_path)  # (incident ids name the log's path)
    write_incidents(log, 4)  # the first half of `whole`
    receiver = Receiver()
    try:
        first = json.loads(run_scan(log, state, receiver.url).stdout)["notifications"]
        assert first["sent"] > 0 and first["owed"] == 0
        log.write_bytes(whole.read_bytes())  # the run went on: 4 more incidents
        receiver.mode = "500"
        second = json.loads(run_scan(log, state, receiver.url).stdout)["notifications"]
        assert second["sent"] == 0 and second["owed"] > 0
        if damage is None:
            state.unlink()
        else:
            state.write_bytes(damage)
        receiver.mode, failed = "ok", len(receiver.posts)
        third = run_scan(log, state, receiver.url)
        assert "read again from its start" in third.stderr or damage is None, third.stderr
        assert json.loads(third.stdout)["notifications"]["owed"] == 0
        fourth = json.loads(run_scan(log, state, receiver.url).stdout)["notifications"]
        assert fourth == {"sent": 0, "errors": [], "owed": 0}
        delivered = receiver.received_keys()[: first["sent"]] + [p.key for p in receiver.posts[failed:]]
    finally:
        receiver.close()
    assert len(delivered) == len(set(delivered))  # nothing twice
    assert set(delivered) == expected  # nothing lost

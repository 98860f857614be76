"""`gradwatch scan --webhook` against a real HTTP receiver that fails the ways real ones do.

Each case: a real `gradwatch scan` process delivers the notes of a log with two incidents (four
notes: opened and ended each) to tests/webhook_server.py in one failure mode; what the receiver
got and what scan says is sent and owed are checked; then the receiver heals and a second scan
must deliver every owed note exactly once. The deadline is `--notify-timeout 3`, so a receiver
that drips its answer one byte every 5 s, or answers after 6 s, costs a scan 3 s, not forever.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import gradwatch_cmd, run_cli
from tests.scan_killer import expected_keys, write_incidents
from tests.webhook_server import Receiver

DEADLINE = "3"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, set[str]]:
    """The log, and the idempotency keys of its four notes (by a clean scan of it)."""
    work = tmp_path_factory.mktemp("hook")
    path = work / "run.log"
    write_incidents(path, 2)
    keys = expected_keys(path, work)
    assert len(keys) == 4
    return path, keys


def scan(log: Path, state: Path, url: str, *more: str) -> tuple[int, dict[str, Any], str, float]:
    """(exit code, notifications, stderr, seconds) of one `gradwatch scan`."""
    started = time.monotonic()
    p = run_cli(
        "scan",
        str(log),
        "--state",
        str(state),
        "--webhook",
        url,
        "--notify-timeout",
        DEADLINE,
        *more,
        "--output",
        "json",
    )
    assert "Traceback" not in p.stderr, p.stderr
    return p.returncode, json.loads(p.stdout)["notifications"], p.stderr, time.monotonic() - started


def heal_and_rescan(log: Path, state: Path, receiver: Receiver, keys: set[str], owed: int) -> None:
    """The receiver works again: the next scan delivers the `owed` notes, each once; over all
    scans the receiver has every note."""
    receiver.mode, before = "ok", len(receiver.posts)
    _, second, _, _ = scan(log, state, receiver.url)
    assert second == {"sent": owed, "errors": [], "owed": 0}
    again = receiver.received_keys()[before:]
    assert len(again) == len(set(again)) == owed
    assert set(receiver.received_keys()) == keys
    for post in receiver.posts:
        assert post.body is None or post.body["idempotency_key"] == post.key


@pytest.mark.parametrize("status", ["301", "302", "303"])
def test_a_redirect_is_not_followed_for_a_post_and_the_notes_stay_owed(
    tmp_path: Path, log: tuple[Path, set[str]], receiver: Receiver, status: str
) -> None:
    """urllib turned these into an empty GET and called it sent: now a failure naming Location."""
    path, keys = log
    receiver.mode = status
    code, first, err, _ = scan(path, tmp_path / "state.json", receiver.url)
    assert code == 1 and first["sent"] == 0 and first["owed"] == 4
    assert f"HTTP {status} redirect to /moved, not followed for a POST" in err
    assert "4 notifications kept for the next scan" in err
    assert [(p.method, p.path) for p in receiver.posts] == [("POST", "/hook")]  # no GET, no more tries
    heal_and_rescan(path, tmp_path / "state.json", receiver, keys, 4)


@pytest.mark.parametrize("status", ["307", "308"])
def test_a_307_or_308_is_posted_again_with_its_body(
    tmp_path: Path, log: tuple[Path, set[str]], receiver: Receiver, status: str
) -> None:
    path, keys = log
    receiver.mode = status
    _, first, err, _ = scan(path, tmp_path / "state.json", receiver.url)
    assert first == {"sent": 4, "errors": [], "owed": 0}, err
    moved = [p for p in receiver.posts if p.path == "/moved"]
    assert {p.key for p in moved} == keys and len(moved) == 4
    assert all(p.method == "POST" and p.body["alerts"][0]["incident"] for p in moved)


@pytest.mark.parametrize("mode", ["drip", "slow"])
def test_a_server_that_drips_or_answers_late_costs_one_deadline_and_the_lock_is_free_after_it(
    tmp_path: Path, log: tuple[Path, set[str]], receiver: Receiver, mode: str
) -> None:
    """drip: one byte of the answer every 5 s (socket timeouts never fire); slow: the whole
    answer after 6 s. Both beyond the 3 s deadline: the scan gives up on the first note, does not
    try the others, keeps all four; a second scan waiting for the lock meanwhile gets it."""
    path, keys = log
    state = tmp_path / "state.json"
    receiver.mode, receiver.drip_s, receiver.slow_s = mode, 5.0, 6.0
    first = subprocess.Popen(
        [*gradwatch_cmd(), "scan", str(path), "--state", str(state), "--webhook", receiver.url]
        + ["--notify-timeout", DEADLINE, "--output", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    while not receiver.posts and first.poll() is None:
        time.sleep(0.01)
    started = time.monotonic()
    waiting = run_cli("scan", str(path), "--state", str(state), "--lock-wait", "60", "--output", "json")
    assert waiting.returncode != 3, waiting.stderr  # not "another scan held the state file"
    out, err = first.communicate(timeout=60)
    assert time.monotonic() - started < 30  # a drip of the ~40 bytes of an answer takes 200 s
    assert json.loads(out)["notifications"]["owed"] == 4
    assert f"no answer within the {DEADLINE} s deadline" in err and "4 notifications kept" in err
    assert receiver.received_keys() == [receiver.received_keys()[0]]  # the others were not tried
    heal_and_rescan(path, state, receiver, keys, 4)  # the first note reaches the receiver again,
    assert receiver.received_keys().count(receiver.received_keys()[0]) == 2  # with the same key to drop it by


@pytest.mark.parametrize("mode", ["500", "reset"])
def test_a_failing_or_resetting_server_is_retried_then_the_notes_stay_owed(
    tmp_path: Path, log: tuple[Path, set[str]], receiver: Receiver, mode: str
) -> None:
    path, keys = log
    receiver.mode = mode
    _, first, err, _ = scan(path, tmp_path / "state.json", receiver.url)
    assert first["sent"] == 0 and first["owed"] == 4
    assert ("HTTP 500 Internal Server Error" if mode == "500" else "Connection reset") in err
    assert "(3 attempts)" in err and "/hook" not in err  # the URL's path may be a secret
    assert len(set(receiver.received_keys())) == 1 and len(receiver.received_keys()) == 3
    heal_and_rescan(path, tmp_path / "state.json", receiver, keys, 4)


def test_retry_after_is_honoured_within_the_deadline(
    tmp_path: Path, log: tuple[Path, set[str]], receiver: Receiver
) -> None:
    path, keys = log
    receiver.mode, receiver.retry_after_s, receiver.times = "retry-after", "2", 1
    _, first, err, _ = scan(path, tmp_path / "state.json", receiver.url)
    assert first == {"sent": 4, "errors": [], "owed": 0}, err
    refused, retried = receiver.posts[:2]
    assert refused.key == retried.key and retried.at - refused.at >= 2  # not the 0.5 s backoff
    assert set(receiver.received_keys()) == keys


def test_retry_after_beyond_the_deadline_leaves_the_notes_owed(
    tmp_path: Path, log: tuple[Path, set[str]], receiver: Receiver
) -> None:
    path, keys = log
    receiver.mode, receiver.retry_after_s = "retry-after", "120"
    _, first, err, _ = scan(path, tmp_path / "state.json", receiver.url)
    assert first["sent"] == 0 and first["owed"] == 4
    assert f"HTTP 429 Too Many Requests, Retry-After 120: beyond what is left of the {DEADLINE} s deadline" in err
    assert len(receiver.posts) == 1
    heal_and_rescan(path, tmp_path / "state.json", receiver, keys, 4)


def test_an_unparsable_webhook_url_or_deadline_is_a_usage_error(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    write_incidents(log, 1)
    for option, value, message in [
        ("--webhook", "http://[::1", "--webhook must be an http:// or https:// URL with a host"),
        ("--notify-timeout", "nan", "'nan' is not a number of seconds"),
        ("--notify-timeout", "0", "0.1<=x<=3600"),
    ]:
        p = run_cli("scan", str(log), "--state", str(tmp_path / "s.json"), option, value)
        assert p.returncode == 2 and message in p.stderr and "Traceback" not in p.stderr, p.stderr

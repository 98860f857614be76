"""`gradwatch scan` end to end: real files, real subprocesses, a real HTTP server and real locks.

The log is a synthetic Megatron-DeepSpeed run (gradwatch.synth) with a grad-norm spike at step
250 and a loss spike at step 600. It "grows" by being written in two parts, cut mid-line, so each
scan sees a partial last line. The oracle is `check` over the whole file (same pipeline, one pass).
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest

from gradwatch import config, synth
from gradwatch.alerts import Severity
from gradwatch.commands.check import run_check
from gradwatch.errors import UsageError
from gradwatch.incidents import Correlator
from gradwatch.pipeline import FileCheck, check_path
from gradwatch.sinks.webhook import post_json
from gradwatch.sources import checkpoint
from tests.conftest import gradwatch_cmd, run_cli

SPEC = synth.RunSpec(
    fmt="megatron-deepspeed",
    steps=800,
    seed=3,
    anomalies=(synth.Anomaly("grad_norm_spike", 250), synth.Anomaly("loss_spike", 600)),
)
#: A --notify-cmd that appends what it was given (stdin JSON and two env vars) to a file.
RECORDER = (
    "import json, os, sys; a = json.load(sys.stdin); "
    "a['env'] = [os.environ['GRADWATCH_DETECTOR'], os.environ['GRADWATCH_STEP']]; "
    "open(sys.argv[1], 'a').write(json.dumps(a) + '\\n')"
)
PROM_LINE = re.compile(
    r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*",?)*)\})? '
    r"(?P<value>[-+]?(?:\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|NaN|Inf))$"
)
PROM_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


# ---- fixtures and helpers -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def full_log(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = tmp_path_factory.mktemp("log") / "full.log"
    synth.write_log(path, SPEC)
    return path.read_bytes()


def cut_of(data: bytes) -> int:
    """Between the two spikes, in the middle of a line."""
    cut = len(data) * 45 // 100
    assert data[cut - 1 : cut] != b"\n"
    return cut


def scan(*args: str, state: Path) -> tuple[int, dict[str, Any], str]:
    """`gradwatch scan --output json`: (exit code, parsed JSON, stderr); never a traceback."""
    p = run_cli("scan", *args, "--state", str(state), "--output", "json")
    assert "Traceback" not in p.stderr, p.stderr
    return p.returncode, json.loads(p.stdout) if p.stdout else {}, p.stderr


def expected_alerts(path: Path) -> list[tuple[Any, ...]]:
    _, alerts = check_path(path, config.load())
    return sorted((a.detector, str(a.severity), a.step, a.line, a.message) for a in alerts)


def keys(alerts: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return sorted((a["detector"], a["severity"], a["step"], a["line"], a["message"]) for a in alerts)


def expected_notes(path: Path) -> list[tuple[str, str]]:
    """(event, incident) of what --fail-on warning notifies, by check's incidents over the whole file:
    each opens and ends once (and escalates once per severity it then reaches)."""
    report = run_check([str(path)], config.load(), None, Severity.WARNING)
    notes = []
    for inc in report.incidents:
        levels = [a.severity for a in inc.alerts if a.severity >= Severity.WARNING]
        notes.append(("opened", inc.id))
        notes += [("escalated", inc.id) for i, level in enumerate(levels) if i and level > max(levels[:i])]
        notes += [("ended", inc.id)] if inc.ended else []
    return sorted(notes)


def told(notes: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return sorted((n["event"], n["incident"]) for n in notes)


def recorded(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def grow(path: Path, data: bytes) -> None:
    with open(path, "ab") as fh:
        fh.write(data)


# ---- incremental reading --------------------------------------------------------------------------
def test_scans_of_a_growing_file_read_only_new_bytes_and_notify_each_incident_once(
    tmp_path: Path, full_log: bytes
) -> None:
    """Offsets advance by exactly what was appended; the union of alerts is check's over the file;
    each incident at or above --fail-on reaches --notify-cmd when it opens and when it ends, once
    each, with its alert's JSON, the headline and GRADWATCH_*."""
    log, state, sent, cut = tmp_path / "run.log", tmp_path / "state.json", tmp_path / "sent.jsonl", cut_of(full_log)
    notify = ("--notify-cmd", f"{sys.executable} -c {json.dumps(RECORDER)} {sent}")
    log.write_bytes(full_log[:cut])
    code1, first, _ = scan(str(log), *notify, state=state)
    notified_first = len(recorded(sent))
    grow(log, full_log[cut:])
    code2, second, _ = scan(str(log), *notify, state=state)
    code3, third, _ = scan(str(log), *notify, state=state)

    assert [(f["new_bytes"], f["offset"], f["restarted"]) for f in first["files"]] == [(cut, cut, "new")]
    assert [(f["new_bytes"], f["offset"], f["restarted"]) for f in second["files"]] == [
        (len(full_log) - cut, len(full_log), None)
    ]
    assert [(f["new_bytes"], f["offset"]) for f in third["files"]] == [(0, len(full_log))]
    expected = expected_alerts(log)
    assert first["alerts"] and second["alerts"], "the cut must leave alerts on both sides"
    assert sorted(keys(first["alerts"]) + keys(second["alerts"])) == expected
    assert (code1, code2, code3) == (1, 1, 0)
    assert third["alerts"] == []
    assert second["files"][0]["last_step"] == 800 and second["files"][0]["records"] == 800
    assert state.stat().st_mode & 0o777 == 0o600

    got = recorded(sent)
    assert 0 < notified_first < len(got)
    assert told(got) == expected_notes(log) and len(expected_notes(log)) == 4  # two incidents
    assert all(a["env"] == [a["detector"], str(a["step"])] and a["path"] == str(log) and a["headline"] for a in got)


def test_rotated_truncated_and_cut_short_files(tmp_path: Path, full_log: bytes) -> None:
    log, state, cut = tmp_path / "run.log", tmp_path / "state.json", cut_of(full_log)
    log.write_bytes(full_log[:cut])
    scan(str(log), state=state)

    log.rename(tmp_path / "run.log.1")  # rotation by rename: a new, longer file at the same path
    log.write_bytes(full_log)
    _, rotated, _ = scan(str(log), state=state)
    assert [(f["restarted"], f["new_bytes"], f["records"]) for f in rotated["files"]] == [
        ("rotated", len(full_log), 800)
    ]

    back = full_log.index(b"\n", len(full_log) * 9 // 10) + 1
    os.truncate(log, back)  # cut short in place (back to a checkpoint's line): nothing new to read
    _, cut_short, _ = scan(str(log), state=state)
    assert [(f["restarted"], f["new_bytes"], f["offset"]) for f in cut_short["files"]] == [("cut short", 0, back)]

    later = full_log[cut_of(full_log) :]
    later = later[later.index(b"\n") + 1 : later.index(b"\n", len(later) // 2) + 1]  # other lines, whole
    with open(log, "r+b") as fh:  # copytruncate: same inode, emptied, the writer's next lines in it
        fh.truncate(0)
        fh.write(later)
    _, truncated, _ = scan(str(log), state=state)
    assert [(f["restarted"], f["new_bytes"], f["offset"]) for f in truncated["files"]] == [
        ("truncated", len(later), len(later))
    ]

    other = b"X" + full_log  # same inode, longer than what was read, other first bytes
    with open(log, "r+b") as fh:
        fh.write(other)
    _, rewritten, _ = scan(str(log), state=state)
    assert [(f["restarted"], f["new_bytes"]) for f in rewritten["files"]] == [("truncated", len(other))]


# ---- notify once --------------------------------------------------------------------------------------
def test_a_failed_notification_is_retried_by_the_next_scan_then_never_again(tmp_path: Path, full_log: bytes) -> None:
    log, state, sent = tmp_path / "run.log", tmp_path / "state.json", tmp_path / "sent.jsonl"
    log.write_bytes(full_log)
    failing = f"{sys.executable} -c 'import sys; sys.stderr.write(\"pager down\\n\"); sys.exit(3)'"
    working = f"{sys.executable} -c {json.dumps(RECORDER)} {sent}"

    code, first, err = scan(str(log), "--notify-cmd", failing, state=state)
    n = len(expected_notes(log))
    assert code == 1 and first["notifications"]["owed"] == n and first["notifications"]["sent"] == 0
    assert "notification failed" in err and "pager down" in err

    _, second, _ = scan(str(log), "--notify-cmd", working, state=state)
    assert second["alerts"] == [] and second["notifications"] == {"sent": n, "errors": [], "owed": 0}
    _, third, _ = scan(str(log), "--notify-cmd", working, state=state)
    assert third["notifications"]["sent"] == 0
    assert told(recorded(sent)) == expected_notes(log)


# ---- webhook against a real HTTP server -----------------------------------------------------------
class _Hook:
    """A webhook receiver on 127.0.0.1 that answers with the given statuses in turn, then 200."""

    def __init__(self, statuses: list[int]) -> None:
        self.statuses, self.bodies = list(statuses), []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server API
                body = self.rfile.read(int(self.headers["Content-Length"]))
                hook.bodies.append((self.headers["Content-Type"], json.loads(body)))
                self.send_response(hook.statuses.pop(0) if hook.statuses else 200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def hook_factory() -> Iterator[Any]:
    hooks: list[_Hook] = []

    def make(statuses: list[int]) -> _Hook:
        hooks.append(_Hook(statuses))
        return hooks[-1]

    yield make
    for h in hooks:
        h.server.shutdown()
        h.server.server_close()


def test_webhook_generic_and_slack_payloads(tmp_path: Path, full_log: bytes, hook_factory: Any) -> None:
    log = tmp_path / "run.log"
    log.write_bytes(full_log)
    generic = hook_factory([])
    scan(str(log), "--webhook", generic.url, state=tmp_path / "a.json")
    assert len(generic.bodies) == len(expected_notes(log))  # one POST per note, with its idempotency key
    for ctype, body in generic.bodies:
        assert ctype == "application/json" and body["source"] == "gradwatch" and len(body["alerts"]) == 1
        assert body["idempotency_key"].startswith("gradwatch-")
    notes = [body["alerts"][0] for _, body in generic.bodies]
    assert told(notes) == expected_notes(log)

    slack = hook_factory([])
    scan(str(log), "--webhook", slack.url, "--webhook-format", "slack", state=tmp_path / "b.json")
    assert len(slack.bodies) == len(notes) and all(set(message) == {"text"} for _, message in slack.bodies)
    texts = [message["text"] for _, message in slack.bodies]
    for n in notes:  # log text in inline code spans, where Slack formats and links nothing
        line = f"incident {n['event']} `{n['detector']}` `{log}` step {n['step']}: `{n['headline']}`"
        assert any(text.endswith(line) for text in texts), line


def test_webhook_retries_with_backoff_and_keeps_what_failed_for_the_next_scan(
    tmp_path: Path, full_log: bytes, hook_factory: Any
) -> None:
    log, state = tmp_path / "run.log", tmp_path / "state.json"
    log.write_bytes(full_log)
    n = len(expected_notes(log))

    flaky = hook_factory([500])  # one failure, then fine: the retry inside the scan delivers
    _, ok, _ = scan(str(log), "--webhook", flaky.url, state=tmp_path / "flaky.json")
    assert len(flaky.bodies) == n + 1 and flaky.bodies[0] == flaky.bodies[1]
    assert ok["notifications"] == {"sent": n, "errors": [], "owed": 0}

    down = hook_factory([500, 503, 500])  # every attempt for the first note fails: the others are not tried
    started = time.monotonic()
    _, first, err = scan(str(log), "--webhook", down.url, state=state)
    assert time.monotonic() - started > 1.5  # backoff 0.5 s + 1 s between the three attempts
    assert len(down.bodies) == 3 and first["notifications"]["owed"] == n
    assert "HTTP 500" in err and "3 attempts" in err and "/hook" not in err  # the URL path may be a secret
    _, second, _ = scan(str(log), "--webhook", down.url, state=state)
    _, third, _ = scan(str(log), "--webhook", down.url, state=state)
    assert len(down.bodies) == 3 + n
    assert second["notifications"] == {"sent": n, "errors": [], "owed": 0} and third["notifications"]["sent"] == 0
    assert told([body["alerts"][0] for _, body in down.bodies[3:]]) == expected_notes(log)


def test_a_webhook_that_refuses_the_request_is_not_retried(hook_factory: Any) -> None:
    """A 4xx other than 429 will not heal within a scan: one attempt, and the reason."""
    hook = hook_factory([404])
    assert (
        post_json(hook.url, {"alerts": []})
        == f"webhook http://127.0.0.1:{hook.server.server_port}: HTTP 404 Not Found (1 attempt)"
    )
    assert len(hook.bodies) == 1


# ---- state file: corruption, safety, locking ------------------------------------------------------
def test_a_corrupt_state_file_warns_and_rescans_with_the_normal_exit_code(tmp_path: Path, full_log: bytes) -> None:
    log, state = tmp_path / "run.log", tmp_path / "state.json"
    log.write_bytes(full_log)
    state.write_bytes(b"\x00garbage{")
    state.chmod(0o600)
    code, out, err = scan(str(log), state=state)
    assert err.startswith("warning: state file") and "damaged" in err and "read again from its start" in err
    assert code == 1 and [(f["restarted"], f["new_bytes"]) for f in out["files"]] == [("new", len(full_log))]
    assert keys(out["alerts"]) == expected_alerts(log)
    assert json.loads(state.read_text())["version"] == checkpoint.FORMAT_VERSION


def test_an_incompatible_state_or_a_check_that_does_not_load_means_a_rescan_that_keeps_what_was_notified(
    tmp_path: Path,
) -> None:
    """Another format version, gradwatch or config, or a check that does not load: the log is read
    again (its incidents grouped anew), but what was notified stays notified."""
    path, log = tmp_path / "state.json", str(tmp_path / "run.log")
    settings = config.load()
    notified = {f"{log}@7 opened warning"}
    saved = checkpoint.ScanState(checkpoint.config_digest(settings), incidents=Correlator(), notified=notified)
    saved.files.append(checkpoint.FileState(key=log, offset=10, check=FileCheck(log, settings)))
    checkpoint.save(path, saved)
    good = json.loads(path.read_text())
    entry = good["files"][0]
    unknown_class = {**entry["check"], "c": "subprocess.Popen"}
    cases = [
        ({**good, "version": 99}, "format version 99"),
        ({**good, "gradwatch": "0.0.1"}, "written by gradwatch '0.0.1'"),
        ({**good, "config": "other"}, "another configuration"),
        ({**good, "files": [{**entry, "check": unknown_class}]}, "'subprocess.Popen' is not a type gradwatch saves"),
    ]
    for doc, said in cases:
        path.write_text(json.dumps(doc))
        warnings: list[str] = []
        state = checkpoint.load(path, settings, warnings.append)
        assert len(warnings) == 1 and said in warnings[0], warnings
        assert state.notified == notified and state.incidents is None
        assert all(f.check is None and f.offset == 0 for f in state.files)
    path.write_text(json.dumps(good))
    resumed = checkpoint.load(path, settings, pytest.fail)
    assert resumed.files[0].offset == 10 and isinstance(resumed.files[0].check, FileCheck)
    assert isinstance(resumed.incidents, Correlator) and resumed.notified == notified


def test_a_state_file_others_can_write_is_refused(tmp_path: Path, full_log: bytes) -> None:
    log, state = tmp_path / "run.log", tmp_path / "state.json"
    log.write_bytes(full_log)
    state.write_text("{}")
    state.chmod(0o664)
    p = run_cli("scan", str(log), "--state", str(state))
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "writable by group or others" in p.stderr and f"chmod go-w {state}" in p.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_state_file_of_another_user_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    state.write_text("{}")
    state.chmod(0o600)
    os.chown(state, 12345, -1)
    with pytest.raises(UsageError, match="belongs to another user"):
        checkpoint.load(state, config.load(), pytest.fail)


def _hold_lock(lock: Path) -> subprocess.Popen[str]:
    code = (
        "import fcntl, sys, time; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); "
        "print('locked', flush=True); time.sleep(600)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code, str(lock)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
    return holder


def test_a_concurrent_scan_is_refused_and_a_killed_holder_does_not_block(tmp_path: Path, full_log: bytes) -> None:
    log, state = tmp_path / "run.log", tmp_path / "state.json"
    log.write_bytes(full_log)
    holder = _hold_lock(tmp_path / "state.json.lock")
    try:
        p = run_cli("scan", str(log), "--state", str(state), "--lock-wait", "0.3")
        assert p.returncode == 3 and "another gradwatch scan is using" in p.stderr and "Traceback" not in p.stderr
        assert not state.exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    code, out, _ = scan(str(log), "--lock-wait", "0", state=state)
    assert code == 1 and out["files"][0]["new_bytes"] == len(full_log)


def test_a_scan_killed_mid_run_leaves_a_usable_state(tmp_path: Path) -> None:
    """SIGKILL while the scan holds the lock (reading): the next scan finishes the job exactly."""
    log, state = tmp_path / "run.log", tmp_path / "state.json"
    synth.write_log(log, replace(SPEC, steps=5000))  # enough to read for the kill to land mid-scan
    long_log = log.read_bytes()
    cut = len(long_log) // 20
    log.write_bytes(long_log[:cut])
    _, first, _ = scan(str(log), state=state)
    grow(log, long_log[cut:])
    victim = subprocess.Popen([*gradwatch_cmd(), "scan", str(log), "--state", str(state)], stdout=subprocess.DEVNULL)
    lock_fd = os.open(tmp_path / "state.json.lock", os.O_RDWR | os.O_CREAT)
    try:
        while victim.poll() is None:  # wait until the victim holds the lock, then kill it
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(lock_fd, fcntl.LOCK_UN)
                time.sleep(0.01)
            except BlockingIOError:
                victim.send_signal(signal.SIGKILL)
                break
    finally:
        os.close(lock_fd)
        victim.wait()
    assert victim.returncode == -signal.SIGKILL, "the scan finished before it could be killed"
    _, second, _ = scan(str(log), state=state)
    assert second["files"][0]["restarted"] is None and second["files"][0]["new_bytes"] == log.stat().st_size - cut
    assert sorted(keys(first["alerts"]) + keys(second["alerts"])) == expected_alerts(log)


#: A --notify-cmd that writes its pid to a file, then hangs: a pager that never answers.
HANGING = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(600)"


def test_a_scan_killed_while_notifying_leaves_a_usable_state(tmp_path: Path, full_log: bytes) -> None:
    """SIGKILL while --notify-cmd runs for the first alert (and the command with it, as a job's cgroup
    goes): the next scan reads nothing again, reports nothing again, and delivers every owed
    notification exactly once."""
    log, state, sent, hung = tmp_path / "run.log", tmp_path / "state.json", tmp_path / "sent.jsonl", tmp_path / "pid"
    log.write_bytes(full_log)
    hanging = f"{sys.executable} -c {json.dumps(HANGING)} {hung}"
    victim = subprocess.Popen(
        [*gradwatch_cmd(), "scan", str(log), "--state", str(state), "--notify-cmd", hanging],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not (hung.exists() and hung.read_text()):
            assert victim.poll() is None and time.monotonic() < deadline, "the notification never started"
            time.sleep(0.02)
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait()
    os.killpg(int(hung.read_text()), signal.SIGKILL)  # the command runs in its own session

    recorder = f"{sys.executable} -c {json.dumps(RECORDER)} {sent}"
    code, second, _ = scan(str(log), "--notify-cmd", recorder, state=state)
    n = len(expected_notes(log))
    assert [(f["restarted"], f["new_bytes"], f["offset"]) for f in second["files"]] == [(None, 0, len(full_log))]
    assert code == 0 and second["alerts"] == []  # the killed scan saved them before notifying
    assert second["notifications"] == {"sent": n, "errors": [], "owed": 0}
    _, third, _ = scan(str(log), "--notify-cmd", recorder, state=state)
    assert third["notifications"]["sent"] == 0
    assert told(recorded(sent)) == expected_notes(log)


# ---- stall by the wall clock ----------------------------------------------------------------------
def test_a_stalled_run_alerts_once_and_again_after_it_resumed_and_stalled(tmp_path: Path, full_log: bytes) -> None:
    running = full_log[: full_log.rindex(b"[after training is done]")]  # a run that said it ended is not stalled
    log, state, cut = tmp_path / "run.log", tmp_path / "state.json", cut_of(full_log)
    log.write_bytes(running[:cut])
    hours_ago = time.time() - 7200
    os.utime(log, (hours_ago, hours_ago))  # steps every 10 s: the limit is the 10 min floor

    def stalls() -> list[dict[str, Any]]:
        _, out, _ = scan(str(log), state=state)
        return [a for a in out["alerts"] if a["detector"] == "stall"]

    [first] = stalls()
    assert "by the wall clock" in first["message"] and first["value"] > 7000
    assert stalls() == []
    more = cut + (len(running) - cut) // 2
    grow(log, running[cut:more])  # the run went on (written just now): no stall
    assert stalls() == []
    grow(log, running[more:])  # ... then stalled again after its new last step
    os.utime(log, (hours_ago, hours_ago))
    [again] = stalls()
    assert again["step"] == 800 and again["step"] > first["step"]


# ---- Prometheus textfile --------------------------------------------------------------------------
def _parse_prom(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    samples = {}
    for line in text.splitlines():
        if line.startswith("#"):
            assert re.match(r"^# (HELP|TYPE) gradwatch_[a-z_]+ \S", line), line
            continue
        m = PROM_LINE.match(line)
        assert m, f"not in the exposition format: {line!r}"
        labels = frozenset(
            (k, v.replace("\\n", "\n").replace('\\"', '"').replace("\\\\", "\\"))
            for k, v in PROM_LABEL.findall(m["labels"] or "")
        )
        samples[(m["name"], labels)] = float(m["value"])
    return samples


def test_the_prometheus_textfile_parses_and_holds_the_last_values(tmp_path: Path, full_log: bytes) -> None:
    log = tmp_path / 'odd "name" \\ here.log'  # label values must be escaped
    log.write_bytes(full_log)
    prom_dir = tmp_path / "textfile"
    prom_dir.mkdir()
    before = time.time()
    _, out, _ = scan(str(log), "--textfile", str(prom_dir), state=tmp_path / "state.json")

    prom = prom_dir / "gradwatch.prom"
    assert prom.stat().st_mode & 0o777 == 0o644 and list(prom_dir.iterdir()) == [prom]
    samples = _parse_prom(prom.read_text())
    run = frozenset({("path", str(log)), ("run", 'odd "name" \\ here')})
    summary, alerts = check_path(log, config.load())
    assert samples[("gradwatch_last_step", run)] == summary.last_step == out["files"][0]["last_step"]
    for metric in ("loss", "grad_norm", "loss_scale", "lr"):
        assert math.isclose(samples[(f"gradwatch_{metric}", run)], summary.last_values[metric])
    assert 0 <= samples[("gradwatch_seconds_since_last_step", run)] < 60
    assert before <= samples[("gradwatch_last_scan_timestamp_seconds", frozenset())] <= time.time()
    counted = {
        (dict(labels)["detector"], dict(labels)["severity"]): n
        for (name, labels), n in samples.items()
        if name == "gradwatch_alerts_total"
    }
    expected: dict[tuple[str, str], int] = {}
    for a in alerts:
        expected[(a.detector, str(a.severity))] = expected.get((a.detector, str(a.severity)), 0) + 1
    assert counted == expected


def test_the_prometheus_textfile_reads_back_with_prometheus_client(tmp_path: Path, full_log: bytes) -> None:
    parser = pytest.importorskip("prometheus_client.parser")
    log, prom_dir = tmp_path / "run.log", tmp_path / "textfile"
    log.write_bytes(full_log)
    prom_dir.mkdir()
    scan(str(log), "--textfile", str(prom_dir), state=tmp_path / "state.json")
    families = {f.name: f for f in parser.text_string_to_metric_families((prom_dir / "gradwatch.prom").read_text())}
    assert families["gradwatch_last_step"].samples[0].value == 800
    assert families["gradwatch_alerts"].type == "counter"

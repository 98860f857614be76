"""The scan state is data, and files are kept by identity: real files, real `gradwatch scan` runs.

- A check saved as JSON and restored at any cut (mid-line too) gives the alerts of one pass, for
  a synthetic run and for every labelled real log.
- Rename, copytruncate, delete and re-create, and a rotated name matched by the glob, between two
  scans: every byte written is read once (none lost, none twice), and no incident is told twice.
- A damaged or hostile state file (truncated, 100,000-deep, negative offsets, wrong types, classes
  not ours) is one warning and a read from the start, with check's exit code: never a traceback.
- A state of the previous format (pickles) is refused without unpickling, and what it notified
  stays notified.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gradwatch import config, synth
from gradwatch.alerts import Alert
from gradwatch.pipeline import FileCheck
from gradwatch.state import StateError, dump, restore_check
from tests.conftest import REPO, gradwatch_cmd, real_folders, run_cli

FIXTURES = REPO / "tests" / "fixtures" / "scan_state_v2"
SPEC = synth.RunSpec(
    fmt="megatron-deepspeed",
    steps=600,
    seed=11,
    anomalies=(synth.Anomaly("grad_norm_spike", 150), synth.Anomaly("loss_spike", 450)),
)
#: A --notify-cmd that appends each note it is given (stdin JSON) to a file.
RECORDER = "import sys; open(sys.argv[1], 'a').write(sys.stdin.read().replace(chr(10), ' ') + chr(10))"


@pytest.fixture(scope="module")
def run_log(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = tmp_path_factory.mktemp("log") / "run.log"
    synth.write_log(path, SPEC)
    return path.read_bytes()


def alert_keys(alerts: list[Alert]) -> list[tuple[Any, ...]]:
    """Alerts in line order (when an alert is raised depends on where the input was cut)."""
    return sorted((a.line or 0, a.detector, str(a.severity), a.step, a.message) for a in alerts)


def resumed_at(data: bytes, cuts: list[int], path: str) -> list[Alert]:
    """Alerts of a check fed `data` in pieces, saved as JSON text and restored at every cut."""
    settings = config.load()
    check, alerts, start = FileCheck(path, settings), [], 0
    for cut in [*cuts, len(data)]:
        alerts += check.feed(data[start:cut])
        check = restore_check(json.loads(json.dumps(dump(check), allow_nan=False)), path, settings)
        start = cut
    return alerts + check.close()


def one_pass(data: bytes, path: str) -> list[Alert]:
    check = FileCheck(path, config.load())
    return check.feed(data) + check.close()


# ---- round trip ---------------------------------------------------------------------------------
def test_a_check_restored_from_json_at_any_cut_gives_the_alerts_of_one_pass(run_log: bytes) -> None:
    lines = run_log.splitlines(keepends=True)
    at_line = len(b"".join(lines[: len(lines) // 3]))
    mid_line = len(run_log) * 2 // 3 + 7
    assert run_log[mid_line - 1 : mid_line] != b"\n"
    cuts = [1, 300, at_line, mid_line, len(run_log) - 1]
    expected = alert_keys(one_pass(run_log, "run.log"))
    assert {k[1] for k in expected} >= {"grad_norm_spike", "loss_spike"}
    assert alert_keys(resumed_at(run_log, cuts, "run.log")) == expected


def test_every_real_log_resumes_from_json_as_from_one_pass() -> None:
    logs = [p for folder in real_folders() for p in sorted(folder.rglob("*.log")) if p.stat().st_size < 8 << 20]
    if not logs:
        pytest.skip("real samples not present")
    for path in logs:
        data = path.read_bytes()
        cut = len(data) * 37 // 100  # (anywhere: in the middle of a line as often as not)
        assert alert_keys(resumed_at(data, [cut], path.name)) == alert_keys(one_pass(data, path.name)), path


def test_a_check_of_another_build_or_class_is_refused(run_log: bytes) -> None:
    """A parser that has gained an attribute since it was saved, or a class that is not ours."""
    settings = config.load()
    check = FileCheck("run.log", settings)
    check.feed(run_log[:5000])
    saved = dump(check)
    parsers = saved["s"]["stream"]["s"]["parsers"]
    del parsers[0]["s"][next(iter(parsers[0]["s"]))]
    with pytest.raises(StateError, match="lacks"):
        restore_check(saved, "run.log", settings)
    with pytest.raises(StateError, match="'os.system' is not a type gradwatch saves"):
        restore_check({**dump(check), "c": "os.system"}, "run.log", settings)


# ---- rotation between two scans -----------------------------------------------------------------
def scan(folder: Path, *paths: str, notify: bool = True) -> tuple[int, dict[str, Any], str]:
    """`gradwatch scan` in `folder` (a real subprocess): (exit code, JSON report, stderr)."""
    sent = folder / "sent.jsonl"
    args = ["--notify-cmd", f"{sys.executable} -c {json.dumps(RECORDER)} {sent}"] if notify else []
    p = run_cli("scan", *paths, "--state", str(folder / "state.json"), *args, "--output", "json")
    assert "Traceback" not in p.stderr, p.stderr
    return p.returncode, json.loads(p.stdout), p.stderr


def read_bytes(report: dict[str, Any]) -> int:
    """New bytes this scan read (one count per run: a rotated file and its successor share it)."""
    return sum({f["path"]: f["new_bytes"] for f in report["files"]}.values())


def notes_sent(folder: Path) -> list[str]:
    sent = folder / "sent.jsonl"
    lines = sent.read_text().splitlines() if sent.exists() else []
    return [f"{n['event']} {n['incident']}" for n in map(json.loads, lines)]


def thirds(data: bytes) -> tuple[bytes, bytes, bytes]:
    """Three parts cut at line ends, as a writer leaves them between two scans."""
    one, two = data.index(b"\n", len(data) // 3) + 1, data.index(b"\n", len(data) * 2 // 3) + 1
    return data[:one], data[one:two], data[two:]


def rename(log: Path) -> None:
    log.rename(log.with_name(log.name + ".1"))


def copytruncate(log: Path) -> None:
    shutil.copyfile(log, log.with_name(log.name + ".1"))
    with open(log, "r+b") as fh:
        fh.truncate(0)


@pytest.mark.parametrize(
    ("rotate", "pattern"),
    [(rename, "run.log"), (rename, "run.log*"), (copytruncate, "run.log"), (copytruncate, "run.log*")],
    ids=["rename", "rename-glob-matches-rotated", "copytruncate", "copytruncate-glob-matches-copy"],
)
def test_a_rotation_between_two_scans_loses_and_doubles_nothing(
    tmp_path: Path, run_log: bytes, rotate: Any, pattern: str
) -> None:
    """The writer appends, the file rotates, the writer goes on in a new file: the second scan
    reads the rest of the rotated file from its offset, then the new file from its start."""
    log = tmp_path / "run.log"
    first, second, third = thirds(run_log)
    log.write_bytes(first)
    _, one, _ = scan(tmp_path, str(tmp_path / pattern))
    with open(log, "ab") as fh:
        fh.write(second)
    rotate(log)
    with open(log, "ab") as fh:
        fh.write(third)
    _, two, _ = scan(tmp_path, str(tmp_path / pattern))
    _, three, _ = scan(tmp_path, str(tmp_path / pattern))

    assert read_bytes(one) + read_bytes(two) == len(run_log)  # none lost, none twice
    assert read_bytes(three) == 0
    expected = alert_keys(one_pass(run_log, str(log)))
    found = [(a["detector"], a["severity"], a["step"]) for r in (one, two) for a in r["alerts"]]
    assert sorted(found) == sorted((k[1], k[2], k[3]) for k in expected)
    sent = notes_sent(tmp_path)
    assert sent and len(sent) == len(set(sent)), sent  # each incident told once


def test_a_file_deleted_and_created_again_is_read_from_its_start(tmp_path: Path, run_log: bytes) -> None:
    """A new run in the old one's place: the same header (the same first bytes) and, likely, the
    same inode number; it is read whole all the same, not from the old file's offset."""
    log = tmp_path / "run.log"
    other = tmp_path / "other.log"
    synth.write_log(other, synth.RunSpec(fmt="megatron-deepspeed", steps=600, seed=12))
    first, _, _ = thirds(run_log)
    assert other.read_bytes()[:256] == first[:256]
    log.write_bytes(first)
    scan(tmp_path, str(log), notify=False)
    log.unlink()
    log.write_bytes(other.read_bytes())
    _, two, _ = scan(tmp_path, str(log), notify=False)
    assert read_bytes(two) == other.stat().st_size
    assert [f["restarted"] for f in two["files"]] in (["rotated"], ["truncated"])  # (the inode reused or not)


# ---- damaged and hostile state files ------------------------------------------------------------
def _damage(doc: dict[str, Any], name: str) -> bytes:
    entry = doc["files"][0]
    if name == "check deeply nested":  # (as text: json.dumps itself would overflow the stack)
        nested = '{"$":"tuple","v":[' * 5000 + "]}" * 5000
        text = json.dumps({**doc, "files": [{**entry, "check": "NESTED"}]})
        return text.replace('"NESTED"', nested).encode()
    changes: dict[str, Any] = {
        "negative offset": {"files": [{**entry, "offset": -5}]},
        "offset a string": {"files": [{**entry, "offset": "10"}]},
        "files a mapping": {"files": {"run.log": entry}},
        "check a number": {"files": [{**entry, "check": 7}]},
        "class not ours": {"files": [{**entry, "check": {**entry["check"], "c": "builtins.eval"}}]},
        "reference ahead": {"incidents": {"$": "ref", "i": 10**6}},
        "array of objects' bytes": {"incidents": {"$": "nd", "dt": "V8", "sh": [1], "v": "AAAAAAAAAAA="}},
    }
    return json.dumps({**doc, **changes[name]}).encode()


@pytest.mark.parametrize(
    "name",
    [
        "truncated",
        "100,000 deep",
        "huge integer",
        "negative offset",
        "offset a string",
        "files a mapping",
        "check a number",
        "check deeply nested",
        "class not ours",
        "reference ahead",
        "array of objects' bytes",
    ],
)
def test_a_damaged_or_hostile_state_is_one_warning_and_a_read_from_the_start(
    tmp_path: Path, run_log: bytes, name: str
) -> None:
    log, state = tmp_path / "run.log", tmp_path / "state.json"
    first, _, _ = thirds(run_log)
    log.write_bytes(first)
    fresh_code, _, _ = scan(tmp_path, str(log), notify=False)
    good = state.read_bytes()
    raw = {
        "truncated": good[: len(good) // 2],
        "100,000 deep": b"[" * 100_000 + b"]" * 100_000,
        "huge integer": good.replace(b'"offset":', b'"offset":' + b"9" * 5000, 1),
    }.get(name) or _damage(json.loads(good), name)
    state.write_bytes(raw)
    code, out, err = scan(tmp_path, str(log), notify=False)
    assert code == fresh_code == 1  # (the alerts found again)
    assert err.startswith("warning: ") and str(state) in err and "read again from" in err, err
    assert [(f["restarted"], f["new_bytes"]) for f in out["files"]] == [("new", len(first))]
    code, again, err = scan(tmp_path, str(log), notify=False)  # the state was saved anew, whole
    assert (code, err, read_bytes(again)) == (0, "", 0)


def test_a_damaged_list_of_what_was_notified_is_said_and_the_rest_of_the_state_kept(tmp_path: Path) -> None:
    log, state = tmp_path / "run.log", tmp_path / "state.json"
    log.write_bytes((FIXTURES / "train.log").read_bytes())
    scan(tmp_path, str(log), notify=False)
    state.write_text(json.dumps({**json.loads(state.read_text()), "notified": 5}))
    code, out, err = scan(tmp_path, str(log), notify=False)
    assert "what was notified is damaged" in err and "notified again once" in err and "Traceback" not in err
    assert (code, read_bytes(out)) == (0, 0)  # the files go on where they were


# ---- the state of the previous format -----------------------------------------------------------
@pytest.mark.parametrize("fixture", ["head-state.json", "head-state-hostile.json"])
def test_a_pickled_state_of_the_previous_format_is_refused_unread_and_nothing_is_told_twice(
    tmp_path: Path, fixture: str
) -> None:
    """Written by gradwatch at commit 4618e79 (format 2: parsers, detectors and incidents pickled)
    for `train.log`, whose one incident it had notified; the hostile copy's pickles would create
    UNPICKLED-MARKER in the working directory if they were loaded."""
    shutil.copy(FIXTURES / "train.log", tmp_path / "train.log")
    shutil.copy(FIXTURES / fixture, tmp_path / "state.json")
    (tmp_path / "state.json").chmod(0o600)
    sent = tmp_path / "sent.jsonl"
    notify = f"{sys.executable} -c {json.dumps(RECORDER)} {sent}"
    args = ["scan", "train.log", "--state", "state.json", "--notify-cmd", notify, "--output", "json"]
    p = subprocess.run([*gradwatch_cmd(), *args], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert "Traceback" not in p.stderr and not (tmp_path / "UNPICKLED-MARKER").exists()
    assert "older gradwatch" in p.stderr and "not loaded" in p.stderr and "read again" in p.stderr
    out = json.loads(p.stdout)
    assert p.returncode == 1 and [a["step"] for a in out["alerts"]] == [45]  # found again ...
    assert not sent.exists()  # ... but not told again
    assert json.loads((tmp_path / "state.json").read_text())["version"] == 3

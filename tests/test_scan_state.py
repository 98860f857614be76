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
import os
import re
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
from tests.rotation_harness import TOTAL_STEPS, ledger_config
from tests.tail_writer import megatron_line

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


def compress(log: Path, suffix: str = ".1") -> None:
    """logrotate's `compress`: renamed, then compressed by the gzip program (the plain file goes)."""
    rotated = log.with_name(log.name + suffix)
    log.rename(rotated)
    subprocess.run(["gzip", str(rotated)], check=True)


def dateext_compress(log: Path) -> None:
    compress(log, "-20240306")


@pytest.mark.parametrize(
    ("rotate", "pattern"),
    [
        (rename, "run.log"),
        (rename, "run.log*"),
        (copytruncate, "run.log"),
        (copytruncate, "run.log*"),
        (compress, "run.log"),
        (compress, "run.log*"),
        (dateext_compress, "run.log"),
    ],
    ids=[
        "rename",
        "rename-glob-matches-rotated",
        "copytruncate",
        "copytruncate-glob-matches-copy",
        "compress",
        "compress-glob-matches-gz",
        "dateext-compress",
    ],
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


def test_a_file_deleted_and_created_again_is_read_where_it_differs(tmp_path: Path, run_log: bytes) -> None:
    """A new run in the old one's place: the same header (the same first bytes) and, likely, the
    same inode number. It is never read from the old file's offset: a new inode is read whole, and
    the same inode is taken for the file rewritten in place (as `tail` takes it) and read from the
    first line that is not what was read."""
    log = tmp_path / "run.log"
    other = tmp_path / "other.log"
    synth.write_log(other, synth.RunSpec(fmt="megatron-deepspeed", steps=600, seed=12))
    first, _, _ = thirds(run_log)
    new = other.read_bytes()
    assert new[:256] == first[:256]
    log.write_bytes(first)
    scan(tmp_path, str(log), notify=False)
    log.unlink()
    log.write_bytes(new)
    _, two, _ = scan(tmp_path, str(log), notify=False)
    shared = os.path.commonprefix([first, new])
    shared = shared[: shared.rfind(b"\n") + 1]
    restarted = [f["restarted"] for f in two["files"]]
    assert (restarted, read_bytes(two)) in ((["rotated"], len(new)), (["cut short"], len(new) - len(shared)))


@pytest.mark.parametrize("pattern", ["run.log", "run.log*"], ids=["path", "glob-matches-both"])
def test_a_rotated_log_being_compressed_is_read_once(tmp_path: Path, run_log: bytes, pattern: str) -> None:
    """gzip writes `log.1.gz` before it removes `log.1`: a scan in between reads the plain file on
    and leaves its compressed copy; once the plain file is gone, its state finds the copy and reads
    nothing of it again."""
    log = tmp_path / "run.log"
    first, second, third = thirds(run_log)
    log.write_bytes(first)
    _, one, _ = scan(tmp_path, str(tmp_path / pattern))
    with open(log, "ab") as fh:
        fh.write(second)
    rotated = log.rename(log.with_name("run.log.1"))
    subprocess.run(["gzip", "-k", str(rotated)], check=True)
    log.write_bytes(third)
    _, two, _ = scan(tmp_path, str(tmp_path / pattern))
    rotated.unlink()
    _, three, _ = scan(tmp_path, str(tmp_path / pattern))
    assert (read_bytes(one) + read_bytes(two), read_bytes(three)) == (len(run_log), 0)


def test_a_log_rotated_in_and_out_between_two_scans_is_read(tmp_path: Path, run_log: bytes) -> None:
    """Two rotations between two scans: `run.log.2` was created and rotated away before any scan
    saw it; written since the last scan began, it is read whole, between the other two."""
    log = tmp_path / "run.log"
    parts = thirds(run_log)
    log.write_bytes(parts[0])
    _, one, _ = scan(tmp_path, str(log))
    log.rename(tmp_path / "run.log.1")
    log.write_bytes(parts[1])
    log.rename(tmp_path / "run.log.2")
    log.write_bytes(parts[2])
    _, two, _ = scan(tmp_path, str(log))
    assert read_bytes(one) + read_bytes(two) == len(run_log)  # (run.log.2's bytes too)


# ---- a log cut short in place ------------------------------------------------------------------
def scan_counted(folder: Path, log: Path) -> tuple[dict[str, Any], list[int]]:
    """`gradwatch scan` with the rotation harness's ledger plugin: (JSON report, steps its parser
    produced in this scan, in order)."""
    config, env = ledger_config(folder)
    steps = folder / "steps.txt"
    steps.unlink(missing_ok=True)
    p = run_cli(
        "scan", str(log), "--state", str(folder / "state.json"), "--config", str(config), "--output", "json", env=env
    )
    assert "Traceback" not in p.stderr and p.returncode in (0, 1), p.stderr
    return json.loads(p.stdout), [int(s) for s in steps.read_text().split()] if steps.exists() else []


def steps_log(steps: range, loss_times: float = 1.0) -> str:
    """Megatron iteration lines (`tests.tail_writer`), their loss `loss_times` as high."""
    lines = (megatron_line(s, total=TOTAL_STEPS) for s in steps)
    return "".join(
        re.sub(r"lm loss: (\S+)", lambda m: f"lm loss: {float(m[1]) * loss_times:.6E}", line) for line in lines
    )


def test_a_log_cut_back_a_few_lines_goes_on_at_the_exact_line(tmp_path: Path, run_log: bytes) -> None:
    """A job cut its log back 40 lines (to a checkpoint's line) and logs on: what is still there is
    not read again, what follows the cut is read (before: the whole log again, from its start)."""
    log = tmp_path / "run.log"
    first, second, third = thirds(run_log)
    log.write_bytes(first + second)
    _, one, _ = scan(tmp_path, str(log))
    kept = len(first + second)
    for _ in range(40):
        kept = (first + second).rindex(b"\n", 0, kept - 1) + 1
    os.truncate(log, kept)
    with open(log, "ab") as fh:
        fh.write(third)
    _, two, _ = scan(tmp_path, str(log))
    assert [(f["restarted"], f["new_bytes"]) for f in two["files"]] == [("cut short", len(third))]
    told = {(a["detector"], a["step"]) for a in one["alerts"]}
    assert told and not told & {(a["detector"], a["step"]) for a in two["alerts"]}
    sent = notes_sent(tmp_path)
    assert len(sent) == len(set(sent)), sent


@pytest.mark.parametrize("banner", [True, False], ids=["restart-line", "no-restart-line"])
def test_a_log_cut_back_far_loses_no_new_line_and_sees_the_resume(tmp_path: Path, banner: bool) -> None:
    """Cut back 2,000 lines, past where the marks are at every line (in a gap between two marks):
    a resumed job logs steps 2,001-2,200 again, its loss 10x higher. Every new step is read, once,
    and the jump alerts. Of the lines read before, none is read again when the job wrote its
    restart line (and resume_regression sees it); without one, only those of the gap before the
    cut (`sources.resume`)."""
    log = tmp_path / "run.log"
    log.write_text(steps_log(range(1000, 4000)))
    _, first = scan_counted(tmp_path, log)
    assert first == list(range(1000, 4000))
    with open(log, "r+b") as fh:
        fh.truncate(len(steps_log(range(1000, 2001))))  # (the line of step 2,000 is the last one left)
    restart = " loading checkpoint from /ckpt at iteration 2000\n" if banner else ""
    with open(log, "a") as fh:
        fh.write(restart + steps_log(range(2001, 2201), loss_times=10))
    report, second = scan_counted(tmp_path, log)
    again, new = second[:-200], second[-200:]
    assert new == list(range(2001, 2201))
    assert again == list(range(2001 - len(again), 2001)) and len(again) <= (0 if banner else 64), again
    # (without a restart line the restart is seen at the mark, with the lines read again: the jump
    # of the new lines is the spike detectors')
    seen = {a["detector"] for a in report["alerts"] if a["step"] >= 2001}
    assert "resume_regression" in seen if banner else seen & {"loss_spike", "resume_regression"}, report["alerts"]


def test_a_log_cut_back_far_and_logging_on_reads_only_what_is_new(tmp_path: Path) -> None:
    """Cut back 2,000 lines and logging on with new steps (no rollback): the lines of the gap
    between two marks that were read before are not read again."""
    log = tmp_path / "run.log"
    log.write_text(steps_log(range(1000, 4000)))
    scan_counted(tmp_path, log)
    with open(log, "r+b") as fh:
        fh.truncate(len(steps_log(range(1000, 2001))))
    with open(log, "a") as fh:
        fh.write(steps_log(range(5000, 5200)))
    _, second = scan_counted(tmp_path, log)
    assert second == list(range(5000, 5200))


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

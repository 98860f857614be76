"""Named pipes (issue #27): read as a stream where the user names one, never opened where a folder
or a glob meets one, refused by `scan`.

Every test runs the real CLI in a subprocess against a real FIFO (`os.mkfifo`) and a real writer
process, with a timeout: a read that blocks where it must not fails the test instead of hanging it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import gradwatch_cmd
from tests.tail_writer import FIRST_STEP
from tests.test_bad_input import megatron_log
from tests.test_tail import tails  # noqa: F401  (the fixture: `gradwatch tail` subprocesses)

#: Seconds any one gradwatch run may take here before it counts as a hang.
HANG_S = 60
WRITER = Path(__file__).with_name("tail_writer.py")
#: `python -c` that waits ARGV[3] seconds, then writes the file ARGV[2] into the pipe ARGV[1]
#: (and holds the pipe open ARGV[4] seconds more, when given).
LATE_WRITER = (
    "import sys, time; time.sleep(float(sys.argv[3])); f = open(sys.argv[1], 'wb'); "
    "f.write(open(sys.argv[2], 'rb').read()); f.flush(); time.sleep(float(sys.argv[4]) if sys.argv[4:] else 0)"
)


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[Any]]]:
    """Processes a test starts; those still running at its end are killed."""
    started: list[subprocess.Popen[Any]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def start(procs: list[subprocess.Popen[Any]], cwd: Path, *args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [*gradwatch_cmd(), *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "NO_COLOR": "1", "COLUMNS": "120"},
    )
    procs.append(proc)
    return proc


def late_writer(procs: list[subprocess.Popen[Any]], cwd: Path, delay: float, hold: float = 0.0) -> None:
    """A writer of train.log into pipe.log, `delay` seconds from now."""
    procs.append(
        subprocess.Popen([sys.executable, "-c", LATE_WRITER, "pipe.log", "train.log", str(delay), str(hold)], cwd=cwd)
    )


def finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=HANG_S)
    assert "Traceback" not in err, err
    return proc.returncode, out, err


@pytest.fixture
def piped(tmp_path: Path) -> Path:
    """train.log (300 records, a grad-norm spike) and an empty named pipe pipe.log beside it."""
    (tmp_path / "train.log").write_text(megatron_log(300, spike_at=2500))
    os.mkfifo(tmp_path / "pipe.log")
    return tmp_path


def without_paths(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The alerts, but for the path they name (and the incident, named by it)."""
    return [{k: v for k, v in a.items() if k not in ("path", "incident")} for a in report["alerts"]]


# ---- check, report, export: a named pipe is read as a stream ---------------------------------------
def test_check_reads_a_named_pipe_as_check_reads_the_file_and_says_it_waits(piped: Path, procs: list[Any]) -> None:
    """The writer comes 3 s late: one note says check waits for it, then its log is checked as
    the same bytes in a file are, the alerts named by the pipe's path."""
    check = start(procs, piped, "check", "pipe.log", "--output", "json")
    late_writer(procs, piped, delay=3)
    code, out, err = finish(check)
    assert err.splitlines() == ["note: waiting for a writer on pipe.log (a named pipe)…"]
    p = subprocess.run(
        [*gradwatch_cmd(), "check", "train.log", "--output", "json"], cwd=piped, capture_output=True, text=True
    )
    from_pipe, from_file = json.loads(out), json.loads(p.stdout)
    assert code == p.returncode == 1
    assert [f["path"] for f in from_pipe["files"]] == ["pipe.log"]
    assert from_pipe["files"][0]["records"] == from_file["files"][0]["records"] == 300
    assert {a["path"] for a in from_pipe["alerts"]} == {"pipe.log"}
    assert without_paths(from_pipe) == without_paths(from_file) != []


def test_a_writer_in_time_and_quiet_get_no_note(piped: Path, procs: list[Any]) -> None:
    late_writer(procs, piped, delay=0)
    code, out, err = finish(start(procs, piped, "check", "pipe.log"))
    assert code == 1 and "300 records" in out and err == ""
    check = start(procs, piped, "check", "pipe.log", "--quiet")
    late_writer(procs, piped, delay=3)
    code, out, err = finish(check)
    assert code == 1 and "grad_norm_spike" in out and err == ""


@pytest.mark.parametrize("writer", ["none", "silent"])
def test_ctrl_c_ends_a_check_of_a_named_pipe_with_exit_130(piped: Path, procs: list[Any], writer: str) -> None:
    """Waiting for a writer (`none`), or for more from a writer that holds the pipe open
    (`silent`): Ctrl-C ends the check, with the interrupt's exit code and no traceback."""
    check = start(procs, piped, "check", "pipe.log")
    if writer == "silent":
        late_writer(procs, piped, delay=0, hold=HANG_S)
    time.sleep(3)  # (the writer's lines are read, or the wait is on)
    assert check.poll() is None, check.communicate()
    check.send_signal(signal.SIGINT)
    code, _, err = finish(check)
    assert code == 130, err
    assert ("waiting for a writer" in err) is (writer == "none")


def test_report_and_export_read_a_named_pipe(piped: Path, procs: list[Any]) -> None:
    late_writer(procs, piped, delay=0)
    code, out, _ = finish(start(procs, piped, "report", "pipe.log", "--out", "r.html"))
    assert code == 0 and "wrote r.html: 1 log, 2 alerts" in out
    assert "pipe.log" in (piped / "r.html").read_text()
    late_writer(procs, piped, delay=0)
    code, out, _ = finish(start(procs, piped, "export", "pipe.log", "--out", "pipe.csv"))
    assert code == 0 and "300 records" in out
    assert finish(start(procs, piped, "export", "train.log", "--out", "file.csv"))[0] == 0
    assert (piped / "pipe.csv").read_text() == (piped / "file.csv").read_text()


# ---- tail: a named pipe alone is followed as `tail -` follows standard input -----------------------
def test_tail_follows_a_named_pipe_to_its_writers_end(
    tmp_path: Path,
    procs: list[Any],
    tails: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    os.mkfifo("pipe.log")
    tail = tails("pipe.log")
    assert tail.started()["mode"] == "waiting for a writer on the named pipe pipe.log"
    spike = FIRST_STEP + 150
    procs.append(
        subprocess.Popen(
            [sys.executable, str(WRITER), "pipe.log", "--count", "300", "--rate", "200", "--spike", str(spike)]
        )
    )
    assert tail.alert_at(spike)["path"] == "pipe.log"
    summary = tail.summary()
    assert summary["reason"] == "end of input" and summary["files"][0]["records"] == 300
    assert tail.proc.returncode == 1


def test_tail_follows_a_named_pipe_alone(piped: Path, procs: list[Any]) -> None:
    code, _, err = finish(start(procs, piped, "tail", "pipe.log", "train.log"))
    assert code == 2 and "pipe.log is a named pipe, followed alone: run one tail for each pipe" in err
    code, _, err = finish(start(procs, piped, "tail", "pipe.log", "--from-end"))
    assert code == 2 and "--from-end does not apply to pipe.log, a named pipe" in err


# ---- scan: a named pipe is never opened -------------------------------------------------------------
def test_scan_refuses_a_named_pipe_it_is_given_and_scans_the_other_files(piped: Path, procs: list[Any]) -> None:
    code, out, err = finish(start(procs, piped, "scan", "pipe.log", "train.log", "--state", "st", "--output", "json"))
    assert code == 2
    assert "error: pipe.log: is a named pipe: scan reads files again where the last scan stopped" in err
    files = {f["path"]: f for f in json.loads(out)["files"]}
    assert files["train.log"]["records"] == 300


# ---- folders and globs: pipes, sockets and devices are named in one note, never opened -------------
@pytest.fixture
def special_folder(piped: Path) -> Iterator[Path]:
    """logs/ with train.log, a named pipe and a listening Unix socket (both named *.log)."""
    logs = piped / "logs"
    logs.mkdir()
    (piped / "train.log").rename(logs / "train.log")
    (piped / "pipe.log").rename(logs / "pipe.log")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(logs / "sock.log"))
        yield piped


NOTE = (
    "note: skipped 2 files that are not regular files (never opened): logs/pipe.log (a named pipe), "
    "logs/sock.log (a socket)"
)


@pytest.mark.parametrize(
    "args",
    [
        ("check", "logs"),
        ("check", "logs/*.log"),
        ("scan", "logs/*.log", "--state", "st"),
        ("report", "logs", "--out", "r.html"),
    ],
)
def test_a_folder_or_glob_names_its_pipes_and_sockets_in_one_note(
    special_folder: Path, procs: list[Any], args: tuple[str, ...]
) -> None:
    code, out, err = finish(start(procs, special_folder, *args))
    assert NOTE in err.splitlines(), err
    assert code == (0 if args[0] == "report" else 1), out + err
    assert "300 records" in out or "1 log" in out


def test_a_folder_of_nothing_but_pipes_names_them_in_its_error(tmp_path: Path, procs: list[Any]) -> None:
    (tmp_path / "logs").mkdir()
    os.mkfifo(tmp_path / "logs" / "pipe.log")
    code, _, err = finish(start(procs, tmp_path, "check", "logs"))
    assert code == 2
    assert err.strip() == (
        "error: no log files found in logs: skipped 1 file that is not a regular file (never opened): "
        "logs/pipe.log (a named pipe)"
    )


def test_tail_of_a_folder_says_which_files_it_never_opens(
    special_folder: Path,
    tails: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(special_folder)
    tail = tails("logs", "--poll", "0.2")
    tail.started()
    summary = tail.stop()
    skipped = [(o["path"], o["detail"]) for o in tail.objs if o["type"] == "notice" and o["kind"] == "skipped"]
    assert skipped == [("logs/pipe.log", "a named pipe: never opened"), ("logs/sock.log", "a socket: never opened")]
    assert summary["files"][0]["records"] == 300

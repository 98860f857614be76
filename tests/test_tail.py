"""`gradwatch tail` end to end: real files, a real writer process, real observers, a real terminal.

Each test runs `gradwatch tail` as a subprocess (`--output jsonl` unless the output itself is under
test), changes files beside it the way trainers and logrotate do, and waits, with a deadline, for
the JSON objects that prove the change was seen. Counting records in the final summary shows that
no line was lost or read twice.
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import io
import json
import math
import os
import pty
import queue
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import termios
import textwrap
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from rich.console import Console

from gradwatch.cli import cli
from gradwatch.config import load
from gradwatch.detectors.stall import Stall
from gradwatch.pipeline import FileCheck
from gradwatch.sinks import prometheus
from gradwatch.sinks.live import LiveView
from tests.conftest import gradwatch_cmd
from tests.tail_writer import megatron_line, write_lines
from tests.test_plugins import RAISES_IN_UPDATE
from tests.test_trainer_error import ECC, ranks

WRITER = Path(__file__).with_name("tail_writer.py")
MODES = [pytest.param([], id="inotify"), pytest.param(["--poll", "0.2"], id="poll")]
Obj = dict[str, Any]


class Tail:
    """`gradwatch tail ARGS --output jsonl` in a subprocess; its JSON lines are collected as they come."""

    def __init__(self, *args: str, output: str = "jsonl") -> None:
        self.proc = subprocess.Popen(
            [*gradwatch_cmd(), "tail", "--output", output, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "NO_COLOR": "1"},
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def objs(self) -> list[Obj]:
        return [json.loads(line) for line in list(self.lines)]

    def wait_for(self, pred: Callable[[Obj], bool], timeout: float = 30.0, what: str = "") -> Obj:
        deadline = time.monotonic() + timeout
        while True:
            for obj in self.objs:
                if pred(obj):
                    return obj
            if time.monotonic() > deadline or (self.proc.poll() is not None and not self._reader.is_alive()):
                break
            time.sleep(0.02)
        raise AssertionError(f"no {what or 'matching object'} in:\n{''.join(self.lines)}\n{self._stderr()}")

    def started(self) -> Obj:
        """The first status: history is read and the files are watched."""
        return self.wait_for(lambda o: o["type"] == "status", what="start status")

    def alerts(self, detector: str = "grad_norm_spike", severity: str = "warning") -> list[Obj]:
        return [
            o for o in self.objs if o["type"] == "alert" and o["detector"] == detector and o["severity"] == severity
        ]

    def alert_at(self, step: int, timeout: float = 30.0) -> Obj:
        return self.wait_for(
            lambda o: o["type"] == "alert" and o["detector"] == "grad_norm_spike" and o["step"] == step,
            timeout,
            what=f"grad-norm alert at step {step}",
        )

    def stop(self, sig: int = signal.SIGINT) -> Obj:
        """Ctrl-C (or `sig`), then the summary."""
        self.proc.send_signal(sig)
        return self.summary()

    def summary(self) -> Obj:
        self.proc.wait(timeout=15)
        self._reader.join(timeout=5)
        assert "Traceback" not in self._stderr()
        return self.wait_for(lambda o: o["type"] == "summary", timeout=0, what="summary")

    def _stderr(self) -> str:
        if self.proc.poll() is None or self.proc.stderr is None:
            return ""
        return self.proc.stderr.read()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def tails() -> Any:
    """Start tails with `tails(*args)`; whatever is still running at the end is killed."""
    started: list[Tail] = []

    def start(*args: str, output: str = "jsonl") -> Tail:
        started.append(Tail(*args, output=output))
        return started[-1]

    yield start
    for t in started:
        t.close()


def writer(log: Path, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, str(WRITER), str(log), *args])


def wait_until(cond: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def notices(t: Tail, kind: str) -> list[Obj]:
    return [o for o in t.objs if o["type"] == "notice" and o["kind"] == kind]


def _plugin_config(tmp_path: Path, source: str) -> Path:
    """A config whose `plugins:` names one file of `source`."""
    (tmp_path / "plugin.py").write_text(textwrap.dedent(source))
    conf = tmp_path / "gradwatch.yaml"
    conf.write_text("plugins: [plugin.py]\n")
    return conf


HANGS = """
    import time

    from gradwatch.api import Detector, register_detector


    @register_detector
    class Hangs(Detector):
        id = "hangs"
        description = "never returns from a batch past step 1100, nor from finish"

        def update(self, batch):
            while batch.records["step"].max() > 1100:
                time.sleep(0.05)
            return []

        def finish(self):
            while True:
                time.sleep(0.05)
"""


def test_a_second_ctrl_c_stops_a_read_that_does_not_end(tmp_path: Path, tails: Any) -> None:
    """The first waits for the read under way (a plugin's detector that hangs on new lines); the
    second stops at once, with the summary (only `kill -9` did)."""
    log = tmp_path / "main_log.txt"
    write_lines(str(log), 1000, 60)
    t = tails(str(log), "--config", str(_plugin_config(tmp_path, HANGS)))
    t.started()
    write_lines(str(log), 1060, 60)
    time.sleep(1.0)
    t.proc.send_signal(signal.SIGINT)
    time.sleep(1.0)
    assert t.proc.poll() is None  # still in the hung read
    summary = t.stop(signal.SIGINT)
    assert summary["reason"] == "interrupted" and t.proc.returncode == 0


def test_a_gzip_file_is_said_to_be_unreadable(tmp_path: Path, tails: Any) -> None:
    """Not silence (found by QA): tail follows plain text, `check` reads gzip."""
    log = tmp_path / "old.log.gz"
    plain = tmp_path / "old.log"
    write_lines(str(plain), 1000, 60)
    log.write_bytes(gzip.compress(plain.read_bytes()))
    t = tails(str(log))
    notice = t.wait_for(lambda o: o["type"] == "notice" and o["kind"] == "unreadable", what="unreadable notice")
    assert notice["path"] == str(log) and notice["detail"].startswith("gzip-compressed: tail follows plain text logs")


def test_a_second_ctrl_c_while_the_files_are_closed_gives_the_summary(tmp_path: Path, tails: Any) -> None:
    """(The summary said exit 0 and the process exited 130, or SIGTERM killed it without one;
    found by review.)"""
    log = tmp_path / "main_log.txt"
    write_lines(str(log), 1000, 60)
    t = tails(str(log), "--config", str(_plugin_config(tmp_path, HANGS)))
    t.started()
    t.proc.send_signal(signal.SIGINT)
    time.sleep(1.0)
    assert t.proc.poll() is None  # in the hung finish
    summary = t.stop(signal.SIGTERM)
    assert summary["reason"] == "interrupted" and summary["exit_code"] == t.proc.returncode == 0


def test_lines_written_just_before_ctrl_c_are_read(tmp_path: Path, tails: Any) -> None:
    """Ctrl-C reads what was written up to then (it was dropped: `_on_data` judged nothing once
    a reason to stop was set; found by review)."""
    log = tmp_path / "main_log.txt"
    write_lines(str(log), 1000, 60)
    t = tails(str(log), "--poll", "5")
    t.started()
    write_lines(str(log), 1060, 10, spikes={1065})
    summary = t.stop()
    assert summary["files"][0]["records"] == 70 and t.alert_at(1065)


def test_the_summary_gives_the_exit_code_a_plugin_failure_makes(tmp_path: Path) -> None:
    log = tmp_path / "main_log.txt"
    write_lines(str(log), 1000, 60)
    conf = _plugin_config(tmp_path, RAISES_IN_UPDATE)
    p = subprocess.run(
        [*gradwatch_cmd(), "tail", "-", "--config", str(conf), "--output", "jsonl"],
        input=log.read_text(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    summary = json.loads(p.stdout.splitlines()[-1])
    assert summary["type"] == "summary" and summary["exit_code"] == p.returncode == 2, p.stderr


@pytest.mark.parametrize("mode", MODES)
def test_spike_written_by_a_running_job_alerts_within_seconds(tmp_path: Path, tails: Any, mode: list[str]) -> None:
    log = tmp_path / "main_log.txt"
    write_lines(str(log), 1000, 60)
    t = tails(str(log), "--exit-on", "warning", *mode)
    assert ("polling every 0.2 s" if mode else "inotify") in t.started()["mode"]
    job = writer(log, "--first", "1060", "--count", "400", "--rate", "100", "--spike", "1100")
    try:
        written = time.monotonic() + 40 / 100  # when step 1100 is written, near enough
        alert = t.alert_at(1100)
        assert time.monotonic() - written < 3.0
        assert alert["severity"] == "warning" and alert["path"] == str(log)
        summary = t.summary()
    finally:
        job.kill()
        job.wait()
    assert t.proc.returncode == 1
    assert summary["reason"] == "--exit-on warning"


@pytest.mark.parametrize("mode", MODES)
def test_rotation_by_rename_loses_and_doubles_no_line(tmp_path: Path, tails: Any, mode: list[str]) -> None:
    log = tmp_path / "main_log.txt"
    write_lines(str(log), 1000, 30)
    t = tails(str(log), "--status-every", "0.1", *mode)
    t.started()
    job = writer(log, "--first", "1030", "--count", "250", "--rate", "100", "--rotate-every", "60", "--spike", "1275")
    assert job.wait(timeout=15) == 0
    t.alert_at(1275)  # in the fifth file: followed live through four rotations
    # every line written is read while following (a lost line keeps this below 280 until the deadline)
    t.wait_for(lambda o: o["type"] == "status" and o["records"] >= 280, what="all 280 records read")
    summary = t.stop()
    (f,) = summary["files"]
    assert (f["records"], f["first_step"], f["last_step"]) == (280, 1000, 1279)
    assert len(notices(t, "rotated")) == 4
    assert len(t.alerts()) == 1
    assert not [o for o in t.objs if o["type"] == "alert" and o["detector"] == "resume_regression"]
    assert t.proc.returncode == 1  # a warning was seen


@pytest.mark.parametrize("mode", MODES)
def test_copytruncate_restarts_at_zero(tmp_path: Path, tails: Any, mode: list[str]) -> None:
    log = tmp_path / "main_log.txt"
    write_lines(str(log), 1000, 50)
    t = tails(str(log), "--status-every", "0.1", *mode)
    t.wait_for(lambda o: o["type"] == "status" and o["records"] == 50, what="all history read")
    shutil.copy(log, tmp_path / "main_log.txt.1")
    with open(log, "r+") as fh:
        fh.truncate(0)
    write_lines(str(log), 1050, 40, spikes={1080})
    t.alert_at(1080)
    summary = t.stop(signal.SIGTERM)
    assert summary["files"][0]["records"] == 90 and summary["reason"] == "interrupted"
    assert notices(t, "truncated")
    assert len(t.alerts()) == 1


@pytest.mark.parametrize("then", ["nothing", "the run going on", "a rollback"])
def test_a_log_cut_far_back_reads_no_line_twice(tmp_path: Path, tails: Any, then: str) -> None:
    """Cut 1,500 lines back, past where tail knows every line end: the lines between the last
    mark that still matches and the cut were read before, so they are not read again (`sources.
    resume`), whatever comes next; a rollback's own lines (lower steps) are read."""
    log = tmp_path / "main_log.txt"
    write_lines(str(log), 1000, 3000)
    t = tails(str(log), "--status-every", "0.1")
    t.wait_for(lambda o: o["type"] == "status" and o["records"] == 3000, what="all history read")
    data = log.read_bytes()
    os.truncate(log, data.index(b"\n", len(data) // 2) + 1)  # through step 2499
    new = {"nothing": 0, "the run going on": 20, "a rollback": 20}[then]
    write_lines(str(log), 2400 if then == "a rollback" else 4000, new)
    t.wait_for(lambda o: o["type"] == "notice" and o["kind"] == "truncated", what="the cut noticed")
    t.wait_for(lambda o: o["type"] == "status" and o["records"] >= 3000 + new, what="the new lines read")
    time.sleep(0.5)  # (anything read twice would be read by now)
    assert t.stop()["files"][0]["records"] == 3000 + new


@pytest.mark.parametrize("mode", MODES)
def test_files_created_after_start_are_followed(tmp_path: Path, tails: Any, mode: list[str]) -> None:
    """A path whose directory does not exist yet, and a glob that gains a per-rank file."""
    late = tmp_path / "later" / "main_log.txt"
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    write_lines(str(ranks / "rank0.log"), 1000, 30)
    t = tails(str(late), str(ranks / "rank*.log"), *mode)
    t.started()
    assert [o["path"] for o in notices(t, "missing")] == [str(late)]
    late.parent.mkdir()
    write_lines(str(late), 1000, 60, spikes={1050})
    write_lines(str(ranks / "rank1.log"), 1000, 60, spikes={1040})
    assert t.alert_at(1050)["path"] == str(late)
    assert t.alert_at(1040)["path"] == str(ranks / "rank1.log")
    summary = t.stop()
    assert {f["path"]: f["records"] for f in summary["files"]} == {
        str(late): 60,
        str(ranks / "rank0.log"): 30,
        str(ranks / "rank1.log"): 60,
    }
    assert {o["path"] for o in notices(t, "added")} >= {str(late), str(ranks / "rank1.log")}


HOOK = """
import json, os, sys
env = {k: v for k, v in os.environ.items() if k.startswith("GRADWATCH_")}
with open(sys.argv[1], "a") as fh:
    fh.write(json.dumps({"stdin": json.loads(sys.stdin.read()), "env": env}) + "\\n")
"""


def test_on_alert_runs_the_command_with_alert_json_and_env(tmp_path: Path, tails: Any) -> None:
    log, hook, out = tmp_path / "main_log.txt", tmp_path / "hook.py", tmp_path / "calls.jsonl"
    hook.write_text(HOOK)
    write_lines(str(log), 1000, 60, spikes={1030})  # an old spike: shown, but pages nobody
    t = tails(str(log), "--on-alert", f"{sys.executable} {hook} {out}", "--on-alert-severity", "warning")
    t.started()
    write_lines(str(log), 1060, 20, spikes={1070})
    alert = t.alert_at(1070)
    wait_until(out.exists)
    t.stop()
    (call,) = [json.loads(line) for line in out.read_text().splitlines()]  # the incident it opened
    headline = call["stdin"].pop("headline")
    assert call["stdin"] == {**{k: v for k, v in alert.items() if k != "type"}, "event": "opened"}
    assert headline.startswith("grad norm ") and alert["incident"] == f"{log}@1070"
    env = call["env"]
    assert env["GRADWATCH_EVENT"] == "opened" and env["GRADWATCH_INCIDENT"] == alert["incident"]
    assert env["GRADWATCH_DETECTOR"] == "grad_norm_spike" and env["GRADWATCH_SEVERITY"] == "warning"
    assert env["GRADWATCH_STEP"] == "1070" and env["GRADWATCH_PATH"] == str(log)
    assert env["GRADWATCH_MESSAGE"] == alert["message"]
    assert len(t.alerts()) == 2


@pytest.mark.parametrize(
    ("code", "reported"),
    [("import sys; sys.exit(3)", "exited with status 3"), ("import time; time.sleep(30)", "did not finish within")],
    ids=["fails", "times-out"],
)
def test_a_failing_on_alert_command_is_reported_and_following_goes_on(
    tmp_path: Path, tails: Any, code: str, reported: str
) -> None:
    log = tmp_path / "main_log.txt"
    write_lines(str(log), 1000, 60)
    cmd = f"{sys.executable} -c '{code}'"
    t = tails(str(log), "--on-alert", cmd, "--on-alert-severity", "warning", "--on-alert-timeout", "0.5")
    t.started()
    write_lines(str(log), 1060, 40, spikes={1070})
    failure = t.wait_for(lambda o: o["type"] == "notice" and o["kind"] == "on-alert failed", what="failure notice")
    assert reported in failure["detail"]
    write_lines(str(log), 1100, 20, spikes={1110})  # still following
    t.alert_at(1110)
    summary = t.stop()
    assert summary["files"][0]["records"] == 120


def test_stall_by_the_wall_clock(tmp_path: Path, tails: Any) -> None:
    log, config = tmp_path / "main_log.txt", tmp_path / "fast-stall.yaml"
    config.write_text("detectors:\n  stall:\n    floor_s: 1.0\n    factor: 1.0\n")
    write_lines(str(log), 1000, 30)  # 1 s per step: the limit is max(1 x 1 s, 1 s)
    t = tails(str(log), "--config", str(config), "--exit-on", "warning")
    stall = t.wait_for(lambda o: o["type"] == "alert" and o["detector"] == "stall", what="stall alert")
    assert stall["step"] == 1029 and "wall clock" in stall["message"]
    assert t.summary()["exit_code"] == 1


def test_the_wall_clock_is_injected() -> None:
    """Stall judgement by a clock the caller advances: once per silent step, re-armed by a step."""
    check = FileCheck("run.log", load())
    check.feed("".join(megatron_line(s) for s in range(1000, 1030)).encode())
    (stall,) = [d for d in check.detectors if isinstance(d, Stall)]
    assert stall.wall_clock_stall(now=599.0, last_step_at=0.0) == []  # floor: 600 s
    assert len(stall.wall_clock_stall(now=601.0, last_step_at=0.0)) == 1
    assert stall.wall_clock_stall(now=900.0, last_step_at=0.0) == []
    check.feed(megatron_line(1030).encode())
    assert len(stall.wall_clock_stall(now=1900.0, last_step_at=1000.0)) == 1


INJECTION = "[bold red]BOOM[/bold red]\x1bc\x07\x1b(0"


def _injected_log(tmp_path: Path) -> Path:
    log = tmp_path / "run[bold red]\x1bc.log"
    write_lines(str(log), 1000, 30)
    with open(log, "a") as fh:
        fh.write(f"found NaN in local grad norm {INJECTION}\n")
    return log


@pytest.mark.parametrize("output", ["text", "jsonl"])
def test_log_content_cannot_style_or_drive_the_terminal(tmp_path: Path, tails: Any, output: str) -> None:
    log = _injected_log(tmp_path)
    t = tails(str(log), "--exit-on", "critical", output=output)
    t.proc.wait(timeout=15)
    t._reader.join(timeout=5)
    out = "".join(t.lines)
    assert "\x1b" not in out and "\x07" not in out
    if output == "jsonl":
        (alert,) = [o for o in t.objs if o["type"] == "alert"]
        assert "[bold red]BOOM[/bold red]" in alert["message"]
    else:
        assert "[bold red]BOOM[/bold red] " in out  # shown as text, escape sequences gone whole
        assert "run[bold red].log" in out
    assert t.proc.returncode == 1


def _screen_text(raw: bytes) -> str:
    """What a terminal would show, roughly: escape sequences removed."""
    text = raw.decode("utf-8", errors="replace")
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\x1b[()][0-9A-B]|\x1b[=>78]", "", text)


def test_live_view_in_a_pseudo_terminal(tmp_path: Path) -> None:
    log = _injected_log(tmp_path)
    write_lines(str(log), 1030, 60)
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    proc = subprocess.Popen(
        [*gradwatch_cmd(), "tail", str(log)],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env={**os.environ, "TERM": "xterm-256color", "COLUMNS": "", "LINES": ""},
        start_new_session=True,
    )
    os.close(slave)
    chunks: queue.Queue[bytes] = queue.Queue()

    def read() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                return
            if not data:
                return
            chunks.put(data)

    threading.Thread(target=read, daemon=True).start()
    raw = bytearray()

    def screen_has(*needles: str, timeout: float = 10.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty):
                raw.extend(chunks.get(timeout=0.05))
            text = _screen_text(bytes(raw))
            if all(n in text for n in needles):
                return text
        raise AssertionError(f"missing {needles} on screen:\n{_screen_text(bytes(raw))}")

    try:
        screen_has("gradwatch tail", "megatron", "step 1,089/100,000", "grad norm", "inotify")
        with open(log, "a") as fh:
            fh.write(megatron_line(1090, spike=True))
        screen_has("grad_norm_spike", "hint:")
        fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
        proc.send_signal(signal.SIGWINCH)
        raw.clear()
        with open(log, "a") as fh:
            fh.write(megatron_line(1091))
        screen_has("step 1,091/100,000")
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=15)
        text = screen_has("tail stopped (interrupted)")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    assert "Traceback" not in text
    assert b"\x1bc" not in raw and b"\x07" not in raw.replace(b"\x1b]", b"")  # no reset, no bell from the log
    assert proc.returncode == 1


def test_live_view_renders_exactly_the_terminal_size() -> None:
    """Rendered into a StringIO at 80x24: 24 rows, header first, status last, log text inert."""
    log = f"/runs/{'very-long-directory/' * 4}main[bold]log.txt"
    check = FileCheck(log, load())
    view = LiveView()
    check.on_batch = lambda batch: view.update(check, batch)
    lines = [megatron_line(s, spike=s == 1050) for s in range(1000, 1090)]
    for alert in check.feed(("".join(lines) + f"found NaN in local grad {INJECTION}\n").encode()):
        view.alerts.append((0.0, alert))
    console = Console(file=io.StringIO(), width=80, height=24, color_system=None, legacy_windows=False)
    rows = console.render_lines(view, console.options, pad=False)
    text = ["".join(seg.text for seg in row) for row in rows]
    assert len(text) == 24 and all(len(r) <= 80 for r in text)
    assert text[0].startswith("gradwatch tail …") and text[0].endswith("megatron  step 1,089/100,000 (1.1%)  ETA 1.1 d")
    assert "[bold]log.txt  megatron" in text[0]  # the path gives way on its left, markup stays text
    assert text[2].startswith("grad norm")
    assert any("CRITICAL step 1,089 nonfinite: trainer reported NaN" in r for r in text)
    assert text[-1] == "reading the history"


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux not installed")
@pytest.mark.parametrize(("width", "height"), [(80, 24), (200, 50)])
def test_live_view_fits_the_terminal(tmp_path: Path, width: int, height: int) -> None:
    """tmux shows the screen as a user sees it: the header on top, the status line at the bottom."""
    log = tmp_path / "main_log.txt"
    write_lines(str(log), 1000, 90, spikes={1050})
    sock, session = f"gw-{os.getpid()}-{width}", "tail"
    tmux = ["tmux", "-L", sock]
    command = " ".join(["env", "-u", "COLUMNS", "-u", "LINES", *gradwatch_cmd(), "tail", str(log)])
    subprocess.run(
        [*tmux, "new-session", "-d", "-s", session, "-x", str(width), "-y", str(height), command], check=True
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            rows = subprocess.run(
                [*tmux, "capture-pane", "-p", "-t", session], capture_output=True, text=True
            ).stdout.splitlines()
            if len(rows) >= height - 1 and "inotify" in rows[-1] and "grad_norm_spike" in "\n".join(rows):
                break
            assert time.monotonic() < deadline, "\n".join(rows)
            time.sleep(0.1)
        assert rows[0].startswith("gradwatch tail") and "step 1,089/100,000" in rows[0]
        assert any(r.startswith("grad norm") for r in rows)
        assert all(len(r) <= width for r in rows)
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-", "x.log"], "standard input"),
        (["x.log", "--on-alert", "no-such-command-gw"], "neither an executable file nor a command"),
        (["x.log", "--on-alert", "'unbalanced"], "No closing quotation"),
        (["x.log", "--output", "live"], "needs a terminal"),
        (["x.log", "--format", "nope"], "unknown format 'nope'"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, ["tail", *args])
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output


# ---- --metrics-port ---------------------------------------------------------------------------------
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> Samples:
    """GET /metrics and parse it with prometheus_client's own parser."""
    parser = pytest.importorskip("prometheus_client.parser")
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    families = parser.text_string_to_metric_families(text)
    return {(s.name, frozenset(s.labels.items())): s.value for f in families for s in f.samples}


def test_metrics_port_serves_the_textfile_gauges_while_following(tmp_path: Path, tails: Any) -> None:
    log = tmp_path / "main_log.txt"
    write_lines(str(log), 1000, 60)
    t = tails(str(log), "--metrics-port", "0")
    url = t.wait_for(lambda o: o["type"] == "notice" and o["kind"] == "metrics", what="metrics notice")["path"]
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/metrics", url)
    run = frozenset({("path", str(log)), ("run", "main_log")})
    assert scrape(url)[("gradwatch_last_step", run)] == 1059

    write_lines(str(log), 1060, 20, spikes={1070})
    t.alert_at(1070)
    wait_until(lambda: scrape(url).get(("gradwatch_last_step", run)) == 1079)
    samples = scrape(url)
    spikes = run | {("detector", "grad_norm_spike"), ("severity", "warning")}
    assert samples[("gradwatch_alerts_total", spikes)] == 1
    assert math.isclose(samples[("gradwatch_grad_norm", run)], 1.0 + 0.01 * (1079 % 7), rel_tol=1e-3)
    assert samples[("gradwatch_loss_scale", run)] == 65536 and samples[("gradwatch_lr", run)] == 1e-4
    assert 0 <= samples[("gradwatch_seconds_since_last_step", run)] < 10
    assert {name for name, _ in samples} == {f.name for f in prometheus.families([])}  # the textfile's names

    t.stop()
    with pytest.raises(urllib.error.URLError):  # the server ends with the tail
        urllib.request.urlopen(url, timeout=5)


def test_metrics_port_in_use_is_a_usage_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(cli, ["tail", str(tmp_path / "x.log"), "--metrics-port", str(port)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert f"--metrics-port {port}: cannot listen on 127.0.0.1:" in result.output


def test_metrics_port_without_prometheus_client_says_how_to_install_it(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import sys\nsys.modules['prometheus_client'] = None\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH", "")]))}
    p = subprocess.run(
        [*gradwatch_cmd(), "tail", str(tmp_path / "x.log"), "--metrics-port", "0", "--output", "jsonl"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr == "error: --metrics-port needs prometheus_client: pip install 'gradwatch[prometheus]'\n"


def test_tail_alerts_on_a_crash_as_it_is_written(tmp_path: Path, tails: Any) -> None:
    """A crashed job's records just stop, and `stall` takes the error as the run's end: without
    this alert a live tail said nothing at all."""
    log = tmp_path / "main_log.txt"
    write_lines(str(log), 1000, 60)
    t = tails(str(log), "--exit-on", "critical")
    t.started()
    with log.open("a") as f:
        f.write("\n".join(ranks(ECC, 4)) + "\n")
    alert = t.wait_for(lambda o: o["type"] == "alert", what="the crash's alert")
    assert (alert["detector"], alert["step"], alert["line"]) == ("trainer_error", 1059, 60 + 13)
    assert t.summary()["reason"] == "--exit-on critical"
    assert t.proc.wait(timeout=10) == 1


def test_on_alert_still_pages_when_the_output_is_gone(tmp_path: Path) -> None:
    """The alert was printed before its command was started: with its reader gone (or a full
    disk) the print failed and nobody was paged (review)."""
    log, hook, out = tmp_path / "main_log.txt", tmp_path / "hook.py", tmp_path / "calls.jsonl"
    hook.write_text(HOOK)
    write_lines(str(log), 1000, 60)
    tail = subprocess.Popen(
        [*gradwatch_cmd(), "tail", str(log), "--output", "jsonl", "--on-alert", f"{sys.executable} {hook} {out}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert tail.stdout is not None
        while json.loads(tail.stdout.readline())["type"] != "status":  # history read, following
            pass
        tail.stdout.close()  # nobody reads its output any more
        with log.open("a") as f:
            f.write("\n".join(ranks(ECC, 2)) + "\n")
        wait_until(out.exists, timeout=20)
        tail.wait(timeout=30)
    finally:
        tail.kill()
    assert json.loads(out.read_text())["stdin"]["detector"] == "trainer_error"

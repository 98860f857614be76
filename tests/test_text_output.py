"""Text output where people read it: piped into CI logs and cron mail, and in a real terminal.

Every test runs `gradwatch` in a subprocess with stdout on a pipe (as `| cat`, a CI runner or cron
have it) or in a tmux terminal, and reads what a user would read. The shipped example logs hold
alerts in several files; `--output json` of the same files says which alerts the text must show.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import EXAMPLES, gradwatch_cmd
from tests.tail_writer import megatron_line, write_lines
from tests.test_tail import Tail, tails  # noqa: F401  (the fixture)

LOGS = sorted(str(p) for p in EXAMPLES.glob("*.log"))
ANSI = re.compile(r"\x1b\[[0-9;]*m")
needs_tmux = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux not installed")


def piped(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`gradwatch ARGS` with stdout and stderr on pipes; COLUMNS=80 as a CI runner may set it."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    return subprocess.run(
        [*gradwatch_cmd(), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**full_env, "COLUMNS": "80", **(env or {})},
    )


def in_tmux(command: list[str], until: Callable[[str], bool], width: int = 100, height: int = 40) -> str:
    """The screen of a tmux terminal running `command` (kept open after it ends), escape codes
    of colours and styles included, once `until` holds for its text without them."""
    sock = f"gw-text-{os.getpid()}-{time.monotonic_ns()}"
    tmux = ["tmux", "-L", sock]
    shell = shlex.join(["env", "-u", "NO_COLOR", "-u", "FORCE_COLOR", "-u", "COLUMNS", "-u", "LINES", *command])
    subprocess.run([*tmux, "new-session", "-d", "-x", str(width), "-y", str(height), f"{shell}; sleep 60"], check=True)
    try:
        deadline = time.monotonic() + 15
        while True:
            screen = subprocess.run(
                [*tmux, "capture-pane", "-p", "-e", "-S", "-"], capture_output=True, text=True
            ).stdout
            if until(ANSI.sub("", screen)):
                return screen
            assert time.monotonic() < deadline, screen
            time.sleep(0.1)
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)


def alerts_of(*args: str) -> list[dict[str, Any]]:
    p = piped("check", "--output", "json", *args)
    return list(json.loads(p.stdout)["alerts"])


def test_piped_check_keeps_every_line_whole_and_unpadded() -> None:
    """`check ... | cat`: no trailing spaces, each `path:line` on one line, each alert's step named."""
    p = piped("check", *LOGS)
    assert p.returncode == 1, p.stderr
    lines = p.stdout.splitlines()
    assert [n for n, line in enumerate(lines) if line != line.rstrip()] == []
    alerts = alerts_of(*LOGS)
    assert alerts
    for a in alerts:
        assert f"      {a['path']}:{a['line']}" in lines  # the whole of it, alone on its line
        heading = rf" *{a['severity']} +step +{a['step']:,}  {a['detector']}\b"
        assert any(re.match(heading, line) for line in lines), heading
    hints = [line for line in lines if line.lstrip().startswith("hint: ")]
    assert {f"      hint: {a['hint']}" for a in alerts} <= set(hints)  # not wrapped, however long
    assert max(map(len, lines)) > 120


def test_width_lays_out_at_n_columns_in_a_pipe() -> None:
    whole = piped("check", *LOGS).stdout.splitlines()
    narrow = piped("check", *LOGS, "--width", "60").stdout.splitlines()
    assert max(map(len, narrow)) <= 60 < max(map(len, whole))
    assert len(narrow) > len(whole)
    assert all(line == line.rstrip() for line in narrow)


def test_color_always_colours_a_pipe_even_with_no_color() -> None:
    coloured = piped("check", *LOGS, "--color", "always", env={"NO_COLOR": "1"}).stdout
    plain = piped("check", *LOGS).stdout
    assert ANSI.search(coloured) and not ANSI.search(plain)
    assert ANSI.sub("", coloured) == plain


@needs_tmux
def test_color_never_in_a_terminal() -> None:
    """In a terminal colour is the default (checked first, so the capture can see it); `never` drops it."""
    done = "files checked"
    auto = in_tmux([*gradwatch_cmd(), "check", *LOGS], lambda s: done in s)
    never = in_tmux([*gradwatch_cmd(), "check", *LOGS, "--color", "never"], lambda s: done in s)
    assert ANSI.search(auto)
    assert not ANSI.search(never)
    assert "step 24,300  grad_norm_spike" in never


def test_quiet_check_prints_the_alerts_alone() -> None:
    p = piped("check", *LOGS, "--quiet")
    assert p.returncode == 1
    for a in alerts_of(*LOGS):
        assert f"{a['path']}:{a['line']}" in p.stdout
    assert "last values" not in p.stdout and "files checked" not in p.stdout and "incidents" not in p.stdout
    healthy = piped("check", str(EXAMPLES / "megatron-ds-fp16-healthy.log"), "--quiet")
    assert (healthy.returncode, healthy.stdout, healthy.stderr) == (0, "", "")


def test_quiet_scan_twice_prints_nothing_the_second_time(tmp_path: Path) -> None:
    state = str(tmp_path / "scan.json")
    first = piped("scan", *LOGS, "--state", state, "--quiet")
    assert first.returncode == 1 and "grad_norm_spike" in first.stdout
    second = piped("scan", *LOGS, "--state", state, "--quiet")
    assert (second.returncode, second.stdout, second.stderr) == (0, "", "")
    loud = piped("scan", *LOGS, "--state", state)  # the same scan without --quiet says it read nothing
    assert "read 0 new bytes" in loud.stdout


@pytest.mark.parametrize("output", ["junit", "json", "github", "text"])
def test_a_missing_file_is_told_on_stderr_whatever_the_output(tmp_path: Path, output: str) -> None:
    missing = str(tmp_path / "x.log")
    p = piped("check", missing, str(EXAMPLES / "hf-trainer-nan.log"), "--output", output)
    assert p.returncode == 2
    assert p.stderr.splitlines() == [f"error: {missing}: no such file"]
    assert f"{missing}: no such file" in p.stdout  # still in the report itself


def test_one_record_is_one_record(tmp_path: Path) -> None:
    log = tmp_path / "one.log"
    log.write_text(megatron_line(1000))
    p = piped("check", str(log))
    assert "  1 record  " in p.stdout and "1 records" not in p.stdout


def test_help_lists_every_command_without_cutting_it() -> None:
    p = piped("--help")
    commands = p.stdout.split("Commands:")[1].split("Examples:")[0]
    assert "..." not in commands
    assert "Check archived logs and report what went wrong, where, and what\n             to do." in commands


def test_format_completes_format_names() -> None:
    env = {"_GRADWATCH_COMPLETE": "bash_complete", "COMP_WORDS": "gradwatch check x.log --format me", "COMP_CWORD": "4"}
    p = piped(env=env)
    assert p.stdout.split() == ["plain,megatron"]


def _history(tmp_path: Path) -> list[str]:
    """Two logs with a grad-norm spike each: the second file's is the earlier step."""
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    write_lines(str(logs[0]), 1000, 200, spikes={1150})
    write_lines(str(logs[1]), 1000, 200, spikes={1120})
    return [str(p) for p in logs]


def test_alerts_already_in_the_files_are_told_in_step_order(tmp_path: Path, tails: Any) -> None:  # noqa: F811
    t = tails(*_history(tmp_path))
    t.started()
    alerts = [o for o in t.objs if o["type"] == "alert"]
    t.stop()
    assert [(a["step"], Path(a["path"]).name) for a in alerts if a["severity"] == "warning"] == [
        (1120, "b.log"),
        (1150, "a.log"),
    ]
    steps = [a["step"] for a in alerts]
    assert steps == sorted(steps)


def test_quiet_tail_prints_the_alerts_alone(tmp_path: Path) -> None:
    t = Tail(*_history(tmp_path), "--quiet", output="text")
    try:
        deadline = time.monotonic() + 10
        while sum("grad_norm_spike" in line for line in t.lines) < 2:
            assert time.monotonic() < deadline and t.proc.poll() is None, "".join(t.lines)
            time.sleep(0.05)
        time.sleep(0.5)
        t.proc.send_signal(signal.SIGINT)
        assert t.proc.wait(timeout=15) == 1
        t._reader.join(timeout=5)
    finally:
        t.close()
    assert t.lines and all(re.match(r"\d\d:\d\d:\d\d (WARNING|INFO) +\w+ step ", line) for line in t.lines), t.lines


def test_quiet_is_for_text_output(tmp_path: Path) -> None:
    p = piped("tail", str(tmp_path / "a.log"), "--quiet", "--output", "jsonl")
    assert p.returncode == 2 and "--quiet is for --output text" in p.stderr


@needs_tmux
def test_live_view_shows_each_files_metrics(tmp_path: Path) -> None:
    logs = _history(tmp_path)

    def both_drawn(screen: str) -> bool:
        return all(f"{log}  megatron  step 1,199/100,000" in screen for log in logs)

    screen = ANSI.sub("", in_tmux([*gradwatch_cmd(), "tail", *logs], both_drawn, width=160, height=40))
    rows = screen.splitlines()
    headers = [n for n, row in enumerate(rows) if "megatron  step 1,199" in row]
    assert len(headers) == 2 and rows[headers[0]].startswith("gradwatch tail ")
    for n in headers:  # each file's block: its own rows of metrics under its header
        assert rows[n + 1].startswith("loss") and rows[n + 2].startswith("grad norm")

"""Pipes and the shell: `tail -` and `check -` on standard input, shell completion, usage errors.

`tail -` reads a real pipe from a real writer process (tests/tail_writer.py writing records over
time, as `python train.py 2>&1 | gradwatch tail -` would); `check -` is compared with `check FILE`
on the same bytes; completion scripts come from the CLI itself, through click's environment variable.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gradwatch import synth
from tests.conftest import gradwatch_cmd, run_cli
from tests.tail_writer import FIRST_STEP

WRITER = Path(__file__).with_name("tail_writer.py")


def tail_pipe(*writer_args: str, tail_args: tuple[str, ...] = ()) -> tuple[int, list[dict[str, Any]], bool, str]:
    """`tail_writer.py /dev/stdout ARGS | gradwatch tail - --output jsonl`.

    The writer starts once tail says it is reading, so that a slow start-up cannot make a live
    pipe look like a finished one. Returns tail's exit code, its JSON objects, whether its first
    alert came while the writer was still writing, and its stderr.
    """
    tail = subprocess.Popen(
        [*gradwatch_cmd(), "tail", "-", "--output", "jsonl", *tail_args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "NO_COLOR": "1"},
    )
    assert tail.stdin is not None and tail.stdout is not None and tail.stderr is not None
    objs: list[dict[str, Any]] = [json.loads(tail.stdout.readline())]  # the start status
    writer = subprocess.Popen([sys.executable, str(WRITER), "/dev/stdout", *writer_args], stdout=tail.stdin)
    tail.stdin.close()  # only the writer holds the pipe now: its exit is tail's end of input
    live = False
    try:
        for line in tail.stdout:
            objs.append(json.loads(line))
            if objs[-1]["type"] == "alert" and sum(o["type"] == "alert" for o in objs) == 1:
                live = writer.poll() is None
        code = tail.wait(timeout=30)
        err = tail.stderr.read()
    finally:
        for proc in (writer, tail):
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    return code, objs, live, err


# ---- tail - ---------------------------------------------------------------------------------------
def test_tail_of_a_pipe_alerts_while_the_writer_runs_and_exits_1_at_the_end_of_input() -> None:
    spike = FIRST_STEP + 150  # 1.5 s into a 4 s run
    code, objs, live, err = tail_pipe("--count", "400", "--rate", "100", "--spike", str(spike))
    assert "Traceback" not in err and err == "", err
    [alert] = [o for o in objs if o["type"] == "alert" and o["severity"] == "warning"]
    assert (alert["detector"], alert["step"], alert["path"]) == ("grad_norm_spike", spike, "<stdin>")
    assert alert["line"] == spike - FIRST_STEP + 1
    assert live, "the alert came only after the writer had finished"
    summary = objs[-1]
    assert summary["type"] == "summary" and summary["reason"] == "end of input"
    assert summary["files"][0]["records"] == 400 and summary["exit_code"] == 1 and code == 1


def test_tail_of_a_healthy_pipe_exits_0_at_the_end_of_input_with_snapshots_dir_empty(tmp_path: Path) -> None:
    out = tmp_path / "ev"
    code, objs, _, err = tail_pipe("--count", "120", "--rate", "400", tail_args=("--snapshot-dir", str(out)))
    assert err == "" and code == 0
    assert [o["type"] for o in objs] == ["status", "summary"]
    assert objs[-1]["reason"] == "end of input" and objs[-1]["files"][0]["records"] == 120
    assert list(out.iterdir()) == []


# ---- check - --------------------------------------------------------------------------------------
def test_check_of_stdin_equals_check_of_the_file(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    spec = synth.RunSpec(
        fmt="megatron-deepspeed",
        steps=1200,
        seed=5,
        anomalies=(synth.Anomaly("grad_norm_spike", 700), synth.Anomaly("loss_scale_collapse", 1000)),
    )
    synth.write_log(log, spec)
    from_file = run_cli("check", "--output", "json", str(log))
    from_pipe = run_cli("check", "--output", "json", "-", stdin=log.read_bytes())
    assert from_pipe.returncode == from_file.returncode == 1 and from_pipe.stderr == ""
    a, b = json.loads(from_pipe.stdout), json.loads(from_file.stdout)
    assert a["files"][0]["path"] == "<stdin>" and {x["path"] for x in a["alerts"]} == {"<stdin>"}
    assert {x["run"] for x in a["incidents"]} == {"<stdin>"}
    for report in (a, b):
        for item in (*report["files"], *report["alerts"], *(x for i in report["incidents"] for x in i["alerts"])):
            item.pop("path")
            item.pop("incident", None)  # (an incident's id is its run's name: the path)
        for incident in report["incidents"]:
            del incident["id"], incident["run"], incident["paths"]
    assert len(a["alerts"]) >= 2 and a == b
    text = run_cli("check", "-", stdin=log.read_bytes())
    head = text.stdout.split("\n\n")[1].splitlines()[0]  # (after the incidents)
    assert head.startswith("<stdin>  megatron  ") and "steps 1-1,200" in head


# ---- shell completion -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("shell", "marks"),
    [
        ("bash", ["_gradwatch_completion()", "complete -o nosort -F _gradwatch_completion gradwatch"]),
        ("zsh", ["#compdef gradwatch", "compdef _gradwatch_completion gradwatch"]),
        ("fish", ["function _gradwatch_completion", "complete --no-files --command gradwatch"]),
    ],
)
def test_completion_scripts_for_bash_zsh_and_fish(shell: str, marks: list[str]) -> None:
    p = run_cli(env={"_GRADWATCH_COMPLETE": f"{shell}_source"})
    assert p.returncode == 0 and p.stderr == ""
    for mark in marks:
        assert mark in p.stdout, f"{mark!r} not in the {shell} script:\n{p.stdout}"
    assert "_GRADWATCH_COMPLETE" in p.stdout  # the script calls gradwatch back for the words


def test_completion_offers_commands_and_option_values() -> None:
    def complete(*words: str) -> list[str]:
        env = {"_GRADWATCH_COMPLETE": "bash_complete", "COMP_WORDS": " ".join(words), "COMP_CWORD": str(len(words) - 1)}
        p = run_cli(env=env)
        assert p.returncode == 0, p.stderr
        return p.stdout.split()

    assert complete("gradwatch", "ch") == ["plain,check"]
    assert complete("gradwatch", "check", "--fail-on", "") == ["plain,warning", "plain,critical"]
    assert complete("gradwatch", "tail", "") == ["file,"]  # paths: the shell completes files


# ---- what does not make sense ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["tail", "-", "x.log"], "cannot be followed together with files"),
        (["tail", "-", "--from-end"], "--from-end does not apply to standard input"),
        (["check", "-", "-"], "can be given once"),
        (["scan", "-", "--state", "s.json"], "standard input cannot do: use check -"),
    ],
)
def test_stdin_usage_errors_are_one_line_and_exit_2(args: list[str], message: str, tmp_path: Path) -> None:
    p = subprocess.run(
        [*gradwatch_cmd(), *args], cwd=tmp_path, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.startswith("error: ") and message in p.stderr and len(p.stderr.splitlines()) == 1, p.stderr

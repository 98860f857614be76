"""The command line as a user meets it: help, listings, exit codes, reports, exports, pipes.

Every test runs the real CLI in a subprocess on files written into pytest's tmp_path.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pandas as pd
import pytest

from gradwatch import __version__
from gradwatch.cli import cli
from tests.conftest import REPO, gradwatch_cmd, run_cli
from tests.test_bad_input import check, check_report, megatron_line, megatron_log, no_traceback, printed, run_values

ALERT_KEYS = {
    "detector",
    "severity",
    "step",
    "path",
    "line",
    "metric",
    "value",
    "baseline",
    "threshold",
    "message",
    "hint",
    "snapshot",
    "incident",
    "paths",
}


def all_commands(group: click.Group = cli, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command and group of the CLI, the top level included: `()`, `("check",)`, `("config", "show")`..."""
    out = [prefix]
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            out += all_commands(command, (*prefix, name))
        else:
            out.append((*prefix, name))
    return out


@pytest.fixture(scope="module")
def spike_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """300 healthy records, steps 10-3000, with the grad norm x50 at step 2500 (line 250): one warning."""
    log = tmp_path_factory.mktemp("spike") / "spike.log"
    log.write_text(megatron_log(300, spike_at=2500))
    return log


# ---- help and listings -----------------------------------------------------------------------
def test_version() -> None:
    p = no_traceback(run_cli("--version"))
    assert p.returncode == 0
    assert p.stdout.strip() == f"gradwatch, version {__version__}"


@pytest.mark.parametrize("command", all_commands(), ids=lambda c: " ".join(c) or "gradwatch")
def test_every_help_exits_0_with_examples(command: tuple[str, ...]) -> None:
    p = no_traceback(run_cli(*command, "--help"))
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("Usage: ")
    examples = p.stdout.split("Examples:", 1)
    assert len(examples) == 2, f"no Examples: section in `gradwatch {' '.join(command)} --help`"
    lines = examples[1].strip().splitlines()
    assert 2 <= len(lines) <= 3, f"`gradwatch {' '.join(command)} --help` should end with 2 or 3 examples: {lines}"
    assert all("gradwatch " in line for line in lines)  # the help ends with them: nothing after


@pytest.mark.parametrize("command", ["formats", "detectors"])
def test_listings_have_one_entry_per_line(command: str) -> None:
    from gradwatch.detectors import DETECTORS
    from gradwatch.parsers import PARSERS

    registry: dict[str, Any] = dict(PARSERS) if command == "formats" else dict(DETECTORS)
    p = no_traceback(run_cli(command))
    assert p.returncode == 0
    lines = p.stdout.splitlines()
    assert [line.split()[0] for line in lines] == list(registry)
    assert all(len(line.split(maxsplit=1)) == 2 for line in lines)  # a name and a description


def test_usage_errors_are_exit_2() -> None:
    for args in (["bogus"], ["check"], ["check", "x.log", "--output", "xml"], ["check", "x.log", "--fail-on", "info"]):
        p = no_traceback(run_cli(*args))
        assert p.returncode == 2, args
        assert p.stdout == ""
        assert p.stderr.startswith("Usage: ") and "gradwatch" in p.stderr and "Error:" in p.stderr


# ---- check: exit codes, JSON, text -------------------------------------------------------------
def nan_log_text() -> str:
    """60 records; a NaN grad norm at step 410, an Inf loss at 460, the loss left out (NaN) at 560."""
    lines = megatron_log(60).splitlines()

    def field(i: int, name: str) -> str:
        return lines[i].split(f"| {name}: ")[1].split(" |")[0]

    lines[40] = lines[40].replace(f"| grad norm: {field(40, 'grad norm')} |", "| grad norm: nan |")
    lines[45] = lines[45].replace(f"| lm loss: {field(45, 'lm loss')} |", "| lm loss: inf |")
    lines[55] = lines[55].replace(f"| lm loss: {field(55, 'lm loss')} |", "|")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def json_run(spike_log: Path) -> tuple[int, dict[str, Any], Path]:
    """`check --output json` over the spike log and a log with NaN/Inf values."""
    nan_log = spike_log.with_name("nan.log")
    nan_log.write_text(nan_log_text())
    rc, report = check_report(str(spike_log), str(nan_log))
    return rc, report, nan_log


def test_json_report_schema_and_exit_code(json_run: tuple[int, dict[str, Any], Path], spike_log: Path) -> None:
    rc, report, nan_log = json_run
    assert rc == 1
    assert set(report) == {"version", "files", "incidents", "alerts", "summary"} and report["version"] == 1
    first, second = report["files"]
    assert {"path", "format", "records", "first_step", "last_step"} <= set(first)
    assert [(f["path"], f["format"], f["records"], f["first_step"], f["last_step"]) for f in report["files"]] == [
        (str(spike_log), "megatron", 300, 10, 3000),
        (str(nan_log), "megatron", 60, 10, 600),
    ]
    for alert in report["alerts"]:
        assert set(alert) == ALERT_KEYS
        assert alert["severity"] in ("info", "warning", "critical")
        assert alert["message"] and alert["hint"] and alert["path"] and alert["line"] > 0
    [warning] = [a for a in report["alerts"] if a["severity"] == "warning"]
    grad_norms = {s: g for s, _, g in run_values(300, spike_at=2500)}
    assert (warning["detector"], warning["step"], warning["line"], warning["path"], warning["metric"]) == (
        "grad_norm_spike",
        2500,
        250,
        str(spike_log),
        "grad_norm",
    )
    assert warning["value"] == pytest.approx(printed(grad_norms[2500], ".3f"))
    assert 1.0 < warning["baseline"] < 2.0 and warning["threshold"] > warning["baseline"]
    summary = report["summary"]
    assert {"alerts", "warning", "critical", "exit_code", "spike_score"} <= set(summary)
    counts = {sev: sum(a["severity"] == sev for a in report["alerts"]) for sev in ("warning", "critical")}
    assert (summary["alerts"], summary["warning"], summary["critical"], summary["exit_code"]) == (
        len(report["alerts"]),
        counts["warning"],
        counts["critical"],
        1,
    )


def test_json_has_no_bare_nan_and_unknown_values_are_null(json_run: tuple[int, dict[str, Any], Path]) -> None:
    """NaN/Inf in the log are nulls in JSON (`strict_json` already refused NaN/Infinity)."""
    _, report, nan_log = json_run
    critical = [a for a in report["alerts"] if a["path"] == str(nan_log) and a["severity"] == "critical"]
    assert [a["detector"] for a in critical] and {a["detector"] for a in critical} == {"nonfinite"}
    assert critical[0]["step"] == 410 and critical[0]["line"] == 41 and critical[0]["value"] is None
    for alert in report["alerts"]:
        for key in ("value", "baseline", "threshold"):
            assert alert[key] is None or isinstance(alert[key], (int, float))


def test_fail_on_critical_turns_a_warning_only_run_into_exit_0(spike_log: Path) -> None:
    rc, report = check_report(str(spike_log), "--fail-on", "critical")
    assert rc == 0
    assert report["summary"]["warning"] == 1 and report["summary"]["critical"] == 0


def test_text_report_shows_format_steps_values_alerts_and_files_without_metrics(
    spike_log: Path, tmp_path: Path
) -> None:
    launcher = tmp_path / "launcher.out"
    launcher.write_text("srun: job 123 queued and waiting for resources\nsrun: job 123 has been allocated resources\n")
    p = check(str(spike_log), str(launcher), env={"COLUMNS": "250"})
    assert p.returncode == 2
    out = p.stdout
    assert "\x1b" not in out  # NO_COLOR and not a terminal
    assert out.startswith("incidents\n")  # the stories first, then each file
    head = next(line for line in out.splitlines() if line.startswith(str(spike_log)))
    assert "megatron" in head and "300 records" in head
    assert "steps 10-3,000" in head
    names, numbers = out.split("last values", 1)[1].splitlines()[1:3]
    assert names.split()[:3] == ["loss", "grad_norm", "loss_scale"]
    _, last_loss, last_grad = run_values(300, spike_at=2500)[-1]
    assert float(numbers.split()[0]) == pytest.approx(last_loss, rel=1e-3)
    assert float(numbers.split()[1]) == pytest.approx(last_grad, rel=1e-3)
    assert "grad_norm_spike" in out and "2,500" in out
    assert f"{spike_log}:250" in out
    assert "hint: " in out
    # the file without metrics says so plainly
    assert f"{launcher}: has 2 lines but no training records in any known format" in out
    last = out.rstrip().splitlines()[-1]
    assert last.startswith("2 files checked: 0 critical, 1 warning") and " in 1 incident" in last
    assert "1 file unreadable or without metrics" in last and last.endswith("(exit 2)")


@pytest.mark.parametrize("width", [40, 60, 80, 120])
def test_text_report_fits_a_narrow_terminal_without_cutting_names_values_or_locations(width: int) -> None:
    """At 40 columns the last values read `grad…` and `2.1…`, sparklines were cut before the spike,
    and at 80 (a CI log) each alert's `file:line` was folded inside a 39-column table cell."""
    log = "examples/logs/megatron-ds-fp16-resume-collapse.log"
    env = {**os.environ, "NO_COLOR": "1"}
    run = [*gradwatch_cmd(), "check", log, "--width", str(width)]  # (a pipe is never wrapped without it)
    text = subprocess.run(run, cwd=REPO, env=env, capture_output=True, text=True, timeout=60).stdout
    report = json.loads(subprocess.run([*run, "--output", "json"], cwd=REPO, capture_output=True, text=True).stdout)
    lines = [line.rstrip() for line in text.splitlines()]
    assert "…" not in text and max(len(line) for line in lines) <= width
    words = " ".join(line.strip() for line in lines)
    for name in ("loss", "grad_norm", "loss_scale", "lr", "step_time_s", "tflops"):
        assert f" {name} " in f" {words} "
    for alert in report["alerts"]:
        assert alert["message"] in words and f"hint: {alert['hint']}" in words
        if width >= 60:  # wide enough for the path: never folded
            assert f"      {log}:{alert['line']}" in lines
    sparklines = [line.split()[1] for line in lines if line.strip().startswith("loss ") and "▁" in line]
    [loss_line] = sparklines  # as many cells as fit, 20 or more; all 40 where there is room
    assert "█" in loss_line and (len(loss_line) == 40 if width >= 100 else 20 <= len(loss_line) <= 40), loss_line


def test_check_into_a_closed_pipe_prints_no_traceback(tmp_path: Path) -> None:
    """`gradwatch check big.log | head -1`: head exits early; gradwatch must not print a traceback."""
    log = tmp_path / "big.log"
    lines = []
    for step, loss, grad_norm in run_values(6000, interval=1):
        if step > 200 and step % 40 == 0:
            grad_norm *= 50  # a spike every 40 steps: a long report
        lines.append(megatron_line(step, loss, grad_norm) + "\n")
    log.write_text("".join(lines))
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "120"}
    producer = subprocess.Popen(
        [*gradwatch_cmd(), "check", str(log)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert producer.stdout is not None and producer.stderr is not None
    head = subprocess.Popen(["head", "-1"], stdin=producer.stdout, stdout=subprocess.PIPE)
    producer.stdout.close()  # only head reads it now: when head exits, the pipe is closed
    first, _ = head.communicate(timeout=60)
    err = producer.stderr.read().decode()
    producer.stderr.close()
    rc = producer.wait(timeout=60)
    assert first.decode().strip() == "incidents"  # (the report leads with them)
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert err == ""
    assert rc in (0, 1)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full on this system")
@pytest.mark.parametrize(
    "args",
    [["config", "show"], ["formats"], ["check", "--output", "json", "{log}"], ["check", "{log}"], ["--help"]],
)
def test_output_to_a_full_disk_is_one_line_and_exit_2(args: list[str]) -> None:
    """`gradwatch config show > /dev/full`: every command printed a traceback (found by QA)."""
    log = str(REPO / "examples" / "logs" / "hf-trainer-nan.log")
    with open("/dev/full", "w") as full:
        p = subprocess.run(
            [*gradwatch_cmd(), *(a.format(log=log) for a in args)],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    assert (p.returncode, p.stderr) == (2, "error: cannot write the output: No space left on device\n")


# ---- export ------------------------------------------------------------------------------------
def read_records(path: Path) -> pd.DataFrame:
    if path.suffix == ".csv":
        return pd.read_csv(path)
    if path.suffix == ".jsonl":
        return pd.read_json(path, lines=True)
    return pd.read_parquet(path)


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".parquet"])
def test_export_writes_the_records(spike_log: Path, tmp_path: Path, suffix: str) -> None:
    out = tmp_path / f"records{suffix}"
    p = no_traceback(run_cli("export", str(spike_log), "--out", str(out)))
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == f"wrote 300 records to {out}, read as megatron"
    records = read_records(out)
    assert len(records) == 300
    values = run_values(300, spike_at=2500)
    assert records["step"].tolist() == [s for s, _, _ in values]
    for i in (0, 123, 249, 299):
        step, loss, grad_norm = values[i]
        row = records.iloc[i]
        assert row["loss"] == pytest.approx(printed(loss, ".6E"))
        assert row["grad_norm"] == pytest.approx(printed(grad_norm, ".3f"))
        assert row["loss_scale"] == 65536.0
        assert row["lr"] == pytest.approx(6e-5)
        assert row["step_time_s"] == pytest.approx(59.6657)
        assert row["samples"] == step * 176
        assert row["line"] == i + 1


def test_export_to_an_unknown_type_is_a_usage_error(spike_log: Path, tmp_path: Path) -> None:
    out = tmp_path / "x.txt"
    p = no_traceback(run_cli("export", str(spike_log), "--out", str(out)))
    assert p.returncode == 2
    assert "--out" in p.stderr and ".txt" in p.stderr and ".parquet" in p.stderr
    assert not out.exists()


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("-", "error: export reads one log file, not standard input"),
        ("DIR", "error: export reads one log file, not DIR, a directory"),
    ],
)
def test_export_of_a_directory_or_standard_input_says_what_it_reads(
    spike_log: Path, tmp_path: Path, source: str, message: str
) -> None:
    """(It said "is a directory with no log files" of a folder of logs, and "-: no such file"; found by QA.)"""
    source = str(spike_log.parent) if source == "DIR" else source
    p = no_traceback(run_cli("export", source, "--out", str(tmp_path / "r.csv"), stdin=spike_log.read_bytes()))
    assert p.returncode == 2 and p.stderr == message.replace("DIR", source) + "\n"


_FROZEN_AT_EXIT = """
import atexit, gc, sys
atexit.register(lambda: print("frozen at exit:", gc.get_freeze_count() > 0))
sys.argv = ["gradwatch", *sys.argv[1:]]
from gradwatch.cli import main
main()
"""


@pytest.mark.parametrize("args", [("--version",), ("check", "no-such.log")])
def test_the_process_ends_without_collecting_its_garbage(args: tuple[str, ...]) -> None:
    """What is left when the command is done is frozen out of the garbage collector, whatever the
    exit code: the shutdown's collections over pandas' modules cost a tenth of a second. Exit
    handlers still run, and the output is whole."""
    done = subprocess.run([sys.executable, "-c", _FROZEN_AT_EXIT, *args], capture_output=True, text=True, timeout=60)
    assert done.stdout.rstrip().endswith("frozen at exit: True"), done
    assert done.returncode == (0 if args == ("--version",) else 2), done

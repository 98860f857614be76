"""`--exclude`, folder walks that skip files in no known format, and `--select`/`--ignore`.

The CLI runs in real subprocesses on files written into tmp_path (`run_in`: no config of the
machine's user in sight).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest

from gradwatch import config
from gradwatch.detectors import DETECTORS
from gradwatch.sources.exclude import Excludes
from gradwatch.sources.paths import expand
from tests.conftest import gradwatch_cmd
from tests.tail_writer import write_lines
from tests.test_bad_input import megatron_log
from tests.test_config_discovery import run_in
from tests.test_tail import tails, wait_until  # noqa: F401  (the fixture: `gradwatch tail` subprocesses)

NOTES = "remember to buy milk\nrerun with lr 3e-4\n"


@pytest.fixture
def logs(tmp_path: Path) -> Path:
    """`logs/`: a log with one grad-norm spike (a warning) beside notes.txt and requirements.txt."""
    (tmp_path / "home").mkdir()
    folder = tmp_path / "logs"
    folder.mkdir()
    (folder / "train.log").write_text(megatron_log(300, spike_at=2500))
    (folder / "notes.txt").write_text(NOTES)
    (folder / "requirements.txt").write_text("numpy==1.26\ntorch>=2.2\n")
    return folder


def detectors_of(stdout: str) -> list[str]:
    """The detectors of the alerts in check's JSON."""
    return [a["detector"] for a in json.loads(stdout)["alerts"]]


def detectors_run(logs: Path, *flags: str) -> set[str]:
    """The detectors that judged train.log: JUnit's test cases."""
    p = run_in(logs, "check", "train.log", "--output", "junit", *flags)
    return {case.get("name", "") for case in ElementTree.fromstring(p.stdout).iter("testcase")}


def test_folder_walk_skips_files_in_no_known_format_with_one_note(logs: Path) -> None:
    p = run_in(logs.parent, "check", "logs", "--output", "json")
    assert p.returncode == 1, p.stderr  # the spike's warning, not the notes' exit 2
    assert [f["path"] for f in json.loads(p.stdout)["files"]] == ["logs/train.log"]
    assert p.stderr.splitlines() == ["note: skipped 2 files in no known format: logs/notes.txt, logs/requirements.txt"]


def test_glob_walk_skips_them_too(logs: Path) -> None:
    p = run_in(logs.parent, "check", "logs/*.*")
    assert p.returncode == 1
    assert "skipped 2 files in no known format" in p.stderr
    assert "notes.txt" not in p.stdout


def test_a_file_named_on_the_command_line_still_fails(logs: Path) -> None:
    p = run_in(logs.parent, "check", "logs/train.log", "logs/notes.txt")
    assert p.returncode == 2
    assert "logs/notes.txt: has 2 lines but no training records" in p.stdout + p.stderr


def test_a_walk_that_finds_no_log_in_a_known_format_fails(logs: Path) -> None:
    (logs / "train.log").unlink()
    p = run_in(logs.parent, "check", "logs")
    assert p.returncode == 2
    assert "no log files in a known format in logs" in p.stderr and "notes.txt" in p.stderr


def test_a_walked_crash_log_with_a_traceback_is_reported(logs: Path) -> None:
    """No records, but an alert that says the run died: not a file to skip."""
    (logs / "crash.txt").write_text(
        "Traceback (most recent call last):\n"
        '  File "train.py", line 10, in <module>\n'
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    )
    p = run_in(logs.parent, "check", "logs", "--output", "json")
    assert "logs/crash.txt" in [f["path"] for f in json.loads(p.stdout)["files"]]
    assert "trainer_error" in detectors_of(p.stdout)


def test_quiet_check_keeps_the_note_to_itself(logs: Path) -> None:
    p = run_in(logs.parent, "check", "logs", "--quiet")
    assert p.returncode == 1
    assert "note:" not in p.stderr


@pytest.mark.parametrize(
    ("globs", "left"),
    [
        (("*.txt",), ["logs/old/train.log", "logs/train.log"]),
        (("notes.txt", "requirements.txt"), ["logs/old/train.log", "logs/train.log"]),
        (("old",), ["logs/notes.txt", "logs/requirements.txt", "logs/train.log"]),
        (("logs/old/*",), ["logs/notes.txt", "logs/requirements.txt", "logs/train.log"]),
        (("train*",), ["logs/notes.txt", "logs/requirements.txt"]),
        ((str(Path("/") / "*" / "old" / "*"),), ["logs/notes.txt", "logs/requirements.txt", "logs/train.log"]),
    ],
)
def test_exclude_matches_names_folders_and_path_ends(logs: Path, globs: tuple[str, ...], left: list[str]) -> None:
    (logs / "old").mkdir()
    (logs / "old" / "train.log").write_text(megatron_log(50))
    assert expand([str(logs)], Excludes(globs)).files == [logs.parent / f for f in left]


def test_exclude_on_check_scan_and_report(logs: Path, tmp_path: Path) -> None:
    (logs / "other.log").write_text(megatron_log(300))
    p = run_in(logs.parent, "check", "logs", "--exclude", "*.txt", "--exclude", "train*", "--output", "json")
    assert p.returncode == 0, p.stdout
    assert [f["path"] for f in json.loads(p.stdout)["files"]] == ["logs/other.log"]
    assert "note:" not in p.stderr  # the excluded files were never read
    p = run_in(logs.parent, "scan", "logs", "--state", str(tmp_path / "s.json"), "--exclude", "other.log")
    assert p.returncode == 1
    assert "other.log" not in p.stdout and "logs/train.log" in p.stdout
    p = run_in(logs.parent, "report", "logs", "--out", str(tmp_path / "r.html"), "--exclude", "*.txt")
    assert p.returncode == 0, p.stderr
    assert "2 logs" in p.stdout
    p = run_in(
        logs.parent, "report", "logs", "--out", str(tmp_path / "r.html"), "--exclude", "*.txt", "--exclude", "o*"
    )
    assert "1 log," in p.stdout


def test_exclude_that_leaves_nothing_is_an_error(logs: Path) -> None:
    p = run_in(logs.parent, "check", "logs", "--exclude", "*")
    assert p.returncode == 2
    assert "no log files found in logs" in p.stderr


def test_scan_skips_walked_files_in_no_known_format(logs: Path, tmp_path: Path) -> None:
    p = run_in(logs.parent, "scan", "logs", "--state", str(tmp_path / "s.json"), "--output", "json")
    assert p.returncode == 1, p.stderr
    assert [f["path"] for f in json.loads(p.stdout)["files"]] == ["logs/train.log"]
    assert "note: skipped 2 files in no known format" in p.stderr


def test_select_runs_only_the_detectors_named(logs: Path) -> None:
    log = str(logs / "train.log")
    assert "grad_norm_spike" in detectors_of(run_in(logs, "check", log, "--output", "json").stdout)
    p = run_in(logs, "check", log, "--output", "json", "--select", "nonfinite,loss_spike", "--select", "stall")
    assert p.returncode == 0
    assert detectors_of(p.stdout) == []
    assert detectors_run(logs, "--select", "nonfinite,loss_spike", "--select", "stall") == {
        "nonfinite",
        "loss_spike",
        "stall",
    }


def test_ignore_leaves_detectors_out(logs: Path) -> None:
    p = run_in(logs, "check", str(logs / "train.log"), "--output", "json", "--ignore", "grad_norm_spike")
    assert p.returncode == 0
    assert "grad_norm_spike" not in detectors_of(p.stdout)
    ran = detectors_run(logs, "--ignore", "grad_norm_spike,stall")
    assert ran == {d for d, c in config.load().detectors.items() if c.enabled} - {"grad_norm_spike", "stall"}


def test_select_overrides_a_config_that_disables(logs: Path) -> None:
    (logs / "gradwatch.yaml").write_text("detectors:\n  grad_norm_spike:\n    enabled: false\n")
    log = str(logs / "train.log")
    assert detectors_of(run_in(logs, "check", log, "--output", "json").stdout) == []
    p = run_in(logs, "check", log, "--output", "json", "--select", "grad_norm_spike")
    assert "grad_norm_spike" in detectors_of(p.stdout)


@pytest.mark.parametrize("command", ["check", "tail", "scan"])
def test_unknown_detector_is_a_usage_error_listing_the_known(logs: Path, tmp_path: Path, command: str) -> None:
    extra = ["--state", str(tmp_path / "s.json")] if command == "scan" else []
    p = run_in(logs, command, str(logs / "train.log"), *extra, "--ignore", "grad_norm_spik")
    assert p.returncode == 2
    assert "--ignore: unknown detector 'grad_norm_spik'" in p.stderr
    assert all(det_id in p.stderr for det_id in DETECTORS)


def test_no_detector_left_is_a_usage_error(logs: Path) -> None:
    p = run_in(logs, "check", str(logs / "train.log"), "--select", "stall", "--ignore", "stall")
    assert p.returncode == 2
    assert "no detector to run" in p.stderr


def test_scan_reads_again_when_the_detectors_chosen_change(logs: Path, tmp_path: Path) -> None:
    """Detectors resumed from a state made without grad_norm_spike would never run it: a re-read."""
    state = str(tmp_path / "s.json")
    p = run_in(logs, "scan", "train.log", "--state", state, "--ignore", "grad_norm_spike", "--output", "json")
    assert p.returncode == 0
    assert detectors_of(p.stdout) == []
    p = run_in(logs, "scan", "train.log", "--state", state, "--output", "json")
    assert "grad_norm_spike" in detectors_of(p.stdout)


def test_tail_ignore(logs: Path) -> None:
    """`tail -` reads its standard input to the end; its JSON lines show which detectors ran."""
    log = (logs / "train.log").read_bytes()
    found = {}
    for flags in ([], ["--ignore", "grad_norm_spike"]):
        p = subprocess.run(
            [*gradwatch_cmd(), "tail", "-", "--output", "jsonl", *flags],
            input=log,
            capture_output=True,
            timeout=120,
            env={**os.environ, "HOME": str(logs.parent / "home")},
        )
        assert b"Traceback" not in p.stderr, p.stderr
        rows = [json.loads(line) for line in p.stdout.decode().splitlines()]
        found[bool(flags)] = {r["detector"] for r in rows if r.get("type") == "alert"}
    assert "grad_norm_spike" in found[False]
    assert "grad_norm_spike" not in found[True]


def test_tail_follows_no_excluded_file_named_globbed_or_created_later(tmp_path: Path, tails: Any) -> None:  # noqa: F811
    write_lines(str(tmp_path / "rank0.log"), 1000, 30)
    write_lines(str(tmp_path / "debug.log"), 1000, 30)
    t = tails(str(tmp_path), str(tmp_path / "debug.log"), "--exclude", "debug*")
    t.started()
    write_lines(str(tmp_path / "rank1.log"), 1000, 30)
    write_lines(str(tmp_path / "debug-2.log"), 1000, 30)
    wait_until(lambda: any(o["type"] == "notice" and o["path"].endswith("rank1.log") for o in t.objs))
    summary = t.stop()
    assert sorted(Path(f["path"]).name for f in summary["files"]) == ["rank0.log", "rank1.log"]

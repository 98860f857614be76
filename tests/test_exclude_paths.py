"""The paths a command reads (`sources.paths`): `--exclude` looks at the path from the folder or glob
the user gave, not at the folders above it; each file is read once, by identity, under the first
name it was given by.

The CLI runs in real subprocesses on real folders, symlinks and hard links in tmp_path.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from gradwatch.sources.exclude import Excludes
from gradwatch.sources.paths import expand
from tests.conftest import gradwatch_cmd
from tests.test_bad_input import megatron_log


def run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*gradwatch_cmd(), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_COLOR": "1", "COLUMNS": "120"},
    )


def checked(p: subprocess.CompletedProcess[str]) -> list[str]:
    """The files in check's (or scan's) JSON report."""
    assert "Traceback" not in p.stderr, p.stderr
    return [f["path"] for f in json.loads(p.stdout)["files"]]


@pytest.fixture
def old(tmp_path: Path) -> Path:
    """old/logs/ (a folder named old above the logs) with train.log, old/x.log and tmp/y.log."""
    logs = tmp_path / "old" / "logs"
    for name in ("train.log", "old/x.log", "tmp/y.log"):
        (logs / name).parent.mkdir(parents=True, exist_ok=True)
        (logs / name).write_text(megatron_log(30))
    return tmp_path


# ---- --exclude: from the folder or glob given on --------------------------------------------------
@pytest.mark.parametrize("root", ["old/logs", "ABSOLUTE/old/logs"])
def test_exclude_never_matches_a_folder_above_the_one_given(old: Path, root: str) -> None:
    """`--exclude old` leaves out old/ inside the logs, not the logs under a folder named old
    (it left out every file: "no log files found"), whether the folder is given relative or absolute."""
    given = root.replace("ABSOLUTE", str(old))
    p = run(old, "check", given, "--exclude", "old", "--output", "json")
    assert p.returncode == 0, p.stderr
    assert checked(p) == [f"{given}/tmp/y.log", f"{given}/train.log"]
    p = run(old, "check", given, "--exclude", "tmp", "--output", "json")
    assert checked(p) == [f"{given}/old/x.log", f"{given}/train.log"]


def test_exclude_in_a_glob_looks_from_the_globs_folder_on(old: Path) -> None:
    p = run(old, "check", f"{old}/old/logs/*/*.log", "--exclude", "old", "--output", "json")
    assert checked(p) == [f"{old}/old/logs/tmp/y.log"]
    p = run(old, "scan", f"{old}/old/*/*.log", "--exclude", "tmp", "--state", "st", "--output", "json")
    assert p.returncode == 0, p.stderr
    assert checked(p) == [f"{old}/old/logs/train.log"]


@pytest.mark.parametrize(
    ("glob", "root", "left"),
    [
        ("old", "old/logs", ["tmp/y.log", "train.log"]),  # a folder below the root, not the one above
        ("logs/old/*", "old/logs", ["tmp/y.log", "train.log"]),  # a path from the root's own name on
        ("old/logs/*", "old/logs", []),  # the whole path as given
        ("*/tmp/*", "old/logs", ["old/x.log", "train.log"]),
        ("ABSOLUTE/*/old/*", "ABSOLUTE/old/logs", ["tmp/y.log", "train.log"]),  # an absolute glob
        ("*.log", "old/logs", []),
    ],
)
def test_exclude_globs_and_what_they_see(
    old: Path, monkeypatch: pytest.MonkeyPatch, glob: str, root: str, left: list[str]
) -> None:
    monkeypatch.chdir(old)
    root, glob = root.replace("ABSOLUTE", str(old)), glob.replace("ABSOLUTE", str(old))
    assert expand([root], Excludes((glob,))).files == [Path(root) / f for f in left]


def test_a_file_named_is_matched_as_it_was_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A shell expands `runs/*/*.log` before gradwatch sees it: the folders named count, those
    above the working directory do not (they were looked at as part of the absolute path)."""
    monkeypatch.chdir(tmp_path)
    assert not any(Excludes((part,)).matches(Path("runs/old/a.log")) for part in tmp_path.parts[1:])
    assert Excludes(("old",)).matches(Path("runs/old/a.log"))
    assert not Excludes(("runs/new",)).matches(Path("runs/old/a.log"))
    assert Excludes(("old/*",)).matches(Path("runs/old/a.log"))


# ---- each file once, under the first name given --------------------------------------------------
@pytest.fixture
def logs(tmp_path: Path) -> Path:
    """logs/train.log (a spike), logs/other.log, a symlink and a hard link to train.log beside logs/."""
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "train.log").write_text(megatron_log(300, spike_at=2500))
    (tmp_path / "logs" / "other.log").write_text(megatron_log(40))
    (tmp_path / "link.log").symlink_to("logs/train.log")
    os.link(tmp_path / "logs" / "train.log", tmp_path / "hard.log")
    return tmp_path


@pytest.mark.parametrize(
    ("args", "files"),
    [
        (["logs/train.log", "logs"], ["logs/train.log", "logs/other.log"]),
        (["logs/train.log", "logs/train.log"], ["logs/train.log"]),
        (["logs/*.log", "logs/t*"], ["logs/other.log", "logs/train.log"]),
        (["link.log", "logs", "hard.log"], ["link.log", "logs/other.log"]),
        (["logs", "./logs/train.log", "hard.log"], ["logs/other.log", "logs/train.log"]),
    ],
)
def test_check_reads_each_file_once_by_identity(logs: Path, args: list[str], files: list[str]) -> None:
    """A file given twice (by name, folder, glob, symlink or hard link) was read and reported
    twice, its alerts doubled."""
    p = run(logs, "check", *args, "--output", "json")
    assert checked(p) == files
    spikes = [a for a in json.loads(p.stdout)["alerts"] if a["severity"] == "warning"]
    assert len(spikes) == 1 and spikes[0]["detector"] == "grad_norm_spike"


def test_scan_and_report_read_each_file_once(logs: Path) -> None:
    p = run(logs, "scan", "logs/train.log", "logs", "link.log", "--state", "st", "--output", "json")
    assert checked(p) == ["logs/train.log", "logs/other.log"]
    p = run(logs, "report", "link.log", "logs/train.log", "hard.log", "--out", "r.html")
    assert p.returncode == 0 and "wrote r.html: 1 log, 2 alerts" in p.stdout, p.stdout + p.stderr

"""Stragglers and dead ranks: with `--run`, a file of the run that falls behind the others is a warning.

Rank files are Megatron-DeepSpeed logs written here (`tests.tail_writer`); `check` runs as a
subprocess, `tail` beside files that grow (the `Tail` helper of tests/test_tail.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gradwatch.config import StragglerConfig
from gradwatch.pipeline import FileSummary
from gradwatch.stragglers import StragglerWatch
from tests.conftest import check_json, run_cli
from tests.tail_writer import megatron_line, write_lines
from tests.test_tail import tails, writer  # noqa: F401  (the fixture: `gradwatch tail` subprocesses)


def ranks(tmp_path: Path, counts: list[int], first: int = 1000) -> list[str]:
    """One file per rank, rank r logging steps first .. first + counts[r] - 1."""
    paths = []
    for r, count in enumerate(counts):
        path = tmp_path / f"rank{r}.log"
        write_lines(str(path), first, count)
        paths.append(str(path))
    return paths


def stragglers_of(*args: str) -> list[tuple[str, int, str]]:
    result = check_json(*args)
    return [(a["path"], a["step"], a["message"]) for a in result["alerts"] if a["detector"] == "straggler"]


def test_a_rank_far_behind_is_one_warning_naming_it_and_both_steps(tmp_path: Path) -> None:
    logs = ranks(tmp_path, [400, 400, 150, 400])
    result = check_json("--run", "job7", *logs)
    (alert,) = [a for a in result["alerts"] if a["detector"] == "straggler"]
    assert (alert["severity"], alert["path"], alert["step"]) == ("warning", logs[2], 1149)
    assert alert["message"] == (
        "rank2.log fell behind at step 1,149; the other files of the run reached 1,399 (more than 100 logged steps on)"
    )
    assert [i["id"] for i in result["incidents"]] == ["job7@1149"]


def test_without_run_each_file_is_a_run_of_its_own(tmp_path: Path) -> None:
    assert stragglers_of(*ranks(tmp_path, [400, 400, 150, 400])) == []


def test_ranks_that_end_together_or_near_raise_nothing(tmp_path: Path) -> None:
    """Up to `lag_logs` logged steps behind: output held in a buffer, a kill that lost its last lines."""
    assert stragglers_of("--run", "job", *ranks(tmp_path, [400, 400, 320, 350])) == []


def test_the_lag_is_counted_in_logged_steps(tmp_path: Path) -> None:
    """Records every 10 steps: 60 records behind is 600 steps but 60 logs: not a straggler; 120 logs is."""
    logs = []
    for r, last in enumerate([2990, 2990, 2390, 1790]):
        path = tmp_path / f"rank{r}.log"
        path.write_text("".join(megatron_line(s) for s in range(1000, last + 1, 10)))
        logs.append(str(path))
    assert [(p, s) for p, s, _ in stragglers_of("--run", "job", *logs)] == [(logs[3], 1790)]


def test_successive_jobs_and_ranks_without_steps_are_not_stragglers(tmp_path: Path) -> None:
    """`slurm-%j.out` of a requeued run: the first job's file ends where the next resumed (and
    before it); Megatron prints progress from one rank: the other ranks' files hold no step."""
    first, second, quiet = tmp_path / "slurm-1.out", tmp_path / "slurm-2.out", tmp_path / "rank0.log"
    write_lines(str(first), 1000, 400)
    write_lines(str(second), 1300, 900)
    quiet.write_text("> building train, validation, and test datasets ...\nNCCL INFO Bootstrap : Using eth0\n")
    assert stragglers_of("--run", "job", str(first), str(second), str(quiet)) == []


def test_the_config_sets_the_lag_and_can_turn_it_off(tmp_path: Path) -> None:
    logs = ranks(tmp_path, [400, 400, 320])
    lax, off = tmp_path / "lax.yaml", tmp_path / "off.yaml"
    lax.write_text("stragglers:\n  lag_logs: 50\n")
    off.write_text("stragglers:\n  enabled: false\n  lag_logs: 50\n")
    assert [(p, s) for p, s, _ in stragglers_of("--run", "job", "--config", str(lax), *logs)] == [(logs[2], 1319)]
    assert stragglers_of("--run", "job", "--config", str(off), *logs) == []


# ---- tail --------------------------------------------------------------------------------------------
def summary(path: str, first: int, last: int) -> FileSummary:
    return FileSummary(path, records=last - first + 1, first_step=first, last_step=last)


def test_the_watch_tells_a_silent_file_once_while_the_others_go_on() -> None:
    watch = StragglerWatch(StragglerConfig())
    files = [summary("a", 1, 50), summary("b", 1, 50), summary("c", 1, 40)]
    limits = dict.fromkeys("abc", 600.0)
    assert watch.look(files, {"a": 1000, "b": 1000, "c": 1000}, limits, now=1500) == []  # c not silent long enough
    assert watch.look(files, {"a": 800, "b": 800, "c": 300}, limits, now=1500) == []  # a, b silent too: a hang
    (alert,) = watch.look(files, {"a": 1400, "b": 1400, "c": 300}, limits, now=1500)
    assert (alert.detector, alert.path, alert.step) == ("straggler", "c", 40)
    assert "fell silent after step 40; the other files of the run went on to 50" in alert.message
    assert watch.look(files, {"a": 1450, "b": 1450, "c": 300}, limits, now=1510) == []  # told once
    unknown = dict.fromkeys("abc", float("inf"))  # the stall detector does not know the pace yet
    assert StragglerWatch(StragglerConfig()).look(files, {"a": 1400, "b": 1400, "c": 0}, unknown, now=1500) == []


def test_tail_warns_about_a_rank_far_behind(tmp_path: Path, tails: Any) -> None:  # noqa: F811
    logs = ranks(tmp_path, [400, 400, 150])
    t = tails(*logs, "--run", "job7")
    alert = t.wait_for(lambda o: o["type"] == "alert" and o["detector"] == "straggler", what="straggler alert")
    assert (alert["path"], alert["step"], alert["severity"]) == (logs[2], 1149, "warning")
    assert "the other files of the run are at 1,399" in alert["message"]
    t.stop()
    assert len(t.alerts("straggler")) == 1


def test_tail_warns_about_a_rank_that_falls_silent_while_the_others_go_on(
    tmp_path: Path,
    tails: Any,  # noqa: F811
) -> None:
    logs = ranks(tmp_path, [30, 30, 30])
    config = tmp_path / "fast-stall.yaml"
    config.write_text("detectors:\n  stall:\n    floor_s: 3.0\n    factor: 1.0\n")
    t = tails(*logs, "--run", "job7", "--config", str(config))
    t.started()
    # (writing on for 15 s, silent for 3 s at most: a loaded machine that holds a writer back for
    # a second still sees the others go on while this one is silent)
    going = [writer(Path(log), "--first", "1030", "--count", "300", "--rate", "20") for log in logs[:2]]
    try:
        alert = t.wait_for(
            lambda o: o["type"] == "alert" and o["detector"] == "straggler", timeout=20, what="straggler alert"
        )
    finally:
        for w in going:
            w.kill()
            w.wait()
    assert (alert["path"], alert["step"]) == (logs[2], 1029) and "fell silent after step 1,029" in alert["message"]
    t.stop()
    assert [a["path"] for a in t.alerts("straggler")] == [logs[2]]


def test_scan_run_warns_once_about_a_rank_that_stays_behind(tmp_path: Path) -> None:
    """cron's `scan --run`: the rank that fell behind is told at the scan that sees it, not again
    at the next while it stays at the same step; a rank that later falls behind is told then."""
    logs = ranks(tmp_path, [400, 400, 150, 400])
    state = tmp_path / "state.json"

    def scanned() -> list[tuple[str, int]]:
        p = run_cli("scan", "--run", "job7", "--state", str(state), "--output", "json", *logs)
        assert p.returncode in (0, 1), p.stderr
        return [(a["path"], a["step"]) for a in json.loads(p.stdout)["alerts"] if a["detector"] == "straggler"]

    assert scanned() == [(logs[2], 1149)]
    for log in (logs[0], logs[1], logs[3]):
        write_lines(log, 1400, 100)
    assert scanned() == []  # rank 2 is still behind at the same step: told already
    write_lines(logs[0], 1500, 300)
    write_lines(logs[1], 1500, 300)
    assert scanned() == [(logs[3], 1499)]

"""A fault of gradwatch's own on one file's content fails that file alone (exit 2, one message
naming it), and every other file is still checked, scanned (its state saved), followed and reported.

No log here makes gradwatch fail (that would be a bug to fix): the batches of the file named
`bad.log` fail on their way to the detectors, which is the only way to stand in for such a bug:
in the test's process for check and scan, in a `gradwatch tail` process of its own
(`FAULTY_GRADWATCH`) for tail.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from gradwatch import pipeline
from gradwatch.cli import cli
from gradwatch.detectors.base import ColumnBatch
from gradwatch.parsers.stream import Batch
from tests import test_tail
from tests.conftest import REPO
from tests.tail_writer import write_lines


class Failing(ColumnBatch):
    """Each batch on its way to the detectors: the bad file's fail."""

    @classmethod
    def of(cls, batch: Batch) -> ColumnBatch:
        if batch.path.endswith("bad.log"):
            raise ZeroDivisionError("boom")
        return ColumnBatch.of(batch)


#: `python -c` this and gradwatch's arguments: the command line, with `Failing` in place.
FAULTY_GRADWATCH = f"""
import runpy, sys
sys.path.insert(0, {str(REPO)!r})
from gradwatch import pipeline
from tests.test_file_boundary import Failing
pipeline.ColumnBatch = Failing
runpy.run_module("gradwatch", run_name="__main__")
"""


@pytest.fixture
def logs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    good, bad = tmp_path / "good.log", tmp_path / "bad.log"
    write_lines(str(good), 1000, 300, spikes={1200})
    write_lines(str(bad), 1000, 300)
    monkeypatch.setattr(pipeline, "ColumnBatch", Failing)
    return good, bad


MESSAGE = "gradwatch failed on this file (ZeroDivisionError: boom)"


def test_check_fails_the_file_alone(logs: tuple[Path, Path]) -> None:
    good, bad = logs
    result = CliRunner().invoke(cli, ["check", "--output", "json", str(bad), str(good)])
    assert result.exit_code == 2, result.output
    report = json.loads(result.stdout)
    errors = {Path(f["path"]).name: f["error"] for f in report["files"]}
    assert errors["good.log"] is None and MESSAGE in errors["bad.log"], errors
    spikes = [(a["path"], a["step"]) for a in report["alerts"] if a["detector"] == "grad_norm_spike"]
    assert spikes[0] == (str(good), 1200) and {path for path, _ in spikes} == {str(good)}, spikes


def test_scan_fails_the_file_alone_and_saves_the_others(logs: tuple[Path, Path], tmp_path: Path) -> None:
    good, bad = logs
    state = tmp_path / "state.json"
    args = ["scan", "--state", str(state), "--output", "json", str(bad), str(good)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    report = json.loads(result.stdout)
    errors = {Path(f["path"]).name: f["error"] for f in report["files"]}
    assert MESSAGE in errors["bad.log"], errors
    assert 1200 in [a["step"] for a in report["alerts"] if a["detector"] == "grad_norm_spike"]
    write_lines(str(good), 1300, 10)
    again = json.loads(CliRunner().invoke(cli, args).stdout)
    reads = {Path(f["path"]).name: f for f in again["files"]}
    assert reads["good.log"]["new_bytes"] < good.stat().st_size / 10, reads  # read on from where it stopped


def test_tail_stops_judging_the_file_alone_and_follows_the_others(
    logs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One notice names the file, once; the other file's alerts come, from its history and live;
    the bad file's spikes raise nothing; the summary and the exit code say 2."""
    good, bad = logs
    monkeypatch.setattr(test_tail, "gradwatch_cmd", lambda: [sys.executable, "-c", FAULTY_GRADWATCH])
    tail = test_tail.Tail(str(bad), str(good))
    try:
        tail.started()
        tail.alert_at(1200)  # the good file's history
        write_lines(str(bad), 1300, 30, spikes={1310})
        write_lines(str(good), 1300, 30, spikes={1320})
        tail.alert_at(1320, timeout=30)  # live
        write_lines(str(bad), 1330, 30, spikes={1340})  # still not judged
        summary = tail.stop()
    finally:
        tail.close()
    assert tail.proc.returncode == 2 and summary["exit_code"] == 2, summary
    failed = [o for o in tail.objs if o["type"] == "notice" and o["kind"] == "unreadable"]
    assert len(failed) == 1 and failed[0]["path"] == str(bad) and MESSAGE in failed[0]["detail"], failed
    alerted = {(Path(a["path"]).name, a["step"]) for a in tail.objs if a["type"] == "alert"}
    assert {("good.log", 1200), ("good.log", 1320)} <= alerted and not {f for f, _ in alerted} - {"good.log"}, alerted

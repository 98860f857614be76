"""`--snapshot-dir`: the evidence file written for each warning or critical alert.

Logs are synthetic runs (gradwatch.synth) with an injected grad-norm spike; the oracle for raw
lines is the log file itself, for records the step numbers the generator wrote. `check` and `scan`
run as real subprocesses; the incremental path (lines after an alert arriving in later chunks) is
driven in-process through the same `FileCheck` the commands use.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gradwatch import config, synth
from gradwatch.errors import ConfigError
from gradwatch.evidence import CUT_MARK
from gradwatch.pipeline import FileCheck
from gradwatch.sinks.snapshot import SUFFIX, SnapshotWriter
from tests.conftest import run_cli
from tests.tail_writer import megatron_line
from tests.test_bad_input import strict_json

SPIKE_STEP = 900
SPEC = synth.RunSpec(
    fmt="megatron-deepspeed", steps=1500, seed=3, anomalies=(synth.Anomaly("grad_norm_spike", SPIKE_STEP, 3.0),)
)


@pytest.fixture(scope="module")
def spike_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("run42") / "main_log.txt"
    synth.write_log(path, SPEC)
    return path


def check_json(*args: str) -> tuple[int, dict[str, Any]]:
    p = run_cli("check", "--output", "json", *args)
    assert "Traceback" not in p.stderr and p.stderr == "", p.stderr
    return p.returncode, strict_json(p.stdout)


def load_snapshot(path: str | Path) -> dict[str, Any]:
    return strict_json(Path(path).read_text())


def snapshots_in(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(SUFFIX))


# ---- what a snapshot holds -------------------------------------------------------------------------
def test_a_spike_gets_a_snapshot_with_its_records_raw_lines_and_detector_settings(
    spike_log: Path, tmp_path: Path
) -> None:
    out = tmp_path / "evidence"  # created by gradwatch
    rc, report = check_json(str(spike_log), "--snapshot-dir", str(out))
    assert rc == 1
    [alert] = [a for a in report["alerts"] if a["detector"] == "grad_norm_spike" and a["severity"] != "info"]
    assert alert["step"] == SPIKE_STEP
    # every warning/critical alert names its file, every info alert none, and the files are all there
    for a in report["alerts"]:
        assert (a["snapshot"] is None) == (a["severity"] == "info")
    assert snapshots_in(out) == sorted(Path(a["snapshot"]).name for a in report["alerts"] if a["snapshot"])
    name = Path(alert["snapshot"]).name
    assert name.startswith(f"{spike_log.parent.name}-main_log.txt-")
    assert name.endswith(f".grad_norm_spike.step{SPIKE_STEP}{SUFFIX}")

    snap = load_snapshot(alert["snapshot"])
    assert snap["version"] == 1 and snap["complete"] is True
    assert snap["alert"] == {**alert, "incident": None}  # (written as found, before it is grouped)
    cfg = config.load().snapshots
    # the last 200 records up to the alert's line: one per step in this log, ending at the spike
    steps = snap["records"]["step"]
    assert steps == list(range(SPIKE_STEP - cfg.records + 1, SPIKE_STEP + 1))
    assert snap["records"]["line"][-1] == alert["line"]
    assert snap["records"]["grad_norm"][-1] == pytest.approx(alert["value"])
    assert {"loss", "grad_norm", "loss_scale", "lr"} <= set(snap["records"])
    assert all(len(col) == cfg.records for col in snap["records"].values())
    # the raw lines around it, exactly as the file has them
    lines = spike_log.read_text().split("\n")
    first, last = alert["line"] - cfg.lines_before, alert["line"] + cfg.lines_after
    assert [x["line"] for x in snap["lines"]] == list(range(first, last + 1))
    assert [x["text"] for x in snap["lines"]] == lines[first - 1 : last]
    assert f"iteration {SPIKE_STEP:8d}/" in snap["lines"][cfg.lines_before]["text"]
    # what the detector compared, and how it is set up
    det = snap["detector"]
    assert (det["id"], det["baseline"], det["threshold"]) == ("grad_norm_spike", alert["baseline"], alert["threshold"])
    assert det["config"]["window"] == 128
    assert all(e["line"] <= alert["line"] for e in snap["events"])
    assert snap["run"]["path"] == str(spike_log) and snap["run"]["format"] == "megatron"
    assert set(snap["host"]) >= {"hostname", "time", "gradwatch"}


def test_lines_after_the_alert_complete_the_snapshot_when_they_arrive(spike_log: Path, tmp_path: Path) -> None:
    """Fed in pieces (as tail reads a growing file), the snapshot is first written without the lines
    after the alert, then again, complete, when they come: the same as from a single read."""
    data = spike_log.read_bytes()
    settings = config.load()

    def snapshot(pieces: list[bytes], out: Path) -> tuple[int, list[bool], dict[str, Any]]:
        writer = SnapshotWriter.open(str(out), settings.snapshots, warn=pytest.fail)
        check = FileCheck(str(spike_log), settings)
        writer.watch(check)
        line, complete = 0, []
        for piece in pieces:
            for alert in writer.attach(check, check.feed(piece)):
                if alert.detector == "grad_norm_spike" and alert.snapshot is not None:
                    line = alert.line or 0
            if line:
                [name] = [n for n in snapshots_in(out) if ".grad_norm_spike." in n]
                complete.append(load_snapshot(out / name)["complete"])
        writer.attach(check, check.close())
        writer.close(check)
        return line, complete, load_snapshot(out / name)

    line, complete, whole = snapshot([data], tmp_path / "whole")
    assert complete == [True]
    cut = sum(len(x) for x in data.splitlines(keepends=True)[: line + 2])  # 2 of the 10 lines after it
    pieces = [data[:cut]] + [data[i : i + 4096] for i in range(cut, len(data), 4096)]
    _, complete, pieced = snapshot(pieces, tmp_path / "pieces")
    assert complete[0] is False and complete[-1] is True
    assert pieced["complete"] is True
    assert (pieced["lines"], pieced["records"], pieced["events"]) == (whole["lines"], whole["records"], whole["events"])


def test_a_long_line_is_cut_and_an_alert_at_the_end_of_input_keeps_what_there_is(tmp_path: Path) -> None:
    log = tmp_path / "long.log"
    lines = [megatron_line(step) for step in range(1000, 1200)]
    lines[190] = "x" * 100_000 + "\n"
    log.write_text("".join(lines) + megatron_line(1200, spike=True) + megatron_line(1201))  # the spike: line 201
    rc, report = check_json(str(log), "--snapshot-dir", str(tmp_path / "ev"))
    [alert] = [a for a in report["alerts"] if a["snapshot"]]
    assert rc == 1 and alert["line"] == 201
    snap = load_snapshot(alert["snapshot"])
    limit = config.load().snapshots.max_line_chars
    by_line = {x["line"]: x["text"] for x in snap["lines"]}
    assert by_line[191] == "x" * limit + CUT_MARK
    assert list(by_line) == list(range(161, 203))  # 40 before, and the one line after that exists
    assert snap["complete"] is True and len((tmp_path / "ev" / Path(alert["snapshot"]).name).read_bytes()) < 200_000


# ---- bounds and errors ---------------------------------------------------------------------------------
def test_the_oldest_snapshots_are_pruned_past_max_files_and_other_files_are_kept(tmp_path: Path) -> None:
    log = tmp_path / "spiky.log"
    spikes = set(range(1200, 1400, 40))  # 5 incidents, each its own snapshot
    log.write_text("".join(megatron_line(s, s in spikes) for s in range(1000, 1420)))
    out = tmp_path / "ev"
    out.mkdir()
    (out / "notes.json").write_text("{}")
    cfg = tmp_path / "c.yaml"
    cfg.write_text("snapshots:\n  max_files: 3\n  records: 20\n")
    rc, report = check_json(str(log), "--config", str(cfg), "--snapshot-dir", str(out))
    named = [Path(a["snapshot"]).name for a in report["alerts"] if a["snapshot"]]
    assert rc == 1 and len(named) == 5 and len(set(named)) == 5
    assert snapshots_in(out) == sorted(named[-3:])  # the newest three
    assert (out / "notes.json").read_text() == "{}"
    assert len(load_snapshot(out / named[-1])["records"]["step"]) == 20


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("snapshots:\n  recrods: 10\n", r"unknown key 'snapshots\.recrods'"),
        ("snapshots:\n  max_files: 0\n", r"snapshots: max_files must be at least 1"),
        ("snapshots:\n  lines_before: many\n", r"snapshots\.lines_before must be an integer"),
        ("snapshots: [1]\n", r"snapshots must be a mapping"),
    ],
)
def test_the_snapshots_section_is_validated_strictly(tmp_path: Path, text: str, match: str) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=match):
        config.load(f)


def test_a_snapshot_dir_that_is_a_file_is_a_usage_error(spike_log: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    p = run_cli("check", str(spike_log), "--snapshot-dir", str(blocker))
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.startswith("error: --snapshot-dir") or "Error: Invalid value for '--snapshot-dir'" in p.stderr


# ---- scan -----------------------------------------------------------------------------------------------
def test_scan_snapshots_show_lines_read_by_the_previous_scan(spike_log: Path, tmp_path: Path) -> None:
    """A spike at the very start of a scan's new bytes still gets its 40 lines before."""
    data = spike_log.read_bytes()
    rc, report = check_json(str(spike_log))
    spike_line = next(a["line"] for a in report["alerts"] if a["detector"] == "grad_norm_spike")
    cut = sum(len(x) for x in data.splitlines(keepends=True)[: spike_line - 3])  # 2 lines before the spike
    log, state, out = tmp_path / "run.log", tmp_path / "state.json", tmp_path / "ev"
    log.write_bytes(data[:cut])
    scan = ("scan", str(log), "--state", str(state), "--output", "json", "--snapshot-dir", str(out))
    assert run_cli(*scan).returncode == 0
    with open(log, "ab") as fh:
        fh.write(data[cut:])
    p = run_cli(*scan)
    assert "Traceback" not in p.stderr, p.stderr
    alerts = json.loads(p.stdout)["alerts"]
    [alert] = [a for a in alerts if a["detector"] == "grad_norm_spike" and a["snapshot"]]
    snap = load_snapshot(alert["snapshot"])
    assert [x["line"] for x in snap["lines"]][0] == spike_line - 40
    assert len(snap["records"]["step"]) == 200 and snap["records"]["step"][-1] == SPIKE_STEP

"""Incidents: alerts that tell one story are one incident, told in one headline and paged once.

The shipped resume example and Megatron-LM logs written here (one file, or one per rank with the
`[rankN]:` prefix torchrun puts on each line) go through the real pipeline: `check` in this
process or as a subprocess, `tail` as a subprocess beside a log that grows. A tail sees alerts
as they come and `check` sees them all at the end: their incidents must be the same.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gradwatch import config
from gradwatch.alerts import Alert, Severity
from gradwatch.commands.check import run_check
from gradwatch.detectors.base import ColumnBatch
from gradwatch.events import Event, EventKind
from gradwatch.incidents import Correlator
from gradwatch.pipeline import FileCheck
from tests.conftest import REPO, check_json, metric_columns, run_cli
from tests.test_escalation import GROWING, megatron_lm_line, run_with
from tests.test_tail import HOOK, tails, wait_until  # noqa: F401  (the fixture: `gradwatch tail` subprocesses)

SETTINGS = config.load()
EXAMPLE = REPO / "examples/logs/megatron-ds-fp16-resume-collapse.log"
INCIDENT_KEYS = {
    "id",
    "run",
    "paths",
    "severity",
    "first_step",
    "end_step",
    "ended",
    "headline",
    "resumed_at",
    "alerts",
}


def rank_lines(rank: int, first: int, count: int, nan_at: int | None = None) -> str:
    """Rank `rank`'s copy of a Megatron-LM log: every rank prints the same records, NaN where asked."""
    lines = []
    for step in range(first, first + count):
        line = megatron_lm_line(step, 1.0 + 0.01 * (step % 7))
        if step == nan_at:
            line = line.replace(line.split("| grad norm: ")[1].split(" |")[0], "nan")
        lines.append(f"[rank{rank}]:{line}")
    return "".join(lines)


def incidents_of(log: Path, run: str | None = None, *more: Path) -> tuple[list[dict[str, Any]], list[Alert]]:
    report = run_check([str(log), *map(str, more)], SETTINGS, None, Severity.WARNING, run=run)
    return [i.to_json() for i in report.incidents], report.alerts


def fed_as_tail_feeds(text: bytes, path: str, sizes: list[int]) -> tuple[list[dict[str, Any]], list[Alert]]:
    """What `tail` groups: the batches go to the correlator as they are parsed, each read's alerts
    (in line order) after them, then the end of input."""
    correlator = Correlator(SETTINGS.incidents)
    check = FileCheck(path, SETTINGS, on_batch=lambda batch: correlator.observe(path, batch))
    kept: list[Alert] = []
    pos = 0
    for size in [*sizes, len(text)]:
        for alert in sorted(check.feed(text[pos : pos + size]), key=Alert.sort_key):
            kept.append(correlator.add(alert)[0] or alert)
        pos += size
    for alert in sorted(check.close(), key=Alert.sort_key):
        kept.append(correlator.add(alert)[0] or alert)
    correlator.settle()
    return [i.to_json() for i in correlator.incidents], sorted(correlator.alerts, key=Alert.sort_key)


# ---- check ----------------------------------------------------------------------------------------
def test_the_shipped_example_is_one_incident_told_from_its_resume() -> None:
    """Five warnings and two infos of four detectors are one story: the run resumed from the
    checkpoint of 24,000, then the scaler overflowed down to 4, with the spikes and the climb."""
    text = run_cli("check", str(EXAMPLE), env={"COLUMNS": "200"})
    assert text.returncode == 1
    block = text.stdout.split("\n\n")[0].splitlines()
    assert block[0] == "incidents" and block[1].split() == [
        "warning",
        "incident",
        "1",
        "steps",
        "24,300-24,332",
        "(over)",
    ]
    assert block[2].strip() == (
        "resumed at 24,000 (checkpoint load); 11 overflows in 11 steps, loss scale 8,192 → 4; "
        "grad norm 35x; loss 1.6x; loss climbing 1.3x"
    )
    assert (
        text.stdout.rstrip().splitlines()[-1].startswith("1 file checked: 0 critical, 5 warning, 2 info in 1 incident")
    )

    report = check_json(str(EXAMPLE))
    (incident,) = report["incidents"]
    assert set(incident) == INCIDENT_KEYS and report["summary"]["incidents"] == 1
    assert (incident["severity"], incident["first_step"], incident["end_step"]) == ("warning", 24300, 24332)
    assert incident["resumed_at"] == 24000 and incident["ended"] == "over" and incident["paths"] == [str(EXAMPLE)]
    assert incident["headline"] == block[2].strip()
    assert {a["incident"] for a in report["alerts"]} == {incident["id"]}
    listed = [(a["detector"], a["severity"], a["step"], a["line"]) for a in incident["alerts"]]
    assert sorted(listed) == sorted((a["detector"], a["severity"], a["step"], a["line"]) for a in report["alerts"])


def test_alerts_far_apart_are_two_incidents_and_those_near_are_one(tmp_path: Path) -> None:
    """Spikes 500 steps apart are two stories; a spike and the loss spike 2 steps after it, one."""
    log = tmp_path / "main_log.txt"
    log.write_text(run_with({1100: 20.0, 1600: 30.0}, count=700, loss_spikes={1102: 3.0}))
    incidents, alerts = incidents_of(log)
    assert [(i["first_step"], i["severity"], i["ended"], i["resumed_at"]) for i in incidents] == [
        (1100, "warning", "over", None),
        (1600, "warning", "over", None),
    ]
    first, second = incidents
    assert first["headline"].startswith("grad norm 20x; loss 3.0x") and second["headline"] == "grad norm 30x"
    assert {a.detector for a in alerts if a.incident == first["id"]} == {"grad_norm_spike", "loss_spike"}
    assert [a.incident for a in alerts if a.step == 1600] == [second["id"]]


def test_a_restart_ends_the_incident_before_it_and_explains_the_one_after(tmp_path: Path) -> None:
    """A run that crashed into trouble and was resumed from an earlier checkpoint: the trouble
    before the load is over; the spike 30 steps after it is told from the resume."""
    log = tmp_path / "main_log.txt"
    resumed = " loading checkpoint from /ckpt at iteration 1150\n"
    log.write_text(run_with({1180: 20.0}, count=200) + resumed + run_with({1180: 25.0}, first=1151, count=100))
    incidents, _ = incidents_of(log)
    assert [(i["first_step"], i["ended"], i["resumed_at"]) for i in incidents] == [
        (1180, "over", None),
        (1180, "over", 1150),
    ]
    assert incidents[1]["id"] == f"{log}@1180#2"
    assert incidents[1]["headline"] == "resumed at 1,150 (checkpoint load); grad norm 25x"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_incidents_as_alerts_come_are_the_incidents_of_all_alerts_at_once(tmp_path: Path, seed: int) -> None:
    """Fed in random pieces as a tail reads them, or checked whole: the same incidents and alerts."""
    two = tmp_path / "two.log"
    two.write_text(run_with({1100: 20.0, 1600: 30.0}, count=700, loss_spikes={1102: 3.0}))
    rng = random.Random(seed)
    for log in (EXAMPLE, two):
        data = log.read_bytes()
        sizes = [rng.randint(1, 20_000) for _ in range(40)]
        assert fed_as_tail_feeds(data, str(log), sizes) == incidents_of(log)


def test_rank_files_of_one_run_are_one_alert_naming_them(tmp_path: Path) -> None:
    """Four ranks print the same NaN: with --run one alert names the four files, in one incident;
    without it, each file is its own run."""
    logs = [tmp_path / f"rank{r}.log" for r in range(4)]
    for r, log in enumerate(logs):
        log.write_text(rank_lines(r, 1000, 100, nan_at=1050))
    incidents, alerts = incidents_of(logs[0], "job7", *logs[1:])
    (critical,) = [a for a in alerts if a.severity is Severity.CRITICAL]
    assert (critical.detector, critical.step, critical.paths) == ("nonfinite", 1050, tuple(map(str, logs)))
    assert [(i["id"], i["paths"], i["severity"]) for i in incidents] == [
        ("job7@1050", list(map(str, logs)), "critical")
    ]
    apart, _ = incidents_of(logs[0], None, *logs[1:])
    assert len(apart) == 4


def test_an_overflow_that_does_not_say_its_scales_still_counts() -> None:
    """fairseq's overflow lines name no scale: the headline counts the overflow, without a traceback."""
    correlator = Correlator()
    overflow = Event(EventKind.OVERFLOW, 30, 30, data={"attempted": None, "new": 4.0})
    assert (
        correlator.observe("run.log", ColumnBatch(columns=metric_columns({"loss": np.ones(50)}), events=[overflow]))
        == []
    )
    collapse = Alert(
        "loss_scale_collapse", Severity.WARNING, 30, "loss_scale", 4.0, None, None, "fell", "", 31, "run.log"
    )
    kept, [note] = correlator.add(collapse)
    assert kept is not None and (note.event, note.incident, note.headline) == (
        "opened",
        "run.log@30",
        "1 overflow in 1 step",
    )


# ---- tail ------------------------------------------------------------------------------------------
def calls(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []


def test_tail_pages_an_incident_when_it_opens_escalates_and_ends(tmp_path: Path, tails: Any) -> None:  # noqa: F811
    """A spike that grows from 20x to 5,000x its median, with a loss spike beside it, then 60 quiet
    steps: --on-alert runs three times (opened, escalated, ended), not once per alert."""
    log, hook, out = tmp_path / "main_log.txt", tmp_path / "hook.py", tmp_path / "calls.jsonl"
    hook.write_text(HOOK)
    log.write_text(run_with({}, count=60))
    t = tails(str(log), "--on-alert", f"{sys.executable} {hook} {out}", "--on-alert-severity", "warning")
    t.started()
    with log.open("a") as f:
        f.write(run_with(GROWING, first=1060, count=100, loss_spikes={1101: 3.0}))
    t.wait_for(lambda o: o["type"] == "incident" and o["event"] == "ended", what="the incident's end")
    t.stop()
    alerts = [o for o in t.objs if o["type"] == "alert" and o["severity"] != "info"]
    assert len(alerts) >= 3 and len({o["incident"] for o in alerts}) == 1
    got = [(c["stdin"]["event"], c["stdin"]["severity"], c["stdin"]["incident"]) for c in calls(out)]
    incident = alerts[0]["incident"]
    assert got == [
        ("opened", "warning", incident),
        ("escalated", "critical", incident),
        ("ended", "critical", incident),
    ]
    headlines = [c["env"]["GRADWATCH_HEADLINE"] for c in calls(out)]
    assert headlines == ["grad norm 20x", "grad norm 600x; loss 3.0x", "grad norm 600x; loss 3.0x"]


def test_tail_of_four_rank_files_with_the_same_nan_pages_once(tmp_path: Path, tails: Any) -> None:  # noqa: F811
    """`tail --run`: the NaN that four ranks print is one alert, one incident, one --on-alert."""
    logs = [tmp_path / f"rank{r}.log" for r in range(4)]
    hook, out = tmp_path / "hook.py", tmp_path / "calls.jsonl"
    hook.write_text(HOOK)
    for r, log in enumerate(logs):
        log.write_text(rank_lines(r, 1000, 40))
    t = tails(*map(str, logs), "--run", "job7", "--on-alert", f"{sys.executable} {hook} {out}", "--status-every", "0.2")
    t.started()
    for r, log in enumerate(logs):
        with log.open("a") as f:
            f.write(rank_lines(r, 1040, 20, nan_at=1050))
    t.wait_for(lambda o: o["type"] == "incident", what="the incident")
    wait_until(lambda: t.objs[-1]["type"] == "status" and t.objs[-1]["records"] == 4 * 60)
    summary = t.stop()
    assert [f["records"] for f in summary["files"]] == [60] * 4
    critical = [o for o in t.objs if o["type"] == "alert" and o["severity"] == "critical"]
    assert [(o["detector"], o["step"], o["incident"]) for o in critical] == [("nonfinite", 1050, "job7@1050")]
    (call,) = calls(out)
    assert (call["stdin"]["event"], call["env"]["GRADWATCH_INCIDENT"]) == ("opened", "job7@1050")

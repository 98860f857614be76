"""Severity says how bad: an incident that grows past its critical threshold escalates, once.

An ongoing condition raises one alert and then stays quiet until it has been over for `quiet`
rows (`Incident`); a grad norm going from 20x to 5,000x its median used to stay a warning, so
`check --fail-on critical`, `tail --exit-on critical` and `--on-alert-severity critical` never
fired. Now a hit worse than any alert of its incident raises one more alert (same incident,
escalated); a hit at a severity already raised stays quiet. The logs here are Megatron-LM lines
the tests write, read by the real pipeline or the real CLI.
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
from gradwatch.detectors.base import Incident
from gradwatch.pipeline import FileCheck
from tests.conftest import check_json, run_cli
from tests.test_tail import HOOK, tails  # noqa: F401  (the fixture: `gradwatch tail` subprocesses)

SETTINGS = config.load()


def megatron_lm_line(step: int, grad_norm: float, loss: float = 3.2) -> str:
    """One Megatron-LM training log line (formats.md section 1, without DeepSpeed's fields)."""
    return (
        f" [2024-05-02 10:{step // 60 % 60:02d}:{step % 60:02d}] iteration {step:8d}/  500000 | "
        f"consumed samples: {step * 1024:12d} | elapsed time per iteration (ms): 1402.6 | "
        f"learning rate: 2.000E-04 | global batch size:  1024 | lm loss: {loss:.6E} | "
        f"loss scale: 1.0 | grad norm: {grad_norm:.4f} | number of skipped iterations:   0 | "
        f"number of nan iterations:   0 |\n"
    )


def run_with(
    spikes: dict[int, float], first: int = 1000, count: int = 200, loss_spikes: dict[int, float] | None = None
) -> str:
    """`count` records from step `first`, grad norms about 1.0 and losses about 3.2 times the
    factors in `spikes` and `loss_spikes`."""
    loss_spikes = loss_spikes or {}
    return "".join(
        megatron_lm_line(s, (1.0 + 0.01 * (s % 7)) * spikes.get(s, 1.0), (3.3 - 1e-4 * s) * loss_spikes.get(s, 1.0))
        for s in range(first, first + count)
    )


#: a spike that grows within its incident: 20x, then 80x, 600x and 5,000x the median
GROWING = {1100: 20.0, 1101: 80.0, 1102: 600.0, 1103: 5000.0, 1104: 3000.0, 1105: 4000.0}


def check(text: str, sizes: list[int] | None = None) -> list[Alert]:
    """Alerts of the whole pipeline on `text`, fed in pieces of these sizes (then the rest)."""
    fc = FileCheck("run.log", SETTINGS)
    data, pos, alerts = text.encode(), 0, []
    for size in sizes or []:
        alerts += fc.feed(data[pos : pos + size])
        pos += size
    alerts += fc.feed(data[pos:])
    return alerts + fc.close()


def grad_alerts(alerts: list[Alert], detector: str = "grad_norm_spike") -> list[tuple[str, int | None]]:
    return [(str(a.severity), a.step) for a in alerts if a.detector == detector]


# ---------------------------------------------------------------------------------------------
# Incident


def test_incident_escalates_once_per_severity() -> None:
    """A hit worse than any raised for its incident is one "escalate"; a same-level hit is quiet."""
    w, c = Severity.WARNING, Severity.CRITICAL
    inc = Incident(quiet=5)
    hits = np.array([0, 1, 2, 3, 4, 20, 21])
    levels = np.array([w, w, c, c, w, w, c])
    out = inc.scan(0, 30, hits, np.arange(100, 130), levels)
    assert out == [
        ("open", 0, 100),
        ("escalate", 2, 100),
        ("close", 10, 100),
        ("open", 20, 120),  # a new incident starts at its own severity ...
        ("escalate", 21, 120),  # ... and may escalate again
        ("close", 27, 120),
    ]


def test_incident_without_severities_never_escalates() -> None:
    """Callers that give no severities (plugins, detectors with one severity) see what they did."""
    inc = Incident(quiet=5)
    out = inc.scan(0, 30, np.array([0, 1, 2, 20]), np.arange(30))
    assert [kind for kind, _, _ in out] == ["open", "close", "open", "close"]


def test_info_escalates_to_warning_then_critical() -> None:
    """An incident opened as info (start-up) rises a level at a time: at most one alert per level."""
    i, w, c = Severity.INFO, Severity.WARNING, Severity.CRITICAL
    inc = Incident(quiet=50)
    out = inc.scan(0, 10, np.array([0, 1, 2, 3, 4]), np.arange(10), np.array([i, w, w, c, w]))
    assert out == [("open", 0, 0), ("escalate", 1, 0), ("escalate", 3, 0)]


# ---------------------------------------------------------------------------------------------
# grad_norm_spike through the pipeline


def test_a_growing_grad_norm_spike_escalates_to_one_critical_alert() -> None:
    alerts = [a for a in check(run_with(GROWING)) if a.detector == "grad_norm_spike"]
    assert grad_alerts(alerts) == [("warning", 1100), ("critical", 1102), ("info", 1126)]
    escalated = alerts[1]
    assert "600.0x its recent median" in escalated.message
    assert escalated.message.endswith("(escalated to critical: same incident, since step 1100)")


def test_a_spike_that_stays_a_warning_raises_one_alert() -> None:
    """20x, 40x, 80x: the same severity within the incident, no second alert."""
    alerts = check(run_with({1100: 20.0, 1101: 40.0, 1102: 80.0}))
    assert grad_alerts(alerts) == [("warning", 1100), ("info", 1123)]


def test_escalation_does_not_depend_on_batch_boundaries() -> None:
    text = run_with(GROWING)
    whole = check(text)
    for seed in range(3):
        rng = random.Random(seed)
        sizes = [rng.randint(1, 700) for _ in range(len(text) // 350)]
        assert check(text, sizes) == whole


@pytest.mark.parametrize(
    ("factor", "severity"),
    [(1485.0, "warning"), (100.0, "warning"), (20.0, "info")],
    ids=["1485x", "100x", "20x"],
)
def test_startup_spikes_are_one_level_lower(factor: float, severity: str) -> None:
    """In the first 100 steps (optimizer warm-up) a spike is one level lower: 100x or more warns."""
    alerts = check(run_with({60: factor}, first=1, count=150))
    assert grad_alerts(alerts)[0] == (severity, 60)


# ---------------------------------------------------------------------------------------------
# loss_spike through the pipeline

#: a loss spike that grows within its incident: 1.6x and 2.5x the median (warnings), then 4x and 5x
#: (past its critical_ratio of 3x)
GROWING_LOSS = {1100: 1.6, 1101: 2.5, 1102: 4.0, 1103: 5.0, 1104: 2.0}


def test_a_growing_loss_spike_escalates_to_one_critical_alert() -> None:
    alerts = [a for a in check(run_with({}, loss_spikes=GROWING_LOSS)) if a.detector == "loss_spike"]
    assert grad_alerts(alerts, "loss_spike") == [("warning", 1100), ("critical", 1102), ("info", 1125)]
    assert "3.99x its recent median" in alerts[1].message
    assert alerts[1].message.endswith("(escalated to critical: same incident, since step 1100)")


def test_a_loss_spike_that_stays_a_warning_raises_one_alert() -> None:
    alerts = check(run_with({}, loss_spikes={1100: 1.6, 1101: 2.0, 1102: 2.5}))
    assert grad_alerts(alerts, "loss_spike") == [("warning", 1100), ("info", 1123)]


def test_loss_spike_escalation_does_not_depend_on_batch_boundaries() -> None:
    """(Its own alerts: how the detectors' alerts of one batch interleave is not the point here.)"""
    text = run_with({}, loss_spikes=GROWING_LOSS)
    whole = [a for a in check(text) if a.detector == "loss_spike"]
    assert grad_alerts(whole, "loss_spike")[1] == ("critical", 1102)
    for seed in range(3):
        rng = random.Random(seed)
        sizes = [rng.randint(1, 700) for _ in range(len(text) // 350)]
        assert [a for a in check(text, sizes) if a.detector == "loss_spike"] == whole


# ---------------------------------------------------------------------------------------------
# the commands users run


def test_check_fail_on_critical_fires_on_a_spike_that_grows(tmp_path: Path) -> None:
    grows, stays = tmp_path / "grows.log", tmp_path / "stays.log"
    grows.write_text(run_with(GROWING))
    stays.write_text(run_with({1100: 20.0, 1101: 40.0}))
    assert run_cli("check", "--fail-on", "critical", str(stays)).returncode == 0
    p = run_cli("check", "--fail-on", "critical", str(grows))
    assert p.returncode == 1, p.stdout + p.stderr
    report = check_json("--fail-on", "critical", str(grows))
    assert report["summary"]["critical"] == 1 and report["summary"]["exit_code"] == 1


def test_tail_pages_once_on_the_escalation_and_exits_on_critical(tmp_path: Path, tails: Any) -> None:  # noqa: F811
    """`--on-alert-severity critical` runs the command for the escalated alert only, and
    `--exit-on critical` ends the tail there."""
    log, hook, out = tmp_path / "main_log.txt", tmp_path / "hook.py", tmp_path / "calls.jsonl"
    hook.write_text(HOOK)
    log.write_text(run_with({}, count=60))
    t = tails(
        str(log),
        *("--on-alert", f"{sys.executable} {hook} {out}", "--on-alert-severity", "critical"),
        *("--exit-on", "critical"),
    )
    t.started()
    with log.open("a") as f:
        f.write(run_with(GROWING, first=1060, count=60))
    t.wait_for(lambda o: o["type"] == "alert" and o["severity"] == "critical", what="the escalated alert")
    summary = t.summary()
    assert t.proc.returncode == 1 and summary["reason"] == "--exit-on critical"
    shown = [(o["severity"], o["step"]) for o in t.objs if o["type"] == "alert"]
    assert shown[:2] == [("warning", 1100), ("critical", 1102)]
    (call,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert call["stdin"]["step"] == 1102 and call["env"]["GRADWATCH_SEVERITY"] == "critical"
    assert "escalated to critical" in call["stdin"]["message"]

"""The example plugin: its parser, its detector, and both inside gradwatch once installed.

`pip install -e examples/plugins` (next to gradwatch), then `pytest examples/plugins`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from gradwatch_attnlogit.detector import METRIC, AttnLogitGrowth, AttnLogitGrowthConfig
from gradwatch_attnlogit.parser import AttnlabParser

from gradwatch.api import COLUMNS, METRICS, Batch, ParseOutput, register_detector, register_parser

LOG = Path(__file__).resolve().parents[1] / "attnlab-run.log"


def batch(steps: np.ndarray, values: np.ndarray) -> Batch:
    """Records as gradwatch hands them to detectors: COLUMNS, then the declared extra metric."""
    n = len(steps)
    frame = pd.DataFrame({name: np.full(n, np.nan) for name in METRICS})
    frame.insert(0, "step", steps)
    frame["ts"], frame["line"], frame["nonfinite"] = np.nan, steps // 10, ""  # one log line per 10 steps
    frame[METRIC] = values
    assert list(frame.columns) == [*COLUMNS, METRIC]
    return Batch(frame)


def growth_run() -> tuple[np.ndarray, np.ndarray]:
    """100 logs near 30, then doubling from step 1010: 60 (2x, quiet), 120 (4x: the alert)."""
    rng = np.random.default_rng(0)
    steps = np.arange(10, 1061, 10)
    values = np.where(steps <= 1000, 30 + rng.uniform(-1, 1, len(steps)), 30 * 2.0 ** ((steps - 1000) // 10))
    return steps, values


def test_the_classes_fit_gradwatchs_contract() -> None:
    """Registration checks the classes at once (it raises PluginError otherwise)."""
    assert register_detector(AttnLogitGrowth) is AttnLogitGrowth
    assert register_parser(AttnlabParser) is AttnlabParser


def test_the_parser_reads_attnlab_records_and_leaves_other_lines() -> None:
    out, parser = ParseOutput(), AttnlabParser()
    lines = LOG.read_text().splitlines()
    taken = [parser.parse(text, n, None, out) for n, text in enumerate(lines, 1)]
    assert sum(taken) == out.counts["attnlab"] == 106 and out.last_step == 1060
    assert not taken[0]  # "starting run": not a record
    assert not parser.parse(" iteration       10/    100 | lm loss: 2.0E+00 |", 1, None, out)


def test_the_detector_alerts_once_where_the_logit_passes_3x_its_median() -> None:
    steps, values = growth_run()
    (alert,) = AttnLogitGrowth().update(batch(steps, values))
    assert (alert.step, alert.value, alert.severity.name) == (1020, 120.0, "WARNING")
    assert alert.baseline == pytest.approx(30, abs=1)


def test_the_detector_gives_the_same_alerts_whatever_the_batch_size() -> None:
    steps, values = growth_run()
    whole = AttnLogitGrowth(AttnLogitGrowthConfig(quiet=3)).update(batch(steps, values))
    detector = AttnLogitGrowth(AttnLogitGrowthConfig(quiet=3))
    pieces = []
    for lo in range(0, len(steps), 7):
        pieces += detector.update(batch(steps[lo : lo + 7], values[lo : lo + 7]))
    assert pieces == whole


def test_the_config_refuses_a_ratio_that_would_alert_on_every_value() -> None:
    with pytest.raises(ValueError, match="ratio must be above 1"):
        AttnLogitGrowthConfig(ratio=1.0)


def test_gradwatch_finds_the_plugin_and_alerts_on_the_example_log() -> None:
    if not any(ep.name == "attn_logit_growth" for ep in entry_points(group="gradwatch.detectors")):
        pytest.skip("the plugin is not installed here: pip install -e examples/plugins")
    p = subprocess.run(
        [sys.executable, "-m", "gradwatch", "check", "--output", "json", str(LOG)], capture_output=True, text=True
    )
    report = json.loads(p.stdout)
    assert p.returncode == 1 and report["files"][0]["format"] == "attnlab"
    assert [(a["detector"], a["step"]) for a in report["alerts"]] == [("attn_logit_growth", 1020)]

"""The labelled real logs: every file parses, labelled anomalies are found at the right step,
and the files labelled healthy raise no warning. Labels: ../shared/samples/real/labels.json."""

from __future__ import annotations

import json

import pytest

from gradwatch import config
from gradwatch.alerts import Severity
from gradwatch.pipeline import check_path
from tests.conftest import REAL, check_json, real_samples


def _labels() -> dict:
    path = REAL / "labels.json"
    return json.loads(path.read_text()) if path.is_file() else {"expect": [], "healthy": []}


def _alerts(rel: str):
    summary, alerts = check_path(real_samples() / rel, config.load())
    return summary, [a for a in alerts if a.severity >= Severity.WARNING]


@pytest.mark.parametrize("label", _labels()["expect"], ids=lambda e: f"{e['detector']}@{e['lo']}")
def test_labelled_anomaly_is_found_at_its_step(label: dict) -> None:
    """Each labelled anomaly is raised by its detector with a step inside the labelled range."""
    _, alerts = _alerts(label["file"])
    steps = [a.step for a in alerts if a.detector == label["detector"]]
    assert any(s is not None and label["lo"] <= s <= label["hi"] for s in steps), (
        f"{label['detector']} not found in {label['lo']}-{label['hi']}; got {[(a.detector, a.step) for a in alerts]}"
    )


@pytest.mark.parametrize("rel", _labels()["healthy"])
def test_healthy_file_is_quiet(rel: str) -> None:
    """Files labelled healthy raise no warning or critical alert."""
    summary, alerts = _alerts(rel)
    assert summary.records > 0
    assert alerts == [], [(a.detector, a.step, a.message) for a in alerts]


def test_every_real_file_parses_without_traceback_through_the_cli() -> None:
    """The whole real corpus through the real CLI: valid JSON, a format for each file."""
    root = real_samples()
    files = sorted(p for p in root.rglob("*.log"))
    assert len(files) > 30
    doc = check_json(*map(str, files))
    by_path = {f["path"]: f for f in doc["files"]}
    for p in files:
        entry = by_path[str(p)]
        assert entry["format"] is not None, f"{p.name}: no format recognised"
        assert entry["records"] > 0


@pytest.mark.parametrize(
    ("rel", "fmt"),
    [
        ("megatron-deepspeed/bloom-tr11-176b-wrapped-throughput-drop-42780.log", "megatron"),
        ("deepspeed/dschat-step1-sft-opt1.3b-overflow-hysteresis-full.log", "deepspeed"),
        ("megatron-lm/bigscience-2021-megatron-lm-gpt2-n4-pp4-full.log", "megatron"),
    ],
)
def test_format_is_sniffed(rel: str, fmt: str) -> None:
    summary, _ = check_path(real_samples() / rel, config.load())
    assert summary.format == fmt


def test_hard_wrapped_records_are_joined() -> None:
    """tr11 42780: each record wrapped over three physical lines still gives all its fields."""
    summary, _ = check_path(
        real_samples() / "megatron-deepspeed/bloom-tr11-176b-wrapped-throughput-drop-42780.log",
        config.load(),
    )
    assert summary.records == 5
    assert summary.first_step == 42780
    assert summary.last_values["tflops"] == pytest.approx(141.1, abs=0.05)
    assert summary.last_values["grad_norm"] > 0


def test_deepspeed_progress_lines_do_not_become_records_in_a_megatron_log() -> None:
    """In Megatron-DeepSpeed logs the DeepSpeed `step=` lines are events, not duplicate records."""
    summary, _ = check_path(
        real_samples() / "megatron-deepspeed/msft-megds-moe-tokendrop-with-kernel-full.log",
        config.load(),
    )
    assert summary.format == "megatron"
    assert summary.first_step == 10

"""The labelled real logs: every file parses, labelled anomalies are found at the right step,
and the files labelled healthy raise no warning. Labels: ../shared/samples/real/labels.json and
../shared/samples/real-more/labels.json (`A|B`: an alert of either detector; lo = hi = 0: an alert
at any step or none)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gradwatch import config
from gradwatch.alerts import Severity
from gradwatch.pipeline import check_path
from tests.conftest import REAL, REAL_MORE, check_json, real_folders, real_samples


def _labels() -> dict[str, list]:
    """Both folders' labels, with file paths made absolute."""
    labels: dict[str, list] = {"expect": [], "healthy": []}
    for folder in (REAL, REAL_MORE):
        path = folder / "labels.json"
        if path.is_file():
            one = json.loads(path.read_text())
            labels["expect"] += [dict(e, file=folder / e["file"]) for e in one["expect"]]
            labels["healthy"] += [folder / h for h in one["healthy"]]
    return labels


def _alerts(path: Path):
    summary, alerts = check_path(path, config.load())
    return summary, [a for a in alerts if a.severity >= Severity.WARNING]


def _label_id(label: dict) -> str:
    return f"{label['file'].parent.name}/{label['file'].name[:28]}:{label['detector']}@{label['lo']}"


@pytest.mark.parametrize("label", _labels()["expect"], ids=_label_id)
def test_labelled_anomaly_is_found_at_its_step(label: dict) -> None:
    """Each labelled anomaly is raised by its detector (one of `A|B`) with a step inside the
    labelled range; lo = 0 also takes an alert without a step (a log that prints none)."""
    _, alerts = _alerts(label["file"])
    ids, lo, hi = label["detector"].split("|"), label["lo"], label["hi"]
    steps = [a.step for a in alerts if a.detector in ids]
    assert any((s is None and lo == 0) or (s is not None and lo <= s <= hi) for s in steps), (
        f"{label['detector']} not found in {lo}-{hi}; got {[(a.detector, a.step) for a in alerts]}"
    )


@pytest.mark.parametrize("path", _labels()["healthy"], ids=lambda p: f"{p.parent.name}/{p.name[:40]}")
def test_healthy_file_is_quiet(path: Path) -> None:
    """Files labelled healthy are read and raise no warning or critical alert."""
    summary, alerts = _alerts(path)
    assert summary.records > 0
    assert alerts == [], [(a.detector, a.step, a.message) for a in alerts]


def test_every_real_file_parses_without_traceback_through_the_cli() -> None:
    """The whole real corpus through the real CLI: valid JSON, a format for each file."""
    real_samples()  # (skips, saying why, where the samples are absent)
    files = sorted(p for folder in real_folders() for p in folder.rglob("*.log"))
    assert len(files) > 30
    doc = check_json(*map(str, files))
    by_path = {f["path"]: f for f in doc["files"]}
    told = {a["path"] for a in doc["alerts"] if a["severity"] in ("warning", "critical")}
    for p in files:
        entry = by_path[str(p)]
        if entry["records"] == 0:  # a crash before any step: read, and its alert tells it
            assert str(p) in told, f"{p.name}: no records and no alert"
            continue
        assert entry["format"] is not None, f"{p.name}: no format recognised"


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

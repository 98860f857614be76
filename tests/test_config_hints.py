"""Hints that use the configuration: they name the settings the log printed (its latest `config`
event by the alert's line), and say nothing of settings it did not print."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from gradwatch.detectors.base import ColumnBatch
from gradwatch.detectors.logit_norm_drift import LogitNormDrift
from gradwatch.events import Event, EventKind
from gradwatch.records import RecordBuilder, columns_of
from tests.conftest import run_cli
from tests.test_resume_config import iterations

DEEPSPEED_JSON = """\
[2024-03-09 07:59:00,100] [INFO] [config.py:904:print] DeepSpeedEngine configuration:
[2024-03-09 07:59:00,100] [INFO] [config.py:908:print]   fp16_enabled ................. True
[2024-03-09 07:59:00,101] [INFO] [config.py:908:print]   json = {
    "train_batch_size": 2048,
    "fp16": {
        "enabled": true,
        "loss_scale": 0,
        "loss_scale_window": 500,
        "initial_scale_power": 12,
        "hysteresis": 2,
        "min_loss_scale": 1
    },
    "steps_per_print": 2000
}
"""


def collapsing(first: int = 1, last: int = 300) -> str:
    """Megatron-DeepSpeed fp16 records: the loss scale steady at 4096, then halving every step from 200."""
    lines = []
    for step in range(first, last + 1):
        scale = 4096.0 if step < 200 else max(4096.0 / 2 ** (step - 199), 1.0)
        lines.append(iterations(step, step)[0].replace("loss scale: 1.0", f"loss scale: {scale:.1f}"))
    return "\n".join(lines) + "\n"


def scale_hints(log: Path) -> list[str]:
    p = run_cli("check", "--output", "json", str(log))
    assert "Traceback" not in p.stderr, p.stderr
    return [a["hint"] for a in json.loads(p.stdout)["alerts"] if a["detector"] == "loss_scale_collapse"]


def test_loss_scale_hints_name_the_deepspeed_fp16_settings_printed(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text(DEEPSPEED_JSON + collapsing())
    hints = scale_hints(log)
    assert len(hints) == 3, hints  # the cascade, the floor, 1 (critical)
    assert set(hints) == {hints[0]}
    assert hints[0].endswith(
        "or train in bf16; this run's fp16 settings: initial_scale_power=12, loss_scale_window=500, "
        "hysteresis=2, min_loss_scale=1; a run that lost its scaler state starts again at 2**12 = 4,096; "
        "it grows back only after 500 steps without overflow"
    )


def test_loss_scale_hints_without_settings_printed_name_none(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text(collapsing())
    hints = scale_hints(log)
    assert hints and all("settings" not in h and "initial_scale_power" not in h for h in hints), hints


# ---- logit drift: the FSDP settings of OLMo-style config dumps, as config events -----------------

FSDP = {"fsdp_reduce_dtype": "bfloat16", "nodes": 32, "world_size": 256}


def drift_batches(config_line: int, cuts: list[int]) -> list[ColumnBatch]:
    """400 records (lines 2-401) of a logit norm creeping from 10 to 40 under a flat loss, and a
    config event at `config_line`, cut into batches after the lines in `cuts`."""
    n = 400
    lines = np.arange(2, n + 2)
    metrics = {"logit_norm": np.linspace(10.0, 40.0, n), "loss": np.full(n, 2.5)}
    event = Event(EventKind.CONFIG, config_line, data={"config": FSDP, "raw": {}, "source": "olmo-config"})
    out, lo = [], 0
    for hi in [*cuts, n + 2]:
        keep = (lines > lo) & (lines <= hi)
        builder = RecordBuilder()
        part = {k: v[keep] for k, v in metrics.items()}
        builder.add_columns(
            lines[keep] * 10, lines[keep], np.full(keep.sum(), np.nan), part, np.full(keep.sum(), "", dtype=object), "x"
        )
        events = [event] if lo < config_line <= hi else []
        out.append(ColumnBatch(columns=columns_of(builder.take_columns() or {}), events=events))
        lo = hi
    return out


def drift_hints(batches: list[ColumnBatch]) -> list[str]:
    det = LogitNormDrift(path="run.log")
    alerts: list[Any] = [a for b in batches for a in det.update(b)]
    assert [a.metric for a in alerts] == ["logit_norm"], alerts
    return [a.hint for a in alerts]


def test_logit_drift_hint_names_the_reduce_dtype_and_the_run_size() -> None:
    [hint] = drift_hints(drift_batches(1, []))
    assert hint == (
        "the output-logit norm is growing while the loss hides it: this run reduces FSDP gradients in "
        "bfloat16 (fsdp_reduce_dtype) on 32 nodes, 256 GPUs, which loses precision as more ranks are "
        "summed; reduce in float32 (reduce_dtype=float32), add z-loss or lower the learning rate; "
        "compare with a run on fewer nodes"
    )
    assert drift_hints(drift_batches(1, [1, 37, 150, 151, 399])) == [hint]


def test_logit_drift_hint_takes_the_config_as_of_the_alerts_line() -> None:
    """A config printed after the alert (a restart) does not change it, whatever the batches."""
    [plain] = drift_hints(drift_batches(399, []))
    assert "fsdp_reduce_dtype" not in plain and plain.startswith("the output-logit norm is growing")
    assert drift_hints(drift_batches(399, [200])) == [plain]

"""stall judges a gap between records against the pace of as many steps as it covers.

A healthy log printed every 100 steps of 12 s has records 20 min apart: that is the pace, not a
hang, from the very first interval on (it once warned "no new step for 20 min" there, because the
first record's step time was taken as the time between records). A real hang between two records
of such a log is still one.
"""

from __future__ import annotations

import time
from pathlib import Path

from tests.conftest import check_json

T0 = time.mktime((2024, 4, 6, 3, 0, 0, 0, 0, -1))


def megatron_lm_log(path: Path, every: int, step_s: float, hang_after: int | None = None, hang_s: float = 0.0) -> Path:
    """Megatron-LM's timestamped iteration lines, one every `every` steps of `step_s` seconds."""
    lines, clock = [], T0
    for step in range(every, 20 * every + 1, every):
        clock += every * step_s
        took = every * step_s
        if hang_after is not None and step - every == hang_after:
            clock += hang_s
            took += hang_s
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(clock))
        lines.append(
            f" [{stamp}] iteration {step:8d}/{20 * every:8d} | consumed samples: {step * 128:12d} | "
            f"elapsed time per iteration (ms): {1000 * took / every:.1f} | learning rate: 1.000000E-04 | "
            f"global batch size:   128 | lm loss: {3.0 - step / 1e5:.6E} | loss scale: 1.0 | grad norm: 1.300 | "
            "num zeros: 0.0 | number of skipped iterations:   0 | number of nan iterations:   0 |"
        )
    path.write_text("\n".join(lines) + "\n")
    return path


def stalls(path: Path) -> list[dict[str, object]]:
    return [a for a in check_json(str(path))["alerts"] if a["detector"] == "stall"]


def test_log_interval_100_with_12_s_steps_is_no_stall(tmp_path: Path) -> None:
    assert stalls(megatron_lm_log(tmp_path / "train.log", every=100, step_s=12.0)) == []


def test_a_hang_between_records_of_a_sparse_log_is_a_stall(tmp_path: Path) -> None:
    found = stalls(megatron_lm_log(tmp_path / "train.log", every=100, step_s=12.0, hang_after=1000, hang_s=4 * 3600))
    assert [a["step"] for a in found] == [1000]
    assert "no new step for 4.3 h after step 1000" in str(found[0]["message"])

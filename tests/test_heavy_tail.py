"""loss_spike, loss_divergence and throughput_drop under the noise real healthy runs have.

Real per-step losses have heavy tails: a healthy pre-training run has ordinary one-step bumps of
+10-20% (a torchtitan run's +16% two-step bump), a small-batch fine-tune dips by 30-40% and
comes back, with a +29% batch now and then. A 6-sigma test alone flags them; a spike of 1.5x is
still one. Each test writes its own log in a real format and runs `gradwatch check` on it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tests.conftest import check_json


def jsonl_log(path: Path, losses: np.ndarray, first_step: int = 1) -> Path:
    rows = [json.dumps({"step": first_step + i, "loss": round(float(v), 5)}) for i, v in enumerate(losses)]
    path.write_text("\n".join(rows) + "\n")
    return path


def healthy_losses(n: int, seed: int = 0) -> np.ndarray:
    """A falling per-step loss with 1% log-normal noise."""
    rng = np.random.default_rng(seed)
    steps = np.arange(1, n + 1)
    return (2.0 + 8.0 * (1 + steps / 100) ** -0.5) * np.exp(0.01 * rng.standard_normal(n))


def loud(path: Path, *detectors: str) -> list[tuple[str, int]]:
    alerts = check_json(str(path))["alerts"]
    return [(a["detector"], a["step"]) for a in alerts if a["detector"] in detectors and a["severity"] != "info"]


def test_ordinary_two_step_bumps_are_no_spike_or_divergence(tmp_path: Path) -> None:
    loss = healthy_losses(3000)
    for at in range(400, 3000, 300):  # +16% then +12%, back the step after: a batch, not an incident
        loss[at] *= 1.16
        loss[at + 1] *= 1.12
    assert loud(jsonl_log(tmp_path / "train.jsonl", loss), "loss_spike", "loss_divergence") == []


def test_a_1_5x_spike_is_found_among_ordinary_bumps(tmp_path: Path) -> None:
    loss = healthy_losses(3000)
    for at in range(400, 3000, 300):
        loss[at] *= 1.16
    loss[2050] *= 1.5
    assert loud(jsonl_log(tmp_path / "train.jsonl", loss), "loss_spike") == [("loss_spike", 2051)]


def test_a_fine_tunes_dips_and_a_35_percent_batch_are_no_spike(tmp_path: Path) -> None:
    """A bump past the relative floor, but within the run's own recent step-to-step changes."""
    rng = np.random.default_rng(1)
    loss = 1.28 * np.exp(0.02 * rng.standard_normal(100))
    loss[[10, 15, 29, 36, 56, 71]] *= [0.69, 0.78, 0.78, 0.81, 0.58, 0.83]  # batches of four samples
    loss[67] = 1.35 * np.median(loss[:67])
    assert loud(jsonl_log(tmp_path / "finetune.jsonl", loss, first_step=0), "loss_spike") == []


def test_a_loss_back_above_where_the_run_started_is_a_divergence(tmp_path: Path) -> None:
    path = tmp_path / "excerpt.jsonl"
    rows = [(1, 10.655), (2, 10.652), (3, 10.646), (2498, 12.675), (2499, 13.401), (2500, 12.550)]
    path.write_text("".join(json.dumps({"step": s, "loss": v}) + "\n" for s, v in rows))
    assert loud(path, "loss_divergence") == [("loss_divergence", 2500)]


def test_a_log_that_begins_mid_run_has_no_start_to_go_back_above(tmp_path: Path) -> None:
    path = tmp_path / "resumed.jsonl"
    rows = [(50001, 2.10), (50002, 2.11), (50003, 2.09), (52000, 2.45), (52001, 2.47), (52002, 2.44)]
    path.write_text("".join(json.dumps({"step": s, "loss": v}) + "\n" for s, v in rows))
    assert loud(path, "loss_divergence") == []


def nemo2_log(path: Path, save_at: int | None, slow: range) -> Path:
    """NeMo 2 training lines of 0.25 s steps, slow (0.65 s) over `slow`, an async save after `save_at`."""
    lines = []
    for step in range(100):
        took = 0.65 if step in slow else 0.25
        lines.append(
            f"Training epoch 0, iteration {step}/99 | lr: 3e-05 | global_batch_size: 4 | global_step: {step} | "
            f"reduced_train_loss: 1.28 | train_step_timing in s: {took} | consumed_samples: {4 * step + 4}"
        )
        if step == save_at:
            lines.append(
                "[NeMo I 2025-06-18 16:52:54 nemo_logging:393] Scheduled async checkpoint save for "
                f"/results/checkpoints/model--epoch=0-consumed_samples={4 * step + 4}.0-last.ckpt"
            )
    path.write_text("\n".join(lines) + "\n")
    return path


def test_steps_slowed_by_an_async_checkpoint_save_are_no_throughput_drop(tmp_path: Path) -> None:
    assert loud(nemo2_log(tmp_path / "nemo.log", save_at=49, slow=range(50, 63)), "throughput_drop") == []


def test_the_same_slow_stretch_without_a_save_is_a_throughput_drop(tmp_path: Path) -> None:
    found = loud(nemo2_log(tmp_path / "nemo.log", save_at=None, slow=range(50, 63)), "throughput_drop")
    assert found == [("throughput_drop", 50)]


def test_a_negative_policy_loss_growing_in_size_is_no_divergence(tmp_path: Path) -> None:
    """An RL policy loss of -0.15 is not "above 2x" a mean of -0.10: ratios need a positive level."""
    loss = -0.02 - 0.003 * np.arange(60) * np.exp(0.05 * np.random.default_rng(2).standard_normal(60))
    assert loud(jsonl_log(tmp_path / "ppo.jsonl", loss), "loss_divergence") == []

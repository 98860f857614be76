"""Detectors give the same alerts whatever the batch boundaries (design rule; see design.md).

Each labelled synthetic run is checked in one batch and in random small batches (feeding the
bytes in random chunks makes the stream hand detectors batches of 0 to a few records).
"""

from __future__ import annotations

import random

import pytest

from gradwatch import config
from gradwatch.pipeline import FileCheck
from gradwatch.synth import Anomaly, RunSpec, generate, supported_kinds

SETTINGS = config.load()


def _alerts(data: bytes, sizes: list[int] | None) -> list[tuple]:
    check = FileCheck("run.log", SETTINGS)
    alerts = []
    pos = 0
    for size in sizes or []:
        alerts += check.feed(data[pos : pos + size])
        pos += size
    alerts += check.feed(data[pos:])
    alerts += check.close()
    return sorted((a.detector, str(a.severity), a.step, a.line, a.message) for a in alerts)


def _chunks(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    sizes, total = [], 0
    while total < n:
        sizes.append(rng.randint(1, 6000))
        total += sizes[-1]
    return sizes


CASES = [
    ("megatron-deepspeed", "grad_norm_spike"),
    ("megatron-deepspeed", "loss_scale_collapse"),
    ("megatron-deepspeed", "resume_regression"),
    ("megatron-deepspeed", "loss_divergence"),
    ("megatron-deepspeed", "stall"),
    ("megatron-lm", "skipped_steps"),
    ("megatron-lm", "nonfinite"),
    ("olmo", "logit_norm_drift"),
    ("olmo", "loss_collapse"),
    ("torchtitan", "throughput_drop"),
    ("torchtitan", "loss_spike"),
    ("hf-trainer", "nonfinite"),
    ("jsonl", "logit_norm_drift"),
]


@pytest.mark.parametrize(("fmt", "kind"), CASES, ids=lambda v: v)
def test_alerts_do_not_depend_on_batch_boundaries(fmt: str, kind: str) -> None:
    z_loss = kind == "logit_norm_drift" and fmt == "olmo"
    spec = RunSpec(fmt=fmt, steps=3000, seed=11, z_loss=z_loss)
    assert kind in supported_kinds(spec)
    spec = RunSpec(fmt=fmt, steps=3000, seed=11, z_loss=z_loss, anomalies=(Anomaly(kind, 2000, magnitude=2.0),))
    data = "".join(generate(spec)).encode()
    whole = _alerts(data, None)
    assert any(a[0] == kind for a in whole) or kind in ("stall",), whole
    assert _alerts(data, _chunks(len(data), seed=5)) == whole


def test_trainer_error_does_not_depend_on_batch_boundaries() -> None:
    """A crash of four ranks, a requeue, an end message and an error long after it (found by QA:
    an end and an error in different batches made a warning a critical)."""
    from tests.test_bad_input import megatron_line, run_values
    from tests.test_trainer_error import ECC, OOM, ranks

    records = [megatron_line(s, loss, g) for s, loss, g in run_values(120)]
    lines = [*records[:40], *ranks(ECC, 4), " loading checkpoint from /ckpt at iteration 400", *records[40:80]]
    lines += [*OOM, *records[80:], "[after training is done] datetime: 2024-03-02 08:00:00"]
    lines += [f"saving shard {i}" for i in range(3000)] + [*OOM, *records[-3:]]
    data = ("\n".join(lines) + "\n").encode()
    whole = [a for a in _alerts(data, None) if a[0] == "trainer_error"]
    assert sorted(a[1] for a in whole) == ["critical", "critical", "info", "info", "warning"], whole
    for seed in (1, 2, 3):
        assert [a for a in _alerts(data, _chunks(len(data), seed)) if a[0] == "trainer_error"] == whole

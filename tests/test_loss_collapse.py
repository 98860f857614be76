"""loss_collapse's rule for a run that died: a loss of exactly 0 right after a non-finite grad norm.

The HF Trainer keeps NaN losses out of its running mean (`logging_nan_inf_filter`), so once the
weights are NaN every later dict says `'loss': 0.0` beside `'grad_norm': nan`. One such dict
alone is a NaN step (nonfinite's); a 0 in the record after a non-finite grad norm, down from a
real loss, is the collapse. A run that memorises its data (a loss falling smoothly to 0.004, or
printed as 0.0 with four decimals) stays quiet.
"""

from __future__ import annotations

import math
import random

import numpy as np

from gradwatch import config
from gradwatch.alerts import Alert
from gradwatch.detectors.base import ColumnBatch
from gradwatch.detectors.loss_collapse import LossCollapse
from gradwatch.parsers.stream import BatchFacts
from gradwatch.pipeline import FileCheck
from gradwatch.records import RecordBuilder, columns_of

NAN = math.nan


def hf_dict(loss: float, grad_norm: float, lr: float, epoch: float) -> str:
    """An HF Trainer log dict as `print` shows it (NaN as `nan`), padded as tqdm leaves it."""
    return f"{{'loss': {loss!r}, 'grad_norm': {grad_norm!r}, 'learning_rate': {lr!r}, 'epoch': {epoch!r}}}" + " " * 40


def check(lines: list[str]) -> list[tuple[str, str, int | None]]:
    fc = FileCheck("trainer.log", config.load())
    alerts = fc.feed(("\n".join(lines) + "\n").encode()) + fc.close()
    return [(a.detector, str(a.severity), a.step) for a in alerts if a.severity > 0]


def test_a_loss_of_0_after_a_nan_grad_norm_is_a_collapse() -> None:
    """The first dict's grad norm is NaN (its loss still real); from then on the trainer prints 0."""
    lines = [hf_dict(2.3145, NAN, 2.0e-08 * (i + 1), 0.01 * i) for i in range(1)]
    lines += [hf_dict(0.0, NAN, 2.0e-08 * (i + 1), 0.01 * i) for i in range(1, 6)]
    assert check(lines) == [("nonfinite", "critical", 1), ("loss_collapse", "critical", 2)]


def test_one_nan_step_in_a_healthy_run_is_no_collapse() -> None:
    """One dict of a NaN step (0.0 beside nan) between healthy ones: nonfinite only."""
    losses = [1.9, 1.85, 1.83, 0.0, 1.8, 1.79, 1.78]
    grads = [0.9, 0.8, 0.85, NAN, 0.8, 0.7, 0.75]
    lines = [hf_dict(loss, g, 1e-5, 0.1 * i) for i, (loss, g) in enumerate(zip(losses, grads, strict=True))]
    assert [a for a in check(lines) if a[0] == "loss_collapse"] == []


def records(steps: np.ndarray, loss: np.ndarray, grad: np.ndarray) -> ColumnBatch:
    """A batch of these records, one a line (line = step); NaN values are ones printed as nan."""
    builder = RecordBuilder()
    for step, lv, gv in zip(steps.tolist(), loss.tolist(), grad.tolist(), strict=True):
        bad = [name for name, v in (("loss", lv), ("grad_norm", gv)) if math.isnan(v)]
        builder.add(step, step, None, {"loss": lv, "grad_norm": gv}, bad)
    return ColumnBatch.of_columns(BatchFacts(), columns_of(builder.take_columns() or {}))


def memorising_run() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An MMEngine-like QLoRA run on a tiny repeated dataset: the loss falls smoothly from 1.24 to
    about 0.004 over 3 epochs of 381 iterations (logged every 10), printed with 4 decimals."""
    steps = np.arange(10, 1144, 10)
    progress = steps / steps[-1]
    rng = np.random.default_rng(5)
    loss = np.round(1.24 * np.exp(-5.7 * progress) * rng.uniform(0.85, 1.15, len(steps)), 4)
    grad = np.round(0.55 * np.exp(-3.7 * progress), 4)
    return steps, loss, grad


def run(detector: LossCollapse, batch: ColumnBatch) -> list[Alert]:
    return [a for a in detector.update(batch) if a.severity > 0]


def test_a_memorising_run_stays_quiet() -> None:
    steps, loss, grad = memorising_run()
    assert loss[0] > 1.0 and loss[-1] < 0.01
    assert run(LossCollapse(), records(steps, loss, grad)) == []


def test_a_memorising_run_printing_0_after_a_nan_grad_norm_stays_quiet() -> None:
    """Near its end the loss prints as 0.0000 right after a NaN grad norm: it was already about 0
    (the last loss under min_baseline), so nothing fell."""
    steps, loss, grad = memorising_run()
    grad[-10], loss[-9] = NAN, 0.0
    assert run(LossCollapse(), records(steps, loss, grad)) == []


def test_the_collapse_is_found_whatever_the_batch_boundaries() -> None:
    steps = np.arange(1, 41)
    loss = np.concatenate([np.linspace(2.4, 2.1, 20), [2.09], np.zeros(19)])
    grad = np.concatenate([np.full(20, 0.8), np.full(20, NAN)])
    whole = run(LossCollapse(), records(steps, loss, grad))
    assert [(a.step, a.value, a.baseline) for a in whole] == [(22, 0.0, 2.09)]
    rng = random.Random(3)
    for _ in range(5):
        detector, found, pos = LossCollapse(), [], 0
        while pos < len(steps):
            end = pos + rng.randint(1, 4)
            found += run(detector, records(steps[pos:end], loss[pos:end], grad[pos:end]))
            pos = end
        assert [(a.step, a.line, a.message) for a in found] == [(a.step, a.line, a.message) for a in whole]

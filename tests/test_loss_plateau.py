"""loss_plateau: a run whose loss stays at its start-up level while the steps go on.

Logs are Megatron-LM lines the tests write (a `padded vocab` line where the vocabulary is known);
the healthy look-alikes are the ones the detector must leave alone: a falling pretraining loss, a
fine-tune that learns slowly, a fine-tune flat under heavy noise, short logs, a resumed log,
a reinforcement-learning objective below 0, and every healthy real log.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from gradwatch import config
from gradwatch.alerts import Alert, Severity
from gradwatch.pipeline import FileCheck
from tests.conftest import REAL
from tests.test_escalation import megatron_lm_line

VOCAB_LINE = " > padded vocab (size: 50257) with 47 dummy tokens (new size: 50304)\n"


def run_log(loss: np.ndarray, first: int = 10, interval: int = 10, vocab: bool = False) -> str:
    """Records from step `first` every `interval` steps with these losses."""
    lines = [megatron_lm_line(first + i * interval, 1.2, float(v)) for i, v in enumerate(loss)]
    return (VOCAB_LINE if vocab else "") + "".join(lines)


def noisy(level: np.ndarray | float, rel_noise: float, n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.asarray(level) * (1 + rel_noise * rng.standard_normal(n))


def plateau_alerts(
    text: str, sizes: list[int] | None = None, settings: config.Settings | None = None, path: str = "run.log"
) -> list[Alert]:
    fc = FileCheck(path, settings or config.load())
    data, pos, alerts = text.encode(), 0, []
    for size in sizes or []:
        alerts += fc.feed(data[pos : pos + size])
        pos += size
    alerts += fc.feed(data[pos:]) + fc.close()
    return [a for a in alerts if a.detector == "loss_plateau"]


def test_a_pretraining_loss_stuck_at_ln_vocab_is_critical() -> None:
    """lr 0 from the start: 10.95 +- 0.2% for 1500 steps; judged at the first record 1000 steps in."""
    (alert,) = plateau_alerts(run_log(noisy(10.95, 0.002, 150), vocab=True))
    assert (alert.severity, alert.step) == (Severity.CRITICAL, 1010)
    assert "random-init level ln(50257)=10.82" in alert.message
    assert "learning rate is not 0" in alert.hint and "frozen" in alert.hint


def test_the_vocab_size_may_come_from_the_config(tmp_path: Path) -> None:
    conf = tmp_path / "gradwatch.yaml"
    conf.write_text("detectors:\n  loss_plateau:\n    vocab_size: 50257\n")
    (alert,) = plateau_alerts(run_log(noisy(10.95, 0.002, 150)), settings=config.load(conf))
    assert alert.severity is Severity.CRITICAL


@pytest.mark.parametrize("level", [10.95, 1.8], ids=["pretraining-no-vocab", "fine-tune"])
def test_a_loss_flat_within_noise_is_a_warning(level: float) -> None:
    (alert,) = plateau_alerts(run_log(noisy(level, 0.004, 150)))
    assert (alert.severity, alert.step) == (Severity.WARNING, 1010)
    assert "flat at its start-up level" in alert.message


def test_a_stuck_loss_is_found_whatever_the_batch_boundaries() -> None:
    text = run_log(noisy(10.95, 0.002, 150), vocab=True)
    whole = plateau_alerts(text)
    assert len(whole) == 1
    for seed in range(3):
        rng = random.Random(seed)
        sizes = [rng.randint(1, 900) for _ in range(len(text) // 450)]
        assert plateau_alerts(text, sizes) == whole


STEPS = np.arange(300)
HEALTHY = {
    # a pretraining loss falling from ln(vocab) as a power law, steps 10..3000
    "pretraining": (run_log(noisy(2.5 + 8.4 * (1 + STEPS / 8) ** -0.7, 0.01, 300), vocab=True)),
    # a fine-tune learning slowly: 1.90 -> 1.80 over 3000 steps under 2% noise
    "slow-fine-tune": run_log(noisy(1.9 - 0.1 * STEPS / 300, 0.02, 300)),
    # a fine-tune flat at 1.28 under 4% noise (a genomic model near ln 4): maybe learning, not sure
    "noisy-flat-fine-tune": run_log(noisy(1.28, 0.04, 300)),
    # flat, but only 900 steps, or only 40 records over 4000 steps
    "short-in-steps": run_log(noisy(10.95, 0.002, 90), vocab=True),
    "short-in-records": run_log(noisy(10.95, 0.002, 40), interval=100, vocab=True),
    # a log that starts at a resume, on the plateau training reached
    "resumed": run_log(noisy(2.1, 0.002, 300), first=52000),
}


@pytest.mark.parametrize("text", list(HEALTHY.values()), ids=list(HEALTHY))
def test_healthy_look_alikes_stay_quiet(text: str) -> None:
    assert plateau_alerts(text) == []


def test_an_objective_below_0_is_not_judged() -> None:
    """PPO's loss hovers around -0.1: flat, and no likelihood."""
    assert plateau_alerts(run_log(noisy(-0.1, 0.01, 150))) == []


def _healthy_real_logs() -> list[Path]:
    found = []
    for folder in (REAL, REAL.parent / "real-more"):
        labels = folder / "labels.json"
        if labels.is_file():
            found += [folder / name for name in json.loads(labels.read_text())["healthy"]]
    return found


@pytest.mark.skipif(not _healthy_real_logs(), reason="real samples not present (third-party logs, not shipped)")
def test_every_healthy_real_log_stays_quiet() -> None:
    loud = {str(p): plateau_alerts(p.read_text(errors="replace"), path=str(p)) for p in _healthy_real_logs()}
    assert {p: a for p, a in loud.items() if a} == {}

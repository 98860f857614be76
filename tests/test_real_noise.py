"""The detection benchmark's heavy-tailed noise model (benchmarks/real_noise.py) and synth's hook for it.

The model resamples healthy real logs' own step-to-step changes, in units of each file's body
sigma. What counts as a change decides how heavy the tails look: a reprinted value's zero change
shrank a fine-tune's sigma until its ordinary grad-norm changes read as 15 sigmas (the benchmark
then gave grad_norm_spike 146 false alerts per 10k steps), and a log printed every 100 steps lost
all its records to a start-up cut of 20 records.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from types import ModuleType

import numpy as np
import pytest

from gradwatch.synth import RunSpec, generate, normal_draws
from tests.conftest import REPO


@pytest.fixture(scope="module")
def real_noise() -> ModuleType:
    """benchmarks/real_noise.py (the benchmarks are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location("real_noise", REPO / "benchmarks" / "real_noise.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["real_noise"] = module
    spec.loader.exec_module(module)
    return module


def noisy_grad_norms(n: int, seed: int = 0) -> np.ndarray:
    """A grad norm falling slowly, with 10% log-normal noise."""
    rng = np.random.default_rng(seed)
    return 0.5 * np.exp(-np.arange(n) / 400.0) * np.exp(0.1 * rng.standard_normal(n))


def test_a_reprinted_value_is_no_change(real_noise: ModuleType) -> None:
    """A trainer that prints the last optimizer step's grad norm at every log, each one twice:
    the changes are those of the values once, not half of them zeros."""
    once = noisy_grad_norms(200)
    steps = np.arange(1, 401) * 10
    twice = np.repeat(once, 2)
    expected = real_noise.changes(steps[::2], once)
    assert np.allclose(real_noise.changes(steps, twice), expected)
    assert np.abs(expected).max() < 6


def test_a_log_every_100_steps_keeps_its_records_past_the_start_up(real_noise: ModuleType) -> None:
    """20 records 100 steps apart: the first (step 100) is start-up, the other 19 are runs' noise."""
    found = real_noise.changes(np.arange(1, 21) * 100, noisy_grad_norms(20, seed=1))
    assert len(found) == 18


def test_per_step_logs_still_skip_their_first_20_records(real_noise: ModuleType) -> None:
    found = real_noise.changes(np.arange(1, 101), noisy_grad_norms(100, seed=2))
    assert len(found) == 100 - 20 - 1


def test_a_smooth_fall_is_not_read_as_no_noise(real_noise: ModuleType) -> None:
    """Interval means of a falling loss: the bend where the fall slows is a few sigmas, not 20."""
    loss = np.array([9.48, 7.16, 6.22, 5.73, 5.02, 4.42, 3.90, 3.39, 3.15, 2.98, 2.84, 2.74, 2.65, 2.58, 2.52])
    found = real_noise.changes(np.arange(1, 16) * 100, loss)
    assert len(found) and np.abs(found).max() < 8


def test_a_jump_of_an_excerpt_is_no_change(real_noise: ModuleType) -> None:
    """Two stretches of a run 4,000 steps apart, the grad norm 100x higher in the second: 29 + 29
    changes (past step 100: no start-up to leave out), the jump not one of them."""
    steps = np.concatenate([np.arange(1000, 1030), np.arange(5000, 5030)])
    norms = np.concatenate([noisy_grad_norms(30, seed=3), 100 * noisy_grad_norms(30, seed=4)])
    found = real_noise.changes(steps, norms)
    assert len(found) == 29 + 29 and np.abs(found).max() < 10


def values(text: str, key: str) -> np.ndarray:
    return np.array([json.loads(line)[key] for line in text.splitlines() if line.startswith("{")], dtype=float)


def test_synth_draws_its_noise_through_the_hook(real_noise: ModuleType) -> None:
    """`RunSpec.noise_draws`: by default synth's own draws, bit for bit; a model's replace those of
    its keys (here grad-norm draws of +-40 sigmas) and leave the loss as it was."""
    spec = RunSpec(fmt="jsonl", steps=400, seed=5, fp16=False)
    plain = "".join(generate(spec))
    assert "".join(generate(dataclasses.replace(spec, noise_draws=normal_draws))) == plain
    pools = {"grad": real_noise.Pool(("x.log",), (np.array([-40.0, 40.0]),))}
    heavy = "".join(generate(dataclasses.replace(spec, noise_draws=real_noise.Resampled(pools))))
    assert np.array_equal(values(heavy, "loss"), values(plain, "loss"))
    assert np.log(values(plain, "grad_norm")[100:]).std() < 0.5
    assert np.log(values(heavy, "grad_norm")[100:]).std() > 5

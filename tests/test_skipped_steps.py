"""skipped_steps reads DeepSpeed's `step=N, skipped=K` counters as columns and looks closely only
at the lines that can alert; its alerts must be those of looking at every line in turn.

The reference below is that plain rule: each line against the one before it, every counted line
observed. Sequences are random: healthy stretches, bursts of skips, runs that skip everything,
restarts (steps going back), another engine's counter, and batches cut anywhere.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from gradwatch.detectors.skipped_steps import SkippedSteps, SkippedStepsConfig
from gradwatch.events import SkipCounts
from gradwatch.parsers.stream import Batch
from gradwatch.records import RecordBuilder


def _reference(lines: list[tuple[int, int, int]], config: SkippedStepsConfig) -> list[dict]:
    """The alerts of observing every counted line in turn (the rule as first written)."""
    det = SkippedSteps(config)
    last: tuple[int, int] | None = None
    alerts = []
    for line, step, total in lines:
        previous, last = last, (step, total)
        if previous is None:
            covered, skipped = step, total
        elif step > previous[0] and total >= previous[1]:
            covered, skipped = step - previous[0], total - previous[1]
        else:
            continue
        if covered <= 0:
            continue
        alert = det._observe(det._deepspeed, line, step, covered, float(skipped))
        if alert is not None:
            alerts.append(alert.to_json())
    return alerts


def _batched(lines: list[tuple[int, int, int]], cuts: list[int], config: SkippedStepsConfig) -> list[dict]:
    det = SkippedSteps(config)
    alerts = []
    for a, b in zip([0, *cuts], [*cuts, len(lines)], strict=True):
        rows = np.array(lines[a:b], dtype=np.int64).reshape(-1, 3)
        batch = Batch(RecordBuilder.empty(), skip_counts=SkipCounts(rows[:, 0], rows[:, 1], rows[:, 2]))
        alerts += [alert.to_json() for alert in det.update(batch)]
    return alerts


def _counters(rng: random.Random, n: int) -> list[tuple[int, int, int]]:
    """`n` progress lines of a run with random episodes."""
    out, step, total, line = [], 0, 0, 0
    mode = "healthy"
    for _ in range(n):
        if rng.random() < 0.05:
            mode = rng.choice(["healthy", "healthy", "burst", "all", "restart", "other engine"])
        every = rng.choice([1, 5, 10, 10, 50])
        line += rng.randint(1, 30)
        if mode == "restart":
            step, mode = max(0, step - rng.randint(1, 400)), "healthy"
            total = max(0, total - rng.randint(0, 3))
            out.append((line, step, total))
            continue
        if mode == "other engine":
            out.append((line, rng.randint(0, step + 5), rng.randint(0, total + 5)))
            continue
        step += every
        if mode == "burst":
            total += rng.randint(0, every)
        elif mode == "all":
            total += every
        elif rng.random() < 0.02:
            total += 1
        out.append((line, step, total))
    return out


CONFIGS = [
    SkippedStepsConfig(),
    SkippedStepsConfig(window=20, max_rate=0.1, calibration_steps=0, quiet_steps=30, min_steps=10),
    SkippedStepsConfig(window=300, max_rate=0.5, all_skipped_fraction=0.5, min_steps=200),
]


@pytest.mark.parametrize("seed", range(60))
def test_counters_read_as_columns_alert_as_every_line_observed(seed: int) -> None:
    rng = random.Random(seed)
    lines = _counters(rng, rng.choice([5, 50, 400, 1500]))
    config = CONFIGS[seed % len(CONFIGS)]
    expected = _reference(lines, config)
    cuts = sorted(rng.sample(range(1, len(lines)), min(len(lines) - 1, rng.randint(0, 12))))
    assert _batched(lines, cuts, config) == expected
    assert _batched(lines, [], config) == expected


def test_the_random_runs_do_alert() -> None:
    """The comparison above means something: the runs raise both kinds of alert."""
    messages = []
    for seed in range(60):
        rng = random.Random(seed)
        lines = _counters(rng, rng.choice([5, 50, 400, 1500]))
        messages += [a["message"] for a in _reference(lines, CONFIGS[seed % len(CONFIGS)])]
    assert sum("the run is not training" in m for m in messages) >= 5
    assert sum("of the last" in m for m in messages) >= 20


def test_a_zero_skip_line_that_reaches_min_steps_alerts_all_skipped() -> None:
    """45 of 45 steps skipped, then a line that skipped nothing brings the count to 50: 45 of 50
    is still 90%, and that line is the one that says so."""
    lines = [(1, 45, 45), (2, 50, 45)]
    config = SkippedStepsConfig(window=5)  # the skips at step 45 are out of the window at 50
    alerts = _batched(lines, [], config)
    assert [(a["step"], a["line"]) for a in alerts] == [(50, 2)]
    assert alerts == _reference(lines, config)


def test_skips_out_of_the_window_stay_out_after_a_restart_in_the_next_batch() -> None:
    """Step 10's skips leave the window at step 100, a line that is not looked at closely; after a
    restart in the next batch, step 15's one skip must not be counted with them."""
    config = SkippedStepsConfig(window=20, calibration_steps=0, quiet_steps=0, min_steps=1000)
    lines = [(1, 10, 5), (2, 100, 5), (3, 5, 5), (4, 15, 6)]
    expected = _reference(lines, config)
    assert [a["step"] for a in expected] == [10]
    assert _batched(lines, [2], config) == expected


def test_a_zero_skip_line_alerts_on_the_rate_once_calibration_is_over() -> None:
    """Skips during calibration do not alert, but they are still in the window at the first line after it."""
    config = SkippedStepsConfig(calibration_steps=100)
    lines = [(1, 0, 0), *((k, 10 * k, 0) for k in range(1, 9)), (9, 90, 40), (10, 100, 40), (11, 110, 40)]
    alerts = _batched(lines, [3, 10], config)
    assert [(a["step"], a["severity"]) for a in alerts] == [(110, "warning")]
    assert alerts == _reference(lines, config)


def test_skips_from_before_a_restart_still_in_the_window_count_after_a_batch_cut() -> None:
    """After a restart the window holds skips out of step order (step 1000, then step 10); a
    line in the next batch that skipped nothing still sees both (found by review)."""
    config = SkippedStepsConfig(min_steps=10**6)
    lines = [(1, 1000, 20), (2, 5, 20), (3, 10, 30), (4, 200, 30)]
    expected = _reference(lines, config)
    assert [(a["step"], a["severity"]) for a in expected] == [(200, "warning")]
    assert _batched(lines, [3], config) == expected


@pytest.mark.parametrize("seed", range(30))
def test_counts_beyond_exact_floats_alert_as_every_line_observed(seed: int) -> None:
    """Steps and counts beyond 2**53: the totals are summed in the order the lines come,
    so they round as observing every line does, and an emptied window holds no residue."""
    rng = random.Random(seed)
    scale = rng.choice([10**12, 10**13, 10**14])  # up to 2**63 over the steps of `_counters`
    lines = [(line, step * scale, total * scale) for line, step, total in _counters(rng, rng.choice([50, 300]))]
    config = CONFIGS[seed % len(CONFIGS)]
    cuts = sorted(rng.sample(range(1, len(lines)), min(len(lines) - 1, rng.randint(0, 12))))
    assert _batched(lines, cuts, config) == _reference(lines, config)


# Cases a review found with steps and counts beyond 2**53 (the window's sums round there)
ROUNDING_CASES = [
    # the window empties, but its running sum would keep a rounding residue of 32 "skips"
    (
        [
            (213, 502514228689312285, 165558388779213128),
            (269, 1279999999999993155, 313419999999999991),
            (272, 1289999999999993155, 313419999999999991),
        ],
        SkippedStepsConfig(window=20, max_rate=0.1, calibration_steps=0, quiet_steps=30, min_steps=10),
        2,
    ),
    # what lines not looked at drop from the window is dropped before the next line adds its skips
    (
        [
            (261, 1479999999999990842, 453799999999999989),
            (266, 1489999999999990842, 453799999999999989),
            (267, 1348956971676798266, 449326905457930088),
            (302, 1688999999999990842, 534139999999999989),
        ],
        SkippedStepsConfig(window=300, max_rate=0.5, all_skipped_fraction=0.5, min_steps=200),
        2,
    ),
    # totals are summed line after line in floating point: 2**53 + 1 + 1 stays 2**53
    (
        [(1, 2**53, 2**53), (2, 2**53 + 1, 2**53 + 1), (3, 2**53 + 2, 2**53 + 2), (4, 2**53 + 3, 2**53 + 3)],
        SkippedStepsConfig(min_steps=2**53 + 2, max_rate=1e30),
        0,
    ),
]


@pytest.mark.parametrize(("lines", "config", "alerts"), ROUNDING_CASES)
def test_sums_beyond_exact_floats_round_as_observing_every_line_does(
    lines: list[tuple[int, int, int]], config: SkippedStepsConfig, alerts: int
) -> None:
    expected = _reference(lines, config)
    assert len(expected) == alerts
    for cuts in ([], *([c] for c in range(1, len(lines))), [1, 2]):
        assert _batched(lines, cuts, config) == expected

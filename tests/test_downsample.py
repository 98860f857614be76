"""MinMaxBuckets: bounded memory, spikes kept, and the same buckets whatever the batching."""

from __future__ import annotations

import numpy as np
import pytest

from gradwatch.downsample import MinMaxBuckets


def feed(buckets: MinMaxBuckets, x: np.ndarray, y: np.ndarray, cuts: list[int]) -> MinMaxBuckets:
    for a, b in zip([0, *cuts], [*cuts, len(x)], strict=True):
        buckets.add(x[a:b], y[a:b])
    return buckets


def test_a_million_points_fit_in_capacity_and_the_spike_survives() -> None:
    x = np.arange(1, 1_000_001, dtype=np.float64)
    y = np.random.default_rng(0).normal(1.0, 0.01, len(x))
    y[400_000], y[700_000] = 50.0, -3.0
    b = feed(MinMaxBuckets(64), x, y, list(range(100_000, 1_000_000, 100_000)))
    assert len(b) <= 64
    env = b.envelope(40)
    assert len(env) == 40
    assert env.hi.max() == 50.0 and env.hi_x[env.hi.argmax()] == 400_001
    assert env.lo.min() == -3.0 and env.lo_x[env.lo.argmin()] == 700_001
    xs, _ = env.polyline()
    assert (np.diff(xs) >= 0).all()


def test_batching_and_order_do_not_change_the_buckets() -> None:
    rng = np.random.default_rng(1)
    x = np.concatenate([np.arange(0, 5000), np.arange(3000, 9000)]).astype(np.float64)  # a resume replays steps
    y = rng.random(len(x))
    whole = feed(MinMaxBuckets(100), x, y, [])
    for _ in range(5):
        cuts = sorted(rng.choice(np.arange(1, len(x)), size=20, replace=False).tolist())
        parts = feed(MinMaxBuckets(100), x, y, cuts)
        for a, b in zip(whole.envelope(50).__dict__.values(), parts.envelope(50).__dict__.values(), strict=True):
            np.testing.assert_array_equal(a, b)


def test_nan_inf_and_stepless_points_are_skipped() -> None:
    b = MinMaxBuckets(8)
    b.add(np.array([-1.0, 1.0, 2.0, 3.0]), np.array([5.0, np.nan, np.inf, 2.0]))
    env = b.envelope(4)
    assert env.lo.tolist() == [2.0] and env.hi_x.tolist() == [3.0]
    assert len(MinMaxBuckets(8).envelope(10)) == 0


def test_capacity_must_allow_two_buckets() -> None:
    with pytest.raises(ValueError, match="capacity"):
        MinMaxBuckets(1)

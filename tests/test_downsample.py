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


@pytest.mark.parametrize("seed", range(8))
def test_buckets_of_few_per_batch_are_those_of_every_point(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A large batch that falls in few buckets is reduced slice by slice (`_few_buckets`): the
    buckets, with where each minimum and maximum first occurs, are those reducing every point
    gives. Ties (values rounded to a few levels), resumes, jumps, NaN and huge batches included."""
    from gradwatch import downsample

    rng = np.random.default_rng(seed)
    n = 200_000
    x = np.arange(n, dtype=np.float64) * rng.choice([1, 10])
    if seed % 2:
        x[n // 2 :] -= 30_000  # a resume replays steps: keys out of order in that batch
    x[n // 3 :] += 500_000  # skipped ahead: buckets left empty within a batch
    y = np.round(rng.normal(1.0, 0.3, n), 1)  # few levels: many ties for the min and the max
    if seed % 3 == 0:
        y = np.where(rng.random(n) < 0.5, -0.0, 0.0)  # equal zeros of both signs
    y[rng.integers(0, n, 50)] = np.nan
    cuts = sorted(set(rng.integers(1, n, 12).tolist()))
    capacity = int(rng.choice([16, 128, 1000]))
    fast = feed(MinMaxBuckets(capacity), x, y, cuts)
    monkeypatch.setattr(downsample, "_FEW_BUCKETS_FROM", n + 1)
    slow = feed(MinMaxBuckets(capacity), x, y, cuts)
    for a, b in zip(fast._columns(), slow._columns(), strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(np.signbit(a), np.signbit(b))
    assert fast.width == slow.width and fast.x_range() == slow.x_range()

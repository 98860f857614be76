"""The spike score's window stats: pandas' rolling mean and standard deviation, to rounding, but
the same bits however a run is cut into batches, and no trace of a value once it left the window."""

from __future__ import annotations

import pickle

import numpy as np
import pandas as pd
import pytest

from gradwatch.spike_score import SpikeScore, window_means, window_stats
from tests.conftest import metric_columns


def _rough(rng: np.random.Generator, n: int) -> np.ndarray:
    """A loss-like series with spikes, a constant stretch and a shift of level."""
    values = rng.normal(3.0, 0.1, n)
    values[n // 3 : n // 2] = 2.5  # no spread at all
    values[n // 2 :] += 40.0
    values[rng.integers(0, n, 6)] = 1e6
    return values


def _exact(values: np.ndarray, window: int, min_periods: int) -> tuple[np.ndarray, np.ndarray]:
    """Each window's mean and standard deviation by numpy, two passes over the window's values."""
    mean, std = np.full(len(values), np.nan), np.full(len(values), np.nan)
    for i in range(min_periods, len(values)):
        before = values[max(0, i - window) : i]
        mean[i] = before.mean()
        if len(before) > 1:  # (ddof 1: none of one value)
            std[i] = 0.0 if before.min() == before.max() else before.std(ddof=1)
    return mean, std


def _in_batches(values: np.ndarray, cuts: list[int], window: int, min_periods: int) -> tuple[np.ndarray, np.ndarray]:
    """`window_stats` fed as `SpikeScore.update` feeds it: the last `window` values carried."""
    means, stds, tail, seen = [], [], np.empty(0), 0
    for lo, hi in zip([0, *cuts], [*cuts, len(values)], strict=True):
        joined = np.concatenate([tail, values[lo:hi]])
        mean, std = window_stats(joined, len(tail), seen - len(tail), window, float(values[0]), min_periods)
        means.append(mean)
        stds.append(std)
        tail, seen = joined[-window:], seen + hi - lo
    return np.concatenate(means), np.concatenate(stds)


@pytest.mark.parametrize(("window", "min_periods"), [(1000, 100), (64, 10), (7, 7), (2, 1), (1, 1)])
def test_window_stats_are_each_windows_mean_and_std(window: int, min_periods: int) -> None:
    """As numpy finds them window by window, to 1e-9 of the spread in windows of 64 and more;
    pandas' rolling sums, the score's stats before, are off by 2e-4 of it in windows of 1000
    where values of 1e6 passed through."""
    rng = np.random.default_rng(window)
    values = _rough(rng, 6000)
    mean, std = window_stats(values, 0, 0, window, float(values[0]), min_periods)
    expected_mean, expected_std = _exact(values, window, min_periods)
    np.testing.assert_array_equal(np.isnan(mean), np.isnan(expected_mean))
    np.testing.assert_array_equal(np.isnan(std), np.isnan(expected_std))
    np.testing.assert_array_equal(std == 0, expected_std == 0)  # a window of one value: no spread
    spread = expected_std > 0
    # sums are taken about the run's first value: a window of two values 40 above it and 1e-5
    # apart keeps only 4 digits of their spread (the score's windows of 1000 keep 10)
    rtol = 1e-9 if window >= 64 else 1e-3
    np.testing.assert_allclose(std[spread], expected_std[spread], rtol=rtol)
    np.testing.assert_array_less(np.abs(mean - expected_mean)[spread], rtol * expected_std[spread])
    pandas_mean = pd.Series(values).rolling(window, min_periods=min_periods).mean().shift(1).to_numpy()
    np.testing.assert_array_equal(np.isnan(mean), np.isnan(pandas_mean))


@pytest.mark.parametrize("seed", range(6))
def test_window_means_are_window_stats_means_bit_for_bit(seed: int) -> None:
    """loss_divergence's level mean (`window_means`, no spread computed) is `window_stats`' mean
    with one value needed, for batches cut anywhere in the run with the tails they carry."""
    rng = np.random.default_rng(seed)
    values = _rough(rng, 3000)
    window = [1000, 50, 3][seed % 3]
    for seen in sorted(set(rng.integers(0, len(values) - 1, 30).tolist())):
        start = min(window, seen)  # the tail: the last `window` values before the batch
        joined = values[seen - start : int(rng.integers(seen + 1, len(values) + 1))]
        expected = window_stats(joined, start, seen - start, window, float(values[0]), 1)[0]
        np.testing.assert_array_equal(window_means(joined, start, seen - start, window, float(values[0])), expected)


@pytest.mark.parametrize("seed", range(6))
def test_window_stats_are_the_same_bits_however_the_run_is_cut(seed: int) -> None:
    rng = np.random.default_rng(seed)
    values = _rough(rng, 7000)
    window = [1000, 50, 3][seed % 3]
    whole = window_stats(values, 0, 0, window, float(values[0]), min(100, window))
    small = sorted(set(rng.integers(1, len(values), 2000).tolist()))  # many cuts, a value or a few apart
    large = sorted(set(rng.integers(1, len(values), 5).tolist()))
    for cuts in (small, large):
        mean, std = _in_batches(values, cuts, window, min(100, window))
        np.testing.assert_array_equal(mean, whole[0])
        np.testing.assert_array_equal(std, whole[1])


def test_spike_score_in_batches_computes_the_stats_of_the_whole_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """What `update` carries from batch to batch (the tail, the count of values seen, the origin)
    gives each value the stats of the run fed at once, bit for bit, NaN and inf skipped."""
    from gradwatch import spike_score

    rng = np.random.default_rng(10)
    loss = _rough(rng, 5000)
    loss[rng.integers(0, 5000, 40)] = np.nan
    loss[123] = np.inf
    stats: list[tuple[np.ndarray, np.ndarray]] = []
    real = spike_score.window_stats

    def recorded(*args: object) -> tuple[np.ndarray, np.ndarray]:
        stats.append(real(*args))  # type: ignore[arg-type]
        return stats[-1]

    monkeypatch.setattr(spike_score, "window_stats", recorded)
    whole = SpikeScore()
    whole.update(metric_columns({"loss": loss, "grad_norm": loss}))
    expected = stats[0]
    cuts = sorted(set(rng.integers(1, len(loss), 300).tolist()))
    stats.clear()
    pieces = SpikeScore()
    for lo, hi in zip([0, *cuts], [*cuts, len(loss)], strict=True):
        pieces.update(metric_columns({"loss": loss[lo:hi], "grad_norm": np.full(hi - lo, np.nan)}))
    np.testing.assert_array_equal(np.concatenate([mean for mean, _ in stats]), expected[0])
    np.testing.assert_array_equal(np.concatenate([std for _, std in stats]), expected[1])
    assert pieces.spikes["loss"] == whole.spikes["loss"] > 0 and pieces.counted["loss"] == whole.counted["loss"]


@pytest.mark.parametrize("huge", [1e12, 1e200, np.finfo(np.float64).max])
def test_a_huge_value_leaves_no_trace_once_out_of_the_window(huge: float) -> None:
    """Running sums kept a rounding residue of a 1e12 long after it left the window and counted
    184 spikes in the unit noise after it; 1e200 overflows its square."""
    rng = np.random.default_rng(7)
    noise = rng.normal(0, 1, 4000)
    spiked = noise.copy()
    spiked[500] = huge
    plain_mean, plain_std = window_stats(noise, 0, 0, 1000, float(noise[0]), 100)
    mean, std = window_stats(spiked, 0, 0, 1000, float(noise[0]), 100)
    np.testing.assert_array_equal(mean[1501:], plain_mean[1501:])  # windows after it: the same bits
    np.testing.assert_array_equal(std[1501:], plain_std[1501:])
    np.testing.assert_array_equal(mean[:501], plain_mean[:501])
    score = SpikeScore()
    score.update(metric_columns({"loss": spiked, "grad_norm": np.abs(noise) + 1}))
    assert score.spikes["loss"] == 1


@pytest.mark.parametrize("first", [1.0, 1e4, 1e6, 1e8])
def test_an_outlier_first_value_costs_no_digits(first: float) -> None:
    """The sums are taken about the median of the first 100 values, not about the first value: a
    first grad norm of 1e6 before values of 1.0 +- 1% cancelled every digit of their spread."""
    rng = np.random.default_rng(11)
    values = rng.normal(1.0, 0.01, 3000)
    values[0], values[1500] = first, 1.2  # one real spike of 20 sigma
    score = SpikeScore()
    score.update(metric_columns({"loss": values, "grad_norm": np.full(3000, np.nan)}))
    mean, std = _exact(values, 1000, 100)
    judged = np.isfinite(std) & (std > 0)
    expected = int((np.abs(values - mean)[judged] > 7 * std[judged]).sum())
    assert (score.spikes["loss"], score.counted["loss"]) == (expected, int(judged.sum())) == (1, 2900)


def test_spike_score_counts_the_values_beyond_seven_sigma() -> None:
    rng = np.random.default_rng(8)
    loss = rng.normal(3.0, 0.01, 5000)
    loss[[1200, 3300, 4100]] = [3.5, 2.5, 3.2]  # 50, 50 and 20 sigma
    loss[2000] = 3.05  # 5 sigma: not a spike
    score = SpikeScore()
    score.update(metric_columns({"loss": loss, "grad_norm": np.full(5000, np.nan)}))
    assert score.spikes == {"loss": 3, "grad_norm": 0}
    assert score.counted == {"loss": 5000 - 100, "grad_norm": 0}  # judged from the 100th value before on
    assert score.percent() == {"loss": pytest.approx(300 / 4900), "grad_norm": None}


def test_a_score_pickled_before_blocks_were_counted_reads_on() -> None:
    """A scan state saved by an older version has no `_seen` or `_origin`: its blocks begin at
    its tail, and reading on takes the score on from there."""
    rng = np.random.default_rng(9)
    loss = _rough(rng, 3000)
    old = SpikeScore()
    old.update(metric_columns({"loss": loss[:1500], "grad_norm": loss[:1500]}))
    del old.__dict__["_seen"], old.__dict__["_origin"]
    restored = pickle.loads(pickle.dumps(old))
    restored.update(metric_columns({"loss": loss[1500:], "grad_norm": loss[1500:]}))
    assert restored.counted["loss"] == 3000 - 100
    assert SpikeScore._seen == {} and SpikeScore._origin == {}  # the class defaults stay empty

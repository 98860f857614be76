"""Detectors compute a window median only where the window's bounds leave a value in doubt; the
alerts must be those of computing every median.

`prev_window_median(..., wanted)` gives the same medians where wanted (NaN elsewhere), and
`prev_window_lowest` and `prev_window_highest` bound them. Then each detector that narrows its
medians runs on rough random records twice: as shipped, and with every median computed.
"""

from __future__ import annotations

import numpy as np
import pytest

from gradwatch.detectors import grad_norm_spike, loss_collapse, stall, throughput_drop
from gradwatch.detectors.base import Detector, prev_window_highest, prev_window_lowest, prev_window_median
from gradwatch.parsers.stream import Batch
from gradwatch.records import columns_of


@pytest.mark.parametrize("seed", range(20))
def test_wanted_medians_equal_all_medians_there(seed: int) -> None:
    rng = np.random.default_rng(seed)
    tail = rng.lognormal(size=int(rng.integers(0, 40)))
    values = rng.lognormal(size=int(rng.integers(1, 400)))
    values[rng.random(len(values)) < 0.1] = np.nan
    window = int(rng.integers(1, 50))
    wanted = rng.random(len(values)) < rng.choice([0.01, 0.05, 0.5])
    everything, tail_after = prev_window_median(tail, values, window)
    some, same_tail = prev_window_median(tail, values, window, wanted)
    np.testing.assert_array_equal(some[wanted], everything[wanted])
    assert np.isnan(some[~wanted]).all()
    np.testing.assert_array_equal(same_tail, tail_after)
    lo, hi = prev_window_lowest(tail, values, window), prev_window_highest(tail, values, window)
    known = ~np.isnan(everything)
    assert (lo[known] <= everything[known]).all() and (everything[known] <= hi[known]).all()
    assert (np.isnan(lo) == ~known).all()


def _every_median(
    tail: np.ndarray, values: np.ndarray, window: int, wanted: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    return prev_window_median(tail, values, window)


def _run(rng: np.random.Generator) -> list[Batch]:
    """Records whose grad norm, loss and throughput wander, jump by factors of 1 to 30, and fall
    for stretches of 1 to 12 logs to 0.1-100% of their level (the loss to 0.1-5%, its grad norm
    with it or not), often: many values sit near the detectors' thresholds. Cut into random batches."""
    n = 3000
    level = np.exp(np.cumsum(rng.normal(0, 0.02, n)))
    jumps = np.where(rng.random(n) < 0.05, rng.uniform(1, 30, n), 1.0)
    slow, collapsed, grad_collapsed = np.ones(n), np.ones(n), np.ones(n)
    for start in rng.choice(n, size=60, replace=False).tolist():
        stretch = slice(start, start + int(rng.integers(1, 13)))
        slow[stretch] = rng.uniform(0.001, 1.0)
        if rng.random() < 0.5:
            collapsed[stretch] = rng.uniform(0.001, 0.05)
            grad_collapsed[stretch] = collapsed[stretch] if rng.random() < 0.5 else 1.0
    data = {
        "step": np.arange(1, n + 1),
        "line": np.arange(1, n + 1) * 3,
        "grad_norm": level * jumps * grad_collapsed * rng.lognormal(0, 0.3, n),
        "loss": 3 * level * collapsed * rng.lognormal(0, 0.05, n),
        "tflops": 150 * slow * rng.lognormal(0, 0.1, n),
        "nonfinite": np.full(n, ""),
    }
    cuts = np.sort(rng.choice(np.arange(1, n), size=int(rng.integers(0, 40)), replace=False))
    bounds = [0, *cuts.tolist(), n]
    return [
        Batch(columns_of({k: v[a:b] for k, v in data.items()}).frame) for a, b in zip(bounds, bounds[1:], strict=False)
    ]


def _alerts(detector: type[Detector], batches: list[Batch]) -> list[dict]:
    det = detector()
    return [a.to_json() for b in batches for a in det.update(b)]


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize(
    "detector", [grad_norm_spike.GradNormSpike, loss_collapse.LossCollapse, throughput_drop.ThroughputDrop]
)
def test_narrowed_medians_raise_the_alerts_of_all_medians(
    detector: type[Detector], seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches = _run(np.random.default_rng(seed))
    shipped = _alerts(detector, batches)
    assert any(a["severity"] != "info" for a in shipped), "the run should alert"
    for module in (grad_norm_spike, loss_collapse, throughput_drop):
        monkeypatch.setattr(module, "prev_window_median", _every_median)
    assert _alerts(detector, batches) == shipped


def _batch(**columns: list[float]) -> Batch:
    n = len(next(iter(columns.values())))
    data = {"step": np.arange(1, n + 1), "line": np.arange(1, n + 1), "nonfinite": np.full(n, "")}
    return Batch(columns_of({**data, **{k: np.array(v, dtype=np.float64) for k, v in columns.items()}}).frame)


@pytest.mark.parametrize(
    ("detector", "batch"),
    [
        # two middle values whose mean overflows: the median is inf, beyond the window's largest
        (loss_collapse.LossCollapse(loss_collapse.LossCollapseConfig(window=2)), _batch(loss=[1e308, 1e308, 5e307])),
        (
            throughput_drop.ThroughputDrop(throughput_drop.ThroughputDropConfig(window=2, min_history=1, sustain=1)),
            _batch(tflops=[1e308, 1e308, 5e307, 1.0, 1e308, 1e308, 1.0]),
        ),
        # signed zeros: which middle zero a heap or a partition picks must not show
        (
            loss_collapse.LossCollapse(loss_collapse.LossCollapseConfig(window=3, min_baseline=0.0)),
            _batch(loss=[-1.0] * 60 + [0.0, -0.0, 0.0, 0.0]),
        ),
    ],
)
def test_medians_at_the_edges_of_floats_raise_the_alerts_of_all_medians(
    detector: Detector, batch: Batch, monkeypatch: pytest.MonkeyPatch
) -> None:
    import copy

    shipped = [a.to_json() for a in copy.deepcopy(detector).update(batch)]
    assert shipped, "the case should alert"
    for module in (grad_norm_spike, loss_collapse, throughput_drop):
        monkeypatch.setattr(module, "prev_window_median", _every_median)
    assert [a.to_json() for a in detector.update(batch)] == shipped


def test_a_zero_median_is_positive_zero_both_ways() -> None:
    from gradwatch.detectors.base import median, moving_median

    values = np.array([0.0, -0.0, -0.0, 0.0, -0.0])
    assert np.signbit(moving_median(values, 3)).sum() == 0
    assert not np.signbit(median(values)) and not np.signbit(median(values[:4]))


@pytest.mark.parametrize("seed", range(12))
def test_loss_collapse_alerts_do_not_depend_on_where_batches_are_cut(seed: int) -> None:
    """A collapsed stretch must not pull the baseline down, within a batch as across batches:
    each loss's median is that of the healthy losses before it (found by review: `--jobs 2`
    cut batches elsewhere than `--jobs 1` and raised other alerts)."""
    import pandas as pd

    batches = _run(np.random.default_rng(seed))
    whole = Batch(pd.concat([b.records for b in batches], ignore_index=True))
    cut = _alerts(loss_collapse.LossCollapse, batches)
    assert any(a["severity"] != "info" for a in cut), "the run should alert"
    assert _alerts(loss_collapse.LossCollapse, [whole]) == cut
    one_by_one = [Batch(whole.records.iloc[k : k + 1].reset_index(drop=True)) for k in range(0, 600)]
    assert _alerts(loss_collapse.LossCollapse, one_by_one) == _alerts(
        loss_collapse.LossCollapse, [Batch(whole.records.iloc[:600].reset_index(drop=True))]
    )


@pytest.mark.parametrize("cut", [None, 10, 55, 80])
def test_a_long_collapse_stays_one_incident_however_it_is_batched(cut: int | None) -> None:
    """Longer than the window, a collapse must not become the baseline: no "away from 0 again"
    while the loss is still at 0.001."""
    n = 150
    loss = np.where(np.arange(n) < 50, 3.0, 0.001)
    batch = _batch(loss=loss.tolist())  # no grad norm logged: it counts as about 0
    parts = (
        [batch]
        if cut is None
        else [Batch(batch.records.iloc[a:b].reset_index(drop=True)) for a, b in ((0, cut), (cut, n))]
    )
    alerts = _alerts(loss_collapse.LossCollapse, parts)
    assert [(a["severity"], a["step"]) for a in alerts] == [("critical", 51)]


def _stall_run(rng: np.random.Generator) -> list[Batch]:
    """Records 1-10 steps apart whose pace wanders: timed gaps from a heavy tail with hangs of up
    to a day, step times where the clock is missing, and restarts; cut into random batches."""
    n = 3000
    steps = np.cumsum(rng.choice([1, 1, 1, 10], n))
    gaps = rng.lognormal(2.0, 1.0, n) * np.where(rng.random(n) < 0.03, rng.uniform(5, 8000, n), 1.0)
    ts = 1.7e9 + np.cumsum(gaps)
    ts[rng.random(n) < 0.2] = np.nan
    step_time = np.where(rng.random(n) < 0.3, rng.lognormal(2.0, 1.0, n), np.nan)
    data = {
        "step": steps,
        "line": np.arange(1, n + 1) * 2,
        "ts": ts,
        "step_time_s": step_time,
        "loss": np.full(n, 2.0),
        "nonfinite": np.full(n, ""),
    }
    cuts = np.sort(rng.choice(np.arange(1, n), size=int(rng.integers(0, 40)), replace=False))
    bounds = [0, *cuts.tolist(), n]
    return [
        Batch(columns_of({k: v[a:b] for k, v in data.items()}).frame) for a, b in zip(bounds, bounds[1:], strict=False)
    ]


@pytest.mark.parametrize("seed", range(12))
def test_stall_medians_where_in_doubt_raise_the_alerts_of_all_medians(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(seed)
    batches = _stall_run(rng)
    config = stall.StallConfig(
        factor=[10.0, 3.0, 1.5, 0.0, 0.5][seed % 5],
        floor_s=[600.0, 60.0, 0.0][seed % 3],
        history=[50, 7, 1][seed % 4 % 3],
    )

    def alerts() -> list[dict]:
        detector = stall.Stall(config)
        return [a.to_json() for b in batches for a in detector.update(b)]

    shipped = alerts()
    assert shipped or config.factor <= 0 or config.floor_s >= 600, "the run should alert"
    monkeypatch.setattr(stall.Stall, "_least_limit", lambda self, joined, ends: np.full(len(ends), -np.inf))
    assert alerts() == shipped

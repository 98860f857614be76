"""Loss divergence: a sustained rise, not a one-off spike.

Three rules, all computed over whole batches with numpy, with the tail of the stream carried:
- rises: the loss rose on `rising_logs` consecutive logs, by at least `rise_ratio` and
  `rise_delta` nats in total, and by as much without its largest step (BigScience tr8-104B: 6.37,
  6.60, 7.31, 9.12, 10.24): a climb, not one jump; under the heavy tails of real per-step noise
  two small rises and one ordinary +20% bump make three rises of 1.2x at tens per 10k steps;
- trend: the median of the last `trend_window` logs is `rise_ratio` times (and `rise_delta` nats
  above) the lowest such median of the `trend_lookback` logs before them: a noisy climb that
  never rises three times in a row is still caught, and a short spike moves no median;
- level (llm-foundry's KillLossSpike): the loss at least `level_ratio` times the mean of the
  previous `window` logs for more than `level_logs` consecutive logs: critical;
- above the start: `above_start_steps` or more steps into a run that the log shows from its
  first log interval, the loss on `rising_logs` consecutive logs at least `rise_delta` nats
  above the level it started at (the median of its first `rising_logs` logs): a healthy run is
  far below its initial loss by then, and one back above it has undone its training, however
  few logs show it (an excerpt: 10.65 at iterations 1-3, 12.67, 13.40, 12.55 at 2498-2500). A
  log that begins mid-run (a resumed job, an excerpt) has no initial loss to compare with: a
  change of data mix late in a run may lift the loss above where that log began.
Every rule compares with a positive level: a ratio to a negative or zero level says nothing (an
RL policy loss of -0.15 is "above 2x" a mean of -0.10), and such losses are no cross-entropy.
A step going backwards or repeating (a resume) restarts the history: that jump is resume_regression's.
Records that logged a non-finite value are skipped: their other fields are not a loss level (the
HF Trainer prints `'loss': 0.0` beside `'grad_norm': nan`, and a climb "from 0" after it is the
run going back to normal, not diverging); the nonfinite detector owns them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import bottleneck as bn
import numpy as np

from gradwatch.alerts import Alert, Severity
from gradwatch.detectors.base import (
    SMALL_BATCH,
    BuiltInConfig,
    Detector,
    columns,
    median,
    moving_median,
)
from gradwatch.parsers.stream import Batch
from gradwatch.spike_score import window_means

_HINT = (
    "the loss is climbing, not spiking: stop or roll back to a checkpoint before the rise, then lower "
    "the learning rate, check for a bad data shard, and with fp16 consider bf16; check the grad norm "
    "and (if logged) the output-logit norm for what started it"
)


@dataclass(frozen=True, kw_only=True)
class LossDivergenceConfig(BuiltInConfig):
    positive: ClassVar[tuple[str, ...]] = ("trend_window", "trend_lookback", "window")
    rising_logs: int = 3
    rise_ratio: float = 1.2
    rise_delta: float = 0.3
    trend_window: int = 20
    trend_lookback: int = 200
    window: int = 100
    level_ratio: float = 2.0
    level_logs: int = 4
    above_start_steps: int = 1000
    quiet: int = 50


def _run_lengths(flags: np.ndarray, carried: int) -> np.ndarray:
    """Length of the run of True ending at each position (a run may continue from `carried`)."""
    idx = np.arange(len(flags))
    last_false = np.maximum.accumulate(np.where(~flags, idx, -1))
    runs = idx - last_false
    return np.where(last_false < 0, runs + carried, runs)


class LossDivergence(Detector):
    id = "loss_divergence"
    description = "loss rising for several logs in a row, trending up, or held at 2x its earlier mean"
    Config = LossDivergenceConfig
    config: LossDivergenceConfig
    #: the trend median at each value of `_tail` (see `_trend`); a class default, so that a detector
    #: pickled in a scan state before it existed still loads (its medians are then computed again)
    _med_tail = np.empty(0)
    #: values since the last reset (where the level mean's blocks begin, `window_means`) and the
    #: first of them (the origin of its sums); class defaults for detectors pickled before them
    #: (blocks then begin at the kept tail)
    _count: int | None = None
    _origin: float | None = None
    #: the first logs since the last reset and their steps, and the logs in a row above their
    #: median (class defaults: a detector pickled before the rule has it from its next reset)
    _start: tuple[float, ...] | None = None
    _start_steps: tuple[int, ...] = ()
    _above = 0

    def __init__(self, config: LossDivergenceConfig | None = None, path: str = "") -> None:
        super().__init__(config, path)
        cfg = self.config
        self._keep = max(cfg.window, 2 * cfg.trend_window + cfg.trend_lookback)
        self._tail = np.empty(0)  # the last `_keep` losses
        self._med_tail = np.empty(0)
        self._rises = 0  # consecutive rises up to the last value
        self._run_start = np.nan  # the value before those rises
        self._high = 0  # consecutive logs at level_ratio x the window mean
        self._last_step: int | None = None
        self._seen = 0
        self._quiet_until = -1  # row index up to which alerts are held back
        self._count = 0
        self._origin = None
        self._start, self._start_steps, self._above = (), (), 0

    def update(self, batch: Batch) -> list[Alert]:
        rec = columns(batch)
        loss = rec["loss"]
        ok = np.isfinite(loss) & ~rec.flagged()
        if not ok.any():
            return []
        v, steps, lines = loss[ok], rec["step"][ok], rec["line"][ok]
        alerts: list[Alert] = []
        # a step going backwards is a resume: history before it says nothing about divergence
        prev_steps = np.concatenate([[self._last_step if self._last_step is not None else -1], steps[:-1]])
        cuts = np.flatnonzero(steps <= prev_steps).tolist()
        self._last_step = int(steps[-1])
        bounds, resumes = [0, *cuts, len(v)], set(cuts)  # (a set: a batch may hold a resume at every record)
        for lo, hi in zip(bounds, bounds[1:], strict=False):
            if lo in resumes:
                self._reset()
            if hi > lo:
                alerts += self._segment(v[lo:hi], steps[lo:hi], lines[lo:hi])
        return alerts

    def _reset(self) -> None:
        self._tail, self._rises, self._run_start, self._high = np.empty(0), 0, np.nan, 0
        self._med_tail = np.empty(0)
        self._count, self._origin = 0, None
        self._start, self._start_steps, self._above = (), (), 0

    def _segment(self, v: np.ndarray, steps: np.ndarray, lines: np.ndarray) -> list[Alert]:
        cfg = self.config
        tail, n = self._tail, len(v)
        joined = np.concatenate([tail, v])
        prev = joined[len(tail) - 1 : -1] if len(tail) else np.concatenate([[np.nan], v[:-1]])
        # rises
        rise = v > prev
        rises = _run_lengths(rise, self._rises)
        idx = np.arange(n)
        start_idx = idx - rises  # index (in v) of the value before the run; negative: earlier
        carried_start = self._run_start if self._rises else prev[0]  # a run that began in an earlier batch
        starts = np.where(start_idx >= 0, v[np.clip(start_idx, 0, n - 1)], carried_start)
        cond_rise = (rises >= cfg.rising_logs) & (starts > 0) & (v >= cfg.rise_ratio * starts)
        cond_rise &= v - starts >= cfg.rise_delta
        for pos in np.flatnonzero(cond_rise).tolist():  # a climb, not one jump (few: rows that rose)
            end = len(tail) + pos
            climb = float(v[pos]) - float(np.diff(joined[max(0, end - int(rises[pos])) : end + 1]).max())
            cond_rise[pos] = climb >= cfg.rise_ratio * starts[pos] and climb - starts[pos] >= cfg.rise_delta
        # trend
        med_v, ref_v = self._trend(joined, len(tail))
        cond_trend = (ref_v > 0) & (med_v >= cfg.rise_ratio * ref_v) & (med_v - ref_v >= cfg.rise_delta)
        # level
        if self._count is None:
            self._count = len(tail)
        if self._origin is None:
            self._origin = float(joined[0])
        mean = window_means(joined, len(tail), self._count - len(tail), cfg.window, self._origin)
        self._count += n
        high = (mean > 0) & (v >= cfg.level_ratio * mean)
        highs = _run_lengths(high, self._high)
        cond_level = highs > cfg.level_logs
        # above the start
        begun, start_level = self._start_level(v, steps)
        first = self._start_steps[0] if self._start_steps else 0
        above = (np.arange(n) >= begun) & (steps - first >= cfg.above_start_steps)
        above &= (start_level > 0) & (v >= start_level + cfg.rise_delta)
        aboves = _run_lengths(above, self._above)
        self._above = int(aboves[-1])
        cond_start = aboves >= cfg.rising_logs
        # carry state
        self._high = int(highs[-1])
        if rises[-1]:
            self._run_start = float(starts[-1])
        self._rises = int(rises[-1])
        self._tail = joined[-self._keep :]
        start, self._seen = self._seen, self._seen + n
        alerts: list[Alert] = []
        for pos in np.flatnonzero(cond_rise | cond_trend | cond_level | cond_start).tolist():
            if start + pos <= self._quiet_until:
                continue
            self._quiet_until = start + pos + cfg.quiet
            value = float(v[pos])
            if cond_level[pos]:
                base = float(mean[pos])
                alerts.append(
                    self.alert(
                        Severity.CRITICAL,
                        steps[pos],
                        lines[pos],
                        "loss",
                        value,
                        base,
                        cfg.level_ratio * base,
                        f"loss {value:.4g} has stayed above {cfg.level_ratio:g}x its earlier mean {base:.4g} "
                        f"for {int(highs[pos])} logs",
                        _HINT,
                    )
                )
            elif cond_rise[pos]:
                base = float(starts[pos])
                alerts.append(
                    self.alert(
                        Severity.WARNING,
                        steps[pos],
                        lines[pos],
                        "loss",
                        value,
                        base,
                        cfg.rise_ratio * base,
                        f"loss rose on {int(rises[pos])} consecutive logs, {base:.4g} -> {value:.4g}"
                        + (f" ({value / base:.2f}x)" if base > 0 else ""),
                        _HINT,
                    )
                )
            elif cond_start[pos]:
                alerts.append(
                    self.alert(
                        Severity.WARNING,
                        steps[pos],
                        lines[pos],
                        "loss",
                        value,
                        start_level,
                        start_level + cfg.rise_delta,
                        f"loss {value:.4g} is back above the level the run started at ({start_level:.4g}) "
                        f"for {int(aboves[pos])} logs, {int(steps[pos]) - first} steps in",
                        _HINT,
                    )
                )
            else:
                now, base = float(med_v[pos]), float(ref_v[pos])
                times = f"{now / base:.2f}x" if base > 0 else "above"  # a run may log a loss of 0.0
                alerts.append(
                    self.alert(
                        Severity.WARNING,
                        steps[pos],
                        lines[pos],
                        "loss",
                        now,
                        base,
                        cfg.rise_ratio * base,
                        f"loss trending up: median of the last {cfg.trend_window} logs {now:.4g} is "
                        f"{times} its recent low {base:.4g}",
                        _HINT,
                    )
                )
        return alerts

    def _start_level(self, v: np.ndarray, steps: np.ndarray) -> tuple[int, float]:
        """Take the run's first `rising_logs` values from `v` while they are missing; returns the
        index in `v` of the first value past them and their median: NaN until they are all in,
        or where the log does not show the run from its first interval (it began at a step past
        the interval between its first two records)."""
        if self._start is None:  # pickled before this rule: none until the next reset
            return len(v), float("nan")
        wanted = max(self.config.rising_logs, 1) - len(self._start)
        if wanted > 0:
            self._start += tuple(float(x) for x in v[:wanted])
            self._start_steps += tuple(int(x) for x in steps[:wanted])
        begun = max(wanted, 0)
        first, *rest = self._start_steps or (0,)
        from_beginning = first <= (rest[0] - first if rest else 1)
        if wanted > len(v) or not from_beginning:
            return begun, float("nan")
        return begun, median(np.array(self._start))

    def _trend(self, joined: np.ndarray, start: int) -> tuple[np.ndarray, np.ndarray]:
        """For each of `joined[start:]`: the median of the last `trend_window` logs (NaN before
        there are as many), and the lowest such median of the `trend_lookback` logs before them.

        The medians of the values kept are kept too, so that a small batch computes only its own
        (the same numbers: a kept value's window never reaches past the kept tail when it is read).
        """
        tw, lookback = self.config.trend_window, self.config.trend_lookback
        if len(joined) - start > SMALL_BATCH or len(self._med_tail) != start:
            med = moving_median(joined, tw, min_count=tw)
            earlier = np.concatenate([np.full(min(tw, len(med)), np.nan), med[: max(len(med) - tw, 0)]])
            ref = bn.move_min(earlier, min(lookback, len(earlier)), min_count=1)[start:]
        else:
            own = [
                median(joined[end - tw + 1 : end + 1]) if end >= tw - 1 else np.nan for end in range(start, len(joined))
            ]
            med = np.concatenate([self._med_tail, own])
            ref = np.full(len(joined) - start, np.nan)
            for i, end in enumerate(range(start - tw, len(joined) - tw)):
                earlier = med[max(0, end - lookback + 1) : end + 1] if end >= 0 else med[:0]
                earlier = earlier[~np.isnan(earlier)]
                if len(earlier):
                    ref[i] = earlier.min()
        self._med_tail = med[-self._keep :]
        return med[start:], ref

"""The heavy-tailed noise model of the detection benchmark: real logs' own step-to-step changes.

`gradwatch.synth` draws its loss and grad-norm noise from a normal law: a 6-sigma test never sees
a 6-sigma value there, while real runs have ordinary bumps of 10-30 body sigmas (a batch of code
in a text run, a fine-tune's batch of four). This model keeps synth's curves, anomalies and
noise level and swaps the normal draws for values resampled from the healthy labelled real logs:
for each file gradwatch reads, the log-ratios of consecutive logged values, less the median of
their `DETREND - 1` neighbours (the curve's slope), in units of the file's own robust sigma
(1.4826 x MAD), so that each draw says how many body sigmas the step's noise is; synth scales
them by its noise level. A draw picks a file, then one of its values: every file weighs the same.

The values are those a detector compares: a value that repeats the previous one exactly is a
reprint, not a new measurement (Megatron-DeepSpeed on skipped steps; xtuner prints the grad norm
of the last optimizer step at every log, half of them twice), and counting its zero change would
shrink the file's sigma until ordinary changes read as 15 sigmas. The start-up fall is a trend,
not noise: the records of the run's first `STARTUP_STEPS` steps are left out, at most
`SKIP_RECORDS` of them (a log printed every 100 steps has one start-up record, not 20 spanning
2,000 steps). A change across a jump of more than `JUMP` log intervals (an excerpt) is left
out. The slope leaves a change itself out: in a smooth fall (interval means 100 steps apart) a
change is often the median of its own window, and the residuals of 0 it leaves made a bend in
the curve 22 sigmas.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gradwatch import config, synth
from gradwatch.parsers.stream import Batch
from gradwatch.pipeline import check_path

SAMPLES = Path(__file__).resolve().parents[2] / "shared" / "samples"
#: synth's noise keys and the record columns they stand for
METRICS = {"loss": "loss", "grad": "grad_norm"}
STARTUP_STEPS = 100  # the detectors' start-up window (grad_norm_spike's `startup_steps`)
SKIP_RECORDS = 20  # the detectors' own warm-up (loss_spike's `warmup`)
JUMP = 20  # log intervals: a longer gap is an excerpt's jump (the detectors' `gap_factor`)
MIN_CHANGES = 8  # fewer values than this say little about a file's tails
DETREND = 5  # logged changes around each one whose median (without it) is its slope


@dataclass(frozen=True)
class Pool:
    """Changes in body sigmas, per file, of one metric."""

    files: tuple[str, ...]
    values: tuple[np.ndarray, ...]

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        which = rng.integers(len(self.values), size=n)
        lengths = np.array([len(v) for v in self.values])
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        at = offsets[which] + (rng.random(n) * lengths[which]).astype(int)
        return np.concatenate(self.values)[at]


def healthy_files(root: Path) -> list[Path]:
    """The files every `labels.json` under `root` calls healthy."""
    found = []
    for labels in sorted(root.glob("*/labels.json")):
        found += [labels.parent / name for name in json.loads(labels.read_text()).get("healthy", [])]
    return [f for f in found if f.is_file()]


def changes(steps: np.ndarray, values: np.ndarray) -> np.ndarray:
    """A file's step-to-step log-ratios of one metric, detrended, in units of its robust sigma."""
    ok = np.isfinite(values) & (values > 0)
    steps, values = steps[ok], values[ok]
    fresh = np.diff(values, prepend=np.nan) != 0  # (the first value is fresh)
    steps, values = steps[fresh], values[fresh]
    startup = (np.arange(len(steps)) < SKIP_RECORDS) & (steps <= STARTUP_STEPS)
    steps, logs = steps[~startup], np.log(values[~startup])
    if len(logs) <= MIN_CHANGES:
        return np.empty(0)
    step_diffs = np.diff(steps)
    forward = step_diffs[step_diffs > 0]
    if not len(forward):
        return np.empty(0)
    d = np.diff(logs)[(step_diffs > 0) & (step_diffs <= JUMP * forward.min())]
    if len(d) < MIN_CHANGES:
        return np.empty(0)
    h = DETREND // 2
    trend = np.array([np.median(np.delete(d[max(0, i - h) : i + h + 1], min(i, h))) for i in range(len(d))])
    d = d - trend
    sigma = 1.4826 * np.median(np.abs(d - np.median(d)))
    return d / sigma if sigma > 0 else np.empty(0)


def load_pools(root: Path = SAMPLES) -> dict[str, Pool]:
    """The pools of `METRICS` from the healthy real logs under `root` ({} where there are none)."""
    settings = config.load()
    per_metric: dict[str, list[tuple[str, np.ndarray]]] = {key: [] for key in METRICS}
    for path in healthy_files(root):
        frames: list[Batch] = []
        check_path(path, settings, on_batch=frames.append)
        records = [b.records for b in frames if len(b.records)]
        if not records:
            continue
        steps = np.concatenate([r["step"].to_numpy() for r in records])
        for key, column in METRICS.items():
            values = np.concatenate([r[column].to_numpy(dtype=float) for r in records])
            found = changes(steps, values)
            if len(found):
                per_metric[key].append((str(path.relative_to(root)), found))
    return {
        key: Pool(tuple(name for name, _ in got), tuple(v for _, v in got)) for key, got in per_metric.items() if got
    }


@dataclass(frozen=True)
class Resampled:
    """synth's noise with the keys of `pools` resampled from them: a `RunSpec.noise_draws`."""

    pools: dict[str, Pool]

    def __call__(self, key: str, rng: np.random.Generator, n: int) -> np.ndarray:
        pool = self.pools.get(key)
        return synth.normal_draws(key, rng, n) if pool is None else pool.draw(rng, n)

"""The heavy-tailed noise model of the detection benchmark: real logs' own step-to-step changes.

`gradwatch.synth` draws its loss and grad-norm noise from a normal law: a 6-sigma test never sees
a 6-sigma value there, while real runs have ordinary bumps of 10-30 body sigmas (a batch of code
in a text run, a fine-tune's batch of four). This model keeps synth's curves, anomalies and
noise level and swaps the normal draws for values resampled from the healthy labelled real logs:
for each file gradwatch reads, the log-ratios of consecutive logged values (one log interval
apart), past the first `SKIP_RECORDS` records (the start-up fall is a trend, not noise), less
their running median (the curve's slope), in units of the file's own robust sigma (1.4826 x
MAD), so that each draw says how many body sigmas the step's noise is; synth scales them by its
noise level. A draw picks a file, then one of its values: every file weighs the same.
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
SKIP_RECORDS = 20  # the detectors' own warm-up (loss_spike's `warmup`)
MIN_CHANGES = 8  # fewer values than this say little about a file's tails
DETREND = 5  # logged changes in the running median taken off each one


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
    steps, logs = steps[ok][SKIP_RECORDS:], np.log(values[ok][SKIP_RECORDS:])
    if len(logs) <= MIN_CHANGES:
        return np.empty(0)
    step_diffs = np.diff(steps)
    forward = step_diffs[step_diffs > 0]
    if not len(forward):
        return np.empty(0)
    d = np.diff(logs)[step_diffs == forward.min()]  # one log interval apart: no excerpt's jumps
    if len(d) < MIN_CHANGES:
        return np.empty(0)
    trend = np.array([np.median(d[max(0, i - DETREND // 2) : i + DETREND // 2 + 1]) for i in range(len(d))])
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


_normal_noise = synth._Run._noise  # noqa: SLF001 (synth's draws, wrapped below)
_pools: dict[str, Pool] = {}


def _resampled_noise(run: synth._Run, u: int, v: int) -> dict[str, np.ndarray]:
    """synth's draws for steps u..v, the pooled metrics resampled (a pure function of seed and step)."""
    drawn = _normal_noise(run, u, v)
    if not _pools:
        return drawn
    j = (u - 1) // run.block
    base = j * run.block + 1
    out = dict(drawn)
    for index, (key, pool) in enumerate(sorted(_pools.items())):
        rng = np.random.default_rng([run.spec.seed, 7, index, j])
        out[key] = pool.draw(rng, run.block)[u - base : v - base + 1]
    return out


def use(pools: dict[str, Pool]) -> None:
    """Make synth draw from `pools` from now on in this process ({}: its normal draws again)."""
    _pools.clear()
    _pools.update(pools)
    synth._Run._noise = _resampled_noise  # type: ignore[method-assign,assignment]  # noqa: SLF001

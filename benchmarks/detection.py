"""Benchmark: how well gradwatch's detectors find labelled anomalies, against two simple baselines.

    .venv/bin/python benchmarks/detection.py [--steps 60000] [--formats megatron-lm,olmo,...] [--seed N]
                                             [--noise gaussian,heavy] [--samples DIR]

Corpus (generated in memory with `gradwatch.synth`, deterministic per seed): for each format, runs
of 3,000-5,000 steps with realistic noise and the healthy trouble-lookalikes: fp16 calibration and
the loss-scale sawtooth (fp16 in 75% of the runs of the formats that have it), lr warm-up,
checkpoint saves, validation, Megatron interval means (`--log-interval 10` in 30% of the Megatron
runs), a clean restart from the latest checkpoint (25% of the runs), a learning-rate step decay
(20%), step times of 2-20 s, vocabularies of 32k-128k. Each run carries exactly one injected
anomaly, so labels never overlap: its kind cycles through every kind the format can show
(`synth.supported_kinds`), its step is uniform in 40-75% of the run, its magnitude log-uniform in
[1, 4] (1 = clearly visible), and for short kinds its duration is random too; a stall is a hang of
30 min to 2 h (NCCL's watchdog fires after 10-30 min; BLOOM tr11 hung for hours), whatever the step
time. Runs are added until the format's healthy steps reach `--steps` and each kind has
`--min-per-kind` instances.

Two noise models, the same runs under each: `gaussian`, synth's own log-normal noise, and `heavy`,
the loss and grad-norm noise resampled from the healthy labelled real logs' own step-to-step
changes (`real_noise`: read with gradwatch's parsers from `--samples`, by default
../shared/samples; where that folder or its healthy files are absent, the heavy model is skipped
with a message, and a metric no healthy file logs keeps the normal draws).

Each run is read by `FileCheck` (all detectors, default config), fed in 8 MiB chunks like
`gradwatch check`. The baselines see the same parsed records (loss and grad norm, in line order):
- `10x median`: a value at least 10x, or at most 1/10, the median of the previous 100 values
  (Megatron's spiky-loss factor idea, plain);
- `3-sigma`: |value - mean| > 3 std of the previous 100 values (a plain rolling z-score).
A baseline flag within 20 records of its previous flag is the same incident (gradwatch's rule).

Scoring: an anomaly affects the run from one log interval before its label (a stall is named by
the step before the hang; DeepSpeed prints OVERFLOW before the record) to its end (the run's end
for the lasting kinds: divergence, collapse, skipping, scale collapse, logit drift), plus a
recovery margin of max(100 steps, 10 logs). The rest of the run is healthy: a warning or critical
alert there is a false alert. An anomaly is found when the detector of its kind (for a baseline:
a flag on the kind's natural metric, grad norm for grad-norm spikes and loss for the loss kinds and
NaN; the other kinds have no natural metric among the two) alerts within the kind's window after
the label (`WINDOWS`, each with its reason). Delay is in logged steps from the label to the record
at which the alert could be raised: the alert's step, plus, for the detectors that name the start
of an incident they confirm later, the records they wait for (throughput_drop: 4 more slow logs;
resume_regression: 2 more records; stall: the record that ends the gap).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import multiprocessing
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import real_noise

from gradwatch import config
from gradwatch.alerts import Alert, Severity
from gradwatch.parsers.stream import Batch
from gradwatch.pipeline import FileCheck
from gradwatch.synth import ANOMALY_KINDS, FORMATS, Anomaly, RunSpec, generate, labels, supported_kinds

CHUNK = 8 << 20
BASELINE_WINDOW = 100
INCIDENT_QUIET = 20
#: kinds whose effect lasts to the end of the run (synth: collapse and skipping persist; divergence,
#: a scale cascade and a logit drift do not go back by themselves)
LASTING = ("loss_divergence", "loss_scale_collapse", "logit_norm_drift", "loss_collapse", "skipped_steps")


@dataclass(frozen=True)
class Window:
    """How far after its label an anomaly must be found: max(logs, steps / log interval) logs."""

    logs: int
    steps: int
    why: str

    def records(self, interval: int) -> float:
        return max(self.logs, self.steps / interval)

    def text(self) -> str:
        if not self.steps:
            return f"{self.logs} log" + ("s" if self.logs != 1 else "")
        return f"{self.steps} steps" + (f", >={self.logs} logs" if self.logs else "")


WINDOWS: dict[str, Window] = {
    "grad_norm_spike": Window(2, 0, "the spike is in the record it hits"),
    "loss_spike": Window(2, 0, "same; a Megatron interval mean dilutes a spike but does not delay it"),
    "loss_divergence": Window(0, 100, "the first half of the injected 200-step rise: a rise must last"),
    "loss_scale_collapse": Window(3, 0, "hysteresis 2 absorbs the 1st overflow, then 3 halvings in a row"),
    "nonfinite": Window(2, 0, "the NaN record itself"),
    "logit_norm_drift": Window(0, 1000, "the injected 1000-step ramp; blocks of 20 logs, 3 not falling"),
    "resume_regression": Window(4, 0, "decided on the 3rd record after the restart"),
    "loss_collapse": Window(2, 0, "the first record near 0"),
    "skipped_steps": Window(3, 40, "25% of the last 100 steps: ~28 at skip rate >= 0.9, +10 (DS prints)"),
    "stall": Window(1, 0, "known when the record after the gap arrives"),
    "throughput_drop": Window(6, 0, "5 slow logs in a row (one slow log after a save is normal)"),
}
#: records a detector waits for after the step it names (see the module docstring)
DECISION_LAG = {"throughput_drop": 4, "resume_regression": 2, "stall": 1}
#: the baselines' natural metric per kind (None: neither loss nor grad norm is the kind's signal)
NATURAL: dict[str, str | None] = {
    "grad_norm_spike": "grad_norm",
    "loss_spike": "loss",
    "loss_divergence": "loss",
    "nonfinite": "loss",
    "resume_regression": "loss",
    "loss_collapse": "loss",
    "loss_scale_collapse": None,
    "logit_norm_drift": None,
    "skipped_steps": None,
    "stall": None,
    "throughput_drop": None,
}
SHORT = {
    "grad_norm_spike": "gn spike",
    "loss_spike": "loss spike",
    "loss_divergence": "diverge",
    "nonfinite": "nonfinite",
    "resume_regression": "resume",
    "loss_collapse": "collapse",
}
BASELINES = ("10x median", "3-sigma")
#: the issue's targets (the delay target is for spikes, NaN and (loss) collapse)
TARGET_RECALL, TARGET_FA = 0.95, 0.5
TARGET_DELAY = {"grad_norm_spike": 2.0, "loss_spike": 2.0, "nonfinite": 2.0, "loss_collapse": 2.0}

SETTINGS = config.load()
NOISE_MODELS = ("gaussian", "heavy")
#: the heavy model's pools, loaded before the workers fork (they inherit them)
HEAVY: dict[str, real_noise.Pool] = {}


# ----------------------------------------------------------------------------------------------
# the corpus


@dataclass
class Run:
    fmt: str
    index: int
    spec: RunSpec
    noise: str = "gaussian"


def affected(spec: RunSpec, label: Anomaly) -> tuple[int, int]:
    """First and last step the anomaly (with its recovery margin) makes not healthy."""
    k, last = spec.log_interval, spec.start_step + spec.steps - 1
    d = label.duration
    if label.kind in LASTING:
        end = last
    elif label.kind == "grad_norm_spike":
        end = label.step + d + 5  # the loss may follow 0-2 steps later, for 1-3 steps
    elif label.kind == "resume_regression":
        end = label.step + 8 * d  # synth's decay runs 8 time constants
    elif label.kind == "stall":
        end = label.step
    else:
        end = label.step + d
    return max(spec.start_step, label.step - k), min(last, end + max(100, 10 * k))


def healthy_steps(spec: RunSpec, label: Anomaly) -> int:
    lo, hi = affected(spec, label)
    return spec.steps - (hi - lo + 1)


def plan_format(fmt: str, seed: int, healthy_target: int, min_per_kind: int) -> list[Run]:
    """The runs of one format: one anomaly each, kinds cycled, until both quotas are met."""
    rng = np.random.default_rng([seed, FORMATS.index(fmt)])
    kinds = list(supported_kinds(RunSpec(fmt=fmt, z_loss=True)))
    runs: list[Run] = []
    counts = dict.fromkeys(kinds, 0)
    healthy = 0
    cycle: list[str] = []
    while healthy < healthy_target or min(counts.values()) < min_per_kind:
        if not cycle:
            cycle = [str(k) for k in rng.permutation(kinds)]
        kind = cycle.pop()
        spec = make_spec(fmt, kind, rng, seed * 100_003 + FORMATS.index(fmt) * 10_007 + len(runs))
        runs.append(Run(fmt, len(runs), spec))
        counts[kind] += 1
        healthy += healthy_steps(spec, labels(spec)[0])
    return runs


def make_spec(fmt: str, kind: str, rng: np.random.Generator, seed: int) -> RunSpec:
    """One run of `fmt` with one anomaly of `kind`, its healthy options drawn from `rng`."""
    steps = int(rng.integers(3000, 5001))
    megatron = fmt in ("megatron-deepspeed", "megatron-lm")
    fp16_format = fmt in ("megatron-deepspeed", "megatron-lm", "hf-trainer", "jsonl")
    step = int(rng.integers(int(0.40 * steps), int(0.75 * steps)))
    magnitude = float(10 ** rng.uniform(0.0, math.log10(4.0)))
    step_time = float(rng.uniform(2.0, 20.0))
    duration = 1  # the kind's natural length
    if kind == "grad_norm_spike":
        duration = int(rng.integers(1, 4))
    elif kind in ("loss_spike", "nonfinite"):
        duration = int(rng.integers(1, 6))
    elif kind == "throughput_drop":
        duration = int(rng.integers(100, 401))
    elif kind == "stall":  # synth's hang: duration x 100 steps' time x magnitude
        hang = 10 ** rng.uniform(math.log10(1800.0), math.log10(7200.0))
        magnitude, duration = 1.0, max(1, round(hang / (100.0 * step_time)))
    restarts: tuple[int, ...] = ()
    saves = list(range(1000, step - 400, 1000))
    if saves and rng.random() < 0.25:  # from the latest checkpoint, well before the anomaly
        restarts = (int(rng.choice(saves)) + 1,)
    lr_drops: tuple[tuple[int, float], ...] = ()
    if rng.random() < 0.2:
        lr_drops = ((int(rng.integers(1000, step - 300)), float(rng.choice([0.1, 0.3, 0.5]))),)
    spec = RunSpec(
        fmt=fmt,
        steps=steps,
        log_interval=10 if megatron and rng.random() < 0.3 else 1,
        fp16=fp16_format and (kind == "loss_scale_collapse" or rng.random() < 0.75),
        z_loss=fmt in ("olmo", "olmo-core") and (kind == "logit_norm_drift" or rng.random() < 0.5),
        timestamps=kind == "stall" or rng.random() < 0.7,
        vocab=int(rng.choice([32000, 50257, 128256])),
        seed=seed,
        step_time_s=step_time,
        anomalies=(Anomaly(kind, step, magnitude, duration),),
        restarts=restarts,
        lr_drops=lr_drops,
    )
    assert kind in supported_kinds(spec), (fmt, kind, spec)
    return spec


# ----------------------------------------------------------------------------------------------
# one run: gradwatch, the baselines, the score


@dataclass
class Result:
    noise: str
    fmt: str
    kind: str
    interval: int
    steps: int
    healthy_steps: int
    found: dict[str, float | None] = field(default_factory=dict)  # system -> delay in logs (None: missed)
    false: dict[str, int] = field(default_factory=dict)  # system -> false alerts
    false_by_detector: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # misses and false alerts, for --verbose
    seconds: float = 0.0


def run_one(run: Run) -> Result:
    """Generate one run, check it with gradwatch and the baselines, score both."""
    t0 = time.perf_counter()
    spec = run.spec
    if run.noise == "heavy":
        spec = dataclasses.replace(spec, noise_draws=real_noise.Resampled(HEAVY))
    [label] = labels(spec)
    frames: list[pd.DataFrame] = []

    def keep(batch: Batch) -> None:
        if len(batch.records):
            frames.append(batch.records[["step", "loss", "grad_norm"]])

    data = "".join(generate(spec)).encode()
    check = FileCheck(f"{run.fmt}-{run.index}.log", SETTINGS, on_batch=keep)
    alerts: list[Alert] = []
    for pos in range(0, len(data), CHUNK):
        alerts += check.feed(data[pos : pos + CHUNK])
    alerts += check.close()
    records = pd.concat(frames, ignore_index=True)

    k = spec.log_interval
    lo, hi = affected(spec, label)
    res = Result(run.noise, run.fmt, label.kind, k, spec.steps, healthy_steps(spec, label))
    res.notes.append(f"{run.noise} noise, {run.fmt} run {run.index}: {spec}")
    window = WINDOWS[label.kind].records(k)
    loud = [(a.step if a.step is not None else -1, a.detector) for a in alerts if a.severity >= Severity.WARNING]
    systems = {"gradwatch": loud, **{name: baseline(name, records) for name in BASELINES}}
    for system, hits in systems.items():
        false = [(s, who) for s, who in hits if not lo <= s <= hi]
        res.false[system] = len(false)
        if system == "gradwatch":
            for s, who in false:
                res.false_by_detector[who] = res.false_by_detector.get(who, 0) + 1
                res.notes.append(f"false {who} at step {s}")
        signal = label.kind if system == "gradwatch" else NATURAL[label.kind]
        mine = [s for s, who in hits if s >= lo and who == signal]
        lag = DECISION_LAG.get(label.kind, 0) if system == "gradwatch" else 0
        delays = [max(0.0, (s - label.step) / k + lag) for s in mine]
        delays = [d for d in delays if d <= window]
        res.found[system] = min(delays) if delays else None
        if system == "gradwatch" and not delays:
            near = sorted({(s, who) for s, who in hits if lo <= s <= hi})[:6]
            res.notes.append(f"missed {label.kind} at {label.step} (m={label.magnitude:.2f}); alerts near: {near}")
    res.seconds = time.perf_counter() - t0
    return res


def baseline(name: str, records: pd.DataFrame) -> list[tuple[int, str]]:
    """(step, metric) of each incident a baseline flags on loss and grad norm."""
    out: list[tuple[int, str]] = []
    steps = records["step"].to_numpy()
    for metric in ("loss", "grad_norm"):
        v = records[metric].to_numpy(dtype=float)
        logged = np.isfinite(v)  # a plain rule cannot compare NaN with anything
        s, at = pd.Series(v[logged]), steps[logged]
        prev = s.rolling(BASELINE_WINDOW, min_periods=BASELINE_WINDOW // 5)
        x = s.to_numpy()
        if name == "10x median":
            med = prev.median().shift(1).to_numpy()
            flag = (x >= 10 * med) | (x <= med / 10)
        else:
            mean, std = prev.mean().shift(1).to_numpy(), prev.std().shift(1).to_numpy()
            flag = np.abs(x - mean) > 3 * std
        last = -(10**9)
        for i in np.flatnonzero(flag).tolist():
            if i - last > INCIDENT_QUIET:
                out.append((int(at[i]), metric))
            last = i
    return out


# ----------------------------------------------------------------------------------------------
# the report


def machine() -> str:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent
        ).stdout.strip()
    except OSError:
        commit = ""
    return (
        f"{platform.node()} ({platform.system()} {platform.release()}, {platform.machine()}, {os.cpu_count()} CPUs, "
        f"load {os.getloadavg()[0]:.1f}), Python {platform.python_version()}, numpy {np.__version__}, "
        f"pandas {pd.__version__}" + (f", gradwatch @ {commit} + working tree" if commit else "")
    )


def recall_of(system: str, results: list[Result]) -> float:
    return sum(r.found[system] is not None for r in results) / len(results) if results else math.nan


def num(x: float | None, spec: str) -> str:
    return "-" if x is None or math.isnan(x) else format(x, spec)


def noise_text(model: str) -> str:
    if model == "gaussian":
        return "gaussian: synth's log-normal noise"
    pools = "; ".join(f"{key} from {len(pool.files)} file(s)" for key, pool in sorted(HEAVY.items()))
    return f"heavy: real step-to-step changes resampled ({pools}; see benchmarks/real_noise.py)"


def report(results: list[Result], args: argparse.Namespace, elapsed: float) -> bool:
    """Print the tables of each noise model; True when every target is met on all of them."""
    print("gradwatch detection benchmark (benchmarks/detection.py)")
    print(f"machine: {machine()}")
    print(
        f"seed {args.seed}, --steps {args.steps:,} healthy steps per format, --min-per-kind {args.min_per_kind}, "
        f"{args.jobs} worker(s); formats: {', '.join(args.formats)}"
    )
    per_model = len(results) // max(1, len(args.noise))
    print(
        f"corpus: {per_model} runs = {per_model} anomalies per noise model, "
        f"{sum(r.steps for r in results) // max(1, len(args.noise)):,} steps; "
        f"generated and checked in {elapsed:.0f} s"
    )
    ok = True
    for model in args.noise:
        print(f"\n=== noise {noise_text(model)}\n")
        ok &= report_model([r for r in results if r.noise == model], args)
    print()
    print("windows (logged steps after the label in which the kind's detector must alert):")
    for kind in ANOMALY_KINDS:
        print(f"  {kind:<20} {WINDOWS[kind].text():<22} {WINDOWS[kind].why}")
    if args.verbose:
        print()
        for r in results:
            if len(r.notes) > 1:
                print("\n    ".join(r.notes))
    print(
        f"\ntargets: recall >= {TARGET_RECALL} per detector, <= {TARGET_FA} false alerts per 10k healthy steps, "
        "mean delay <= 2 logged steps for spikes, NaN and loss collapse, under every noise model: "
        + ("all met" if ok else "NOT all met")
    )
    return ok


def report_model(results: list[Result], args: argparse.Namespace) -> bool:
    """Print one noise model's tables; True when its targets are met."""
    healthy = sum(r.healthy_steps for r in results)
    print(f"{healthy:,} healthy steps")
    head = f"{'detector':<20} {'n':>4} {'recall':>7} {'FA/10k':>7} {'delay':>6} {'max':>5}  {'window':<22} target"
    print(head)
    print("-" * len(head))
    ok = True
    by_kind = {k: [r for r in results if r.kind == k] for k in ANOMALY_KINDS}
    for kind in ANOMALY_KINDS:
        rs = by_kind[kind]
        delays = [d for r in rs if (d := r.found["gradwatch"]) is not None]
        recall = len(delays) / len(rs) if rs else math.nan
        fa = sum(r.false_by_detector.get(kind, 0) for r in results) / healthy * 1e4
        mean = float(np.mean(delays)) if delays else None
        met = recall >= TARGET_RECALL and fa <= TARGET_FA
        if kind in TARGET_DELAY:
            met = met and mean is not None and mean <= TARGET_DELAY[kind]
        ok &= met or not rs  # a kind none of the formats can show is not judged
        verdict = ("met" if met else "MISSED") if rs else "n/a"
        print(
            f"{kind:<20} {len(rs):>4} {num(recall, '.3f'):>7} {fa:>7.2f} {num(mean, '.2f'):>6} "
            f"{num(max(delays) if delays else None, '.1f'):>5}  {WINDOWS[kind].text():<22} {verdict}"
        )
    fa_all = sum(r.false["gradwatch"] for r in results) / healthy * 1e4
    print(f"{'all detectors':<20} {len(results):>4} {'':>7} {fa_all:>7.2f}")
    print()
    natural = [k for k in ANOMALY_KINDS if NATURAL[k]]
    print("gradwatch and the baselines on the kinds whose signal is the loss or the grad norm (recall per kind)")
    head2 = f"{'system':<20} {'n':>4} {'recall':>7} {'FA/10k':>7} {'delay':>6}  " + " ".join(
        f"{SHORT[k]:>10}" for k in natural
    )
    print(head2)
    print("-" * len(head2))
    applicable = [r for r in results if NATURAL[r.kind]]
    for name in ("gradwatch", *BASELINES):
        found = [d for r in applicable if (d := r.found[name]) is not None]
        cells = " ".join(f"{num(recall_of(name, by_kind[k]), '.2f'):>10}" for k in natural)
        fa = sum(r.false[name] for r in results) / healthy * 1e4
        print(
            f"{name:<20} {len(applicable):>4} {len(found) / max(1, len(applicable)):>7.3f} {fa:>7.2f} "
            f"{num(float(np.mean(found)) if found else None, '.2f'):>6}  {cells}"
        )
    print()
    head3 = f"{'format':<20} {'runs':>5} {'steps':>10} {'healthy':>10} {'recall':>7} {'FA/10k':>7} {'s/run':>6}"
    print(head3)
    print("-" * len(head3))
    for fmt in args.formats:
        rs = [r for r in results if r.fmt == fmt]
        h = sum(r.healthy_steps for r in rs)
        hit = sum(r.found["gradwatch"] is not None for r in rs)
        print(
            f"{fmt:<20} {len(rs):>5} {sum(r.steps for r in rs):>10,} {h:>10,} {hit / len(rs):>7.3f} "
            f"{sum(r.false['gradwatch'] for r in rs) / h * 1e4:>7.2f} {np.mean([r.seconds for r in rs]):>6.2f}"
        )
    missed = [f"{r.fmt}/{r.kind}" for r in results if r.found["gradwatch"] is None]
    if missed:
        print(f"\nmissed ({len(missed)}): " + ", ".join(missed[:20]) + (" ..." if len(missed) > 20 else ""))
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60_000, help="healthy steps per format (default 60000)")
    parser.add_argument("--formats", default=",".join(FORMATS), help="comma-separated synth formats (default: all)")
    parser.add_argument("--seed", type=int, default=0, help="corpus seed (default 0)")
    parser.add_argument("--min-per-kind", type=int, default=3, help="anomalies of each kind per format (default 3)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes (default: CPUs)")
    parser.add_argument(
        "--noise", default=",".join(NOISE_MODELS), help="comma-separated noise models (default: gaussian,heavy)"
    )
    parser.add_argument(
        "--samples", type=Path, default=real_noise.SAMPLES, help="the labelled real logs (default ../shared/samples)"
    )
    parser.add_argument("--verbose", action="store_true", help="list the runs with a miss or a false alert")
    args = parser.parse_args()
    args.formats = [f for f in args.formats.split(",") if f]
    unknown = [f for f in args.formats if f not in FORMATS]
    if unknown:
        parser.error(f"unknown format(s) {', '.join(unknown)}; expected some of {', '.join(FORMATS)}")
    args.noise = [m for m in args.noise.split(",") if m]
    if not args.noise or any(m not in NOISE_MODELS for m in args.noise):
        parser.error(f"--noise takes some of {', '.join(NOISE_MODELS)}")
    if "heavy" in args.noise:
        HEAVY.update(real_noise.load_pools(args.samples))
        if not HEAVY:
            print(
                f"note: no healthy real logs readable under {args.samples}: the heavy-tailed noise model is skipped",
                file=sys.stderr,
            )
            args.noise.remove("heavy")
    if not args.noise:
        parser.error("no noise model left to run")
    plan = [run for fmt in args.formats for run in plan_format(fmt, args.seed, args.steps, args.min_per_kind)]
    runs = [dataclasses.replace(run, noise=model) for model in args.noise for run in plan]
    runs.sort(key=lambda r: -r.spec.steps)  # long runs first: the workers finish together
    t0 = time.perf_counter()
    if args.jobs > 1:
        with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
            results = pool.map(run_one, runs, chunksize=1)
    else:
        results = [run_one(r) for r in runs]
    results.sort(key=lambda r: (args.noise.index(r.noise), FORMATS.index(r.fmt), ANOMALY_KINDS.index(r.kind)))
    sys.exit(0 if report(results, args, time.perf_counter() - t0) else 1)


if __name__ == "__main__":
    main()

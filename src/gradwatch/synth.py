"""Synthetic training logs in the real console formats, with labelled injected anomalies.

Why this exists: real logs with ground truth are few and short (``samples/real``), but the test suite
needs labelled scenarios, the benchmarks need gigabyte logs and a detection corpus, and the examples
need readable logs. This module simulates an optimizer-step-level training run (numpy only, vectorised
in blocks of ~10k steps) and renders it in one of ``FORMATS`` with the exact line shapes of
``/work/shared/formats.md``, including the lines that are *normal* but look alarming (fp16
calibration, loss-scale sawtooth, lr warm-up, checkpoint saves, validation blocks, restarts of a
resumed run) so that detectors are exercised on healthy negatives too.

Healthy model (per optimizer step ``t``; "progress" ``p`` = successful, non-skipped steps so far):

* loss ``L(p) = L_end + (L0 - L_end) * (1 + p/tau)**-alpha`` with ``L0 = ln(vocab) + 0.1``,
  ``L_end`` ~ 1.6-1.9, ``tau`` ~ 80-120, ``alpha`` ~ 0.45-0.55 (about 3.7 at 2k steps, 2.6 at 10k,
  1.9-2.3 at 100k), times log-normal noise of 1.1 % (up to 2.3 % while it falls fast) and a slow
  0.4 % wander. The same curve for every format (it only depends on ``vocab`` and the seed);
* lr: linear warm-up then cosine decay to lr/10 over the run (skipped steps do not advance the
  schedulers of the fp16 formats, so lr reads ``0.000E+00`` during calibration);
* grad norm: ``level * (1 + 6 exp(-p/150))`` times log-normal noise (sigma 0.15 plus a slow wander).
  Levels: megatron-deepspeed fp16 1.5e4 ("tr8-style", fp16 norms of 1e3-1e6 were normal there),
  megatron-deepspeed bf16 0.3 (tr11), megatron-lm 1.0, olmo / olmo-core 0.4, composer 0.5,
  torchtitan 0.8, hf-trainer 1.5, jsonl 1.0; ``RunSpec.grad_norm_level`` overrides;
* z-loss ``1e-4 * logZ**2`` (logZ ~ 3, flat) and logit norm ~ 35 (flat), step time
  ``step_time_s`` with 1.2 % noise (first step of a (re)start 3x slower: start-up); checkpoint saves
  and evaluations every 1000 steps add wall-clock time (timestamps) but not step time;
* fp16 loss scale: DeepSpeed / Megatron dynamic scaler semantics (hysteresis 2, window 1000, halve
  on overflow, double after a clean window). Calibration from 2**16 (DeepSpeed) or 2**32
  (Megatron-LM) on a fresh run; afterwards a hazard that grows 4x per doubling above an equilibrium
  scale yields isolated overflows every ~1-3k steps (the sawtooth).

Logged values follow the trainers' code: Megatron prints the *interval mean* of the loss over the
non-skipped iterations (Megatron-DeepSpeed over all of them: DeepSpeed skips are invisible to it),
the mean elapsed time, the *sum* of skipped/nan iterations, but lr, loss scale and grad norm of the
logging iteration only; HF prints the interval-mean loss (with its NaN filter) and the last grad
norm; torchtitan, OLMo, OLMo-core, Composer and jsonl print the values of the logged step. Quirks
kept on purpose: current Megatron-LM prints ``lm loss: 0.000000E+00`` for an interval whose
iterations were all skipped (its ``avg >= 0.0`` test; older form and calibration omit the field),
HF prints ``'loss': 0.0`` with ``'grad_norm': nan`` for a NaN step, DeepSpeed skips show as a stale
grad norm while Megatron-DeepSpeed keeps ``number of skipped iterations:   0``.

Anomalies (``magnitude`` m scales them; see ``Anomaly`` for durations):

* grad_norm_spike: grad norm x m*10**U(1,3) at the label, decaying over ``duration`` steps; 60 %
  of the time the loss jumps x(1 + m*U(.2,.8)) 0-2 steps later;
* loss_spike: loss x(1 + m*U(.5,1)) for ``duration`` steps (x0.8 per step), grad norm x1.5-2.5;
* loss_divergence: progress stops and the loss climbs convexly to 2m*U(1,1.25) x its level over
  ``duration`` and stays there (capped near ln(vocab)+1), grad norm x5m;
* loss_scale_collapse: consecutive overflows from the label (``[deepspeed]``/``[deepscale]`` OVERFLOW
  lines in DeepSpeed formats, skipped iterations in Megatron-LM) down to 8 (m<2), 4, 2 or, for m>=8,
  to 1 and DeepSpeed's ``Current loss scale already at minimum ... Exiting run.`` (the log ends);
  loss x(1 + 0.3 min(m,3)) meanwhile;
* nonfinite: NaN loss for ``duration`` steps (Megatron omits ``lm loss``; fp16 also overflows);
* logit_norm_drift: ZLoss / logit norm up to x min(10, 3m) over ``duration``, CE loss unaffected;
* resume_regression: the run dies 0-2 log intervals after the step it will reload (jsonl: 1-2, so
  the step counter visibly goes back), prints the format's load lines and replays from the label
  with the loss ``frac = min(1, .15 + .35m)`` of the way back to ln(vocab)+0.6 and the grad norm
  x10m, both decaying with time constant ``duration``;
* loss_collapse: loss 10**U(-6,-3)/m, grad norm ~2e-4 x level; skipped_steps: silent skips with
  probability min(1, .9 + .1(m-1)) per step (lr and loss frozen); stall: a hang of
  ``duration * 100 * step_time_s * m`` before the label; throughput_drop: step time / 0.6**m.

Clean restarts (``RunSpec.restarts``: a crash, the requeue downtime, the load lines, and training
going on from the checkpoint as if nothing happened) and learning-rate step decays
(``RunSpec.lr_drops``) are healthy negatives and never labels.

Labels: ``labels(spec)`` / ``write_log`` return the anomalies *as rendered*: ``step`` is the first
logged step at which the anomaly is visible (the requested step moved up to the next record, or to
the next DeepSpeed ``step=`` line for silent skipping), ``duration`` the effective duration.
"""

# %-formatting is deliberate here: it is the fastest bulk formatter in CPython and mirrors the
# trainers' own format specs ("%.6E" == "{:.6E}"), which matters for gigabyte benchmark logs.
# ruff: noqa: UP031

from __future__ import annotations

import math
import os
from bisect import bisect_left
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from itertools import accumulate

import numpy as np

__all__ = [
    "ANOMALY_KINDS",
    "FORMATS",
    "Anomaly",
    "NoiseDraws",
    "RunSpec",
    "generate",
    "labels",
    "normal_draws",
    "supported_kinds",
    "write_log",
    "write_sized",
]

ANOMALY_KINDS: tuple[str, ...] = (
    "grad_norm_spike",
    "loss_spike",
    "loss_divergence",
    "loss_scale_collapse",
    "nonfinite",
    "logit_norm_drift",
    "resume_regression",
    "loss_collapse",
    "skipped_steps",
    "stall",
    "throughput_drop",
)

FORMATS: tuple[str, ...] = (
    "megatron-deepspeed",
    "megatron-lm",
    "olmo",
    "olmo-core",
    "composer",
    "torchtitan",
    "hf-trainer",
    "jsonl",
)


#: the step-level noises of the healthy model, each in units of its sigma (see the module docstring)
NOISE_KEYS: tuple[str, ...] = ("loss", "grad", "time", "z")
#: `n` draws of the noise named `key` (one of `NOISE_KEYS`) from `rng`, in units of its sigma
NoiseDraws = Callable[[str, np.random.Generator, int], np.ndarray]


def normal_draws(key: str, rng: np.random.Generator, n: int) -> np.ndarray:
    """synth's own noise: standard-normal draws, whatever the key (`RunSpec.noise_draws`'s default)."""
    return rng.standard_normal(n)


@dataclass(frozen=True)
class Anomaly:
    """One injected fault, which is also its ground-truth label.

    ``step`` is where the fault becomes visible in the log. ``magnitude`` scales its strength
    (1 = clearly visible, larger = stronger). ``duration`` is in optimizer steps; 1 (the default)
    means "the kind's natural length" for kinds that cannot happen in one step (divergence 200,
    logit drift 1000, resume decay 100, throughput drop 200, collapse and silent skipping: to the end
    of the run).
    """

    kind: str
    step: int
    magnitude: float = 1.0
    duration: int = 1


@dataclass(frozen=True)
class RunSpec:
    """What to simulate and how to print it (see the module docstring for the healthy model).

    ``fp16`` only matters where a loss scale exists (megatron-deepspeed, megatron-lm, hf-trainer
    with DeepSpeed, jsonl); the FSDP formats are always bf16. ``calibration`` only applies to a
    fresh run (``start_step == 1``): resumed runs restore their scaler. ``timestamps=False`` selects
    the timestamp-less variant where one exists (older Megatron-LM line, jsonl without ``ts``);
    DeepSpeed, OLMo, OLMo-core and torchtitan lines always carry their logger timestamp.
    ``restarts`` are healthy negatives, not labels: at each step s the job dies 0-2 log intervals
    after its checkpoint at s-1 (jsonl: 1-2, the step visibly repeats or goes back), prints the
    format's load lines after the requeue downtime, and resumes cleanly from s: optimizer and
    scaler state restored, loss and grad norm continue where they were. ``lr_drops`` are
    ``(step, factor)`` step decays of the learning rate (healthy too): from ``step`` the lr is
    multiplied by ``factor`` < 1, the loss anneals 3 % lower per decade of drop (time constant 50
    steps) and the grad norm creeps 20 % higher per decade (time constant 200 steps).
    ``noise_draws`` replaces the standard-normal draws of the healthy model's noise (`NoiseDraws`;
    `normal_draws` by default): a benchmark's heavy-tailed noise model keeps the same curves and
    anomalies.
    """

    fmt: str = "megatron-deepspeed"
    steps: int = 2000
    log_interval: int = 1
    start_step: int = 1
    fp16: bool = True
    calibration: bool = True
    sawtooth: bool = True
    noise_lines: bool = True
    vocab: int = 50257
    seed: int = 0
    anomalies: tuple[Anomaly, ...] = ()
    timestamps: bool = True
    step_time_s: float = 10.0
    z_loss: bool = False
    grad_norm_level: float | None = None
    restarts: tuple[int, ...] = ()
    lr_drops: tuple[tuple[int, float], ...] = ()
    noise_draws: NoiseDraws | None = field(default=None, repr=False, compare=False)


# ----------------------------------------------------------------------------------------------
# per-format constants


@dataclass(frozen=True)
class _Profile:
    gbs: int  # global batch size (sequences)
    seq: int  # tokens per sequence
    lr: float  # peak learning rate
    grad_bf16: float  # healthy grad-norm level, bf16
    grad_fp16: float  # healthy grad-norm level, fp16
    tflops: float  # per-GPU TFLOP/s at the nominal step time
    devices: int  # GPUs (throughput per device)
    scaler: str  # "ds" (DeepSpeed), "megatron", "generic" or "" (no fp16 in this format)
    averaged: bool  # loss printed as an interval mean
    first_record: bool  # also logs step 1 whatever the interval
    ds_lines: bool  # DeepSpeed engine lines interleave


_PROFILES: dict[str, _Profile] = {
    "megatron-deepspeed": _Profile(2048, 2048, 6e-5, 0.3, 1.5e4, 148.0, 384, "ds", True, False, True),
    "megatron-lm": _Profile(512, 4096, 3e-4, 1.0, 1.0, 243.0, 256, "megatron", True, False, False),
    "olmo": _Profile(2048, 2048, 4e-4, 0.4, 0.4, 180.0, 256, "", False, False, False),
    "olmo-core": _Profile(1024, 4096, 4e-4, 0.4, 0.4, 380.0, 256, "", False, True, False),
    "composer": _Profile(256, 2048, 6e-4, 0.5, 0.5, 150.0, 64, "", False, False, False),
    "torchtitan": _Profile(256, 8192, 8e-4, 0.8, 0.8, 400.0, 256, "", False, True, False),
    "hf-trainer": _Profile(64, 1024, 5e-5, 1.5, 1.5, 90.0, 8, "ds", True, False, True),
    "jsonl": _Profile(1024, 2048, 3e-4, 1.0, 1.0, 200.0, 128, "generic", False, False, False),
}

_BLOCK = 10_000  # steps simulated per numpy block (rounded up to a multiple of log_interval)
_ABSENT = -1.0  # "field not printed" for non-negative metrics (grad norm, loss)
_MIN_SCALE = 1.0
_SCALE_WINDOW = 1000
_DS_PRINT = 10  # DeepSpeed steps_per_print
_SAVE_EVERY = 1000
_EVAL_EVERY = 1000
_CKPT = "/ckpt"
_T0 = 1_709_280_000.0  # 2024-03-01 08:00:00 UTC
_DEFAULT_DURATION = {
    "loss_divergence": 200,
    "logit_norm_drift": 1000,
    "resume_regression": 100,
    "throughput_drop": 200,
}
_PERSISTENT = ("loss_collapse", "skipped_steps")  # duration 1 -> until the end of the run
_ANSI = {
    "red": "\033[31m",
    "green": "\033[32m",
    "yellow": "\033[33m",
    "blue": "\033[34m",
    "magenta": "\033[35m",
    "cyan": "\033[36m",
    "reset": "\033[39m",
    "orange": "\033[38;2;180;60;0m",
    "turquoise": "\033[38;2;54;234;195m",
}


def _fp16_effective(spec: RunSpec) -> bool:
    return spec.fp16 and _PROFILES[spec.fmt].scaler != ""


def supported_kinds(spec: RunSpec) -> tuple[str, ...]:
    """The anomaly kinds this format/spec can render visibly (others raise in ``generate``).

    Why: a label must never point at something the log cannot show (no logit norm on a Megatron
    console, no loss scale in bf16, no clock in HF dict lines), so benchmark builders filter by it.
    """
    fmt = spec.fmt
    if fmt not in _PROFILES:
        raise ValueError(f"unknown format {fmt!r}; expected one of {FORMATS}")
    out = []
    for kind in ANOMALY_KINDS:
        if kind == "loss_scale_collapse" and not _fp16_effective(spec):
            continue
        if kind == "logit_norm_drift" and not (fmt == "jsonl" or (fmt in ("olmo", "olmo-core") and spec.z_loss)):
            continue
        if kind == "skipped_steps" and fmt not in (
            "megatron-deepspeed",
            "megatron-lm",
            "hf-trainer",
            "olmo-core",
        ):
            continue
        if kind in ("stall", "throughput_drop") and fmt == "hf-trainer":
            continue
        if kind == "stall" and fmt == "jsonl" and not spec.timestamps:
            continue
        out.append(kind)
    return tuple(out)


# ----------------------------------------------------------------------------------------------
# number formatting helpers


def _olmo_float(v: float) -> str:
    """OLMo ``format_float``: str() below 1e-4, thousands commas above 1000, else fixed decimals."""
    if v < 0.0001:
        return str(v)
    if v > 1000:
        return f"{int(v):,d}"
    if v > 100:
        return "%.1f" % v
    if v > 10:
        return "%.2f" % v
    if v > 1:
        return "%.3f" % v
    return "%.4f" % v


def _olmo_core_float(v: float) -> str:
    """OLMo-core ``format_float``: like OLMo but ``%.2E`` below 1e-4 (``LR (group 0)=1.00E-05``)."""
    if v < 0.0001:
        return "%.2E" % v
    if v > 1000:
        return f"{int(v):,d}"
    if v > 100:
        return "%.1f" % v
    if v > 10:
        return "%.2f" % v
    if v > 1:
        return "%.3f" % v
    return "%.4f" % v


def _olmo_col(values: np.ndarray, core: bool = False) -> list[str]:
    """``_olmo_float`` / ``_olmo_core_float`` over a whole column (same output, vectorised)."""
    v = np.asarray(values, dtype=np.float64)
    cat = np.select([v < 0.0001, v > 1000, v > 100, v > 10, v > 1], [0, 1, 2, 3, 4], 5)
    first = int(cat[0]) if len(cat) else 5
    groups: list[tuple[int, np.ndarray | None]]
    if len(cat) and (cat == first).all():
        groups = [(first, None)]
    else:
        groups = [(int(c), np.flatnonzero(cat == c)) for c in np.unique(cat)]
    out = np.empty(len(v), dtype=object)
    for c, idx in groups:
        vals = (v if idx is None else v[idx]).tolist()
        if c == 0:
            strs = ["%.2E" % x for x in vals] if core else [str(x) for x in vals]
        elif c == 1:
            strs = [f"{int(x):,d}" for x in vals]
        else:
            fmt = ("%.1f", "%.2f", "%.3f", "%.4f")[c - 2]
            strs = [fmt % x for x in vals]
        if idx is None:
            return strs
        out[idx] = strs
    return out.tolist()


def _timestamps(clock: np.ndarray) -> list[str]:
    """ISO-like ``YYYY-mm-ddTHH:MM:SS.fff`` strings (UTC) for an array of epoch seconds, vectorised."""
    if len(clock) == 0:
        return []
    ms = np.floor(np.asarray(clock, dtype=np.float64) * 1000.0).astype(np.int64)
    stamps: np.ndarray = ms.astype("datetime64[ms]")
    return np.datetime_as_string(stamps, unit="ms").tolist()


def _ts_bulk(clock: np.ndarray, style: str) -> list[str]:
    """Timestamps for many records at once: one C-level replace over the joined strings.

    Styles: "comma" ``2026-05-18 16:04:50,821`` (logging/DeepSpeed), "dot" ``... 10:00:05.520``
    (OLMo), "sec" ``2024-04-06 03:02:12`` (Megatron-LM, OLMo-core).
    """
    if len(clock) == 0:
        return []
    if style == "sec":
        sec: np.ndarray = np.floor(np.asarray(clock, dtype=np.float64)).astype(np.int64)
        sec = sec.astype("datetime64[s]")
        joined = "\n".join(np.datetime_as_string(sec, unit="s").tolist())
        return joined.replace("T", " ").split("\n")
    joined = "\n".join(_timestamps(clock)).replace("T", " ")
    if style == "comma":
        joined = joined.replace(".", ",")
    return joined.split("\n")


def _ts_ds(s: str) -> str:  # [2023-04-18 01:46:59,142]
    return "[" + s[:10] + " " + s[11:19] + "," + s[20:23] + "]"


def _ts_comma(s: str) -> str:  # 2026-05-18 16:04:50,821
    return s[:10] + " " + s[11:19] + "," + s[20:23]


def _ts_sec(s: str) -> str:  # 2024-04-06 03:02:12
    return s[:10] + " " + s[11:19]


def _ts_dot(s: str) -> str:  # 2024-08-06 10:00:05.520
    return s[:10] + " " + s[11:23]


def _one_ts(clock: float) -> str:
    return _timestamps(np.array([clock]))[0]


def _tqdm_intervals(sec: np.ndarray) -> list[str]:
    """tqdm ``format_interval`` for a column of seconds: ``MM:SS`` or ``H:MM:SS``."""
    s = np.maximum(0, np.asarray(sec)).astype(np.int64)
    h, m, x = (s // 3600).tolist(), (s % 3600 // 60).tolist(), (s % 60).tolist()
    return ["%d:%02d:%02d" % (a, b, c) if a else "%02d:%02d" % (b, c) for a, b, c in zip(h, m, x, strict=True)]


def _tqdm_bar_text(eighths: int) -> str:
    full, part = divmod(eighths, 8)
    return ("█" * full + (" ▏▎▍▌▋▊▉"[part] if full < 10 else "")).ljust(10)


_TQDM_BARS = [_tqdm_bar_text(i) for i in range(81)]  # 10-char bar for int(frac * 80)


# ----------------------------------------------------------------------------------------------
# anomaly placement


@dataclass
class _Placed:
    kind: str
    label: int  # first logged step where it is visible
    onset: int  # first simulated step it affects
    end: int  # last simulated step it affects (inclusive)
    duration: int
    magnitude: float
    params: dict[str, float] = field(default_factory=dict)


@dataclass
class _State:
    clock: float = _T0
    scale: float = 1.0
    hyst: int = 2
    last_ov: int = 0
    scale_float: bool = False  # old DeepSpeed prints floats once the scale was divided
    mode: str = ""  # "calib", "cascade", "exit"
    mode_target: float = 0.0
    succ: int = 0  # successful optimizer steps before the next step
    ds_skipped: int = 0
    last_grad: float = _ABSENT
    loss_key_seen: bool = False  # Megatron-LM: lm loss key exists in total_loss_dict
    exited: int = 0  # step at which DeepSpeed raised at the minimum scale
    samples_sum: float = 0.0  # DeepSpeed RunningAvgSamplesPerSec
    samples_n: int = 0
    first_step_pending: bool = True  # start-up slowness of a (re)start
    memory_line_done: bool = False
    hf_last_loss: float = 0.0
    cascade_steps: list[int] = field(default_factory=list)


class _Block:
    """Per-step and per-record arrays of one simulated step range (``r_*``: one per record)."""

    u: int  # first step
    v: int  # last step (inclusive)
    steps: np.ndarray
    loss: np.ndarray
    clock: np.ndarray  # wall clock at the end of each step (epoch seconds)
    lr: np.ndarray
    scale: np.ndarray
    grad: np.ndarray  # as printed (stale on DeepSpeed-skipped steps, _ABSENT if not printed)
    T: np.ndarray  # step time (s)
    ov_events: list[tuple[int, float, float, int, bool]]  # step, attempted, new, hysteresis, float
    ds_skipped: np.ndarray  # DeepSpeed cumulative skipped counter
    exit_step: int
    rec_idx: np.ndarray
    rec_steps: list[int]
    r_loss: np.ndarray
    r_grad: np.ndarray
    r_lr: np.ndarray
    r_scale: np.ndarray
    r_T: np.ndarray  # interval-mean step time
    r_skipped: np.ndarray  # interval sums
    r_nan: np.ndarray
    r_clock: np.ndarray
    r_z: np.ndarray
    r_logit: np.ndarray
    r_skipflag: np.ndarray


# ----------------------------------------------------------------------------------------------
# the simulator


class _Run:
    def __init__(self, spec: RunSpec) -> None:
        if spec.fmt not in _PROFILES:
            raise ValueError(f"unknown format {spec.fmt!r}; expected one of {FORMATS}")
        if spec.steps < 1 or spec.log_interval < 1 or spec.start_step < 1:
            raise ValueError("steps, log_interval and start_step must be >= 1")
        if spec.vocab < 2 or spec.step_time_s <= 0:
            raise ValueError("vocab must be >= 2 and step_time_s > 0")
        if any(not 0.0 < f < 1.0 for _, f in spec.lr_drops):
            raise ValueError("an lr drop factor must be in (0, 1)")
        self.spec = spec
        self.fmt = spec.fmt
        self.p = _PROFILES[spec.fmt]
        self.k = spec.log_interval
        self.first = spec.start_step
        self.last = spec.start_step + spec.steps - 1
        self.fp16 = _fp16_effective(spec)
        self.block = self.k * max(1, -(-_BLOCK // self.k))
        ok = supported_kinds(spec)
        for a in spec.anomalies:
            if a.kind not in ANOMALY_KINDS:
                raise ValueError(f"unknown anomaly kind {a.kind!r}; expected one of {ANOMALY_KINDS}")
            if a.kind not in ok:
                raise ValueError(f"{a.kind} cannot be rendered in {spec.fmt} with this spec")
            if a.magnitude <= 0 or a.duration < 1:
                raise ValueError("anomaly magnitude must be > 0 and duration >= 1")

        rng = np.random.default_rng([spec.seed, 0])
        self.l0 = math.log(spec.vocab) + 0.1
        self.l_end = 1.6 + 0.3 * rng.random()
        self.alpha = 0.45 + 0.1 * rng.random()
        self.tau = 80.0 + 40.0 * rng.random()
        self.warmup = max(10, min(2000, self.last // 50))
        self.grad_level = spec.grad_norm_level or (self.p.grad_fp16 if self.fp16 else self.p.grad_bf16)
        self.wander = {
            key: (rng.uniform(3000, 30000, 3), rng.uniform(0, 2 * math.pi, 3)) for key in ("loss", "grad", "time")
        }
        self.ds_old = self.fmt == "megatron-deepspeed" and bool(rng.random() < 0.5)
        self.host = "node-%03d" % rng.integers(1, 400)
        self.clock0 = _T0 + (spec.seed % 365) * 86400.0
        # fp16 scaler
        if self.p.scaler == "megatron":
            self.scale_init = 2.0**32
            self.scale_cal = 2.0 ** int(rng.integers(15, 18))
        else:
            self.scale_init = 2.0**16
            self.scale_cal = 2.0 ** int(rng.integers(11, 14))
        self.scale_eq = self.scale_cal * 2.0
        self.ds_raise = self.p.scaler == "ds"

        self.placed = [self._place(i, a) for i, a in enumerate(spec.anomalies)]
        self.placed += [self._place_restart(i, s) for i, s in enumerate(spec.restarts)]
        self.placed.sort(key=lambda q: q.label)
        self.has_skip_anomaly = any(q.kind == "skipped_steps" for q in self.placed)
        self.ds_print = self.p.ds_lines and (spec.noise_lines or self.has_skip_anomaly)
        self._noise_cache: tuple[int, dict[str, np.ndarray]] | None = None

    # -- record grid ----------------------------------------------------------------------------

    def _is_record(self, t: int) -> bool:
        return t % self.k == 0 or (self.p.first_record and t == 1)

    def _record_at_or_after(self, s: int) -> int:
        if self.p.first_record and s == 1:
            return 1
        return -(-s // self.k) * self.k

    def _interval_start(self, b: int) -> int:
        if b == 1:
            return 1
        prev = b - self.k
        if self.p.first_record and prev < 1:
            prev = 1
        return max(self.first, prev + 1)

    def _place(self, i: int, a: Anomaly) -> _Placed:
        """Turn a requested anomaly into where it is injected and where it shows (the label)."""
        rng = np.random.default_rng([self.spec.seed, 1, i])
        s = a.step
        if not (self.first <= s <= self.last):
            raise ValueError(f"anomaly step {s} outside the run [{self.first}, {self.last}]")
        label = self._record_at_or_after(s)
        # Interval-mean formats (Megatron, HF) show a fault injected anywhere in the interval at its
        # closing record, so inject from the interval start (diluted honestly by the mean); what
        # they print from the logging step only (grad norm; HF's NaN shows only as grad_norm: nan)
        # must hit the record step itself.
        instant = a.kind == "grad_norm_spike" or (self.fmt == "hf-trainer" and a.kind == "nonfinite")
        onset = self._interval_start(label) if self.p.averaged and not instant else label
        if a.kind == "skipped_steps" and self.p.ds_lines:
            label = max(label, -(-s // _DS_PRINT) * _DS_PRINT)
            onset = max(self.first, label - _DS_PRINT + 1)
        if a.kind == "resume_regression":
            onset = self._interval_start(label)
            if onset - 1 < self.first:
                raise ValueError("resume_regression needs at least one logged step before it")
        if label > self.last:
            raise ValueError(f"{a.kind} at step {s} would only show at step {label}, after the run ends")
        dur = a.duration
        if dur == 1 and a.kind in _DEFAULT_DURATION:
            dur = _DEFAULT_DURATION[a.kind]
        if dur == 1 and a.kind in _PERSISTENT:
            dur = self.last - onset + 1
        m = a.magnitude
        q = _Placed(a.kind, label, onset, onset + dur - 1, dur, m)
        pr = q.params
        if a.kind == "grad_norm_spike":
            pr["factor"] = m * 10.0 ** rng.uniform(1.0, 3.0)
            pr["loss"] = float(rng.random() < 0.6)
            pr["loss_lag"] = float(rng.integers(0, 3))
            pr["loss_len"] = float(rng.integers(1, 4))
            pr["loss_factor"] = 1.0 + m * rng.uniform(0.2, 0.8)
            q.end = max(q.end, onset + int(pr["loss_lag"] + pr["loss_len"]) - 1)
        elif a.kind == "loss_spike":
            pr["factor"] = 1.0 + m * rng.uniform(0.5, 1.0)
            pr["grad_factor"] = rng.uniform(1.5, 2.5)
        elif a.kind == "loss_divergence":
            pr["ratio"] = 2.0 * m * rng.uniform(1.0, 1.25)
            pr["grad_ratio"] = 5.0 * m
            q.end = self.last
        elif a.kind == "loss_scale_collapse":
            # cascade floor: 8 (m < 2), 4 (m < 4), 2 (m < 8), else the minimum 1 -> DeepSpeed exits
            pr["final"] = 8.0 if m < 2 else 4.0 if m < 4 else 2.0 if m < 8 else _MIN_SCALE
            pr["loss_factor"] = 1.0 + 0.3 * min(m, 3.0)
            q.end = self.last
        elif a.kind == "logit_norm_drift":
            pr["factor"] = min(10.0, 3.0 * m)
            q.end = self.last
        elif a.kind == "resume_regression":
            pr["frac"] = min(1.0, 0.15 + 0.35 * m)
            pr["grad_factor"] = 10.0 * m
            lo_lost = self.k if self.fmt == "jsonl" else 0  # jsonl: the step going back is the sign
            pr["lost"] = float(rng.integers(lo_lost, 2 * self.k + 1))
            q.end = min(self.last, onset + 8 * dur)
        elif a.kind == "loss_collapse":
            pr["level"] = 10.0 ** rng.uniform(-6.0, -3.0) / m
        elif a.kind == "skipped_steps":
            pr["p"] = min(1.0, 0.9 + 0.1 * (m - 1.0))
        elif a.kind == "stall":
            pr["gap"] = a.duration * 100.0 * self.spec.step_time_s * m
            q.end = onset
        elif a.kind == "throughput_drop":
            pr["factor"] = 0.6**m
        return q

    def _place_restart(self, i: int, s: int) -> _Placed:
        """A clean restart: the resume machinery of resume_regression with nothing lost."""
        q = self._place(1000 + i, Anomaly("resume_regression", s))
        q.params.update(frac=0.0, grad_factor=1.0, clean=1.0)
        return q

    # -- timeline -------------------------------------------------------------------------------

    def _segments(self) -> list[tuple[int, int, bool, _Placed | None]]:
        """(first, last, anomalies_on, resume_before) pieces; lost steps replay after a restart."""
        segs: list[tuple[int, int, bool, _Placed | None]] = []
        cur = self.first
        pending: _Placed | None = None
        for q in (q for q in self.placed if q.kind == "resume_regression"):
            c = q.onset - 1
            if c < cur:
                raise ValueError("resume_regression anomalies overlap")
            segs.append((cur, c, True, pending))
            lost = min(self.last, c + int(q.params["lost"]))
            if lost > c:
                segs.append((c + 1, lost, False, None))
            pending = q
            cur = c + 1
        segs.append((cur, self.last, True, pending))
        return segs

    # -- per-step simulation --------------------------------------------------------------------

    def _noise(self, u: int, v: int) -> dict[str, np.ndarray]:
        """The noise draws (standard normal unless `RunSpec.noise_draws`) keyed by step (pure
        function of seed and step)."""
        j = (u - 1) // self.block
        if self._noise_cache is None or self._noise_cache[0] != j:
            rng = np.random.default_rng([self.spec.seed, 2, j])
            draw = self.spec.noise_draws or normal_draws
            self._noise_cache = (j, {key: draw(key, rng, self.block) for key in NOISE_KEYS})
        base = j * self.block + 1
        return {key: arr[u - base : v - base + 1] for key, arr in self._noise_cache[1].items()}

    def _wave(self, key: str, steps: np.ndarray) -> np.ndarray:
        periods, phases = self.wander[key]
        out = np.zeros(len(steps))
        for per, ph in zip(periods.tolist(), phases.tolist(), strict=True):
            out += np.sin(steps * (2.0 * math.pi / per) + ph)
        return out / 3.0

    def _base_loss(self, prog: np.ndarray | float) -> np.ndarray:
        return self.l_end + (self.l0 - self.l_end) * (1.0 + np.asarray(prog) / self.tau) ** (-self.alpha)

    def _lr(self, prog: np.ndarray) -> np.ndarray:
        peak = self.p.lr
        w = self.warmup
        x = prog.astype(np.float64)
        frac = np.clip((x - w) / max(1.0, self.last - w), 0.0, 1.0)
        cos = peak / 10 + 0.5 * (peak - peak / 10) * (1.0 + np.cos(math.pi * frac))
        return np.where(x < w, peak * x / w, cos)

    def _hazard(self) -> float:
        ratio = math.log2(self.st.scale / self.scale_eq)
        return min(0.5, max(1e-7, (1.0 / 2500.0) * 4.0**ratio))

    def _scale_range(
        self, u: int, v: int, forced: list[int], cascades: dict[int, _Placed], rng_ok: bool
    ) -> tuple[np.ndarray, np.ndarray, list[tuple[int, float, float, int, bool]]]:
        """Event-driven loss-scaler simulation over steps u..v (overflows are sparse)."""
        st = self.st
        n = v - u + 1
        ov = np.zeros(n, dtype=bool)
        events: list[tuple[int, float, float, int, bool]] = []
        if not self.fp16:
            return ov, np.ones(n), events
        ch_idx = [-1]
        ch_val = [st.scale]
        cascade_steps = sorted(cascades)
        rng = self.scale_rng

        def overflow(t: int) -> bool:
            att, hb, was_float = st.scale, st.hyst, st.scale_float
            if st.hyst > 1:
                st.hyst -= 1
                new = att
            else:
                if att <= _MIN_SCALE and self.ds_raise:
                    st.exited = t
                    events.append((t, att, att, -1, was_float))
                    ov[t - u] = True
                    return False
                new = max(att / 2.0, _MIN_SCALE)
                st.scale_float = True
            st.scale = new
            st.last_ov = t
            ov[t - u] = True
            ch_idx.append(t - u)
            ch_val.append(new)
            events.append((t, att, new, hb, was_float))
            return True

        t = u
        while t <= v:
            if st.mode:
                if st.mode == "cascade":
                    st.cascade_steps.append(t)
                if not overflow(t):
                    break
                if st.mode == "exit":
                    pass  # keeps overflowing at the minimum until DeepSpeed raises
                elif st.scale <= st.mode_target:
                    if st.mode == "cascade" and st.mode_target <= _MIN_SCALE and self.ds_raise:
                        st.mode = "exit"
                    else:
                        st.mode = ""
                t += 1
                continue
            i = bisect_left(forced, t)
            nf = forced[i] if i < len(forced) else math.inf
            i = bisect_left(cascade_steps, t)
            nc = cascade_steps[i] if i < len(cascade_steps) else math.inf
            ng: float = math.inf
            nr: float = math.inf
            if self.spec.sawtooth:
                d = max(1, -(-(t - st.last_ov) // _SCALE_WINDOW))
                ng = st.last_ov + d * _SCALE_WINDOW
                if rng_ok:
                    nr = t + int(rng.geometric(self._hazard())) - 1
            e = min(nf, nc, ng, nr)
            if e > v:
                break
            e = int(e)
            if e == nc:
                st.mode = "cascade"
                st.mode_target = cascades[e].params["final"]
                t = e
                continue
            if e in (nf, nr):
                if not overflow(e):
                    break
            else:  # window of clean steps completed: grow
                st.scale *= 2.0
                st.hyst = 2
                ch_idx.append(e - u)
                ch_val.append(st.scale)
            t = e + 1
        pos = np.searchsorted(np.array(ch_idx), np.arange(n), side="right") - 1
        return ov, np.array(ch_val)[pos], events

    def _simulate(self, u: int, v: int, on: bool) -> _Block | None:
        st = self.st
        spec = self.spec
        n = v - u + 1
        steps = np.arange(u, v + 1)
        z = self._noise(u, v)
        act = [q for q in self.placed if on and q.onset <= v and q.end >= u] if on else []

        # loss scaler: forced overflows (NaN steps in fp16, cascades), calibration, sawtooth
        forced: list[int] = []
        cascades: dict[int, _Placed] = {}
        for q in act:
            if q.kind == "nonfinite" and self.fp16:
                forced.extend(range(max(u, q.onset), min(v, q.end) + 1))
            elif q.kind == "loss_scale_collapse" and u <= q.onset <= v:
                cascades[q.onset] = q
        forced.sort()
        ov, scale, ov_events = self._scale_range(u, v, forced, cascades, rng_ok=on)
        if st.exited:  # DeepSpeed raised inside this step: it prints no record
            cut = st.exited - u
            if cut == 0:
                return None
            n, v = cut, st.exited - 1
            steps, ov, scale = steps[:cut], ov[:cut], scale[:cut]
            z = {key: arr[:cut] for key, arr in z.items()}
            ov_events = [e for e in ov_events if e[0] < st.exited]

        silent = np.zeros(n, dtype=bool)
        for q in act:
            if q.kind == "skipped_steps":
                lo, hi = max(u, q.onset), min(v, q.end)
                if lo <= hi:
                    r = np.random.default_rng([spec.seed, 3, q.onset, lo])
                    silent[lo - u : hi - u + 1] = r.random(hi - lo + 1) < q.params["p"]
                    if lo == q.onset:
                        silent[lo - u] = True
        skipped = ov | silent
        ok = ~skipped
        succ_after = st.succ + np.cumsum(ok)
        prog = succ_after - ok  # successful updates before this step
        st.succ = int(succ_after[-1])

        loss = self._base_loss(prog)
        # relative noise: ~1.1 %, larger while the loss falls fast, small at the uniform-output init
        sigma = 0.011 + 0.012 * np.exp(-prog / 500.0) * np.minimum(1.0, prog / 50.0)
        loss = loss * np.exp(sigma * z["loss"] + 0.004 * self._wave("loss", steps))
        lr = self._lr(prog if self.p.scaler else steps - 1)
        grad = (
            self.grad_level
            * (1.0 + 6.0 * np.exp(-prog / 150.0))
            * np.exp(0.15 * z["grad"] + 0.1 * self._wave("grad", steps))
        )
        for at, factor in spec.lr_drops:  # step decay: the loss anneals down, the grad norm creeps up
            after = steps >= at
            if after.any():
                decades = math.log10(1.0 / factor)
                rel = np.maximum(steps - at, 0)
                lr = np.where(after, lr * factor, lr)
                loss = loss * np.where(after, 1.0 - 0.03 * decades * (1.0 - np.exp(-rel / 50.0)), 1.0)
                grad = grad * np.where(after, 1.0 + 0.2 * decades * (1.0 - np.exp(-rel / 200.0)), 1.0)
        logz = 3.0 * (1.0 + 0.5 * np.exp(-prog / 2000.0)) * np.exp(0.02 * z["z"])
        logit = 35.0 * (1.0 + 0.3 * np.exp(-prog / 3000.0)) * np.exp(0.01 * z["z"])
        T = spec.step_time_s * np.exp(0.012 * z["time"] + 0.01 * self._wave("time", steps))
        if st.first_step_pending:
            T[0] *= 3.0
            st.first_step_pending = False
        extra = np.zeros(n)  # wall-clock time not counted as step time (saves, evals)
        nan = np.zeros(n, dtype=bool)

        for q in act:
            lo, hi = max(u, q.onset), min(v, q.end)
            if lo > hi:
                continue
            sl = slice(lo - u, hi - u + 1)
            rel = steps[sl] - q.onset
            pr = q.params
            if q.kind == "grad_norm_spike":
                in_spike = rel < q.duration
                grad[sl] *= np.where(in_spike, pr["factor"] ** (0.75**rel), 1.0)
                if pr["loss"]:
                    lag, ln = pr["loss_lag"], pr["loss_len"]
                    hit = (rel >= lag) & (rel < lag + ln)
                    loss[sl] *= np.where(hit, 1.0 + (pr["loss_factor"] - 1.0) * 0.7 ** (rel - lag), 1.0)
            elif q.kind == "loss_spike":
                shape = 0.8**rel
                loss[sl] *= 1.0 + (pr["factor"] - 1.0) * shape
                grad[sl] *= 1.0 + (pr["grad_factor"] - 1.0) * shape
            elif q.kind == "loss_divergence":
                # progress stops (loss level frozen at the onset), then a convex rise to `ratio`
                # over `duration`, then a slow further climb capped near the init loss
                frac = np.minimum(1.0, (rel + 1.0) / q.duration)
                frozen = self._base_loss(prog[sl][0] - rel[0]) / self._base_loss(prog[sl])
                x = loss[sl] * frozen * pr["ratio"] ** (frac**1.3)
                cap = (self.l0 + 1.0) * np.exp(0.01 * z["loss"][sl])
                loss[sl] = np.minimum(x, cap)
                grad[sl] *= pr["grad_ratio"] ** frac
            elif q.kind == "nonfinite":
                nan[sl] = True
            elif q.kind == "logit_norm_drift":
                frac = np.minimum(1.0, (rel + 1.0) / q.duration)
                f = 1.0 + (pr["factor"] - 1.0) * frac
                logz[sl] *= np.sqrt(f)
                logit[sl] *= f
            elif q.kind == "resume_regression":
                tau = float(q.duration)
                loss[sl] *= 1.0 + (pr["ratio"] - 1.0) * np.exp(-rel / tau)
                grad[sl] *= 1.0 + (pr["grad_factor"] - 1.0) * np.exp(-rel / (tau / 2.0))
            elif q.kind == "loss_collapse":
                loss[sl] = pr["level"] * np.exp(0.3 * z["loss"][sl])
                grad[sl] = self.grad_level * 2e-4 * np.exp(0.3 * z["grad"][sl])
                logz[sl] *= 0.1
            elif q.kind == "stall":
                T[q.onset - u] += pr["gap"]
            elif q.kind == "throughput_drop":
                T[sl] /= pr["factor"]
        if st.cascade_steps and on:
            cs = st.cascade_steps
            for q in act:
                if q.kind != "loss_scale_collapse":
                    continue
                lo, hi = max(u, q.onset), v
                rel_end = steps[lo - u :] - cs[-1]
                bump = np.where(rel_end <= 0, 1.0, np.exp(-np.maximum(rel_end, 0) / 30.0))
                loss[lo - u :] *= 1.0 + (q.params["loss_factor"] - 1.0) * bump
        loss[nan] = np.nan
        if not self.fp16:
            grad[nan] = np.nan

        # what the format prints as grad norm on skipped steps
        if self.p.ds_lines or (self.p.scaler == "generic" and self.fp16):
            stale = ov | silent
            idx = np.where(~stale, np.arange(n), -1)
            np.maximum.accumulate(idx, out=idx)
            prev = st.last_grad
            grad = np.where(idx >= 0, grad[np.maximum(idx, 0)], prev)
        elif self.p.scaler == "megatron":
            grad = np.where(skipped, _ABSENT, grad)
        if self.fmt == "hf-trainer":  # HF's own norm of the NaN'd grads ('loss': 0.0 + nan)
            grad[nan] = np.nan
        if n:
            last_printed = grad[-1]
            st.last_grad = float(last_printed)

        # wall clock: save/eval time after those steps, resume gap handled by the caller
        if spec.noise_lines:
            save_mask = (steps % _SAVE_EVERY == 0) & (steps < self.last)
            extra[1:] += np.where(save_mask[:-1], 30.0 + 3.0 * spec.step_time_s, 0.0)
            eval_mask = (steps % _EVAL_EVERY == 0) & (steps < self.last)
            extra[1:] += np.where(eval_mask[:-1], 3.0 * spec.step_time_s, 0.0)
            self.pending_extra = float(
                (30.0 + 3.0 * spec.step_time_s) * bool(save_mask[-1]) + 3.0 * spec.step_time_s * bool(eval_mask[-1])
            )
        clock = st.clock + np.cumsum(T + extra)
        st.clock = float(clock[-1])

        # records
        recmask = steps % self.k == 0
        if self.p.first_record and u == 1:
            recmask[0] = True
        rec_idx = np.flatnonzero(recmask)
        b = _Block()
        b.u, b.v = u, v
        b.steps = steps
        b.loss = loss
        b.clock = clock
        b.lr = lr
        b.scale = scale
        b.grad = grad
        b.T = T
        b.ov_events = ov_events
        b.exit_step = st.exited
        b.ds_skipped = st.ds_skipped + np.cumsum(skipped)
        st.ds_skipped = int(b.ds_skipped[-1])
        b.rec_idx = rec_idx
        b.rec_steps = steps[rec_idx].tolist()
        if len(rec_idx):
            starts = np.concatenate(([0], rec_idx[:-1] + 1))
            cnt = rec_idx - starts + 1
            # interval sums end at the last record: steps after it (the end of a run, or of a run
            # that died before its next log) are never printed, and reduceat's last piece would
            # otherwise run on to the end of the block
            m = int(rec_idx[-1]) + 1
            if self.fmt == "megatron-lm":
                w = ok
                num = np.add.reduceat(np.where(w, loss, 0.0)[:m], starts)
                den = np.add.reduceat(w.astype(np.int64)[:m], starts)
                seen = st.loss_key_seen | (np.cumsum(w)[rec_idx] > 0)
                avg = np.where(den > 0, num / np.maximum(den, 1), 0.0)
                current = spec.timestamps
                avg = np.where(den > 0, avg, np.where(seen & current, 0.0, _ABSENT))
                b.r_loss = avg
                st.loss_key_seen = bool(seen[-1])
            elif self.fmt == "megatron-deepspeed":
                b.r_loss = np.add.reduceat(loss[:m], starts) / cnt
            elif self.fmt == "hf-trainer":
                fin = np.isfinite(loss)
                num = np.add.reduceat(np.where(fin, loss, 0.0)[:m], starts)
                den = np.add.reduceat(fin.astype(np.int64)[:m], starts)
                b.r_loss = np.where(den > 0, num / np.maximum(den, 1), 0.0)
            else:
                b.r_loss = loss[rec_idx]
            b.r_T = np.add.reduceat(T[:m], starts) / cnt
            b.r_skipped = np.add.reduceat(skipped.astype(np.int64)[:m], starts)
            b.r_nan = np.add.reduceat((skipped & nan).astype(np.int64)[:m], starts)
            b.r_grad = grad[rec_idx]
            b.r_lr = lr[rec_idx]
            b.r_scale = scale[rec_idx]
            b.r_clock = clock[rec_idx]
            b.r_z = 1e-4 * logz[rec_idx] ** 2
            b.r_logit = logit[rec_idx]
            b.r_skipflag = silent[rec_idx].astype(np.float64)
        else:
            empty = np.zeros(0)
            b.r_loss = b.r_T = b.r_skipped = b.r_nan = b.r_grad = b.r_lr = empty
            b.r_scale = b.r_clock = b.r_z = b.r_logit = b.r_skipflag = empty
        return b

    # -- rendering ------------------------------------------------------------------------------

    def chunks(self) -> Iterator[tuple[list[str], list[bool]]]:
        """Yield (pieces, is_record) per block; every piece is whole lines ending in newline."""
        spec = self.spec
        st = _State(clock=self.clock0)
        self.st = st
        self.scale_rng = np.random.default_rng([spec.seed, 4])
        self.pending_extra = 0.0
        fresh = self.first == 1
        if self.fp16:
            if fresh and spec.calibration:
                st.scale = self.scale_init
                st.mode = "calib"
                st.mode_target = self.scale_cal
            else:
                st.scale = self.scale_cal * 2.0
            st.last_ov = self.first - 1 - (0 if fresh else int(self.scale_rng.integers(0, 1000)))
        st.succ = self.first - 1
        st.ds_skipped = 0
        st.loss_key_seen = not fresh
        renderer = getattr(self, "_render_" + self.fmt.replace("-", "_"))
        head = self._header(resume_at=None if fresh else self.first - 1)
        if head:
            yield [head], [False]
        snapshots: dict[int, _State] = {}
        for seg_first, seg_last, on, resume in self._segments():
            if resume is not None:
                c = resume.onset - 1
                saved = snapshots[c]
                self.st.clock += 600.0 + 40.0 * spec.step_time_s  # crash, requeue, load
                keep_clock = self.st.clock
                restored = replace(saved, clock=keep_clock, cascade_steps=list(saved.cascade_steps))
                restored.first_step_pending = True
                restored.last_grad = _ABSENT
                self.st = st = restored
                pre = float(self._base_loss(st.succ))
                target = pre + (self.l0 + 0.5 - pre) * resume.params["frac"]
                resume.params["ratio"] = target / pre
                yield [self._restart_lines(c)], [False]
            u = seg_first
            while u <= seg_last:
                v = min(seg_last, ((u - 1) // self.block + 1) * self.block)
                blk = self._simulate(u, v, on)
                st = self.st
                if blk is not None:
                    yield renderer(blk)
                if st.exited:
                    yield [self._exit_lines()], [False]
                    return
                if self.pending_extra:
                    st.clock += self.pending_extra
                    self.pending_extra = 0.0
                if on and u <= seg_last <= v:
                    snapshots[seg_last] = replace(st, cascade_steps=list(st.cascade_steps))
                u = v + 1
        tail = self._footer()
        if tail:
            yield [tail], [False]

    @staticmethod
    def _assemble(
        rec: dict[int, str], before: dict[int, list[str]], after: dict[int, list[str]]
    ) -> tuple[list[str], list[bool]]:
        if not before and not after:  # records were inserted in step order
            return list(rec.values()), [True] * len(rec)
        keys = sorted(set(rec).union(before, after))
        pieces: list[str] = []
        isrec: list[bool] = []
        for t in keys:
            s = rec.get(t)
            bl = before.get(t)
            al = after.get(t)
            if bl is None and al is None:
                pieces.append(s)  # type: ignore[arg-type]
                isrec.append(True)
            else:
                pieces.append("".join(bl or ()) + (s or "") + "".join(al or ()))
                isrec.append(s is not None)
        return pieces, isrec

    def _ds_lines(self, b: _Block, before: dict[int, list[str]]) -> None:
        """DeepSpeed OVERFLOW lines and the every-10-steps progress/timer lines."""
        if b.ov_events:
            cl = _timestamps(np.array([b.clock[t - b.u] - 0.5 for t, *_ in b.ov_events]))
            for (t, att, new, hb, was_float), ts in zip(b.ov_events, cl, strict=True):
                if hb < 0:
                    continue  # the exit is rendered by _exit_lines
                if self.ds_old:
                    fa = ("%.1f" % att) if was_float else ("%d" % att)
                    fn = ("%.1f" % new) if (was_float or new != att) else ("%d" % new)
                    line = (
                        "%s [INFO] [stage_1_and_2.py:1644:step] [deepscale] OVERFLOW! Rank 0 "
                        "Skipping step. Attempted loss scale: %s, reducing to %s\n" % (_ts_ds(ts), fa, fn)
                    )
                elif hb > 1:
                    line = (
                        "%s [INFO] [loss_scaler.py:188:update_scale] [deepspeed] OVERFLOW! Rank 0 "
                        "Skipping step. Attempted loss scale: %d, but hysteresis is %d. "
                        "Reducing hysteresis to %d\n" % (_ts_ds(ts), att, hb, hb - 1)
                    )
                else:
                    line = (
                        "%s [INFO] [loss_scaler.py:181:update_scale] [deepspeed] OVERFLOW! Rank 0 "
                        "Skipping step. Attempted loss scale: %d, reducing to %d\n" % (_ts_ds(ts), att, new)
                    )
                before.setdefault(t, []).append(line)
        if not self.ds_print:
            return
        first = -(-b.u // _DS_PRINT) * _DS_PRINT
        sel = np.arange(first, b.v + 1, _DS_PRINT)
        if not len(sel):
            return
        idx = sel - b.u
        stamps = _timestamps(b.clock[idx] - 0.05)
        lrs = b.lr[idx].tolist()
        sk = b.ds_skipped[idx].tolist()
        sps = (self.p.gbs / b.T[idx]).tolist()
        mom = "[(0.9, 0.95), (0.9, 0.95)]"
        logline = "logging.py:60:log_dist" if self.ds_old else "logging.py:96:log_dist"
        st = self.st
        for t, s, lr, k, cur in zip(sel.tolist(), stamps, lrs, sk, sps, strict=True):
            st.samples_sum += cur
            st.samples_n += 1
            tsd = _ts_ds(s)
            lines = [
                "%s [INFO] [%s] [Rank 0] step=%d, skipped=%d, lr=[%r, %r], mom=%s\n" % (tsd, logline, t, k, lr, lr, mom)
            ]
            if self.spec.noise_lines:
                if self.ds_old:
                    lines.append(
                        "%s [INFO] [timer.py:189:stop] 0/%d, SamplesPerSec=%.2f, "
                        "MemAllocated=30.71GB, MaxMemAllocated=61.27GB\n" % (tsd, t, cur)
                    )
                else:
                    lines.append(
                        "%s [INFO] [timer.py:199:stop] epoch=0/micro_step=%d/global_step=%d, "
                        "RunningAvgSamplesPerSec=%r, CurrSamplesPerSec=%r, MemAllocated=30.71GB, "
                        "MaxMemAllocated=61.27GB\n" % (tsd, t, t, st.samples_sum / st.samples_n, cur)
                    )
            before.setdefault(t, []).extend(lines)

    def _val_loss(self, b: _Block, t: int) -> float:
        """Validation loss: recent training level (anomalies included) + 2 % generalisation gap."""
        i = t - b.u
        recent = b.loss[max(0, i - 20) : i + 1]
        recent = recent[np.isfinite(recent)]
        if not len(recent):
            return math.nan
        rng = np.random.default_rng([self.spec.seed, 5, t])
        return float(np.median(recent)) * 1.02 * math.exp(0.004 * rng.standard_normal())

    # Megatron-DeepSpeed -------------------------------------------------------------------------

    def _render_megatron_deepspeed(self, b: _Block) -> tuple[list[str], list[bool]]:
        spec, p = self.spec, self.p
        before: dict[int, list[str]] = {}
        after: dict[int, list[str]] = {}
        self._ds_lines(b, before)
        rec: dict[int, str] = {}
        if len(b.rec_idx):
            head = (
                " iteration %8d/%8d | consumed samples: %12d | consumed tokens: %12d | "
                "elapsed time per iteration (ms): %.1f | learning rate: %.3E | "
                "global batch size: %5d |"
            )
            tail = (
                " num zeros: 0.0 | number of skipped iterations:   0 | number of nan iterations:"
                "   0 | samples per second: %.3f | TFLOPs: %.2f |\n"
            )
            timer = (
                "time (ms) | forward-compute: %.2f | backward-compute: %.2f | "
                "backward-embedding-all-reduce: %.2f | optimizer: %.2f | batch-generator: %.2f\n"
            )
            gbs, seq = p.gbs, p.seq
            steps = np.asarray(b.rec_steps, dtype=np.int64)
            T = b.r_T
            ms = T * 1000.0
            tmpl = head.replace("%8d/%8d", "%8d/" + "%8d" % self.last) + "%s%s%s" + tail
            cols: list[list] = [
                b.rec_steps,
                (steps * gbs).tolist(),
                (steps * (gbs * seq)).tolist(),
                ms.tolist(),
                b.r_lr.tolist(),
                [gbs] * len(steps),
                [(" lm loss: %.6E |" % x) if x > 0.0 else "" for x in b.r_loss.tolist()],
                [" loss scale: %.1f |" % x for x in b.r_scale.tolist()] if self.fp16 else [""] * len(steps),
                [(" grad norm: %.3f |" % x) if x != _ABSENT else "" for x in b.r_grad.tolist()],
                (gbs / T).tolist(),
                (p.tflops * spec.step_time_s / T).tolist(),
            ]
            if spec.noise_lines:
                tmpl += timer
                cols += [(f * ms).tolist() for f in (0.31, 0.62, 0.02, 0.04, 0.002)]
            rec = dict(zip(b.rec_steps, [tmpl % row for row in zip(*cols, strict=True)], strict=True))
            self._megatron_extras(b, after, current=False)
        return self._assemble(rec, before, after)

    def _megatron_extras(self, b: _Block, after: dict[int, list[str]], current: bool) -> None:
        """Memory line after the first record, validation blocks, checkpoint saves."""
        spec = self.spec
        if not spec.noise_lines or not b.rec_steps:
            return
        st = self.st
        if not st.memory_line_done:
            st.memory_line_done = True
            t0 = b.rec_steps[0]
            after.setdefault(t0, []).append(
                "[Rank 0] (after %d iterations) memory (MB) | allocated: 23215.0859375 | "
                "max allocated: 26204.5595703125 | reserved: 30772.0 | max reserved: 30772.0\n" % t0
            )
        for t in range(-(-b.u // _EVAL_EVERY) * _EVAL_EVERY, b.v + 1, _EVAL_EVERY):
            if t >= self.last or not self._is_record(t):
                continue
            val = self._val_loss(b, t)
            if val != val:
                continue
            s = " validation loss at iteration %d | lm loss value: %.6E | lm loss PPL: %.6E | " % (
                t,
                val,
                math.exp(min(val, 700.0)),
            )
            dash = "-" * (len(s) + 1) + "\n"
            lines = [dash, s + "\n", dash]
            after.setdefault(t, []).extend(lines)
        for t in range(-(-b.u // _SAVE_EVERY) * _SAVE_EVERY, b.v + 1, _SAVE_EVERY):
            if t >= self.last:
                continue
            ts = _one_ts(float(b.clock[t - b.u]) + 3.0 * spec.step_time_s)
            save_ms = (30.0 + 3.0 * spec.step_time_s) * 1000.0
            if self.fmt == "megatron-deepspeed":
                lines = [
                    "saving checkpoint at iteration %7d to %s\n" % (t, _CKPT),
                    "%s [INFO] [logging.py:96:log_dist] [Rank 0] Saving model checkpoint: "
                    "%s/global_step%d/mp_rank_00_model_states.pt\n" % (_ts_ds(ts), _CKPT, t),
                    "  successfully saved checkpoint at iteration %7d to %s\n" % (t, _CKPT),
                    "time (ms) | save-checkpoint: %.2f\n" % save_ms,
                ]
            elif current:
                ts2 = _one_ts(float(b.clock[t - b.u]) + 3.0 * spec.step_time_s + save_ms / 1000)
                lines = [
                    " [%s] saving checkpoint at iteration %7d to %s in torch_dist format\n" % (_ts_sec(ts), t, _CKPT),
                    "  [%s] successfully saved checkpoint from iteration %7d to %s "
                    "[ t 1/1, gtp_remat 1/1, p 1/1 ]\n" % (_ts_sec(ts2), t, _CKPT),
                    "(min, max) time across ranks (ms):\n",
                    "    %s: (%.2f, %.2f)\n" % ("save-checkpoint ".ljust(48, "."), save_ms * 0.99, save_ms),
                ]
            else:
                lines = [
                    "saving checkpoint at iteration %7d to %s\n" % (t, _CKPT),
                    "  successfully saved checkpoint at iteration %7d to %s\n" % (t, _CKPT),
                ]
            after.setdefault(t, []).extend(lines)

    # Megatron-LM ------------------------------------------------------------------------------

    def _render_megatron_lm(self, b: _Block) -> tuple[list[str], list[bool]]:
        spec, p = self.spec, self.p
        rec: dict[int, str] = {}
        after: dict[int, list[str]] = {}
        if len(b.rec_idx):
            current = spec.timestamps
            if current:
                head = (
                    " [%s] iteration %8d/%8d | consumed samples: %12d | elapsed time per iteration"
                    " (ms): %.1f | throughput per GPU (TFLOP/s/GPU): %.1f | learning rate: %.6E |"
                    " global batch size: %5d |"
                )
                tss = _ts_bulk(b.r_clock, "sec")
            else:
                head = (
                    " iteration %8d/%8d | consumed samples: %12d | elapsed time per iteration (ms):"
                    " %.1f | learning rate: %.3E | global batch size: %5d |"
                )
                tss = [""] * len(b.rec_steps)
            tail = " number of skipped iterations: %3d | number of nan iterations: %3d |\n"
            names = ("forward-backward", "forward-compute", "backward-compute", "optimizer")
            fracs = (0.95, 0.31, 0.62, 0.04)
            timer_fmt = "(min, max) time across ranks (ms):\n" + "".join(
                "    " + (nm + " ").ljust(48, ".") + ": (%.2f, %.2f)\n" for nm in names
            )
            total, gbs = self.last, p.gbs
            nominal = p.tflops * spec.step_time_s
            noise = spec.noise_lines
            for t, ts, loss, grad, lr, sc, T, sk, nn in zip(
                b.rec_steps,
                tss,
                b.r_loss.tolist(),
                b.r_grad.tolist(),
                b.r_lr.tolist(),
                b.r_scale.tolist(),
                b.r_T.tolist(),
                b.r_skipped.tolist(),
                b.r_nan.tolist(),
                strict=True,
            ):
                if current:
                    s = head % (ts, t, total, t * gbs, T * 1000.0, nominal / T, lr, gbs)
                    if loss >= 0.0:
                        s += " lm loss: %.6E |" % loss
                else:
                    s = head % (t, total, t * gbs, T * 1000.0, lr, gbs)
                    if loss > 0.0:
                        s += " lm loss: %.6E |" % loss
                s += " loss scale: %.1f |" % (sc if self.fp16 else 1.0)
                if grad != _ABSENT:
                    s += (" grad norm: %.3f | num zeros: 0 |" if current else " grad norm: %.3f |") % (grad)
                s += tail % (sk, nn)
                if noise:
                    ms = T * 1000.0
                    vals: list[float] = []
                    for f in fracs:
                        vals.extend((f * ms * 0.995, f * ms))
                    if current:
                        s += timer_fmt % tuple(vals)
                    else:
                        s += (
                            "time (ms) | forward-compute: %.2f | backward-compute: %.2f | "
                            "optimizer: %.2f | batch-generator: %.2f\n" % (0.31 * ms, 0.62 * ms, 0.04 * ms, 0.002 * ms)
                        )
                rec[t] = s
            self._megatron_extras(b, after, current=current)
        return self._assemble(rec, {}, after)

    # OLMo ---------------------------------------------------------------------------------------

    def _olmo_prefix(self, ts: str, line: int) -> str:
        return "%s %s:0  olmo.train:%d  INFO    " % (_ts_dot(ts), self.host, line)

    def _render_olmo(self, b: _Block) -> tuple[list[str], list[bool]]:
        spec, p = self.spec, self.p
        after: dict[int, list[str]] = {}
        loss = b.r_loss
        cols: list[list] = [
            _ts_bulk(b.r_clock, "dot"),
            b.rec_steps,
            _olmo_col(loss),
        ]
        tmpl = (
            "%s " + self.host + ":0  olmo.train:908  INFO    [step=%d/" + str(self.last)
            + ",epoch=0]\n    train/CrossEntropyLoss=%s\n"
        )  # fmt: skip
        if spec.z_loss:
            tmpl += "    train/ZLoss=%s\n"
            cols.append(_olmo_col(b.r_z))
        tmpl += "    train/Perplexity=%s\n    optim/total_grad_norm=%s\n"
        cols.append(_olmo_col(np.exp(np.minimum(loss, 700.0))))
        cols.append(_olmo_col(b.r_grad))
        if spec.noise_lines:
            tmpl += (
                "    throughput/total_tokens=%s\n    throughput/device/tokens_per_second=%s\n"
                "    throughput/device/batches_per_second=%s\n"
                "    System/Peak GPU Memory (MB)=39,203\n"
            )
            steps = np.asarray(b.rec_steps, dtype=np.float64)
            cols.append(_olmo_col(steps * (p.gbs * p.seq)))
            cols.append(_olmo_col(p.gbs * p.seq / p.devices / b.r_T))
            cols.append(_olmo_col(1.0 / b.r_T))
        rec = dict(zip(b.rec_steps, [tmpl % row for row in zip(*cols, strict=True)], strict=True))
        if spec.noise_lines:
            for t in range(-(-b.u // _SAVE_EVERY) * _SAVE_EVERY, b.v + 1, _SAVE_EVERY):
                if t >= self.last:
                    continue
                c = float(b.clock[t - b.u])
                after.setdefault(t, []).extend(
                    [
                        self._olmo_prefix(_one_ts(c + 0.5), 1089) + "Saving checkpoint...\n",
                        self._olmo_prefix(_one_ts(c + 30.0), 1093) + "Checkpoint saved to %s/step%d\n" % (_CKPT, t),
                    ]
                )
        return self._assemble(rec, {}, after)

    # OLMo-core --------------------------------------------------------------------------------

    def _olmo_core_prefix(self, ts: str, where: str) -> str:
        return "[%s] INFO     [%s, rank=0] " % (_ts_sec(ts), where)

    def _render_olmo_core(self, b: _Block) -> tuple[list[str], list[bool]]:
        spec, p = self.spec, self.p
        before: dict[int, list[str]] = {}
        after: dict[int, list[str]] = {}
        loss = b.r_loss
        tmpl = (
            "[%s] INFO     [olmo_core.train.callbacks.console_logger:62, rank=0] [step=%d/"
            + str(self.last) + ",epoch=1]\n    train/CE loss=%s\n    train/PPL=%s\n"
        )  # fmt: skip
        cols: list[list] = [
            _ts_bulk(b.r_clock, "sec"),
            b.rec_steps,
            _olmo_col(loss, core=True),
            _olmo_col(np.exp(np.minimum(loss, 700.0)), core=True),
        ]
        if spec.z_loss:
            tmpl += "    train/Z loss=%s\n"
            cols.append(_olmo_col(b.r_z, core=True))
        tmpl += "    optim/total grad norm=%s\n    optim/step skipped=%s\n    optim/LR (group 0)=%s\n"
        cols.append(_olmo_col(b.r_grad, core=True))
        cols.append(_olmo_col(b.r_skipflag, core=True))
        cols.append(_olmo_col(b.r_lr, core=True))
        if spec.noise_lines:
            tmpl += (
                "    throughput/total tokens=%s\n    throughput/device/TPS=%s\n"
                "    throughput/device/BPS=%s\n    system/GPU active mem (GiB)=61.27\n"
            )
            steps = np.asarray(b.rec_steps, dtype=np.float64)
            cols.append(_olmo_col(steps * (p.gbs * p.seq), core=True))
            cols.append(_olmo_col(p.gbs * p.seq / p.devices / b.r_T, core=True))
            cols.append(_olmo_col(1.0 / b.r_T, core=True))
        rec = dict(zip(b.rec_steps, [tmpl % row for row in zip(*cols, strict=True)], strict=True))
        if spec.noise_lines:
            # progress-only markers on the steps between metric records
            others = np.setdiff1d(b.steps, b.steps[b.rec_idx], assume_unique=True)
            if len(others):
                mark = (
                    "[%s] INFO     [olmo_core.train.callbacks.console_logger:52, rank=0] "
                    "[step=%d/" + str(self.last) + ",epoch=1]\n"
                )  # fmt: skip
                ts_o = _ts_bulk(b.clock[others - b.u], "sec")
                for t, ts in zip(others.tolist(), ts_o, strict=True):
                    before[t] = [mark % (ts, t)]
            for t in range(-(-b.u // _SAVE_EVERY) * _SAVE_EVERY, b.v + 1, _SAVE_EVERY):
                if t >= self.last:
                    continue
                ts = _one_ts(float(b.clock[t - b.u]) + 0.5)
                after.setdefault(t, []).append(
                    self._olmo_core_prefix(ts, "olmo_core.train.trainer:1021")
                    + "Saving checkpoint for step %d to '%s/step%d'...\n" % (t, _CKPT, t)
                )
        return self._assemble(rec, before, after)

    # Composer ---------------------------------------------------------------------------------

    def _render_composer(self, b: _Block) -> tuple[list[str], list[bool]]:
        spec, p = self.spec, self.p
        rec: dict[int, str] = {}
        after: dict[int, list[str]] = {}
        tok = p.gbs * p.seq
        start = self.clock0
        for t, loss, grad, lr, T, c in zip(
            b.rec_steps,
            b.r_loss.tolist(),
            b.r_grad.tolist(),
            b.r_lr.tolist(),
            b.r_T.tolist(),
            b.r_clock.tolist(),
            strict=True,
        ):
            ppl = math.exp(min(loss, 700.0)) if loss == loss else loss
            parts = ["[batch=%d/%d]:\n" % (t, self.last)]
            if spec.noise_lines:
                parts.append(
                    "\t Train time/batch: %d\n\t Train time/sample: %d\n\t Train time/token: %d\n"
                    "\t Train memory/peak_reserved_mem: 62.3200\n"
                    "\t Train trainer/device_train_microbatch_size: 8\n" % (t - 1, (t - 1) * p.gbs, (t - 1) * tok)
                )
            parts.append(
                "\t Train loss/train/total: %.4f\n"
                "\t Train metrics/train/LanguageCrossEntropy: %.4f\n"
                "\t Train metrics/train/LanguagePerplexity: %.4f\n"
                "\t Train l2_norm/grad/global: %.4f\n"
                "\t Train lr-DecoupledAdamW/group0: %.4f\n" % (loss, loss, ppl, grad, lr)
            )
            if spec.noise_lines:
                parts.append(
                    "\t Train throughput/batches_per_sec: %.4f\n"
                    "\t Train throughput/samples_per_sec: %.4f\n"
                    "\t Train throughput/device/tokens_per_sec: %.4f\n" % (1.0 / T, p.gbs / T, tok / p.devices / T)
                )
            parts.append("\t Train time/train: %.4f\n" % ((c - start) / 3600.0))
            rec[t] = "".join(parts)
        if spec.noise_lines:
            for t in range(-(-b.u // _EVAL_EVERY) * _EVAL_EVERY, b.v + 1, _EVAL_EVERY):
                if t >= self.last or not self._is_record(t):
                    continue
                val = self._val_loss(b, t)
                if val != val:
                    continue
                lines = ["[Eval batch=%d/5] Eval on eval data\n" % i for i in range(1, 6)]
                lines.append(
                    "[batch=%d/%d]:\n\t Eval metrics/eval/LanguageCrossEntropy: %.4f\n"
                    "\t Eval metrics/eval/LanguagePerplexity: %.4f\n" % (t, self.last, val, math.exp(min(val, 700.0)))
                )
                after.setdefault(t, []).extend(lines)
        return self._assemble(rec, {}, after)

    # torchtitan -------------------------------------------------------------------------------

    def _titan_prefix(self, ts: str) -> str:
        return "[rank0]:[titan] %s - root - INFO - " % _ts_comma(ts)

    def _render_torchtitan(self, b: _Block) -> tuple[list[str], list[bool]]:
        spec, p = self.spec, self.p
        rec: dict[int, str] = {}
        after: dict[int, list[str]] = {}
        c = _ANSI
        fmt = (
            c["red"] + "step: %2d  " + c["green"] + "loss: %8.5f  " + c["orange"]
            + "grad_norm: %7.4f  " + c["turquoise"] + "memory: 61.27GiB(77.41%%)  " + c["blue"]
            + "tps: %s  " + c["cyan"] + "tflops: %s  " + c["magenta"] + "mfu: %.2f%%"
            + c["reset"] + "\n"
        )  # fmt: skip
        tps_nom = p.gbs * p.seq / p.devices
        nominal = p.tflops * spec.step_time_s
        fmt = "[rank0]:[titan] %s - root - INFO - " + fmt
        tf = nominal / b.r_T
        cols = (
            _ts_bulk(b.r_clock, "comma"),
            b.rec_steps,
            b.r_loss.tolist(),
            b.r_grad.tolist(),
            [f"{x:,}" for x in np.rint(tps_nom / b.r_T).astype(np.int64).tolist()],
            [f"{x:,.2f}" for x in tf.tolist()],
            (100.0 * tf / 989.0).tolist(),
        )
        rec = dict(zip(b.rec_steps, [fmt % row for row in zip(*cols, strict=True)], strict=True))
        if spec.noise_lines:
            for t in range(-(-b.u // _EVAL_EVERY) * _EVAL_EVERY, b.v + 1, _EVAL_EVERY):
                if t >= self.last or not self._is_record(t):
                    continue
                ts = _one_ts(float(b.clock[t - b.u]) + 1.0)
                val = self._val_loss(b, t)
                if val != val:
                    continue
                after.setdefault(t, []).append(
                    self._titan_prefix(ts)
                    + c["yellow"]
                    + "validate step: %2d  " % t
                    + c["green"]
                    + "loss: %7.4f  " % val
                    + c["turquoise"]
                    + "memory: 61.27GiB(77.41%)  "
                    + c["blue"]
                    + "tps: %s" % f"{round(tps_nom * 3):,}"
                    + c["reset"]
                    + "\n"
                )
            save_s = 30.0 + 3.0 * spec.step_time_s
            for t in range(-(-b.u // _SAVE_EVERY) * _SAVE_EVERY, b.v + 1, _SAVE_EVERY):
                if t >= self.last:
                    continue
                cl = float(b.clock[t - b.u])
                after.setdefault(t, []).extend(
                    [
                        self._titan_prefix(_one_ts(cl + 0.2))
                        + "Saving the checkpoint (or staging if async is enabled).\n",
                        self._titan_prefix(_one_ts(cl + save_s))
                        + "Finished saving the checkpoint (or staging if async is enabled)"
                        "in %.2f seconds.\n" % (save_s - 0.2),
                    ]
                )
        return self._assemble(rec, {}, after)

    # HF Trainer ---------------------------------------------------------------------------------

    def _hf_info(self, clock: float, line: int, msg: str) -> str:
        return "[INFO|trainer.py:%d] %s >> %s\n" % (line, _ts_comma(_one_ts(clock)), msg)

    def _render_hf_trainer(self, b: _Block) -> tuple[list[str], list[bool]]:
        spec = self.spec
        before: dict[int, list[str]] = {}
        after: dict[int, list[str]] = {}
        self._ds_lines(b, before)
        per_epoch = 5000.0
        steps = np.asarray(b.rec_steps, dtype=np.int64)
        grads = b.r_grad.astype(np.float32).astype(np.float64).tolist()  # torch float32 .item()
        grads = [None if g == _ABSENT else g for g in grads] if _ABSENT in grads else grads
        cols: list[list] = [
            np.round(b.r_loss, 4).tolist(),
            grads,
            b.r_lr.tolist(),
            np.round(steps / per_epoch, 2).tolist(),
        ]
        tmpl = "{'loss': %r, 'grad_norm': %r, 'learning_rate': %r, 'epoch': %r}\n"
        if spec.noise_lines:  # the tqdm bar as captured logs show it, on its own line
            tmpl += " %3.0f%%|%s| %d/" + str(self.last) + " [%s<%s, %5.2fs/it]\n"
            frac = np.minimum(1.0, steps / self.last)
            el = b.r_clock - self.clock0
            per_it = el / np.maximum(1, steps - self.first + 1)
            cols += [
                (frac * 100.0).tolist(),
                [_TQDM_BARS[i] for i in (frac * 80).astype(np.int64).tolist()],
                b.rec_steps,
                _tqdm_intervals(el),
                _tqdm_intervals((self.last - steps) * per_it),
                per_it.tolist(),
            ]
        rec = dict(zip(b.rec_steps, [tmpl % row for row in zip(*cols, strict=True)], strict=True))
        if spec.noise_lines:
            for t in range(-(-b.u // _EVAL_EVERY) * _EVAL_EVERY, b.v + 1, _EVAL_EVERY):
                if t >= self.last or not self._is_record(t):
                    continue
                val = self._val_loss(b, t)
                if val != val:
                    continue
                after.setdefault(t, []).append(
                    "{'eval_loss': %r, 'eval_runtime': 31.4159, 'eval_samples_per_second': 81.487, "
                    "'eval_steps_per_second': 2.546, 'epoch': %r}\n" % (round(val, 4), round(t / per_epoch, 2))
                )
            for t in range(-(-b.u // _SAVE_EVERY) * _SAVE_EVERY, b.v + 1, _SAVE_EVERY):
                if t >= self.last:
                    continue
                after.setdefault(t, []).append(
                    self._hf_info(
                        float(b.clock[t - b.u]) + 1.0,
                        3503,
                        "Saving model checkpoint to %s/checkpoint-%d" % (_CKPT, t),
                    )
                )
        return self._assemble(rec, before, after)

    # jsonl --------------------------------------------------------------------------------------

    def _render_jsonl(self, b: _Block) -> tuple[list[str], list[bool]]:
        spec, p = self.spec, self.p
        tmpl = '{"step": %d, "loss": %.6g, "grad_norm": %.6g, "lr": %.6g, "loss_scale": %r, '
        tmpl += '"logit_norm": %.6g, '
        cols: list[list] = [
            b.rec_steps,
            b.r_loss.tolist(),
            b.r_grad.tolist(),
            b.r_lr.tolist(),
            b.r_scale.tolist() if self.fp16 else [1.0] * len(b.rec_steps),
            b.r_logit.tolist(),
        ]
        if spec.timestamps:
            tmpl += '"ts": %.3f, '
            cols.append(b.r_clock.tolist())
        tmpl += '"tps": %.1f}\n'
        cols.append((p.gbs * p.seq / b.r_T).tolist())
        lines = [tmpl % row for row in zip(*cols, strict=True)]
        bad = ~np.isfinite(b.r_loss) | ~np.isfinite(b.r_grad) | (b.r_grad == _ABSENT)
        for i in np.flatnonzero(bad).tolist():  # JSON spelling of nan / missing values
            line = lines[i].replace(": nan", ": NaN").replace(": inf", ": Infinity")
            if b.r_grad[i] == _ABSENT:
                line = line.replace('"grad_norm": -1,', '"grad_norm": null,')
            lines[i] = line
        return list(lines), [True] * len(lines)

    # headers, restarts, exits -------------------------------------------------------------------

    def _load_lines(self, c: int, clock: float) -> str:
        """The format's own checkpoint-load wording for a checkpoint at iteration/step c."""
        fmt, spec = self.fmt, self.spec
        load_ms = 12000.0 + 7.0 * c % 5000
        if fmt == "megatron-deepspeed":
            return (
                " loading checkpoint from %s at iteration %d\n"
                "  successfully loaded checkpoint from %s at iteration %d\n"
                "time (ms) | load-checkpoint: %.2f\n" % (_CKPT, c, _CKPT, c, load_ms)
            )
        if fmt == "megatron-lm":
            if spec.timestamps:
                return (
                    " loading distributed checkpoint from %s at iteration %d\n"
                    "  successfully loaded checkpoint from %s [ t 1/8, gtp_remat 1/1, p 1/1 ] "
                    "at iteration %d\n"
                    "(min, max) time across ranks (ms):\n    %s: (%.2f, %.2f)\n"
                    % (_CKPT, c, _CKPT, c, "load-checkpoint ".ljust(48, "."), load_ms * 0.98, load_ms)
                )
            return (
                " loading checkpoint from %s at iteration %d\n"
                "  successfully loaded checkpoint from %s at iteration %d\n"
                "time (ms) | load-checkpoint: %.2f\n" % (_CKPT, c, _CKPT, c, load_ms)
            )
        if fmt == "olmo":
            return (
                self._olmo_prefix(_one_ts(clock - 40), 1180)
                + "Loading checkpoint from %s/step%d...\n" % (_CKPT, c)
                + self._olmo_prefix(_one_ts(clock - 30), 1184)
                + "Checkpoint successfully loaded\n"
                + self._olmo_prefix(_one_ts(clock - 29), 1201)
                + "Restoring RNG states...\n"
                + self._olmo_prefix(_one_ts(clock - 28), 1210)
                + "Fast-forwarding data loader by %d steps\n" % c
            )
        if fmt == "olmo-core":
            w = "olmo_core.train.trainer:766"
            return (
                self._olmo_core_prefix(_one_ts(clock - 40), w)
                + "Loading checkpoint from '%s/step%d'...\n" % (_CKPT, c)
                + self._olmo_core_prefix(_one_ts(clock - 30), w)
                + "Checkpoint successfully loaded\n"
                + self._olmo_core_prefix(_one_ts(clock - 29), "olmo_core.train.trainer:782")
                + "Will resume training from step %d, epoch 1\n" % c
            )
        if fmt == "composer":
            return "Loading checkpoint from %s/ep0-ba%d-rank0.pt\n" % (_CKPT, c)
        if fmt == "torchtitan":
            return (
                self._titan_prefix(_one_ts(clock - 12)) + "Loading the checkpoint at step %d.\n" % c
                + self._titan_prefix(_one_ts(clock - 1))
                + "Finished loading the checkpoint in 11.31 seconds.\n"
                + self._titan_prefix(_one_ts(clock)) + "Training starts at step %d.\n" % (c + 1)
            )  # fmt: skip
        if fmt == "hf-trainer":
            ep = int(c // 5000)
            return (
                self._hf_info(clock - 5, 2128, "***** Running training *****")
                + self._hf_info(clock - 5, 2136, "  Total optimization steps = %d" % self.last)
                + self._hf_info(
                    clock - 5, 2197, "  Continuing training from checkpoint, will skip to saved global_step"
                )
                + self._hf_info(clock - 5, 2198, "  Continuing training from epoch %d" % ep)
                + self._hf_info(clock - 5, 2199, "  Continuing training from global step %d" % c)
                + self._hf_info(
                    clock - 5,
                    2201,
                    "  Will skip the first %d epochs then the first %d batches in the first epoch."
                    % (ep, c - ep * 5000),
                )
            )
        return ""  # jsonl: a resume shows as the step counter going back

    def _header(self, resume_at: int | None) -> str:
        spec = self.spec
        fmt = self.fmt
        clock = self.st.clock
        if not spec.noise_lines:
            return self._load_lines(resume_at, clock) if resume_at is not None else ""
        dt = _ts_sec(_one_ts(clock))
        if fmt in ("megatron-deepspeed", "megatron-lm"):
            if resume_at is None:
                load = (
                    "WARNING: could not find the metadata file %s/latest_checkpointed_iteration.txt\n"
                    "    will not load any checkpoints and will start from random\n"
                    "time (ms) | load-checkpoint: 0.35\n" % _CKPT
                )
            else:
                load = self._load_lines(resume_at, clock)
            return (
                "> building GPT model ...\n"
                + load
                + "[after model, optimizer, and learning rate scheduler are built] datetime: %s \n"
                "> building train, validation, and test datasets ...\n"
                "[after dataloaders are built] datetime: %s \n"
                "done with setup ...\n"
                "training ...\n"
                "[before the start of training step] datetime: %s \n" % (dt, dt, dt)
            )
        if fmt == "hf-trainer" and resume_at is None:
            return (
                self._hf_info(clock, 2128, "***** Running training *****")
                + self._hf_info(clock, 2130, "  Num Epochs = %d" % max(1, -(-self.last // 5000)))
                + self._hf_info(clock, 2136, "  Total optimization steps = %d" % self.last)
            )
        if fmt == "torchtitan" and resume_at is None:
            return self._titan_prefix(_one_ts(clock)) + "Training starts at step 1.\n"
        if resume_at is not None:
            return self._load_lines(resume_at, clock)
        return ""

    def _restart_lines(self, c: int) -> str:
        spec = self.spec
        clock = self.st.clock
        if self.fmt in ("megatron-deepspeed", "megatron-lm") and spec.noise_lines:
            dt = _ts_sec(_one_ts(clock))
            return (
                "> building GPT model ...\n"
                + self._load_lines(c, clock)
                + "[after model, optimizer, and learning rate scheduler are built] datetime: %s \n"
                "training ...\n"
                "[before the start of training step] datetime: %s \n" % (dt, dt)
            )
        return self._load_lines(c, clock)

    def _exit_lines(self) -> str:
        """DeepSpeed raises when an overflow happens at the minimum scale: the run ends here."""
        return (
            "Traceback (most recent call last):\n"
            '  File "/workspace/Megatron-DeepSpeed/pretrain_gpt.py", line 328, in <module>\n'
            "    pretrain(train_valid_test_datasets_provider, model_provider, forward_step)\n"
            '  File "/opt/conda/lib/python3.10/site-packages/deepspeed/runtime/fp16/loss_scaler.py",'
            " line 175, in update_scale\n"
            "    raise Exception(\n"
            "Exception: Current loss scale already at minimum - cannot decrease scale anymore. "
            "Exiting run.\n"
        )

    def _footer(self) -> str:
        if not self.spec.noise_lines:
            return ""
        clock = self.st.clock
        if self.fmt in ("megatron-deepspeed", "megatron-lm"):
            return "[after training is done] datetime: %s \n" % _ts_sec(_one_ts(clock))
        if self.fmt == "torchtitan":
            return self._titan_prefix(_one_ts(clock)) + "Training completed\n"
        if self.fmt == "hf-trainer":
            rt = clock - self.clock0
            n = self.last - self.first + 1
            return (
                "{'train_runtime': %.4f, 'train_samples_per_second': %.3f, "
                "'train_steps_per_second': %.3f, 'train_loss': %r, 'epoch': %r}\n"
                % (rt, n * self.p.gbs / rt, n / rt, round(self.l_end + 0.8, 4), round(self.last / 5000, 2))
            )
        return ""


# ----------------------------------------------------------------------------------------------
# public API


def labels(spec: RunSpec) -> list[Anomaly]:
    """The anomalies of ``spec`` as they will appear in the log (visible step, effective duration)."""
    run = _Run(spec)
    return [Anomaly(q.kind, q.label, q.magnitude, q.duration) for q in run.placed if not q.params.get("clean")]


def generate(spec: RunSpec) -> Iterator[str]:
    """Yield the log of ``spec`` line by line (each with its trailing newline); deterministic per seed."""
    for pieces, _ in _Run(spec).chunks():
        for piece in pieces:
            lines = piece.split("\n")
            for line in lines[:-1]:
                yield line + "\n"


def write_log(path: str | os.PathLike[str], spec: RunSpec) -> list[Anomaly]:
    """Write the log of ``spec`` to ``path`` and return its labels (see ``labels``)."""
    run = _Run(spec)
    with open(path, "w", encoding="utf-8", newline="") as f:
        for pieces, _ in run.chunks():
            f.write("".join(pieces))
    return [Anomaly(q.kind, q.label, q.magnitude, q.duration) for q in run.placed if not q.params.get("clean")]


def _bytes_per_step(spec: RunSpec) -> float:
    probe_steps = min(2000, max(200, spec.steps))
    probe = replace(spec, steps=probe_steps, anomalies=())
    total = 0
    for pieces, _ in _Run(probe).chunks():
        total += sum(len(s) for s in pieces)
    return max(1.0, total / probe_steps)


def write_sized(path: str | os.PathLike[str], spec: RunSpec, size_bytes: int) -> int:
    """Write a log of about ``size_bytes`` (streamed block by block) and return its record count.

    Why: benchmarks need logs of a chosen size. The run is lengthened (steps keep increasing, so the
    lr schedule and ``iteration N/TOTAL`` stay consistent) to the estimated length; should the
    estimate fall short, a resumed continuation run (with its checkpoint-load lines) is appended.
    Generation stops at a record boundary once the size is reached.
    """
    if size_bytes <= 0:
        raise ValueError("size_bytes must be > 0")
    bps = _bytes_per_step(spec)
    cur = replace(spec, steps=max(spec.steps, int(size_bytes / bps * 1.03) + 100))
    written = 0
    records = 0
    with open(path, "wb") as f:
        done = False
        while not done:
            buf: list[bytes] = []
            blen = 0
            for pieces, isrec in _Run(cur).chunks():
                data = "".join(pieces).encode("utf-8")
                if written + blen + len(data) >= size_bytes:
                    need = size_bytes - written - blen
                    lens = list(accumulate(len(x) for x in pieces))
                    cut = min(len(pieces), bisect_left(lens, need) + 1)
                    data = "".join(pieces[:cut]).encode("utf-8")
                    records += sum(isrec[:cut])
                    buf.append(data)
                    blen += len(data)
                    done = True
                    break
                records += sum(isrec)
                buf.append(data)
                blen += len(data)
                if blen >= 1 << 22:
                    f.write(b"".join(buf))
                    written += blen
                    buf, blen = [], 0
            f.write(b"".join(buf))
            written += blen
            if not done:  # estimate fell short: append a resumed continuation of the run
                cur = replace(
                    cur,
                    start_step=cur.start_step + cur.steps,
                    steps=max(1000, int((size_bytes - written) / bps * 1.05) + 100),
                    anomalies=(),
                    seed=cur.seed + 1,
                )
    return records

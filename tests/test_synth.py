"""Tests for the synthetic log generator: formats, determinism, labels, anomaly rendering, sizing."""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace

import numpy as np
import pytest

from gradwatch.synth import (
    ANOMALY_KINDS,
    FORMATS,
    Anomaly,
    RunSpec,
    generate,
    labels,
    supported_kinds,
    write_log,
    write_sized,
)

ANSI = re.compile(r"\x1b\[[0-9;]*m")

# how each format names the step of a metric record (HF: the tqdm bar after the dict line)
STEP_RE = {
    "megatron-deepspeed": re.compile(r"^ iteration +(\d+)/", re.M),
    "megatron-lm": re.compile(r"iteration +(\d+)/"),
    "olmo": re.compile(r"INFO +\[step=(\d+)/"),
    "olmo-core": re.compile(r"console_logger:62, rank=0\] \[step=(\d+)/"),
    "composer": re.compile(r"^\[batch=(\d+)/", re.M),
    "torchtitan": re.compile(r"INFO - step: +(\d+) "),
    "hf-trainer": re.compile(r"\| (\d+)/\d+ \["),
    "jsonl": re.compile(r'^\{"step": (\d+),', re.M),
}


def text(spec: RunSpec) -> str:
    return "".join(generate(spec))


def records(spec: RunSpec) -> dict[int, str]:
    """step -> text of its metric record (last occurrence wins: a resume replays steps)."""
    lines = [ANSI.sub("", line) for line in generate(spec)]
    out: dict[int, str] = {}
    rx = STEP_RE[spec.fmt]
    for i, line in enumerate(lines):
        m = rx.search(line)
        if not m:
            continue
        step = int(m.group(1))
        if spec.fmt == "hf-trainer":
            out[step] = lines[i - 1]
            continue
        body = [line]
        for nxt in lines[i + 1 :]:
            if not nxt.startswith(("    ", "\t ")):
                break
            body.append(nxt)
        out[step] = "".join(body)
    return out


def megatron_field(line: str, name: str) -> float | None:
    m = re.search(re.escape(name) + r": +([^ |]+) \|", line)
    return float(m.group(1)) if m else None


# ---------------------------------------------------------------------------------------------
# basics


def test_deterministic_per_seed() -> None:
    spec = RunSpec(steps=300, anomalies=(Anomaly("loss_spike", 150),))
    assert text(spec) == text(spec)
    assert text(spec) != text(replace(spec, seed=1))


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_renders_records(fmt: str) -> None:
    spec = RunSpec(fmt=fmt, steps=400, log_interval=4, z_loss=True)
    lines = list(generate(spec))
    assert lines and all(line.endswith("\n") and "\n" not in line[:-1] for line in lines)
    recs = records(spec)
    assert sorted(recs)[-1] == 400
    assert len(recs) in (100, 101)  # torchtitan / OLMo-core also log step 1


@pytest.mark.parametrize("fmt", FORMATS)
def test_quiet_variant_has_only_records(fmt: str) -> None:
    spec = RunSpec(fmt=fmt, steps=100, noise_lines=False, fp16=False)
    body = text(spec)
    assert "validation" not in body and "time (ms)" not in body and "Saving" not in body
    assert len(STEP_RE[fmt].findall(ANSI.sub("", body))) == (0 if fmt == "hf-trainer" else 100)


def test_real_line_shapes() -> None:
    meg = records(RunSpec(steps=30, fp16=False))[30]
    assert re.match(
        r" iteration +30/ +30 \| consumed samples: +61440 \| consumed tokens: +125829120 \| "
        r"elapsed time per iteration \(ms\): [\d.]+ \| learning rate: \d\.\d{3}E-\d\d \| "
        r"global batch size: +2048 \| lm loss: \d\.\d{6}E\+00 \| grad norm: [\d.]+ \| "
        r"num zeros: 0\.0 \| number of skipped iterations: +0 \| number of nan iterations: +0 \| "
        r"samples per second: [\d.]+ \| TFLOPs: [\d.]+ \|\n",
        meg,
    )
    mlm = records(RunSpec(fmt="megatron-lm", steps=30, fp16=False))[30]
    assert re.match(r" \[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] iteration +30/ +30 \|", mlm)
    assert "| loss scale: 1.0 |" in mlm and "learning rate: " in mlm
    raw = "".join(generate(RunSpec(fmt="torchtitan", steps=3)))
    assert re.search(
        r"\[rank0\]:\[titan\] \d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} - root - INFO - \x1b\[31mstep:  2  ",
        raw,
    )
    olmo = records(RunSpec(fmt="olmo", steps=3, z_loss=True))[2]
    assert "    train/CrossEntropyLoss=" in olmo and "    train/ZLoss=0.00" in olmo
    assert re.search(r"train/Perplexity=\d{2},\d{3}\n", olmo)
    comp = records(RunSpec(fmt="composer", steps=3))[3]
    assert comp.startswith("[batch=3/3]:\n\t Train ") and "\t Train loss/train/total: " in comp
    hf = records(RunSpec(fmt="hf-trainer", steps=20))[20]
    assert re.match(r"\{'loss': [\d.]+, 'grad_norm': [\d.]+, 'learning_rate': [\d.e-]+, 'epoch'", hf)
    row = json.loads(records(RunSpec(fmt="jsonl", steps=3))[3])
    assert set(row) >= {"step", "loss", "grad_norm", "lr", "loss_scale", "logit_norm"}


def test_megatron_lm_fp16_calibration_is_printed_like_the_real_thing() -> None:
    recs = records(RunSpec(fmt="megatron-lm", steps=60))
    first = recs[1]
    assert "lm loss" not in first and "grad norm" not in first
    assert "learning rate: 0.000000E+00" in first and "loss scale: 4294967296.0" in first
    assert megatron_field(first, "number of skipped iterations") == 1
    assert megatron_field(recs[2], "loss scale") == 2147483648.0
    assert megatron_field(recs[60], "lm loss") is not None
    # interval sums: with log_interval 10 the first record counts 10 skipped iterations
    rec10 = records(RunSpec(fmt="megatron-lm", steps=60, log_interval=10))[10]
    assert megatron_field(rec10, "number of skipped iterations") == 10


def test_deepspeed_calibration_and_sawtooth_are_healthy() -> None:
    body = text(RunSpec(steps=12_000, noise_lines=False, log_interval=10))
    reduced = [float(x) for x in re.findall(r"reducing to ([\d.]+)", body)]
    assert len(reduced) >= 4  # calibration from 2**16
    assert min(reduced[8:]) >= 256  # isolated overflows later on, no cascade
    assert "Current loss scale already at minimum" not in body


def test_healthy_run_is_quiet() -> None:
    spec = RunSpec(fmt="jsonl", steps=15_000, seed=3)
    rows = [json.loads(line) for line in generate(spec)]
    loss = np.array([r["loss"] for r in rows])[2000:]
    grad = np.array([r["grad_norm"] for r in rows][2000:], dtype=float)
    assert np.isfinite(loss).all() and np.isfinite(grad).all()
    for x, lim in ((loss, 1.15), (grad, 3.0)):
        med = np.median(np.lib.stride_tricks.sliding_window_view(x, 100), axis=1)
        ratio = x[100:] / med[:-1]
        assert ratio.max() < lim and ratio.min() > 1 / lim
    assert 1.7 < loss[-100:].mean() < 2.6


# ---------------------------------------------------------------------------------------------
# anomalies: visible at the label, invisible before it


CASES = [(fmt, kind) for fmt in FORMATS for kind in ANOMALY_KINDS]


@pytest.mark.parametrize(("fmt", "kind"), CASES)
def test_anomaly_changes_the_log_at_its_label(fmt: str, kind: str) -> None:
    healthy = RunSpec(fmt=fmt, steps=700, log_interval=5, z_loss=True, seed=7)
    if kind not in supported_kinds(healthy):
        with pytest.raises(ValueError):
            list(generate(replace(healthy, anomalies=(Anomaly(kind, 401),))))
        return
    spec = replace(healthy, anomalies=(Anomaly(kind, 401, magnitude=2.0),))
    (label,) = labels(spec)
    assert label.kind == kind and label.step >= 401
    a, h = records(spec), records(healthy)
    before = [s for s in h if s < label.step - 10]
    assert all(a[s] == h[s] for s in before), "the anomaly leaked before its label"
    if kind == "logit_norm_drift":  # a drift is visible once it has drifted
        later = [s for s in h if label.step + 200 <= s <= label.step + 300]
        assert all(a[s] != h[s] for s in later)
    elif kind == "skipped_steps" and fmt in ("megatron-deepspeed", "hf-trainer"):
        body = text(spec)
        assert re.search(rf"\[Rank 0\] step={label.step}, skipped=(\d+)", body)
    else:
        assert a[label.step] != h[label.step]


def test_labels_move_to_the_record_that_shows_the_anomaly() -> None:
    spec = RunSpec(fmt="megatron-lm", steps=500, log_interval=10, anomalies=(Anomaly("loss_spike", 203),))
    assert labels(spec) == [Anomaly("loss_spike", 210, 1.0, 1)]
    spec = RunSpec(anomalies=(Anomaly("skipped_steps", 203), Anomaly("loss_divergence", 900)))
    got = {a.kind: a for a in labels(spec)}
    assert got["skipped_steps"].step == 210  # next DeepSpeed `step=` line
    assert got["loss_divergence"].duration == 200  # natural length when duration is 1
    with pytest.raises(ValueError):
        labels(RunSpec(steps=100, anomalies=(Anomaly("loss_spike", 500),)))
    with pytest.raises(ValueError):
        labels(RunSpec(fmt="nope"))
    with pytest.raises(ValueError):
        labels(RunSpec(fmt="megatron-lm", anomalies=(Anomaly("logit_norm_drift", 10),)))


def test_interval_mean_dilutes_a_short_loss_spike() -> None:
    def jump(k: int) -> float:
        spec = RunSpec(fmt="megatron-lm", steps=1000, log_interval=k, fp16=False, seed=2)
        bad = replace(spec, anomalies=(Anomaly("loss_spike", 800),))
        step = labels(bad)[0].step
        return megatron_field(records(bad)[step], "lm loss") / megatron_field(records(spec)[step], "lm loss")

    assert jump(1) > 1.4
    assert 1.02 < jump(10) < jump(1)


def test_grad_norm_spike() -> None:
    spec = RunSpec(steps=800, fp16=False, anomalies=(Anomaly("grad_norm_spike", 600),))
    recs = records(spec)
    ratio = megatron_field(recs[600], "grad norm") / megatron_field(recs[599], "grad norm")
    assert ratio > 5


def test_loss_scale_collapse_cascade() -> None:
    spec = RunSpec(steps=3000, anomalies=(Anomaly("loss_scale_collapse", 2500),))
    body = text(spec)
    tail = body[body.index(" iteration     2499/") :]
    scales = [float(x) for x in re.findall(r"reducing to ([\d.]+)", tail)]
    assert len(scales) >= 5 and scales[-1] <= 8
    assert all(b <= a for a, b in zip(scales, scales[1:], strict=False))
    recs = records(spec)
    assert megatron_field(recs[2520], "loss scale") <= 8
    # the grad norm is DeepSpeed's stale value on skipped steps
    assert megatron_field(recs[2503], "grad norm") == megatron_field(recs[2504], "grad norm")
    assert "Current loss scale already at minimum" not in body
    # strong enough: down to the minimum, DeepSpeed raises and the run ends
    fatal = text(replace(spec, anomalies=(Anomaly("loss_scale_collapse", 2500, magnitude=8),)))
    assert fatal.rstrip().endswith(
        "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run."
    )
    assert re.search(r"\[deepspeed\] OVERFLOW!|\[deepscale\] OVERFLOW!", fatal)


def test_nonfinite_rendering_per_format() -> None:
    def at_label(fmt: str, **kw: object) -> str:
        spec = RunSpec(fmt=fmt, steps=300, anomalies=(Anomaly("nonfinite", 250),), **kw)  # type: ignore[arg-type]
        return records(spec)[labels(spec)[0].step]

    meg = at_label("megatron-deepspeed")
    assert "lm loss" not in meg and "grad norm" in meg  # omitted loss, stale grad norm
    mlm = at_label("megatron-lm", fp16=False)
    assert "lm loss" not in mlm and "grad norm: nan |" in mlm
    assert "'grad_norm': nan" in at_label("hf-trainer")
    assert re.search(r"loss: +nan +grad_norm: +nan", at_label("torchtitan"))
    assert "train/CrossEntropyLoss=nan" in at_label("olmo")
    assert "Train loss/train/total: nan" in at_label("composer")
    assert math.isnan(json.loads(at_label("jsonl"))["loss"])


def test_resume_regression_has_load_lines_and_a_loss_jump() -> None:
    spec = RunSpec(fmt="megatron-deepspeed", steps=2100, anomalies=(Anomaly("resume_regression", 2001),))
    body = text(spec)
    assert " loading checkpoint from /ckpt at iteration 2000\n" in body
    assert "  successfully loaded checkpoint from /ckpt at iteration 2000\n" in body
    after = body[body.index("successfully loaded checkpoint") :]
    first = re.search(r" iteration +(\d+)/.*", after)
    assert first and first.group(1) == "2001"
    resumed = megatron_field(first.group(0) + " |", "lm loss")
    before = megatron_field(records(replace(spec, anomalies=()))[2000], "lm loss")
    assert resumed > 1.5 * before
    for fmt, words in (
        ("megatron-lm", "successfully loaded checkpoint from /ckpt"),
        ("olmo", "Checkpoint successfully loaded"),
        ("olmo-core", "Will resume training from step 2000"),
        ("torchtitan", "Loading the checkpoint at step 2000."),
        ("composer", "Loading checkpoint from /ckpt/ep0-ba2000-rank0.pt"),
        ("hf-trainer", "Continuing training from global step 2000"),
    ):
        assert words in text(replace(spec, fmt=fmt))
    rows = [json.loads(x) for x in generate(replace(spec, fmt="jsonl"))]
    steps = [r["step"] for r in rows]
    assert any(b < a for a, b in zip(steps, steps[1:], strict=False))  # the step goes back


def test_skipped_steps_are_silent_in_megatron_and_counted_by_deepspeed() -> None:
    spec = RunSpec(steps=1000, anomalies=(Anomaly("skipped_steps", 500),))
    body = text(spec)
    skipped = {int(a): int(b) for a, b in re.findall(r"step=(\d+), skipped=(\d+)", body)}
    assert skipped[600] - skipped[500] >= 80 and skipped[490] == skipped[480]
    assert megatron_field(records(spec)[700], "number of skipped iterations") == 0
    # the lr scheduler only advances on the few steps that were not skipped
    bad, ok = records(spec), records(replace(spec, anomalies=()))
    d_bad = megatron_field(bad[600], "learning rate") - megatron_field(bad[700], "learning rate")
    d_ok = megatron_field(ok[600], "learning rate") - megatron_field(ok[700], "learning rate")
    assert abs(d_bad) < 0.3 * abs(d_ok)


def test_stall_throughput_drop_and_collapse() -> None:
    base = RunSpec(fmt="megatron-lm", steps=500, fp16=False, step_time_s=2.0)
    stall = records(replace(base, anomalies=(Anomaly("stall", 300, duration=2),)))

    def ts(line: str) -> float:
        m = re.search(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\]", line)
        assert m
        return np.datetime64(m.group(1).replace(" ", "T")).astype(np.int64)

    assert ts(stall[300]) - ts(stall[299]) >= 2 * 100 * 2.0
    drop = records(replace(base, anomalies=(Anomaly("throughput_drop", 300, duration=50),)))
    key = "throughput per GPU (TFLOP/s/GPU)"
    ratio = megatron_field(drop[320], key) / megatron_field(drop[290], key)
    assert 0.5 < ratio < 0.7
    assert 0.9 < megatron_field(drop[360], key) / megatron_field(drop[290], key) < 1.1
    col = records(replace(base, anomalies=(Anomaly("loss_collapse", 300),)))
    assert megatron_field(col[400], "lm loss") < 1e-2 and megatron_field(col[400], "grad norm") < 0.01


def test_logit_norm_drift_in_olmo_zloss() -> None:
    drift = Anomaly("logit_norm_drift", 1000, duration=300)
    spec = RunSpec(fmt="olmo", steps=1400, z_loss=True, noise_lines=False, anomalies=(drift,))
    bad, ok = records(spec), records(replace(spec, anomalies=()))

    def get(recs: dict[int, str], key: str, step: int) -> float:
        return float(re.search(key + r"=([\d.e-]+)", recs[step]).group(1))  # type: ignore[union-attr]

    assert get(bad, "ZLoss", 1390) > 2.5 * get(ok, "ZLoss", 1390)  # x3 over 300 steps
    assert get(bad, "ZLoss", 990) == get(ok, "ZLoss", 990)
    assert get(bad, "CrossEntropyLoss", 1390) == get(ok, "CrossEntropyLoss", 1390)  # CE unaffected


# ---------------------------------------------------------------------------------------------
# files


def test_write_log_returns_labels(tmp_path) -> None:
    spec = RunSpec(fmt="olmo-core", steps=300, anomalies=(Anomaly("grad_norm_spike", 100),))
    path = tmp_path / "run.log"
    got = write_log(path, spec)
    assert got == labels(spec)
    assert path.read_text(encoding="utf-8") == text(spec)


@pytest.mark.parametrize(("fmt", "size"), [("megatron-deepspeed", 3_000_000), ("hf-trainer", 400_000)])
def test_write_sized_reaches_the_size(tmp_path, fmt: str, size: int) -> None:
    path = tmp_path / "big.log"
    n = write_sized(path, RunSpec(fmt=fmt, steps=50), size)
    got = path.stat().st_size
    assert abs(got - size) <= 0.1 * size
    body = path.read_text(encoding="utf-8")
    assert n == len(STEP_RE[fmt].findall(body))
    assert body.endswith("\n")
    steps = [int(x) for x in STEP_RE[fmt].findall(body)]
    assert steps == sorted(steps) and steps[-1] > 50  # the run was lengthened


def test_write_sized_appends_a_resumed_run_when_the_estimate_falls_short(tmp_path, monkeypatch) -> None:
    import gradwatch.synth as synth

    monkeypatch.setattr(synth, "_bytes_per_step", lambda spec: 5000.0)  # ~5x too pessimistic
    path = tmp_path / "big.log"
    n = write_sized(path, RunSpec(steps=50), 1_000_000)
    body = path.read_text(encoding="utf-8")
    assert abs(len(body) - 1_000_000) <= 100_000
    assert " loading checkpoint from /ckpt at iteration" in body  # the continuation's resume
    steps = [int(x) for x in STEP_RE["megatron-deepspeed"].findall(body)]
    assert n == len(steps) and steps == sorted(steps) and len(set(steps)) == len(steps)


def test_vectorised_olmo_number_format_matches_the_scalar_one() -> None:
    from gradwatch.synth import _olmo_col, _olmo_core_float, _olmo_float

    values = np.array([0.0, 1.787e-06, 0.0002, 0.5, 1.0, 3.14159, 42.4242, 512.5, 195153.7, np.nan])
    assert _olmo_col(values) == [_olmo_float(float(v)) for v in values]
    assert _olmo_col(values, core=True) == [_olmo_core_float(float(v)) for v in values]
    assert _olmo_col(values)[-2:] == ["195,153", "nan"] and _olmo_col(values, core=True)[1] == "1.79E-06"


@pytest.mark.parametrize("fmt", ["megatron-deepspeed", "megatron-lm"])
def test_last_interval_mean_covers_only_its_interval(fmt: str) -> None:
    """A run that ends between two logs: its last record averages its own 10 steps, not the tail too."""
    recs = records(RunSpec(fmt=fmt, steps=4083, log_interval=10, seed=2, fp16=False))
    losses = [megatron_field(recs[s], "lm loss") for s in range(3000, 4081, 10)]
    times = [megatron_field(recs[s], "elapsed time per iteration (ms)") for s in range(3000, 4081, 10)]
    assert losses[-1] < 1.05 * float(np.median(losses[-20:-1]))
    assert times[-1] < 1.05 * float(np.median(times[-20:-1]))


def test_clean_restarts_and_lr_drops_are_not_labels() -> None:
    """Healthy events (a clean restart, an lr step decay) render but are never labels."""
    spec = RunSpec(fmt="jsonl", steps=3000, restarts=(2001,), lr_drops=((1500, 0.1),))
    assert labels(spec) == []
    steps = [json.loads(line)["step"] for line in generate(spec)]
    assert len(steps) > 3000 and steps.count(2001) == 2  # the replayed steps
    lrs = {json.loads(line)["step"]: json.loads(line)["lr"] for line in generate(spec)}
    assert lrs[1500] < 0.2 * lrs[1499]

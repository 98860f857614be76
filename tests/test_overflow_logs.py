"""Logs whose only metric lines are fp16 loss-scaler lines (DeepSpeed's overflows, progress and
timer lines; apex amp; fairseq; FP16_Optimizer) are runs: their lines are records of the loss scale,
the skipped steps and the throughput, which the detectors judge. Every line shape is one its
trainer prints (DeepSpeed's `loss_scaler.py`, `fused_optimizer.py`, `unfused_optimizer.py`,
`timer.py`; apex `amp/handle.py` and `fp16_utils`; fairseq `trainer.py`), written here.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from gradwatch.events import EventKind
from gradwatch.parsers import new_parsers
from gradwatch.parsers.base import ParseOutput
from gradwatch.parsers.deepspeed import DeepSpeedParser
from gradwatch.parsers.stream import LogStream
from tests.conftest import REAL_MORE, check_json, run_cli

_DS = "[2023-04-28 06:51:{:02d},903] [INFO] "


def _read(lines: list[str], every_line: bool = False) -> tuple[str | None, pd.DataFrame, list]:
    """The file's format, its records and its events, as `check` reads the lines."""
    stream = LogStream(new_parsers())
    if every_line:
        stream._scan = None  # the plain path: every line to every parser
    stream.feed("".join(line + "\n" for line in lines).encode())
    stream.close()
    batch = stream.take()
    return stream.format, batch.records, batch.events


def _overflows(events: list) -> list[tuple[int | None, float | None, float]]:
    return [(e.step, e.data["attempted"], e.data["new"]) for e in events if e.kind is EventKind.OVERFLOW]


def _ds(second: int, where: str, message: str) -> str:
    return f"{_DS.format(second % 60)}[{where}] {message}"


def _megatron(step: int, scale: float = 1.0) -> str:
    return (
        f" iteration {step:8d}/    5000 | consumed samples: {step * 32:12d} | elapsed time per iteration (ms): "
        f"1210.3 | learning rate: 1.371E-04 | global batch size:    32 | lm loss: 2.500000E+00 | "
        f"loss scale: {scale:.1f} | grad norm: 2.265 | number of skipped iterations:   0 |"
    )


# --- one line shape at a time ---------------------------------------------------------------

_SHAPES = [
    (  # DeepSpeed ZeRO's loss scaler
        _ds(
            1,
            "loss_scaler.py:181:update_scale",
            "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768",
        ),
        "deepspeed",
        65536.0,
        32768.0,
    ),
    (  # ... before 2022
        _ds(
            1,
            "stage_1_and_2.py:1644:step",
            "[deepscale] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 1048576.0, reducing to 524288.0",
        ),
        "deepspeed",
        1048576.0,
        524288.0,
    ),
    (  # DeepSpeed's unfused FP16 optimizer
        _ds(
            1,
            "unfused_optimizer.py:207:step",
            "[deepspeed] fp16 dynamic loss scale overflow! Skipping step. "
            "Attempted loss scale: 65536.0, reducing to 32768.0",
        ),
        "deepspeed",
        65536.0,
        32768.0,
    ),
    (  # DeepSpeed's fused FP16 optimizer
        _ds(1, "fused_optimizer.py:363:_update_scale", "Reducing dynamic loss scale from 8.0 to 4.0"),
        "deepspeed",
        8.0,
        4.0,
    ),
    (  # apex amp (two spaces after the period)
        "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 16384.0",
        "fp16_scaler",
        None,
        16384.0,
    ),
    (  # NVIDIA's BERT scripts on apex
        "Rank 0 :: Gradient overflow.  Skipping step, reducing loss scale to 4096.0",
        "fp16_scaler",
        None,
        4096.0,
    ),
    (  # fairseq before 0.9
        "| WARNING: overflow detected, setting loss scale to: 0.25",
        "fp16_scaler",
        None,
        0.25,
    ),
    (  # fairseq 0.9
        "2020-03-23 11:41:18 | INFO | fairseq.trainer | NOTE: overflow detected, setting loss scale to: 64.0",
        "fp16_scaler",
        None,
        64.0,
    ),
    (  # fairseq since 0.10
        "2021-08-13 14:58:44 | INFO | fairseq.trainer | NOTE: gradient overflow detected, ignoring gradient, "
        "setting loss scale to: 32.0",
        "fp16_scaler",
        None,
        32.0,
    ),
    (  # apex fp16_utils' and Megatron-LM's FP16_Optimizer, without DeepSpeed's tag
        "OVERFLOW! Skipping step. Attempted loss scale: 65536, reducing to 32768",
        "fp16_scaler",
        65536.0,
        32768.0,
    ),
]


@pytest.mark.parametrize(("line", "fmt", "attempted", "new"), _SHAPES, ids=lambda v: str(v)[:30])
def test_an_overflow_line_alone_is_a_record_of_the_scale_and_of_a_skipped_step(
    line: str, fmt: str, attempted: float | None, new: float
) -> None:
    found, records, events = _read([line])
    assert found == fmt
    assert _overflows(events) == [(None, attempted, new)]
    assert records["loss_scale"].tolist() == [new]
    assert records["skipped"].tolist() == [1.0]
    assert _read([line], every_line=True)[0] == fmt


def test_a_hysteresis_overflow_keeps_the_scale_and_still_skips_the_step() -> None:
    line = _ds(
        1,
        "loss_scaler.py:188:update_scale",
        "[deepspeed] OVERFLOW! Rank 0 Skipping step. "
        "Attempted loss scale: 65536, but hysteresis is 2. Reducing hysteresis to 1",
    )
    _, records, events = _read([line])
    assert events[0].data["hysteresis"] is True
    assert records[["loss_scale", "skipped"]].values.tolist() == [[65536.0, 1.0]]


def test_one_overflow_of_the_fused_optimizer_is_one_record_however_many_ranks_print_it() -> None:
    """`Grad overflow on iteration N` (its logger's prefix on the line before), `Reducing ...` from
    every rank and rank 0's `Overflow detected`: one overflow, one skipped step."""
    update = "fused_optimizer.py:314:_update_scale"
    lines = [
        _ds(
            9,
            "timer.py:199:stop",
            "epoch=0/micro_step=40/global_step=10, RunningAvgSamplesPerSec=29.5, "
            "CurrSamplesPerSec=29.4, MemAllocated=3.96GB, MaxMemAllocated=22.95GB",
        )
    ]
    for _ in range(3):
        lines += [_ds(10, update, ""), "Grad overflow on iteration 10"]
        lines += [_ds(10, "fused_optimizer.py:316:_update_scale", "Reducing dynamic loss scale from 8.0 to 4.0")]
    lines.append(
        _ds(
            10,
            "logging.py:60:log_dist",
            "[Rank 0] Overflow detected. Skipping step. Attempted loss scale: 8.0, reducing to 4.0",
        )
    )
    _, records, events = _read(lines)
    assert _overflows(events) == [(11, 8.0, 4.0)]
    assert records["step"].tolist() == [10, 11]
    assert records["loss_scale"].tolist()[1] == 4.0


def test_timer_lines_are_records_of_throughput() -> None:
    new = _ds(
        2,
        "timer.py:199:stop",
        "epoch=0/micro_step=80/global_step=20, RunningAvgSamplesPerSec=30.1, "
        "CurrSamplesPerSec=28.5, MemAllocated=3.96GB, MaxMemAllocated=22.95GB",
    )
    old = _ds(3, "timer.py:166:stop", "0/160, SamplesPerSec=29.524899679768")
    found, records, _ = _read([new, old])
    assert found == "deepspeed"
    assert records["tps"].tolist() == [28.5, 29.524899679768]  # the current rate, where it is printed
    # the old line counts micro-steps of the epoch, no step of the trainer's
    assert records["step"].tolist() == [20, -1]


def test_a_scale_increase_is_a_record_of_the_scale_without_a_skip() -> None:
    line = _ds(4, "fused_optimizer.py:382:_update_scale", "Increasing dynamic loss scale from 64.0 to 128.0")
    _, records, events = _read([line])
    assert events[0].kind is EventKind.SCALE_INCREASE
    assert records["loss_scale"].tolist() == [128.0]
    assert math.isnan(records["skipped"].iloc[0])


def test_after_a_progress_line_the_trainers_own_count_tells_the_skipped_steps() -> None:
    progress = _ds(
        5,
        "logging.py:96:log_dist",
        "[Rank 0] step=10, skipped=6, lr=[9.6e-06, 9.6e-06], mom=[(0.9, 0.95), (0.9, 0.95)]",
    )
    overflow = _ds(
        6,
        "loss_scaler.py:181:update_scale",
        "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 8192, reducing to 4096",
    )
    _, records, _ = _read([overflow, progress, overflow])
    assert records["step"].tolist() == [-1, 10, 11]
    assert records["loss_scale"].tolist()[2] == 4096.0
    skipped = records["skipped"].tolist()
    assert skipped[0] == 1.0 and math.isnan(skipped[2])


def test_fairseqs_minimum_scale_outside_a_traceback_is_the_minimum() -> None:
    line = "FloatingPointError: Minimum loss scale reached (0.0001). Your loss is probably exploding."
    _, _, events = _read([_megatron(700), line])
    assert [(e.kind, e.step) for e in events] == [(EventKind.SCALE_AT_MINIMUM, 700)]


@pytest.mark.parametrize(
    ("line", "step"),
    [
        (
            _ds(
                1,
                "loss_scaler.py:181:update_scale",
                "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 2, reducing to 1",
            ),
            2499,
        ),  # DeepSpeed counts the skipped step
        ("Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 1.0", 2499),
        ("OVERFLOW! Skipping step. Attempted loss scale: 2, reducing to 1", 2499),
        # fairseq does not count an update that overflowed: `num_updates` stays where it was
        ("| WARNING: overflow detected, setting loss scale to: 1.0", 2498),
    ],
    ids=["deepspeed", "apex", "fp16_optimizer", "fairseq"],
)
def test_inside_another_trainers_log_an_overflow_is_an_event_at_its_trainers_step(line: str, step: int) -> None:
    found, records, events = _read([_megatron(2498, 2.0), line])
    assert found == "megatron"
    assert records["step"].tolist() == [2498]  # the overflow is no record of the file's trainer
    assert [s for s, _, _ in _overflows(events)] == [step]


def test_rank_copies_of_an_apex_overflow_are_one_overflow_until_a_record() -> None:
    line = "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 4096.0"
    _, _, events = _read([_megatron(10, 8192.0), line, line, line, _megatron(11, 4096.0), line])
    assert [s for s, _, _ in _overflows(events)] == [11, 12]


# --- what `check` says of such logs -----------------------------------------------------------


def _log(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "train.log"
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _alerts(doc: dict, severities: tuple[str, ...] = ("warning", "critical")) -> list[tuple[str, str, int | None]]:
    return [(a["detector"], a["severity"], a["step"]) for a in doc["alerts"] if a["severity"] in severities]


def _timer(second: int, step: int, rate: float) -> str:
    return _ds(
        second,
        "timer.py:199:stop",
        f"epoch=0/micro_step={step}/global_step={step}, "
        f"RunningAvgSamplesPerSec={rate}, CurrSamplesPerSec={rate}, MemAllocated=3.96GB, MaxMemAllocated=22.95GB",
    )


def _ds_overflow(second: int, attempted: float, new: float) -> str:
    return _ds(
        second,
        "loss_scaler.py:181:update_scale",
        f"[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: {attempted:g}, reducing to {new:g}",
    )


def _calibration(start: float, halvings: int) -> list[str]:
    """The start-up: one overflow within the hysteresis, then a halving per step."""
    lines = [
        _ds(
            0,
            "loss_scaler.py:188:update_scale",
            "[deepspeed] OVERFLOW! Rank 0 Skipping step. "
            f"Attempted loss scale: {start:g}, but hysteresis is 2. Reducing hysteresis to 1",
        )
    ]
    return lines + [_ds_overflow(k, start / 2**k, start / 2 ** (k + 1)) for k in range(halvings)]


@pytest.mark.parametrize(("start", "halvings"), [(2.0**16, 3), (2.0**32, 16)])
def test_a_deepspeed_log_of_a_normal_start_up_calibration_is_read_and_quiet(
    tmp_path: Path, start: float, halvings: int
) -> None:
    lines = _calibration(start, halvings)
    for step in range(20, 1001, 10):
        lines.append(
            _ds(
                step,
                "logging.py:96:log_dist",
                f"[Rank 0] step={step}, skipped={halvings + 1}, lr=[1e-05, 1e-05], mom=[(0.9, 0.95), (0.9, 0.95)]",
            )
        )
        lines.append(_timer(step, step, 30.0 + step % 3))
    doc = check_json(str(_log(tmp_path, lines)))
    assert doc["summary"]["exit_code"] == 0
    assert doc["files"][0]["format"] == "deepspeed" and doc["files"][0]["records"] > 100
    assert _alerts(doc) == []


def test_a_calibration_with_no_step_at_all_is_read_and_quiet(tmp_path: Path) -> None:
    doc = check_json(
        str(_log(tmp_path, ["Beginning of Epoch 1/16, Total Micro Batches 1840", *_calibration(65536, 3)]))
    )
    assert doc["summary"]["exit_code"] == 0 and doc["files"][0]["records"] == 4
    assert _alerts(doc) == []


def test_a_deepspeed_log_of_a_scale_stuck_at_its_minimum_is_a_collapse(tmp_path: Path) -> None:
    """The scale was already low before the log starts, and sits at 1 while steps still overflow."""
    lines = [_timer(k, step, 29.5) for k, step in enumerate(range(130, 160, 10))]
    lines += [_ds_overflow(20, 1, 1), _timer(21, 160, 29.4), _ds_overflow(22, 1, 1)]
    path = _log(tmp_path, lines)
    p = run_cli("check", "--output", "json", str(path))
    assert p.returncode == 1, p.stdout + p.stderr
    assert _alerts(check_json(str(path))) == [("loss_scale_collapse", "critical", 151)]


def test_a_scale_of_1_is_no_collapse_until_steps_overflow_at_it(tmp_path: Path) -> None:
    """bf16 Megatron logs print `loss scale: 1.0` and never skip; an fp16 run whose scale sits at
    DeepSpeed's minimum of 1 and still overflows has collapsed, though the log never showed it fall."""
    lines = [_megatron(step) for step in range(1, 301)]
    assert _alerts(check_json(str(_log(tmp_path, lines)))) == []
    lines.insert(
        250,
        _ds(
            1,
            "logging.py:96:log_dist",
            "[Rank 0] Overflow detected. Skipping step. Attempted loss scale: 1, reducing to 1",
        ),
    )
    assert _alerts(check_json(str(_log(tmp_path, lines)))) == [("loss_scale_collapse", "critical", 251)]


def test_an_apex_cascade_without_steps_is_one_collapse_that_escalates(tmp_path: Path) -> None:
    lines = [
        f"Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to {2.0**k:.1f}"
        for k in range(15, -2, -1)
    ]
    doc = check_json(str(_log(tmp_path, lines)))
    assert doc["files"][0]["format"] == "fp16_scaler"
    assert _alerts(doc) == [("loss_scale_collapse", "warning", None), ("loss_scale_collapse", "critical", None)]
    assert "escalated" in doc["alerts"][1]["message"]
    p = run_cli("check", "--fail-on", "critical", str(tmp_path / "train.log"))
    assert p.returncode == 1


def test_an_apex_start_up_calibration_is_quiet(tmp_path: Path) -> None:
    lines = [
        f"Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to {2.0**k:.1f}"
        for k in range(15, 11, -1)
    ]
    doc = check_json(str(_log(tmp_path, lines)))
    assert doc["summary"]["exit_code"] == 0 and doc["files"][0]["records"] == 4


def test_a_deepspeed_log_that_skips_most_steps_alerts_skipped_steps(tmp_path: Path) -> None:
    """After the start-up, every other step overflows and the scale grows back in between."""
    lines = [_timer(k, step, 30.0) for k, step in enumerate(range(10, 301, 10))]
    grow = "Increasing dynamic loss scale from 32768 to 65536"
    for k in range(40):
        lines += [_ds_overflow(k, 65536, 32768), _ds(k, "fused_optimizer.py:382:_update_scale", grow)]
    detectors = {d for d, _, _ in _alerts(check_json(str(_log(tmp_path, lines))))}
    assert "skipped_steps" in detectors


def test_a_deepspeed_log_whose_throughput_falls_alerts_throughput_drop(tmp_path: Path) -> None:
    lines = [_timer(k, step, 30.0 if step <= 1500 else 12.0) for k, step in enumerate(range(10, 2001, 10))]
    doc = check_json(str(_log(tmp_path, lines)))
    assert doc["files"][0]["format"] == "deepspeed"
    assert [d for d, _, _ in _alerts(doc)] == ["throughput_drop"]


def test_report_draws_a_deepspeed_log_of_overflows(tmp_path: Path) -> None:
    lines = [_timer(k, step, 29.5) for k, step in enumerate(range(10, 200, 10))] + [_ds_overflow(50, 8, 4)]
    out = tmp_path / "report.html"
    p = run_cli("report", "--out", str(out), str(_log(tmp_path, lines)))
    assert p.returncode == 0, p.stderr
    assert "loss_scale_collapse" in out.read_text()


# --- the real logs of this family (skipped where absent) --------------------------------------


@pytest.mark.parametrize(
    ("name", "detectors", "lo", "hi"),
    [
        ("deepspeed/ds-issue697-fused-optimizer-overflow-only-scale-stuck-at-1.log", {"loss_scale_collapse"}, 0, 350),
        ("other/apex-issue834-o1-gradient-overflow-cascade-32768-to-0.5.log", {"loss_scale_collapse"}, 0, 0),
        (
            "megatron-deepspeed/llm-action-llama-fp16-loss-scale-stuck-1-skipped1586-2500.log",
            {"loss_scale_collapse"},
            2498,
            2500,
        ),
    ],
    ids=["ds697", "apex834", "llm-action"],
)
def test_real_overflow_logs_are_judged(name: str, detectors: set[str], lo: int, hi: int) -> None:
    path = REAL_MORE / name
    if not path.is_file():
        pytest.skip("real samples not present: ../shared/samples/real-more")
    found = [(d, s) for d, _, s in _alerts(check_json(str(path))) if d in detectors]
    assert any((s is None and lo == 0) or (s is not None and lo <= s <= hi) for _, s in found), found


def test_a_real_start_up_calibration_is_read_and_quiet() -> None:
    path = REAL_MORE / "deepspeed" / "ds-issue931-startup-overflow-hysteresis-65536-to-8192.log"
    if not path.is_file():
        pytest.skip("real samples not present: ../shared/samples/real-more")
    doc = check_json(str(path))
    assert doc["files"][0]["records"] > 0 and _alerts(doc) == []


def test_in_another_trainers_log_timer_lines_cost_nothing_once_its_format_is_known(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In a Megatron-DeepSpeed log DeepSpeed's timer lines say nothing: once the format is known
    the stream does not even look for them, and reads the log as line by line all the same."""
    lines = []
    for step in range(1, 200):
        lines.append(_megatron(step, 4096.0))
        if step % 10 == 0:
            progress = f"[Rank 0] step={step}, skipped=1, lr=[1e-05, 1e-05], mom=[(0.9, 0.95)]"
            lines.append(_ds(step, "logging.py:96:log_dist", progress))
            lines.append(_timer(step, step, 30.0))
            lines.append(_ds(step, "timer.py:166:stop", f"0/{step}, SamplesPerSec=29.5, MemAllocated=0.26GB"))
        if step == 150:
            lines += [_ds_overflow(step, 8192, 4096), _timer(step, step, 28.0) + "\r" + _ds_overflow(step, 4096, 2048)]
            lines.append(_timer(step, step, 28.0) + "\rRuntimeError: CUDA error: an illegal memory access")
            lines.append(_timer(step, step, 28.0) + _ds_overflow(step, 2048, 1024))  # two ranks at once
    data = "".join(line + "\n" for line in lines).encode()
    timers_read: list[int] = []
    parse = DeepSpeedParser.parse

    def counted(self: DeepSpeedParser, text: str, line: int, ts: float | None, out: ParseOutput) -> bool:
        if "SamplesPerSec=" in text:
            timers_read.append(line)
        return parse(self, text, line, ts, out)

    monkeypatch.setattr(DeepSpeedParser, "parse", counted)

    def read(every_line: bool) -> tuple:
        stream = LogStream(new_parsers())
        if every_line:
            stream._scan = None  # the plain path: every line to every parser
        stream.feed(data)
        stream.close()
        batch = stream.take()
        skips = batch.skip_counts
        return stream.format, batch.records, batch.events, [skips.line.tolist(), skips.step.tolist()]

    bulk = read(every_line=False)
    assert len(timers_read) == 5  # 2 before the format was known, 3 with other keywords
    plain = read(every_line=True)
    assert bulk[0] == plain[0] == "megatron"
    pd.testing.assert_frame_equal(bulk[1], plain[1])
    assert bulk[2] == plain[2] and bulk[3] == plain[3] and len(bulk[3][0]) == 19
    assert _overflows(bulk[2]) == [(151, 8192.0, 4096.0), (151, 4096.0, 2048.0), (151, 2048.0, 1024.0)]
    assert [e.kind for e in bulk[2]].count(EventKind.ERROR) == 1  # a piece after a timer's `\r`

"""`gradwatch export` as a user runs it: floats exactly as logged, nan told from "not logged", the
fp16 scaler's overflows and DeepSpeed's skip counters as rows, in CSV, JSON lines and Parquet.

Each test runs the real CLI in a subprocess on logs written in the trainers' own line shapes
(/work/shared/formats.md) and reads the output back with the standard library (`csv`, `json`:
pandas' JSON reader rounds floats) or pyarrow.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from gradwatch.sources.archive import CHUNK_BYTES
from tests.conftest import run_cli
from tests.test_bad_input import megatron_line, no_traceback

#: learning rates as the HF Trainer prints them (repr): one of 16 digits, one under 1e-10
LRS = ("9.774074342405685e-06", "3.1415926535897933e-12", "0.00012345678901234567", "1e-05")


def hf_dict(loss: str, grad_norm: str | None, lr: str, epoch: float) -> str:
    """One HF Trainer log dict (`{'loss': ..., 'grad_norm': ..., 'learning_rate': ...}`), a
    missing `grad_norm` left out of it."""
    norm = "" if grad_norm is None else f"'grad_norm': {grad_norm}, "
    return f"{{'loss': {loss}, {norm}'learning_rate': {lr}, 'epoch': {epoch}}}\n"


def ds_progress(step: int, skipped: int, lr: str) -> str:
    return (
        f"[2024-03-11 08:0{step % 10}:00,537] [INFO] [logging.py:96:log_dist] [Rank 0] step={step}, "
        f"skipped={skipped}, lr=[{lr}, {lr}], mom=[(0.9, 0.95), (0.9, 0.95)]\n"
    )


def ds_overflow(attempted: int, new: int) -> str:
    return (
        "[2024-03-11 08:00:39,551] [INFO] [loss_scaler.py:181:update_scale] [deepspeed] OVERFLOW! Rank 0 "
        f"Skipping step. Attempted loss scale: {attempted}, reducing to {new}\n"
    )


def export(log: Path, suffix: str) -> Path:
    out = log.with_name(f"records{suffix}")
    p = no_traceback(run_cli("export", str(log), "--out", str(out)))
    assert p.returncode == 0, p.stderr
    return out


def csv_rows(out: Path) -> list[dict[str, str]]:
    with open(out, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def json_rows(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]


def parquet_rows(out: Path) -> list[dict[str, Any]]:
    return pq.read_table(out).to_pylist()  # type: ignore[no-any-return]


def test_floats_are_written_exactly_as_logged(tmp_path: Path) -> None:
    """lr 9.774074342405685e-06 was written to JSON lines as 0.0000097741, and one under 1e-10 as 0."""
    log = tmp_path / "hf.log"
    log.write_text("".join(hf_dict(f"2.{i}5", "1.25", lr, i / 10) for i, lr in enumerate(LRS)))
    lines = export(log, ".jsonl").read_text().splitlines()
    assert [json.loads(line)["lr"] for line in lines] == [float(lr) for lr in LRS]
    assert [f'"lr":{repr(float(lr))},' in line for lr, line in zip(LRS, lines, strict=True)] == [True] * len(LRS)
    assert [row["lr"] for row in csv_rows(export(log, ".csv"))] == [repr(float(lr)) for lr in LRS]
    assert [row["lr"] for row in parquet_rows(export(log, ".parquet"))] == [float(lr) for lr in LRS]


def test_random_doubles_round_trip_through_every_output(tmp_path: Path) -> None:
    """Every digit of any double a log prints comes back: extremes, integers, negative zero."""
    values = [5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, -0.0, 65536.0, 0.1, 1 / 3, 123456789.12345679]
    log = tmp_path / "run.jsonl"
    log.write_text(
        "".join(json.dumps({"step": i + 1, "loss": 2.0, "grad_norm": v}) + "\n" for i, v in enumerate(values))
    )
    written = [
        [float(r["grad_norm"]) for r in csv_rows(export(log, ".csv"))],
        [r["grad_norm"] for r in json_rows(export(log, ".jsonl"))],
        [r["grad_norm"] for r in parquet_rows(export(log, ".parquet"))],
    ]
    for got in written:
        assert [(v, math.copysign(1, v)) for v in got] == [(v, math.copysign(1, v)) for v in values]


def test_nan_and_inf_are_told_from_not_logged(tmp_path: Path) -> None:
    """NaN and "not logged" were the same empty cell in CSV and null in JSON lines."""
    log = tmp_path / "hf.log"
    norms = ["1.5", "nan", None, "inf", "-inf", "2.5"]
    log.write_text("".join(hf_dict("2.5", g, "1e-05", i / 10) for i, g in enumerate(norms)))
    assert [r["grad_norm"] for r in csv_rows(export(log, ".csv"))] == ["1.5", "nan", "", "inf", "-inf", "2.5"]
    assert [r["grad_norm"] for r in json_rows(export(log, ".jsonl"))] == [1.5, "nan", None, "inf", "-inf", 2.5]
    table = pq.read_table(export(log, ".parquet"))
    column = table.column("grad_norm").to_pylist()
    assert column[2] is None and math.isnan(column[1]) and column[3:5] == [math.inf, -math.inf]
    assert table.column("loss").null_count == 0 and table.column("tps").null_count == len(norms)


def test_the_loss_megatron_leaves_out_of_a_nan_step_is_nan(tmp_path: Path) -> None:
    """Megatron prints no `lm loss` field for a NaN iteration: its loss is nan, not "not logged"."""
    lines = [megatron_line(s, 3.0, 1.5) for s in (10, 20, 30)]
    lines[1] = lines[1].replace("lm loss: 3.000000E+00 | ", "")
    log = tmp_path / "megatron.log"
    log.write_text("\n".join(lines) + "\n")
    rows = csv_rows(export(log, ".csv"))
    assert [(r["loss"], r["nonfinite"], r["tps"]) for r in rows] == [
        ("3.0", "", ""),
        ("nan", "loss", ""),
        ("3.0", "", ""),
    ]
    assert [r["loss"] for r in json_rows(export(log, ".jsonl"))] == [3.0, "nan", 3.0]


def test_deepspeed_overflows_and_skip_counts_are_rows(tmp_path: Path) -> None:
    """An HF Trainer log under DeepSpeed fp16: its overflows and `skipped=K` counters were events
    only, and the export had no loss scale at all."""
    log = tmp_path / "hf-ds.log"
    log.write_text(
        ds_overflow(65536, 32768)
        + ds_progress(10, 1, "1e-05")
        + hf_dict("2.5", "1.5", "1e-05", 0.1)
        + ds_progress(20, 1, "1e-05")
        + hf_dict("2.4", "1.5", "1e-05", 0.2)
        + ds_overflow(32768, 16384)
        + ds_progress(30, 2, "1e-05")
        + hf_dict("2.3", "1.5", "1e-05", 0.3)
    )
    for suffix, read in ((".csv", csv_rows), (".jsonl", json_rows), (".parquet", parquet_rows)):
        rows = [
            {k: r[k] for k in ("line", "step", "loss", "loss_scale", "overflow", "skipped_total")}
            for r in read(export(log, suffix))
        ]
        if suffix == ".csv":
            rows = [{k: float(v) if v else None for k, v in r.items()} for r in rows]
        assert rows == [
            {"line": 1, "step": None, "loss": None, "loss_scale": 32768, "overflow": 1, "skipped_total": None},
            {"line": 2, "step": 10, "loss": None, "loss_scale": None, "overflow": None, "skipped_total": 1},
            {"line": 3, "step": 10, "loss": 2.5, "loss_scale": None, "overflow": None, "skipped_total": None},
            # (the counter of line 4 says what line 2 said: no row)
            {"line": 5, "step": 20, "loss": 2.4, "loss_scale": None, "overflow": None, "skipped_total": None},
            {"line": 6, "step": 21, "loss": None, "loss_scale": 16384, "overflow": 1, "skipped_total": None},
            {"line": 7, "step": 30, "loss": None, "loss_scale": None, "overflow": None, "skipped_total": 2},
            {"line": 8, "step": 30, "loss": 2.3, "loss_scale": None, "overflow": None, "skipped_total": None},
        ], suffix


def test_a_deepspeed_only_log_has_one_row_per_overflow(tmp_path: Path) -> None:
    """Where DeepSpeed's lines are the file's records (no trainer of its own), an overflow is a
    record already: it gets its `overflow` cell, not a second row."""
    log = tmp_path / "ds.log"
    log.write_text(
        ds_progress(1, 0, "1e-05") + ds_overflow(65536, 32768) + ds_progress(2, 1, "1e-05") + ds_progress(3, 1, "2e-05")
    )
    p = no_traceback(run_cli("export", str(log), "--out", str(tmp_path / "r.csv")))
    assert p.stdout.startswith("wrote 4 records") and "read as deepspeed" in p.stdout, p.stdout + p.stderr
    rows = csv_rows(tmp_path / "r.csv")
    assert [(r["line"], r["step"], r["lr"], r["loss_scale"], r["overflow"], r["skipped_total"]) for r in rows] == [
        ("1", "1", "1e-05", "", "", "0"),
        ("2", "2", "", "32768.0", "1", ""),
        ("3", "2", "1e-05", "", "", "1"),
        ("4", "3", "2e-05", "", "", "1"),
    ]


def test_a_log_without_records_leaves_the_output_alone(tmp_path: Path) -> None:
    """Overflow lines alone, read as another format: no records, exit 2, an older export kept."""
    log = tmp_path / "ds.log"
    log.write_text(ds_overflow(65536, 32768) * 3)
    out = tmp_path / "old.csv"
    out.write_text("kept\n")
    p = no_traceback(run_cli("export", "--format", "megatron", str(log), "--out", str(out)))
    assert p.returncode == 2 and "no training records in format megatron" in p.stderr
    assert out.read_text() == "kept\n"


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".parquet"])
def test_a_large_log_is_written_whole_in_batches(tmp_path: Path, suffix: str) -> None:
    """A log of several chunks is written batch by batch: every record once, in line order, one header."""
    n = 40_000
    log = tmp_path / "big.log"
    log.write_text("".join(megatron_line(s, 3.0 + s * 1e-6, 1.5) + "\n" for s in range(1, n + 1)))
    assert log.stat().st_size > 2 * CHUNK_BYTES
    out = export(log, suffix)
    if suffix == ".parquet":
        meta = pq.ParquetFile(out).metadata
        assert meta.num_rows == n and meta.num_row_groups == 1  # batches held to 65,536 rows
        steps = pq.read_table(out).column("step").to_pylist()
    else:
        steps = [int(r["step"]) for r in (csv_rows(out) if suffix == ".csv" else json_rows(out))]
    assert steps == list(range(1, n + 1))

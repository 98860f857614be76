"""The generic reader: trainers without a parser of their own, in the shapes real logs use.

Every log here is written by the test in a trainer's real line shape (none is copied from a
sample). The first group holds the shapes of the real families we met (mlx-lm, litgpt, fairseq,
MMEngine, Lightning, Keras, Coqui, Stable-Baselines3, timm's CSV, MetricLogger, InternEvo,
MaxText, nanoGPT/nanochat); the second, formats that no sample holds, to show the rules generalise
(other key orders, separators and counters) rather than remember files.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from gradwatch.parsers import new_parsers
from gradwatch.parsers.stream import LOCK_AFTER_RECORDS, LogStream
from tests.conftest import check_json, run_cli


def _read(text: str, fmt: str | None = None) -> tuple[str | None, pd.DataFrame, str | None]:
    """The file's format, its records and the layout the reader reports."""
    stream = LogStream(new_parsers(fmt), stand_ins=None if fmt is None else frozenset({fmt}))
    stream.feed(text.encode())
    stream.close()
    return stream.format, stream.take().records, stream.layout


def _steps(records: pd.DataFrame) -> list[int]:
    return records["step"].tolist()


def _values(records: pd.DataFrame, metric: str) -> list[float]:
    return [round(v, 6) if math.isfinite(v) else v for v in records[metric].tolist()]


# ---- the shapes of real families ------------------------------------------------------------


def test_mlx_lm_key_value_with_spaces_in_keys() -> None:
    fmt, rec, layout = _read(
        "Starting training..., iters: 600\n"
        "Iter 1: Val loss 2.480, Val took 0.732s\n"
        "Iter 10: Train loss 2.363, Learning Rate 1.000e-05, It/sec 0.500, Tokens/sec 88.083, Trained Tokens 862\n"
        "Iter 20: Train loss nan, Learning Rate 1.000e-05, It/sec 0.826, Tokens/sec 81.866, Trained Tokens 1853\n"
        "Iter 20: Saved adapter weights to checkpoints/20_adapters.npz.\n"
    )
    assert fmt == "generic"
    assert _steps(rec) == [1, 10, 20]
    assert _values(rec, "val_loss")[0] == 2.48
    assert _values(rec, "loss")[1] == 2.363 and math.isnan(rec["loss"].iloc[2])
    assert rec["nonfinite"].iloc[2] == "loss"
    assert _values(rec, "step_time_s")[1] == 2.0  # It/sec inverted
    assert _values(rec, "tps")[1] == 88.083
    assert layout == "`key value`, step from `Iter`"


def test_litgpt_iter_wins_over_the_optimizer_step_it_repeats() -> None:
    _, rec, _ = _read(
        "iter 1151 step 144: loss 1.7019, iter time: 1106.53ms (optimizer.step)\n"
        "iter 1152 step 144: loss 11.4630, iter time: 1260.82ms\n"
    )
    assert _steps(rec) == [1151, 1152]
    assert _values(rec, "step_time_s") == [1.10653, 1.26082]


def test_fairseq_train_inner_counts_updates() -> None:
    _, rec, layout = _read(
        "2020-10-18 02:34:53 | INFO | train_inner | epoch 001:    100 / 1975 loss=12.834, nll_loss=12.424, "
        "ppl=5496.24, wps=130830, ups=2.15, wpb=60755, bsz=1960, num_updates=100, lr=1.009, gnorm=1.448, clip=41\n"
        "2020-10-18 02:35:39 | INFO | train_inner | epoch 001:    200 / 1975 loss=11.605, nll_loss=11.024, "
        "ppl=2082.74, wps=133400, ups=2.2, wpb=60530.8, bsz=1979.8, num_updates=200, lr=2.008, gnorm=1.406, clip=60\n"
    )
    assert _steps(rec) == [100, 200]
    assert _values(rec, "grad_norm") == [1.448, 1.406]
    assert _values(rec, "ppl") == [5496.24, 2082.74]
    assert _values(rec, "tps") == [130830.0, 133400.0]
    assert not rec["ts"].isna().any()  # the line's own time
    assert layout == "`key=value`, step from `num_updates`"


def test_mmengine_iteration_and_epoch_counters() -> None:
    _, rec, _ = _read(
        "2024/05/07 11:45:16 - mmengine - INFO - Iter(train) [ 510/2046]  lr: 1.7590e-04  eta: 1:25:37  "
        "time: 22.5450  data_time: 19.6772  memory: 15266  loss: 0.6919  grad_norm: nan\n"
    )
    assert _steps(rec) == [510]
    assert rec["nonfinite"].iloc[0] == "grad_norm"
    assert _values(rec, "step_time_s") == [22.545]
    _, rec, _ = _read(
        "01/13 23:08:56 - mmengine - INFO - Epoch(train) [1][ 10/381]  lr: 1.9997e-04  time: 1.4288  loss: 1.2449\n"
        "01/13 23:09:11 - mmengine - INFO - Epoch(train) [2][ 10/381]  lr: 1.9986e-04  time: 1.4585  loss: 1.1690\n"
    )
    assert _steps(rec) == [10, 391]  # epochs before x batches per epoch + batch (MMEngine counts from 1)


def test_lightning_bar_with_postfix_metrics() -> None:
    lines = [
        "Epoch 0:   0%|          | 1/200 [00:03<5:11:29,  0.27it/s]",
        "Epoch 0:   0%|          | 1/200 [00:03<5:11:31,  0.27it/s, v_num=1, train_loss_step=1.41e+5]",
        "Epoch 0:   1%|          | 2/200 [00:06<4:10:12,  0.33it/s, v_num=1, train_loss_step=1.78e+5]",
        "Epoch 1:   0%|          | 1/200 [00:06<4:10:12,  0.33it/s, v_num=1, train_loss_step=nan]",
    ]
    _, rec, layout = _read("\r".join(lines[:2]) + "\n" + "\n".join(lines[2:]) + "\n")
    assert _steps(rec) == [1, 2, 201]
    assert _values(rec, "loss")[:2] == [141000.0, 178000.0]
    assert rec["nonfinite"].iloc[2] == "loss"
    assert layout == "`key=value`, step from `Epoch N + bar`"


def test_keras_epoch_lines_give_the_step_to_the_bar_after_them() -> None:
    _, rec, layout = _read(
        "Epoch 1/10\n"
        "9595/9595 [==============================] - 1s - loss: 0.6242 - acc: 0.6295 - val_loss: 0.5265\n"
        "Epoch 2/10\n"
        "9595/9595 [==============================] - 1s - loss: nan - acc: 0.4117 - val_loss: nan\n"
        "Epoch 3/10\n"
        "128/128 - 0s - loss: 2.8229 - accuracy: 0.1977 - 355ms/epoch - 3ms/step\n"
    )
    assert _steps(rec) == [1, 2, 3]
    assert rec["nonfinite"].tolist() == ["", "loss,val_loss", ""]
    assert layout == "`key: value`, step from the counter line before"


def test_coqui_block_of_rows_after_its_step_line() -> None:
    _, rec, layout = _read(
        "WARNING:tensorboardX.x2num:NaN or Inf found in input tensor.\n"
        "\n"
        "--> STEP: 29/104 -- GLOBAL_STEP: 217050\n"
        "     | > loss_disc: nan  (nan)\n"
        "     | > loss_disc_real_0: nan  (nan)\n"
        "     | > grad_norm_0: 0.00000  (0.00000)\n"
        "     | > loss_mel: 15.34929  (16.04639)\n"
        "     | > current_lr: 0.0002\n"
        "\n"
        "--> STEP: 54/104 -- GLOBAL_STEP: 217075\n"
        "     | > loss_disc: 2.5  (2.4)\n"
    )
    assert _steps(rec) == [217050, 217075]
    assert rec["nonfinite"].iloc[0] == "loss"  # the first loss of the trainer's own naming
    assert _values(rec, "loss")[1] == 2.5
    assert rec["line"].tolist() == [8, 11]  # a block's record is at its last row
    assert layout == "`key: value` rows, step from the counter line before"


def test_stable_baselines3_tables() -> None:
    def table(iteration: int, loss: float) -> str:
        return (
            "-----------------------------------------\n"
            "| rollout/                |             |\n"
            "|    ep_rew_mean          | 1.8         |\n"
            "| time/                   |             |\n"
            "|    fps                  | 180         |\n"
            f"|    iterations           | {iteration:<11} |\n"
            "| train/                  |             |\n"
            "|    learning_rate        | 0.0003      |\n"
            f"|    loss                 | {loss:<11} |\n"
            f"|    n_updates            | {10 * iteration:<11} |\n"
            "|    value_loss           | 0.049       |\n"
            "-----------------------------------------\n"
        )

    _, rec, layout = _read("Using cpu device\n" + table(2, 0.0336) + table(3, -0.0199))
    assert _steps(rec) == [20, 30]  # n_updates is finer than iterations
    assert _values(rec, "loss") == [0.0336, -0.0199]
    assert _values(rec, "lr") == [0.0003, 0.0003]
    assert layout == "table, step from `n_updates`"


def test_csv_with_and_without_a_header() -> None:
    _, rec, layout = _read("epoch,train_loss,eval_loss,eval_top1\n0,6.9,6.8,0.1\n1,nan,6.5,1.2\n")
    assert _steps(rec) == [0, 1]
    assert _values(rec, "val_loss") == [6.8, 6.5]
    assert rec["nonfinite"].tolist() == ["", "loss"]
    assert layout == "CSV, step from `epoch`"
    _, rec, layout = _read("208,4.36,4.16,7.62,23.86\n209,nan,4.16,7.72,24.01\n210,nan,nan,1.0,5.0\n")
    assert _steps(rec) == [208, 209, 210]
    assert _values(rec, "nan_count") == [0.0, 1.0, 2.0]  # unnamed columns: non-finite ones counted
    assert layout == "CSV without a header, step from `first column`"


def test_metric_logger_epoch_and_batch_brackets_and_a_summary_line() -> None:
    _, rec, _ = _read(
        "[05:21:10.402311] Epoch: [1]  [1500/1504]  lr: 0.000012  closs: 0.7704 (0.9509)  "
        "grad_norm: 0.2695 (0.3902)  time: 4.1524  data: 0.0003  max mem: 51710\n"
        "[05:21:23.351943] Averaged stats: lr: 0.000012  closs: 0.7626 (0.9498)  grad_norm: 0.2695 (0.3900)\n"
        "[05:25:06.033566] Epoch: [2]  [0/1504]  lr: 0.000012  closs: 0.9249 (0.9249)  time: 5.8674\n"
    )
    assert _steps(rec) == [1500, 1504]  # the epoch's average is no record
    assert _values(rec, "loss") == [0.7704, 0.9249]


def test_internevo_maxtext_nanochat_shapes() -> None:
    _, rec, _ = _read(
        "2023-11-10T15:05:58.540+08:00 INFO [training_internlm.py, line 601, in record_metrics] - pid=78690 : "
        "tflops=41.97 step=0 loss=11.54 tgs (tokens/gpu/second)=338.62 lr=4.0e-07 loss_scale=65536.0 "
        "grad_norm={'0_default': 87.3, '1_fp32': 0.0} loss/en=11.5 loss/cn=nan\n"
    )
    assert _steps(rec) == [0] and _values(rec, "loss") == [11.54] and rec["nonfinite"].iloc[0] == ""
    assert _values(rec, "tps") == [338.62] and _values(rec, "loss_scale") == [65536.0]
    _, rec, _ = _read("completed step: 3, seconds: 5.402, TFLOP/s/device: 141.542, loss: 11.379\n")
    assert _steps(rec) == [3] and _values(rec, "tflops") == [141.542] and _values(rec, "step_time_s") == [5.402]
    _, rec, _ = _read("step 00004/21400 (0.02%) | loss: 8.893647 | dt: 989.44ms | tok/sec: 529,882 | mfu: 74.13\n")
    assert _steps(rec) == [4] and _values(rec, "tps") == [529882.0] and _values(rec, "step_time_s") == [0.98944]


def test_nanogpt_eval_and_train_lines() -> None:
    _, rec, _ = _read("step 0: train loss 4.1872, val loss 4.0326\niter 0: loss 4.8131, time 36410.71ms, mfu -100%\n")
    assert _steps(rec) == [0, 0]
    assert _values(rec, "val_loss")[0] == 4.0326
    assert _values(rec, "step_time_s")[1] == 36.41071


# ---- formats that no sample holds -------------------------------------------------------------

_OWN_FORMATS = {
    "semicolons, counter first": (
        "global_step=120;loss=2.5;learning_rate=0.001\nglobal_step=121;loss=2.4;learning_rate=0.001\n",
        [120, 121],
        [2.5, 2.4],
    ),
    "JSON after a logger prefix": (
        'INFO:root:{"iteration": 5, "train/loss": 2.2, "grad norm": 1.1}\n'
        'INFO:root:{"iteration": 6, "train/loss": 2.1, "grad norm": 1.0}\n',
        [5, 6],
        [2.2, 2.1],
    ),
    "pipes and capitalised keys": (
        "Step 00120 | Loss 2.3412 | GradNorm 0.92 | LR 1.2e-4 | tok/s 12,345\n"
        "Step 00130 | Loss 2.3011 | GradNorm 0.90 | LR 1.2e-4 | tok/s 12,301\n",
        [120, 130],
        [2.3412, 2.3011],
    ),
    "bracketed epoch and iteration words": (
        "train: [epoch 3][iter 120] total loss: 1.83 grad norm: 0.5\n"
        "train: [epoch 3][iter 140] total loss: 1.79 grad norm: 0.4\n",
        [120, 140],
        [1.83, 1.79],
    ),
    "YAML-like blocks": (
        "step: 10\nloss: 2.5\nlr: 0.001\n---\nstep: 20\nloss: 2.25\nlr: 0.001\n---\n",
        [10, 20],
        [2.5, 2.25],
    ),
    "old fairseq epoch summaries": (
        "| epoch 003 | loss 4.12 | ppl 61.3 | wps 1234 | num_updates 5000\n"
        "| epoch 004 | loss 4.01 | ppl 55.1 | wps 1240 | num_updates 6000\n",
        [5000, 6000],
        [4.12, 4.01],
    ),
    "spaces around equals signs": (
        "2025-01-01 10:00:00,123 - trainer - INFO - Iteration 300 / 1000 - loss = 1.234 - lr = 0.0001\n"
        "2025-01-01 10:00:09,456 - trainer - INFO - Iteration 310 / 1000 - loss = 1.201 - lr = 0.0001\n",
        [300, 310],
        [1.234, 1.201],
    ),
    "counter last, slashed keys": (
        "loss/train=1.23 grad_norm=0.5 trainer/global_step=340\n"
        "loss/train=1.21 grad_norm=0.5 trainer/global_step=350\n",
        [340, 350],
        [1.23, 1.21],
    ),
    "CSV header with other names": (
        "iteration,lm_loss,gradient_norm,learning_rate\n1,10.9,3.2,1e-4\n2,10.1,2.9,1e-4\n",
        [1, 2],
        [10.9, 10.1],
    ),
    "TF2 Keras with time per step": (
        "Epoch 3/10\n100/100 [==============================] - 2s 20ms/step - loss: 0.5012 - val_loss: 0.6001\n"
        "Epoch 4/10\n100/100 [==============================] - 2s 20ms/step - loss: 0.4823 - val_loss: 0.5911\n",
        [3, 4],
        [0.5012, 0.4823],
    ),
    "rank prefix and parenthesised averages": (
        "[rank0]: batch 120: train_loss=2.3 (avg 2.4), gnorm 1.0\n"
        "[rank0]: batch 121: train_loss=2.2 (avg 2.39), gnorm 0.9\n",
        [120, 121],
        [2.3, 2.2],
    ),
    "no counter at all: records counted": (
        "loss: 0.91, lr: 0.01, gnorm: 2.0\nloss: 0.85, lr: 0.01, gnorm: 1.9\nloss: 0.80, lr: 0.01, gnorm: 1.8\n",
        [1, 2, 3],
        [0.91, 0.85, 0.8],
    ),
}


@pytest.mark.parametrize("name", list(_OWN_FORMATS))
def test_formats_no_sample_holds(name: str) -> None:
    text, steps, losses = _OWN_FORMATS[name]
    fmt, rec, layout = _read(text)
    assert fmt == "generic", layout
    assert _steps(rec) == steps
    assert _values(rec, "loss") == losses


# ---- the reader among the others ---------------------------------------------------------------


def test_never_takes_a_file_a_named_parser_reads() -> None:
    """Lines of a generic shape in a Megatron log are not the file's records."""
    megatron = "".join(
        f" iteration {i:>8}/   10000 | consumed samples: {i * 8:>10} | learning rate: 1.000E-04 | "
        f"global batch size:     8 | lm loss: 2.{i:03d}E+00 | loss scale: 65536.0 | grad norm: 0.800 |\n"
        for i in range(1, 6)
    )
    text = "step: 77\nloss: 9.5\n---\n" + megatron + "epoch 1: loss=2.0, step=100\n"
    fmt, rec, _ = _read(text)
    assert fmt == "megatron"
    assert _steps(rec) == [1, 2, 3, 4, 5]  # not 77 nor 100


def test_records_are_released_once_twenty_lock_the_file_to_it() -> None:
    """A live tail of a generic log sees records before the file ends (held while undecided)."""
    stream = LogStream(new_parsers())
    stream.feed("".join(f"iter {i}: loss {3 - i / 100:.3f}\n" for i in range(LOCK_AFTER_RECORDS - 1)).encode())
    assert stream.take().records.empty
    stream.feed(f"iter {LOCK_AFTER_RECORDS}: loss 2.5\n".encode())
    assert len(stream.take().records) == LOCK_AFTER_RECORDS


def test_format_generic_pins_the_reader_and_check_says_how_it_read(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text("".join(f"Iter {i}: Train loss {2 - i / 100:.3f}, Learning Rate 1e-4\n" for i in range(1, 30)))
    doc = check_json(str(log))
    assert doc["files"][0]["format"] == "generic"
    assert doc["files"][0]["layout"] == "`key value`, step from `Iter`"
    assert check_json("--format", "generic", str(log))["files"][0]["records"] == 29
    text = run_cli("check", str(log)).stdout
    assert "generic (`key value`, step from `Iter`)" in text
    assert "generic" in run_cli("formats").stdout


def test_nan_in_a_generic_log_fails_check_at_its_step(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    lines = [f"iter {i}: loss {3 - i / 100:.3f}, lr 1e-4\n" for i in range(1, 40)]
    log.write_text("".join(lines) + "iter 40: loss nan\n")
    p = run_cli("check", "--output", "json", str(log))
    assert p.returncode == 1
    alerts = [(a["detector"], a["step"]) for a in json.loads(p.stdout)["alerts"]]
    assert ("nonfinite", 40) in alerts


def test_config_synonyms_extend_the_table(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text("".join(f"step {i}: xent {2 - i / 100:.3f}, acc 0.5\n" for i in range(1, 30)))
    assert check_json(str(log))["files"][0]["records"] == 0  # `xent` is no name we know
    cfg = tmp_path / "gw.yaml"
    cfg.write_text("formats:\n  synonyms:\n    xent: loss\n")
    doc = check_json("--config", str(cfg), str(log))
    assert doc["files"][0]["format"] == "generic" and doc["files"][0]["records"] == 29
    cfg.write_text("formats:\n  synonyms:\n    xent: lossy\n")
    p = run_cli("check", "--config", str(cfg), str(log))
    assert p.returncode == 2 and "formats.synonyms 'xent': 'lossy' is not a metric name" in p.stderr
    assert "Traceback" not in p.stderr


def test_hostile_lines_give_no_record_and_no_error() -> None:
    """A step of 5,000 digits, a line past the length a metric line has, prose with numbers, a
    percentage after a loss-like word: none is a record, and none raises."""
    _, rec, _ = _read(
        "step "
        + "9" * 5000
        + ": loss 1.0\n"
        + "iter 3: loss "
        + "x" * 10_000
        + " 1.0\n"
        + "Total params: 39,344\nTrainable params: 39,344\n"
        + "Calculating loss...: 100%|#####| 1/1 [00:00<00:00, 31.16it/s]\n"
        + "iter "
        + "9" * 30
        + ": loss 1.0\n"
    )
    assert rec.empty


def test_a_long_line_ends_a_block() -> None:
    _, rec, _ = _read("step: 4\nloss: 2.0\n" + "x" * 10_000 + "\nTotal params: 39,344\n")
    assert _steps(rec) == [4] and rec["line"].tolist() == [2]


def test_tail_of_a_generic_log_alerts_on_what_a_running_job_appends(tmp_path: Path) -> None:
    """A live `tail` of a log only the generic reader reads: a NaN appended later is alerted."""
    from tests.test_tail import Tail

    log = tmp_path / "train.log"
    log.write_text("".join(f"Iter {i}: Train loss {3 - i / 100:.3f}, Learning Rate 1e-4\n" for i in range(1, 31)))
    tail = Tail(str(log), "--exit-on", "critical")
    try:
        tail.started()
        with log.open("a") as f:
            f.write("Iter 31: Train loss nan, Learning Rate 1e-4\n")
        alert = tail.wait_for(lambda o: o["type"] == "alert" and o["detector"] == "nonfinite", what="NaN alert")
        assert alert["step"] == 31 and alert["severity"] == "critical"
        summary = tail.summary()
    finally:
        tail.close()
    assert tail.proc.returncode == 1
    assert summary["files"][0]["format"] == "generic"


def test_a_line_that_says_it_reports_an_evaluation_gives_a_validation_loss() -> None:
    _, rec, _ = _read(
        "epoch 001 | loss 9.2 | ppl 588 | num_updates 1000\n"
        "epoch 001 | valid on 'valid' subset | loss 9.6 | ppl 776 | num_updates 1000\n"
        "Evaluating: step 2000 loss=nan\n"
    )
    assert _steps(rec) == [1000, 1000, 2000]
    assert _values(rec, "loss")[0] == 9.2 and math.isnan(rec["loss"].iloc[1])
    assert _values(rec, "val_loss")[1] == 9.6
    assert rec["nonfinite"].tolist() == ["", "", "val_loss"]


def test_export_says_how_the_file_was_read(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text("".join(f"iter {i}: loss {3 - i / 100:.3f}, lr 1e-4\n" for i in range(1, 6)))
    out = tmp_path / "records.csv"
    p = run_cli("export", str(log), "--out", str(out))
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == f"wrote 5 records to {out}, read as generic (`key value`, step from `iter`)"
    assert pd.read_csv(out)["step"].tolist() == [1, 2, 3, 4, 5]


def test_beside_deepspeed_progress_lines_the_generic_reader_stands_back() -> None:
    """A DeepSpeed-Chat log: per-epoch `ppl:` lines (generic) among DeepSpeed's per-step progress
    lines: the file is DeepSpeed's, its records DeepSpeed's steps only (not two counts mixed)."""
    progress = [
        f"[2023-04-18 01:52:27,404] [INFO] [logging.py:96:log_dist] [Rank 0] step={s}, skipped=0, "
        f"lr=[9.5e-06, 9.5e-06], mom=[(0.9, 0.95), (0.9, 0.95)]\n"
        for s in range(10, 260, 10)
    ]
    text = "***** Evaluating perplexity, Epoch 0/16 *****\nppl: 4998.29\n" + "".join(progress)
    text += "***** Evaluating perplexity, Epoch 1/16 *****\nppl: 2.01\n"
    fmt, rec, _ = _read(text)
    assert fmt == "deepspeed"
    assert _steps(rec) == list(range(10, 260, 10))

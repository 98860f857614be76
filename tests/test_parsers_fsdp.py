"""Parsers for FSDP-style trainers (OLMo, Composer, torchtitan, HF Trainer), NeMo, JSON lines and
user regex formats, tested through `LogStream` with lines as trainers print them (formats.md)."""

# ruff: noqa: E501 - log lines are quoted whole, as the trainers print them

from __future__ import annotations

import math
import random
from pathlib import Path

import pandas as pd
import pytest

from gradwatch.errors import ConfigError, UsageError
from gradwatch.events import EventKind
from gradwatch.parsers import PARSERS, new_parsers
from gradwatch.parsers._text import clean
from gradwatch.parsers.base import ParseOutput
from gradwatch.parsers.jsonl import JsonlParser
from gradwatch.parsers.regex_format import RegexParser, required_literal
from gradwatch.parsers.stream import Batch, LogStream

OURS = ("olmo", "composer", "torchtitan", "hf_trainer", "nemo", "jsonl")


def run(data: str | bytes, *, chunk: int | None = None, parsers=None) -> tuple[LogStream, Batch]:
    """Feed `data` whole (or in `chunk`-byte pieces), close, and take everything."""
    raw = data.encode() if isinstance(data, str) else data
    stream = LogStream(parsers if parsers is not None else new_parsers(), "test.log")
    if chunk is None:
        stream.feed(raw)
    else:
        for i in range(0, len(raw), chunk):
            stream.feed(raw[i : i + chunk])
    stream.close()
    return stream, stream.take()


def lines(*text: str) -> str:
    return "\n".join(text) + "\n"


def events(batch: Batch, kind: EventKind) -> list:
    return [e for e in batch.events if e.kind == kind]


def _real() -> Path:
    root = Path(__file__).resolve().parents[2] / "shared" / "samples" / "real"
    if not root.is_dir():
        pytest.skip("real samples not present: ../shared/samples/real (third-party logs, not shipped)")
    return root


# ---------------------------------------------------------------------------------------- samples

OLMO = lines(
    "2024-08-06 10:00:05.520 intern-studio-160750:0  olmo.train:908  INFO    [step=2/739328,epoch=0]",
    "    optim/total_grad_norm=0.0002",
    "    train/CrossEntropyLoss=1.7872662283480167e-06",
    "    train/Perplexity=1.000",
    "    throughput/total_tokens=2,097,152",
    "2024-08-06 10:00:06.120 intern-studio-160750:0  olmo.train:908  INFO    [step=3/739328,epoch=0]",
    "    optim/total_grad_norm=nan",
    "    train/CrossEntropyLoss=2.1",
    "    throughput/total_tokens=3,145,728",
    "2024-08-06 10:00:07.000 intern-studio-160750:0  olmo.train:1000  INFO    Saving checkpoint...",
)

OLMO_CORE = lines(
    "[2025-02-20 15:18:04] INFO     [olmo_core.train.callbacks.console_logger:62, rank=0] [step=1/7,epoch=1]",
    "    train/CE loss=11.03",
    "    train/PPL=61,659",
    "    train/Z loss=0.0021",
    "    optim/total grad norm=14.34",
    "    optim/LR (group 0)=1.00E-05",
    "    optim/LR (group 1)=2.00E-05",
    "    optim/step skipped=0.0000",
    "    throughput/device/TPS=7,322",
    "[2025-02-20 15:18:05] INFO     [olmo_core.train.callbacks.console_logger:62, rank=0] [step=2/7,epoch=1]",
    "[2025-02-20 15:18:06] INFO     [olmo_core.train.callbacks.console_logger:62, rank=0] [step=3/7,epoch=1]",
    "[2025-02-20 15:18:07] INFO     [olmo_core.train.callbacks.console_logger:62, rank=0] [step=4/7,epoch=1,eta=0h1m2s]",
    "    train/CE loss=10.87",
    "    optim/total grad norm=inf",
    "[2025-02-20 15:18:08] INFO     [olmo_core.train.callbacks.console_logger:62, rank=0] [step=5/7,epoch=1]",
)

COMPOSER = lines(
    "[batch=1/3]:",
    "\t Train time/batch: 0",
    "\t Train time/token: 0",
    "\t Train loss/train/total: 12.0570",
    "\t Train metrics/train/LanguageCrossEntropy: 12.0570",
    "\t Train metrics/train/LanguagePerplexity: 172463.7500",
    "\t Train l2_norm/grad/global: 3.2100",
    "\t Train lr-DecoupledAdamW/group0: 0.0001",
    "\t Train throughput/tokens_per_sec: 65536.0000",
    "\t Train throughput/device/tokens_per_sec: 8192.0000",
    "[batch=2/3]:",
    "\t Train time/token: 4096",
    "\t Train loss/train/total: nan",
    "\t Train l2_norm/grad/global: inf",
    "[Eval batch=1/2] Eval on eval data",
    "[Eval batch=2/2] Eval on eval data:",
    "\t Eval metrics/eval/LanguageCrossEntropy: 9.5000",
    "\t Eval metrics/eval/LanguagePerplexity: 13359.7266",
    "Loading checkpoint from s3://bucket/run/ep0-ba2-rank0.pt",
)

TITAN_LINE = (
    "[rank0]:[titan] 2026-05-18 16:04:50,821 - root - INFO - \x1b[31mstep: 18  \x1b[32mloss:  3.54399"
    "  \x1b[38;2;180;60;0mgrad_norm:  0.7675  \x1b[33mmemory:  9.46GiB(64.99%)  \x1b[34mtps: 7,322"
    "  \x1b[36mtflops: 0.52  \x1b[35mmfu: 0.17%\x1b[39m"
)
TITAN = lines(
    TITAN_LINE,
    TITAN_LINE.replace("[rank0]", "[rank1]"),
    TITAN_LINE.replace("[rank0]", "[rank2]"),
    "[rank0]:[titan] 2026-05-18 16:04:51,000 - root - INFO - step: 19  loss:      nan  grad_norm:     nan"
    "  memory:  9.46GiB(64.99%)  tps: 7,300  tflops: 0.52  mfu: N/A",
    "[rank0]:[titan] 2026-05-18 16:04:52,000 - root - INFO - validate step: 20  loss:  3.4000"
    "  memory:  9.46GiB(64.99%)  tps: 20,000",
    "[rank1]:[titan] 2026-05-18 16:04:52,000 - root - INFO - validate step: 20  loss:  3.4000"
    "  memory:  9.46GiB(64.99%)  tps: 20,000",
)

HF = lines(
    "{'loss': 2.1048, 'grad_norm': 2.1349170207977295, 'learning_rate': 4.9939613526570054e-05, 'epoch': 0.0}",
    "{'loss': 0.0, 'grad_norm': nan, 'learning_rate': 4.9e-05, 'epoch': 0.01}",
    "{'loss': '0.91', 'grad_norm': '0.8618', 'learning_rate': '4.8e-05', 'epoch': '0.02'}",
    "{\u2018loss\u2019: 0.88, \u2018grad_norm\u2019: 0.85, \u2018learning_rate\u2019: 4.7e-05, \u2018epoch\u2019: 0.03}",
    "{'eval_loss': 0.95, 'eval_runtime': 10.1, 'eval_samples_per_second': 99.0, 'epoch': 0.03}",
    "{'train_runtime': 601.2, 'train_samples_per_second': 10.0, 'train_loss': 1.2, 'epoch': 1.0}",
)

NEMO2 = lines(
    "(pretraining, pid=4112) Training epoch 0, iteration 3/9 | lr: 0.0006 | consumed_samples: 128"
    " | global_batch_size: 32 | global_step: 3 | reduced_train_loss: 8.595 | train_step_timing in s: 46.84",
    "(pretraining, pid=4112) Training epoch 1, iteration 0/9 | lr: 0.0006 | consumed_samples: 160"
    " | global_batch_size: 32 | global_step: 4 | reduced_train_loss: 8.1 | train_step_timing in s: 46.9"
    " | val_loss: 4.106",
)

NEMO1 = lines(
    "Epoch 0:   1%|          | 795/77225 [9:07:58<878:01:48, 41.36s/it, loss=3.1, v_num=,"
    " reduced_train_loss=3.090, global_step=794.0, consumed_samples=1.63e+6]",
    "Epoch 0:   1%|          | 796/77225 [9:08:39<878:00:07, 41.36s/it, loss=3.1, v_num=,"
    " reduced_train_loss=3.090, global_step=794.0, consumed_samples=1.63e+6]",
    "Epoch 0:   1%|          | 797/77225 [9:09:20<877:59:26, 41.36s/it, loss=3.1, v_num=,"
    " reduced_train_loss=nan, global_step=795.0, consumed_samples=1.63e+6, val_loss=2.900]",
    "Epoch 0:  45%|####5     | 34103/77225 [5:28:58<171:22:21,  1.73it/s, loss=2.52, v_num=,"
    " reduced_train_loss=2.510, global_step=3.1e+4, consumed_samples=2.54e+8, val_loss=2.900]",
)

JSONL = lines(
    '{"step": 10, "loss": 2.31, "grad_norm": 0.8, "lr": 0.0003, "tokens_per_second": 5000}',
    '{"iteration": 11, "train/loss": NaN, "gradient_norm": Infinity, "output_logit_norm": 41.5}',
    '{"global_step": 12, "train": {"loss": "nan"}, "perplexity": 10.1, "val_loss": 2.2}',
    '{"step": 13, "loss": 2.2, "grad-norm": 0.7',
    '{"lr": 0.001, "warmup": 100}',
)

MEGATRON_LINE = (
    " iteration       20/    1000 | consumed samples:          640 | elapsed time per iteration (ms): 1.0"
    " | learning rate: 1.500E-04 | global batch size:    32 | lm loss: 1.203115E+01 | loss scale: 32768.0"
    " | number of skipped iterations:   0 | number of nan iterations:   0 |"
)

ALL_SAMPLES = {
    "olmo": OLMO,
    "olmo_core": OLMO_CORE,
    "composer": COMPOSER,
    "torchtitan": TITAN,
    "hf_trainer": HF,
    "nemo2": NEMO2,
    "nemo1": NEMO1,
    "jsonl": JSONL,
}


def assert_same(a: Batch, b: Batch) -> None:
    pd.testing.assert_frame_equal(a.records, b.records)
    assert a.events == b.events


# ---------------------------------------------------------------------------------------- registry


def test_registry_order_puts_our_parsers_before_megatron_and_auxiliaries_last() -> None:
    """NeMo 2.0 lines contain `iteration i/N |`: Megatron must come after the NeMo parser."""
    names = list(PARSERS)
    assert names.index("nemo") < names.index("megatron")
    assert all(names.index(n) < names.index("megatron") for n in OURS)
    order = [p.name for p in new_parsers()]
    aux = [p.name for p in new_parsers() if p.auxiliary]
    assert order[-len(aux) :] == aux


@pytest.mark.parametrize("name", sorted(ALL_SAMPLES))
def test_feeding_one_byte_at_a_time_gives_the_same_batch(name: str) -> None:
    """Where the chunks were cut must not matter, also inside a multi-line record."""
    whole = run(ALL_SAMPLES[name])[1]
    assert len(whole.records) > 0
    assert_same(run(ALL_SAMPLES[name], chunk=1)[1], whole)
    assert_same(run(ALL_SAMPLES[name], chunk=7)[1], whole)


@pytest.mark.parametrize("name", sorted(ALL_SAMPLES))
def test_odd_input_never_raises(name: str) -> None:
    """Truncated lines and garbage are left alone, whatever their shape."""
    rng = random.Random(name)
    text = ALL_SAMPLES[name]
    for raw in text.splitlines():
        for cut in range(0, len(raw), 3):
            run(raw[:cut] + "\n")
    noise = "".join(rng.choice(text + "\x00\ufffd{}[]|=:%'\"") for _ in range(5000))
    run(noise)
    run(bytes(rng.randrange(256) for _ in range(5000)))


def test_cut_lines_do_not_yield_cut_values() -> None:
    """The last value of a line cut at a fixed width may itself be cut: it is not read."""
    text = lines(
        "{'loss': 2.1, 'grad_norm': 0.5, 'learning_rate': 4.99e-0",
        "[titan] 2026-05-18 16:04:50,821 - root - INFO - step: 5  loss:  3.50000  grad_norm:  0.7000  memory:  9.46GiB(64.99%)  tps: 7,3",
        "Epoch 0:   1%|          | 795/77225 [9:07:58<878:01:48, 41.36s/it, loss=3.1, v_num=, reduced_train_loss=3.090, global_step=794.0, consumed_samples=1.6",
    )
    _, batch = run(text)
    r = batch.records.set_index("step")
    assert r.loss[1] == 2.1 and r.grad_norm[1] == 0.5 and math.isnan(r.lr[1])
    assert r.grad_norm[5] == 0.7 and math.isnan(r.tps[5])
    assert r.loss[794] == 3.09 and math.isnan(r.samples[794])


def test_absurd_step_numbers_do_not_break_the_batch() -> None:
    """A step that does not fit the int64 column is not a step (the batch must still build)."""
    big = "9" * 30
    text = lines(
        f"[step={big}/10,epoch=0]",
        "    train/CrossEntropyLoss=2.0",
        f"[batch={big}/10]:",
        "\t Train loss/train/total: 2.0",
        f"step: {big}  loss:  2.00000",
        '{"step": 1e300, "loss": 2.0}',
        '{"step": -3, "loss": 2.0}',
        "Epoch 0:  1%| | 1/9 [00:01<00:09, 1.0it/s, reduced_train_loss=2.0, global_step=1e+300]",
    )
    _, batch = run(text)
    assert len(batch.records) > 0
    assert batch.records.step.max() < 10**18


# -------------------------------------------------------------------------------------------- OLMo


def test_olmo_record_from_marker_and_indented_lines() -> None:
    stream, batch = run(OLMO)
    assert stream.format == "olmo"
    r = batch.records
    assert list(r.step) == [2, 3]
    assert r.grad_norm[0] == 0.0002
    assert r.loss[0] == pytest.approx(1.7872662283480167e-06)
    assert r.ppl[0] == 1.0
    assert r.tokens[0] == 2_097_152 and r.tokens[1] == 3_145_728
    assert list(r.line) == [1, 6]
    assert r.ts[0] == pytest.approx(1722938405.52, abs=0.001)
    assert math.isnan(r.grad_norm[1]) and r.nonfinite[1] == "grad_norm"
    assert r.nonfinite[0] == ""


def test_olmo_core_keys_and_bare_markers_make_no_record() -> None:
    stream, batch = run(OLMO_CORE)
    assert stream.format == "olmo"
    r = batch.records
    assert list(r.step) == [1, 4]
    first = r.iloc[0]
    assert (first.loss, first.ppl, first.z_loss, first.grad_norm) == (11.03, 61659.0, 0.0021, 14.34)
    assert first.lr == 1e-05  # group 0, not group 1
    assert first.skipped == 0.0 and first.tps == 7322.0
    assert r.nonfinite[1] == "grad_norm" and math.isinf(r.grad_norm[1])


def test_olmo_non_metric_line_ends_the_record_and_reaches_other_parsers() -> None:
    text = lines(
        "[2025-02-20 15:18:04] INFO     [olmo_core.train.callbacks.console_logger:62, rank=0] [step=9/9,epoch=1]",
        "    train/CE loss=3.5",
        "Traceback (most recent call last):",
        '  File "train.py", line 1, in <module>',
        "RuntimeError: CUDA error: an illegal memory access was encountered",
    )
    _, batch = run(text)
    assert list(batch.records.step) == [9]
    assert [e.data["text"] for e in events(batch, EventKind.ERROR)] == [
        "RuntimeError: CUDA error: an illegal memory access was encountered"
    ]


def test_olmo_record_open_at_end_of_input_is_flushed() -> None:
    text = "[step=7/9,epoch=0]\n    train/CrossEntropyLoss=2.0\n    optim/total_grad_norm=0.5"
    stream, batch = run(text)
    assert stream.format == "olmo"
    assert list(batch.records.step) == [7] and batch.records.grad_norm[0] == 0.5


def test_olmo_srun_prefix_swallows_the_indentation() -> None:
    text = lines(
        "0: 2024-08-06 10:00:05.520 node:0  olmo.train:908  INFO    [step=5/10,epoch=0]",
        "0:     train/CrossEntropyLoss=2.5",
        "0:     optim/total_grad_norm=1.25",
        "[default3]:    train/Perplexity=12.18",
        "0: 2024-08-06 10:00:06.000 node:0  olmo.train:950  INFO    Checkpoint saved to /ckpt/step5",
    )
    _, batch = run(text)
    r = batch.records
    assert (r.step[0], r.loss[0], r.grad_norm[0], r.ppl[0]) == (5, 2.5, 1.25, 12.18)
    [save] = events(batch, EventKind.CHECKPOINT_SAVE)
    assert save.step == 5 and save.data["path"] == "/ckpt/step5"


def test_olmo_core_resume_gives_one_load_event_with_the_step() -> None:
    text = lines(
        "2026-08-07 20:29:09.986\tip-10-20-55-74:0\tolmo_core.train.trainer:935\tINFO\tLoading checkpoint from 's3://bucket/step20'...",
        "2026-08-07 20:29:52.030\tip-10-20-55-74:0\tolmo_core.train.trainer:412\tINFO\tWill resume training from step 20, epoch 1",
        "2026-08-07 20:29:53.000\tip-10-20-55-74:0\tolmo_core.train.trainer:940\tINFO\tCheckpoint successfully loaded",
        "2026-08-07 20:40:00.000\tip-10-20-55-74:0\tolmo_core.train.checkpoint:90\tINFO\tSaving checkpoint for step 40 to '/ckpt/step40'...",
    )
    _, batch = run(text)
    [load] = events(batch, EventKind.CHECKPOINT_LOAD)
    assert (load.step, load.data["iteration"], load.data["path"]) == (20, 20, "s3://bucket/step20")
    assert load.ts == pytest.approx(1786134592.03, abs=0.01)
    [save] = events(batch, EventKind.CHECKPOINT_SAVE)
    assert (save.step, save.data["path"]) == (40, "/ckpt/step40")


def test_olmo_resume_without_step_line() -> None:
    text = lines(
        "2024-08-06 09:00:00.000 node:0  olmo.train:300  INFO    Loading checkpoint from /ckpt/step1000...",
        "2024-08-06 09:01:00.000 node:0  olmo.train:301  INFO    Checkpoint successfully loaded",
    )
    _, batch = run(text)
    [load] = events(batch, EventKind.CHECKPOINT_LOAD)
    assert load.data["path"] == "/ckpt/step1000" and load.step is None


# ---------------------------------------------------------------------------------------- Composer


def test_composer_records_keys_and_nonfinite() -> None:
    stream, batch = run(COMPOSER)
    assert stream.format == "composer"
    r = batch.records
    assert list(r.step) == [1, 2, 2]
    first = r.iloc[0]
    assert (first.loss, first.ppl, first.grad_norm, first.lr) == (12.057, 172463.75, 3.21, 0.0001)
    assert first.tps == 8192.0  # per device, like torchtitan and OLMo
    assert first.tokens == 0.0
    assert math.isnan(r.loss[1]) and math.isinf(r.grad_norm[1])
    assert r.nonfinite[1] == "loss,grad_norm"
    assert r.tokens[1] == 4096.0
    assert r.val_loss[2] == 9.5 and math.isnan(r.loss[2])
    [val] = events(batch, EventKind.VALIDATION)
    assert (val.step, val.data["val_loss"]) == (2, 9.5)
    [load] = events(batch, EventKind.CHECKPOINT_LOAD)
    assert load.data["path"] == "s3://bucket/run/ep0-ba2-rank0.pt"


def test_composer_epoch_markers_and_space_indentation() -> None:
    text = lines(
        "[epoch=2][batch=3/10]:",
        "         Train loss/train/total: 2.5000",
        "         Train throughput/tokens_per_sec: 1000.0",
        "[epoch=2][batch=4/10]:",
        "         Train time/batch: 13",
        "         Train LanguageCrossEntropy: 2.4",
        "         Train Perplexity: 11.02",
    )
    _, batch = run(text)
    r = batch.records
    assert list(r.step) == [13, 14]  # (epoch - 1) * 10 + 3; time/batch + 1
    assert r.tps[0] == 1000.0  # the all-device value when no per-device one is logged
    assert (r.loss[1], r.ppl[1]) == (2.4, 11.02)


def test_composer_srun_prefix_and_split_records() -> None:
    text = lines(
        "0: [batch=1/300000000]:",
        "0:       Train time/batch: 0",
        "0:       Train loss/train/total: 12.0000",
        "0: [batch=2/300000000]:",
        "0:       Train loss/train/total: 11.5000",
    )
    whole = run(text)[1]
    assert list(whole.records.step) == [1, 2] and list(whole.records.loss) == [12.0, 11.5]
    assert_same(run(text, chunk=1)[1], whole)


# -------------------------------------------------------------------------------------- torchtitan


def test_torchtitan_line_with_ansi_and_rank_prefix() -> None:
    stream, batch = run(TITAN)
    assert stream.format == "torchtitan"
    r = batch.records
    assert list(r.step) == [18, 19, 20]  # three ranks printed step 18: one record
    first = r.iloc[0]
    assert (first.loss, first.grad_norm, first.tps, first.tflops, first.mfu) == (
        3.54399,
        0.7675,
        7322.0,
        0.52,
        0.17,
    )
    assert first.ts == pytest.approx(1779120290.821, abs=0.01)
    assert r.nonfinite[1] == "loss,grad_norm"
    assert math.isnan(r.mfu[1])  # `mfu: N/A` is not logged
    assert r.nonfinite[2] == "" and r.val_loss[2] == 3.4 and math.isnan(r.loss[2])
    assert math.isnan(r.tps[2])  # evaluation throughput is not training throughput
    [val] = events(batch, EventKind.VALIDATION)
    assert val.step == 20


def test_torchtitan_without_titan_tag_and_without_grad_norm() -> None:
    text = "[rank0]:2025-02-03 13:39:06,055 - root - INFO - step:  1  loss: 12.2384  memory: 14.77GiB(15.54%)  tps: 1,103  mfu: 0.65%\n"
    _, batch = run(text)
    r = batch.records
    assert (r.step[0], r.loss[0], r.tps[0], r.mfu[0]) == (1, 12.2384, 1103.0, 0.65)
    assert math.isnan(r.grad_norm[0])


def test_torchtitan_resume_one_event_although_every_rank_prints_it() -> None:
    text = lines(
        "[rank0]:[titan] 2026-05-18 17:00:00,000 - root - INFO - Loading the checkpoint at step 400.",
        "[rank1]:[titan] 2026-05-18 17:00:00,000 - root - INFO - Loading the checkpoint at step 400.",
        "[rank0]:[titan] 2026-05-18 17:00:11,000 - root - INFO - Finished loading the checkpoint in 11.31 seconds.",
        "[rank0]:[titan] 2026-05-18 17:00:11,100 - root - INFO - Training starts at step 401.",
        "[rank1]:[titan] 2026-05-18 17:00:11,100 - root - INFO - Training starts at step 401.",
        "[rank0]:[titan] 2026-05-18 17:00:20,000 - root - INFO - step: 401  loss:  3.50000  grad_norm:  0.7000",
    )
    _, batch = run(text)
    [load] = events(batch, EventKind.CHECKPOINT_LOAD)
    assert (load.step, load.data["iteration"]) == (400, 400)
    assert load.ts == pytest.approx(1779123600.0, abs=0.01)
    assert list(batch.records.step) == [401]


def test_torchtitan_new_style_load_and_fresh_start() -> None:
    resumed = lines(
        "[titan] 2026-05-18 17:00:00,000 - root - INFO - Loading the checkpoint from step-400.",
        "[titan] 2026-05-18 17:00:11,100 - root - INFO - Training starts at step 401.",
    )
    [load] = events(run(resumed)[1], EventKind.CHECKPOINT_LOAD)
    assert (load.step, load.data["path"]) == (400, "step-400")
    fresh = "[titan] 2026-05-18 17:00:11,100 - root - INFO - Training starts at step 1.\n"
    assert events(run(fresh)[1], EventKind.CHECKPOINT_LOAD) == []


# -------------------------------------------------------------------------------------- HF Trainer


def test_hf_trainer_dicts_numbered_in_order_of_appearance() -> None:
    stream, batch = run(HF)
    assert stream.format == "hf_trainer"
    r = batch.records
    assert list(r.step) == [1, 2, 3, 4, 4]  # the eval dict shares the step of the last train dict
    assert (r.loss[0], r.grad_norm[0], r.lr[0]) == (
        2.1048,
        2.1349170207977295,
        4.9939613526570054e-05,
    )
    assert r.loss[1] == 0.0 and math.isnan(r.grad_norm[1]) and r.nonfinite[1] == "grad_norm"
    assert (r.loss[2], r.grad_norm[2], r.lr[2]) == (0.91, 0.8618, 4.8e-05)  # quoted values
    assert (r.loss[3], r.grad_norm[3]) == (0.88, 0.85)  # typographic quotes
    assert r.val_loss[4] == 0.95 and math.isnan(r.loss[4])
    assert len(r) == 5  # the train_runtime summary is not a record
    [val] = events(batch, EventKind.VALIDATION)
    assert val.step == 4


def test_hf_trainer_dict_glued_after_tqdm_bar_takes_the_bar_count() -> None:
    bar = " 14%|\u2588\u258d        | {n}/2724 [10:01<59:00,  1.51s/it]"
    text = (
        bar.format(n=379) + "\r" + bar.format(n=380) + "\r" + " " * 20 + "\r"
        "{'loss': 1.5, 'grad_norm': 0.9, 'learning_rate': 4e-05, 'epoch': 0.14}\n"
        + bar.format(n=381)
        + "\r"
        + bar.format(n=390)
        + "{'loss': 1.4, 'grad_norm': nan, 'learning_rate': 3.9e-05, 'epoch': 0.15}   \n"
        + bar.format(n=391)
        + "\n"  # a bar on its own line is a stale snapshot: not used
        + "0: {'loss': 1.3, 'grad_norm': 0.8, 'learning_rate': 3.8e-05, 'epoch': 0.16}\n"
    )
    stream, batch = run(text)
    assert stream.format == "hf_trainer"
    assert list(batch.records.step) == [380, 390, 400]  # the last dict: `logging_steps` after the one before
    assert batch.records.nonfinite[1] == "grad_norm"
    assert_same(run(text, chunk=1)[1], batch)


def test_hf_trainer_resume_and_non_trainer_dicts() -> None:
    text = lines(
        "[INFO|trainer.py:2128] 2024-07-17 00:18:20,620 >> ***** Running training *****",
        "[INFO|trainer.py:2150] 2024-07-17 00:18:20,620 >>   Continuing training from checkpoint, will skip to saved global_step",
        "[INFO|trainer.py:2151] 2024-07-17 00:18:20,620 >>   Continuing training from epoch 0",
        "[INFO|trainer.py:2152] 2024-07-17 00:18:20,620 >>   Continuing training from global step 1200",
        "[2021-06-01 10:00:00,000] [INFO] [config.py:750:print]   optimizer_params ............. {'lr': 5e-05, 'betas': [0.9, 0.999]}",
        "{'loss': 2.0, 'learning_rate': 1e-05, 'epoch': 1.2}",
    )
    _, batch = run(text)
    [load] = events(batch, EventKind.CHECKPOINT_LOAD)
    assert (load.step, load.data["iteration"]) == (1200, 1200)
    assert list(batch.records.step) == [1]  # a config dict with an `lr` is not a record


# -------------------------------------------------------------------------------------------- NeMo


def test_nemo2_lines_are_nemo_not_megatron() -> None:
    stream, batch = run(NEMO2)
    assert stream.format == "nemo"
    assert stream.out.counts == {"nemo": 2}
    r = batch.records
    assert list(r.step) == [3, 4]  # global_step, not the per-epoch iteration
    assert (r.loss[0], r.lr[0], r.step_time_s[0], r.samples[0]) == (8.595, 0.0006, 46.84, 128.0)
    assert r.val_loss[1] == 4.106
    [val] = events(batch, EventKind.VALIDATION)
    assert val.step == 4


def test_nemo2_line_without_known_fields_is_still_not_megatron() -> None:
    text = "Training epoch 0, iteration 3/9 | global_batch_size: 32 | peak_memory_usage: 1e10\n"
    stream, batch = run(text)
    assert stream.out.counts == {} and len(batch.records) == 0


def test_nemo1_progress_bars() -> None:
    stream, batch = run(NEMO1)
    assert stream.format == "nemo"
    r = batch.records
    assert list(r.step) == [794, 795, 31000]  # the redrawn identical bar is one record
    assert (r.loss[0], r.samples[0]) == (3.09, 1.63e6)  # reduced_train_loss, not the running mean
    assert math.isnan(r.loss[1]) and r.nonfinite[1] == "loss"
    assert r.val_loss[1] == 2.9 and math.isnan(r.val_loss[2])  # recorded when it changes
    assert r.loss[2] == 2.51


def test_nemo_async_checkpoint_lines() -> None:
    text = lines(
        "(pretraining, pid=4112) [NeMo I 2025-05-22 20:08:53 model_checkpoint:497] Scheduled async checkpoint save for /ckpt/model_name=0--val_loss=0.00-step=18-consumed_samples=9728.0-last.ckpt",
        "(pretraining, pid=4112) [NeMo I 2025-05-22 20:09:41 model_checkpoint:522] Async checkpoint save for step 19 finalized successfully.",
        "[NeMo I 2025-05-22 20:32:36 model_checkpoint:522] Async checkpoint save for step 48 finalized successfully.",
    )
    _, batch = run(text)
    saves = events(batch, EventKind.CHECKPOINT_SAVE)
    assert [e.step for e in saves] == [18, 48]
    assert saves[0].data["path"].endswith("step=18-consumed_samples=9728.0-last.ckpt")
    assert saves[0].ts == pytest.approx(1747944533.0, abs=0.01)


# -------------------------------------------------------------------------------------- JSON lines


def test_jsonl_aliases_nonfinite_and_bad_lines() -> None:
    stream, batch = run(JSONL)
    assert stream.format == "jsonl"
    r = batch.records
    assert list(r.step) == [10, 11, 12]  # the truncated line and the lr-only object are skipped
    assert (r.loss[0], r.grad_norm[0], r.lr[0], r.tps[0]) == (2.31, 0.8, 0.0003, 5000.0)
    assert r.nonfinite[1] == "loss,grad_norm" and r.logit_norm[1] == 41.5
    assert math.isnan(r.loss[2]) and r.nonfinite[2] == "loss"  # nested "train": {"loss": "nan"}
    assert (r.ppl[2], r.val_loss[2]) == (10.1, 2.2)


def test_jsonl_custom_aliases_and_ordinal_steps() -> None:
    parser = JsonlParser(aliases={"lm_loss": "loss", "it": "step"})
    assert parser.aliases["lm_loss"] == "loss" and parser.aliases["grad_norm"] == "grad_norm"
    text = lines('{"lm_loss": 3.0}', '{"lm_loss": 2.9}', '{"it": 50, "lm_loss": 2.8}', '{"lm_loss": 2.7}')
    _, batch = run(text, parsers=[parser])
    assert list(batch.records.step) == [1, 2, 50, 51]
    assert list(batch.records.loss) == [3.0, 2.9, 2.8, 2.7]
    assert "lm_loss" not in JsonlParser().aliases  # defaults are not changed by an instance


def test_jsonl_alias_to_unknown_metric_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="'lm_loss'.*'lossy'"):
        JsonlParser(aliases={"lm_loss": "lossy"})


# ----------------------------------------------------------------------------------- regex formats


def test_regex_format_through_new_parsers_extra() -> None:
    fmt = RegexParser("mytrainer", r"it (?P<step>\d+) loss=(?P<loss>\S+)(?: gn=(?P<grad_norm>\S+))?")
    assert "mytrainer" not in PARSERS
    text = lines("12:00 it 5 loss=2.50 gn=1,234.5", "12:01 it 6 loss=nan", "something else")
    stream, batch = run(text, parsers=new_parsers(extra=[fmt]))
    assert stream.format == "mytrainer"
    r = batch.records
    assert list(r.step) == [5, 6]
    assert r.grad_norm[0] == 1234.5 and math.isnan(r.grad_norm[1])
    assert r.nonfinite[1] == "loss"
    only = new_parsers("mytrainer", extra=[RegexParser("mytrainer", r"loss=(?P<loss>\S+)")])
    assert [p.name for p in only if not p.auxiliary] == ["mytrainer"]
    with pytest.raises(UsageError, match="unknown format 'nope'"):
        new_parsers("nope", extra=[fmt])


def test_regex_format_errors_name_the_format_and_the_group() -> None:
    with pytest.raises(ConfigError, match="format 'bad'.*group 'los'"):
        RegexParser("bad", r"loss=(?P<los>\S+)")
    with pytest.raises(ConfigError, match="format 'broken'.*does not compile"):
        RegexParser("broken", r"loss=(?P<loss>\S+")
    with pytest.raises(ConfigError, match="format 'nometric'"):
        RegexParser("nometric", r"it (?P<step>\d+)")


def test_regex_required_literal_is_in_every_match() -> None:
    assert required_literal(r"it (?P<step>\d+) loss=(?P<loss>\S+)") == " loss="
    assert required_literal(r"(?i)loss=(?P<loss>\S+)") is None
    assert required_literal(r"a|b") is None
    assert required_literal(r"x?(?P<loss>\d)") is None


# ------------------------------------------------------------------------------------ Megatron too


def test_megatron_line_is_still_megatron_and_none_of_ours_takes_it() -> None:
    stream, batch = run(lines(MEGATRON_LINE, MEGATRON_LINE.replace("20/", "30/")))
    assert stream.format == "megatron"
    assert list(batch.records.step) == [20, 30]
    assert batch.records.loss[0] == pytest.approx(12.03115)
    text = clean(MEGATRON_LINE)
    for parser in new_parsers():
        if parser.name in OURS:
            out = ParseOutput()
            assert parser.parse(text, 1, None, out) is False, parser.name
            assert len(out.records) == 0 and out.events == []


# ------------------------------------------------------------------------------------ real samples


def test_real_composer_srun_prefixed() -> None:
    stream, batch = run((_real() / "composer" / "aws-adt-mpt-srun-prefixed-batch1.log").read_bytes())
    assert stream.format == "composer"
    r = batch.records
    assert len(r) == 1
    assert (r.step[0], r.loss[0], r.ppl[0], r.tokens[0]) == (1, 12.0, 162754.5, 0.0)


def test_real_composer_llm_foundry_readme() -> None:
    data = (_real() / "composer" / "llm-foundry-readme-batch1-4-records.log").read_bytes()
    stream, batch = run(data)
    assert stream.format == "composer"
    r = batch.records
    assert list(r.step) == [1, 2, 3, 4]
    assert list(r.loss) == [10.9736, 10.9724, 10.9745, 10.6459]
    assert r.ppl[0] == 58312.0586
    assert_same(run(data, chunk=1)[1], batch)


def test_real_hf_trainer_srun_prefixed() -> None:
    data = (_real() / "hf-trainer" / "aws-adt-esm2-srun-prefixed-trainer.log").read_bytes()
    stream, batch = run(data)
    assert stream.format == "hf_trainer"
    r = batch.records
    assert list(r.step) == [1, 2, 3, 4, 5]
    assert list(r.loss) == [2.9859, 2.8209, 2.716, 2.6697, 2.6591]
    assert r.grad_norm[0] == 0.9704080820083618 and r.lr[4] == 8.762886597938144e-06
    assert list(r.line) == [17, 19, 21, 23, 25]
    assert_same(run(data, chunk=3)[1], batch)


def test_real_nemo1_bars_with_rounded_global_step() -> None:
    stream, batch = run((_real() / "nemo" / "aws-adt-bionemo-nemo1-progress-bar-val-loss.log").read_bytes())
    assert stream.format == "nemo"
    r = batch.records
    assert list(r.step) == [31000, 31000]  # `global_step=3.1e+4`; two identical redraws dropped
    assert list(r.loss) == [2.51, 2.52]
    assert r.val_loss[0] == 2.51 and r.samples[0] == 2.54e8


def test_real_nemo1_final_progress_bar() -> None:
    stream, batch = run((_real() / "nemo" / "aws-adt-nemo1-lr-scheduler-final-progress.log").read_bytes())
    assert stream.format == "nemo"
    r = batch.records
    assert (list(r.step), r.loss[0], r.samples[0]) == ([39], 10.9, 9984.0)


def test_real_nemo2_ray_prefix_async_checkpoints() -> None:
    data = (_real() / "nemo" / "aws-adt-nemo2-ray-prefix-async-ckpt.log").read_bytes()
    stream, batch = run(data)
    assert stream.format == "nemo"
    assert "megatron" not in stream.out.counts
    r = batch.records
    assert list(r.step) == [19, 29, 45, 46, 48]
    assert (r.loss[0], r.step_time_s[0], r.lr[0], r.samples[0]) == (
        11.03,
        46.86,
        2.999e-06,
        10240.0,
    )
    assert [e.step for e in events(batch, EventKind.CHECKPOINT_SAVE)] == [18, 47]
    assert_same(run(data, chunk=5)[1], batch)


def test_real_megatron_and_deepspeed_logs_are_untouched_by_our_parsers() -> None:
    root = _real()
    files = sorted((root / "megatron-lm").glob("*.log")) + sorted((root / "megatron-deepspeed").glob("*.log"))
    assert files
    for path in files:
        stream, _ = run(path.read_bytes())
        assert stream.format == "megatron", path.name
        assert not set(stream.out.counts) & set(OURS), (path.name, stream.out.counts)
    for path in sorted((root / "deepspeed").glob("*.log")):
        stream, _ = run(path.read_bytes())
        assert not set(stream.out.counts) & set(OURS), (path.name, stream.out.counts)


def test_a_traceback_cut_short_ends_at_the_next_line_that_is_not_a_frame() -> None:
    """A job killed while printing a traceback, then restarted in the same log: the records after
    the cut traceback are read (its frames are indented, and so are Megatron's record lines)."""
    record = (
        " iteration {:8d}/  159576 | consumed samples:       488048 | elapsed time per iteration (ms): 619.6 |"
        " learning rate: 6.000E-05 | global batch size:   176 | lm loss: 3.317482E+00 | loss scale: 65536.0 |"
        " grad norm: 1.234 | number of skipped iterations:   0 | number of nan iterations:   0 |"
    )
    text = lines(
        *(record.format(i) for i in range(1, 40)),
        "Traceback (most recent call last):",
        '  File "pretrain_gpt.py", line 120, in <module>',
        "[2024-03-02 09:00:00,000] [INFO] [launch.py:315:main] restarting the job",
        *(record.format(i) for i in range(40, 80)),
        "Traceback (most recent call last):",
        '  File "pretrain_gpt.py", line 120, in <module>',
        "    main()",
        "RuntimeError: the end",
    )
    _, batch = run(text)
    assert list(batch.records.step) == list(range(1, 80))
    assert [e.data["text"] for e in events(batch, EventKind.ERROR)] == ["RuntimeError: the end"]

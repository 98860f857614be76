"""Configuration blocks become `config` events: one per start, each block shape read with its
canonical keys normalised (`run_config.KEYS`) and every key as printed, whatever prefixes,
logger headers, hard wrapping or other ranks' lines come with it; `check --output json` and
`export --configs` give them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from gradwatch.events import Event, EventKind
from gradwatch.parsers import new_parsers
from gradwatch.parsers.stream import LogStream
from gradwatch.run_config import KEYS
from tests.conftest import real_folders, run_cli
from tests.test_bad_input import megatron_line, no_traceback, strict_json
from tests.test_trainer_error import megatron_records

DS = "[2024-03-02 08:00:01,885] [INFO] [config.py:1003:print]"
DS_JSON = "[2024-03-02 08:00:01,886] [INFO] [config.py:989:print_user_config]"


def megatron_args(**values: str) -> list[str]:
    """Megatron's arguments block as `megatron/arguments.py` prints it (keys padded with dots)."""
    args = {
        "bf16": "False",
        "data_path": "['/data/pile_text_document']",
        "finetune": "False",
        "fp16": "True",
        "global_batch_size": "1024",
        "hysteresis": "2",
        "initial_loss_scale": "4294967296",
        "load": "/ckpt/run1",
        "loss_scale": "None",
        "loss_scale_window": "1000",
        "lr": "0.00015",
        "lr_decay_style": "cosine",
        "lr_warmup_fraction": "None",
        "lr_warmup_iters": "2000",
        "micro_batch_size": "4",
        "min_loss_scale": "1.0",
        "min_lr": "1e-05",
        "no_load_optim": "None",
        "override_lr_scheduler": "False",
        "rampup_batch_size": "['192', '16', '9_765_625']",
        "seed": "1234",
        "tokenizer_type": "GPT2BPETokenizer",
        "train_iters": "None",
        "vocab_file": "/data/gpt2-vocab.json",
        "world_size": "64",
        "zero_stage": "0",
        **values,
    }
    body = [f"  {key} {'.' * (48 - len(key))} {value}" for key, value in sorted(args.items())]
    return [
        "using world size: 64, data-parallel-size: 4, tensor-model-parallel size: 4, pipeline-model-parallel size: 4",
        "------------------------ arguments ------------------------",
        *body,
        "-------------------- end of arguments ---------------------",
        "setting number of micro-batches to constant 256",
    ]


def deepspeed_config(fp16: bool = True) -> list[str]:
    """DeepSpeed's engine configuration (dots to column 29, or two spaces) and its JSON."""

    def entry(key: str, value: str) -> str:
        return f"{DS}   {key} {'.' * (29 - len(key))} {value}".replace(" . ", "  ")

    flag = "true" if fp16 else "false"
    return [
        f"{DS} DeepSpeedEngine configuration:",
        entry("activation_checkpointing_config", "{"),
        '    "partition_activations": false,',
        '    "profile": false',
        "}",
        entry("bfloat16_enabled", str(not fp16)),
        "[2024-03-02 08:00:01,969] [INFO] [config.py:733:__init__] Config mesh_device None world_size = 8",
        entry(
            "dynamic_loss_scale_args", "{'init_scale': 4096, 'scale_window': 500, 'delayed_shift': 2, 'min_scale': 1}"
        ),
        entry("fp16_enabled", str(fp16)),
        entry("train_batch_size", "256"),
        entry("train_micro_batch_size_per_gpu", "4"),
        entry("world_size", "8"),
        entry("zero_optimization_stage", "1"),
        f"{DS_JSON}   json = {{",
        '    "train_micro_batch_size_per_gpu": 4, ',
        '    "zero_optimization": {',
        '        "stage": 1',
        "    }, ",
        '    "fp16": {',
        f'        "enabled": {flag}, ',
        '        "loss_scale": 0, ',
        '        "loss_scale_window": 500, ',
        '        "hysteresis": 2, ',
        '        "min_loss_scale": 1, ',
        '        "initial_scale_power": 12',
        "    }, ",
        '    "bf16": {',
        f'        "enabled": {"false" if fp16 else "true"}',
        "    }, ",
        '    "steps_per_print": 2.000000e+03',
        "}",
        "[2024-03-02 08:00:01,888] [INFO] [engine.py:76:__init__] CONFIG: micro_batches=8 micro_batch_size=4",
    ]


HF_ONE_LINE = (
    "INFO:__main__:Training/evaluation parameters TrainingArguments(output_dir=out, per_device_train_batch_size=4, "
    "gradient_accumulation_steps=8, learning_rate=5e-05, max_steps=-1, lr_scheduler_type=SchedulerType.LINEAR, "
    "warmup_ratio=0.0, warmup_steps=8, logging_dir=runs/May25_06-29-27_node1, seed=42, fp16=True, bf16=False, "
    "fsdp_config={'min_num_params': 0, 'xla': False}, report_to=[], resume_from_checkpoint=None, _n_gpu=1, "
    "mp_parameters=)"
)
HF_LINES = [
    "03/02/2024 08:00:00 - INFO - __main__ - Training/evaluation parameters TrainingArguments(",
    "_n_gpu=1,",
    "accelerator_config={'split_batches': False, 'dispatch_batches': None},",
    "bf16=True,",
    "fp16=False,",
    "gradient_accumulation_steps=4,",
    "learning_rate=0.0003,",
    "lr_scheduler_type=cosine,",
    "max_steps=5000,",
    "per_device_train_batch_size=2,",
    "resume_from_checkpoint=/ckpt/checkpoint-2000,",
    "seed=7,",
    "warmup_ratio=0.03,",
    "warmup_steps=0,",
    ")",
]


def events(lines: list[str], chunk: int = 1 << 20) -> list[Event]:
    """The events of a log of `lines`, read as a file is (all parsers, in chunks of `chunk` bytes)."""
    stream = LogStream(new_parsers())
    data = "".join(f"{line}\n" for line in lines).encode()
    found: list[Event] = []
    for at in range(0, len(data), chunk):
        stream.feed(data[at : at + chunk])
        found += stream.take().events
    stream.close()
    return found + stream.take().events


def configs(lines: list[str], chunk: int = 1 << 20) -> list[Event]:
    return [e for e in events(lines, chunk) if e.kind is EventKind.CONFIG]


def test_megatron_arguments_are_one_event_with_canonical_and_raw_keys() -> None:
    lines = ["> building GPT2BPETokenizer tokenizer ...", *megatron_args(), *megatron_records(10, 3)]
    (event,) = configs(lines)
    assert (event.line, event.step, event.data["source"]) == (3, None, "megatron-args")
    assert event.data["config"] == {
        "data_path": "['/data/pile_text_document']",
        "finetune": False,
        "global_batch_size": 1024,
        "hysteresis": 2,
        "initial_scale_power": 32,
        "load": "/ckpt/run1",
        "load_optimizer": True,
        "loss_scale": 0.0,
        "loss_scale_window": 1000,
        "lr": 0.00015,
        "lr_schedule": "cosine",
        "lr_warmup": 2000.0,
        "micro_batch_size": 4,
        "min_loss_scale": 1.0,
        "min_lr": 1e-05,
        "override_lr_scheduler": False,
        "precision": "fp16",
        "rampup_batch_size": "['192', '16', '9_765_625']",
        "seed": 1234,
        "tokenizer": "GPT2BPETokenizer /data/gpt2-vocab.json",
        "train_iters": None,
        "world_size": 64,
        "zero_stage": 0,
    }
    assert set(event.data["config"]) <= set(KEYS)
    assert event.data["raw"]["no_load_optim"] == "None" and len(event.data["raw"]) == 26


def test_megatron_flags_that_change_a_resume_are_read() -> None:
    lines = megatron_args(
        fp16="False", bf16="True", no_load_optim="True", override_lr_scheduler="True", finetune="True"
    )
    config = configs(lines)[0].data["config"]
    assert (config["precision"], config["load_optimizer"], config["override_lr_scheduler"], config["finetune"]) == (
        "bf16",
        False,
        True,
        True,
    )


def test_deepspeed_engine_configuration_and_its_json_are_two_events_of_one_start() -> None:
    found = configs(
        ["[2024-03-02 08:00:00,000] [INFO] [engine.py:1] DeepSpeed info: version=0.14.0", *deepspeed_config()]
    )
    assert [(e.line, e.data["source"]) for e in found] == [(2, "deepspeed-config"), (15, "deepspeed-json")]
    engine, user = (e.data["config"] for e in found)
    assert engine == {
        "global_batch_size": 256,
        "hysteresis": 2,
        "initial_scale_power": 12,
        "loss_scale_window": 500,
        "micro_batch_size": 4,
        "min_loss_scale": 1.0,
        "precision": "fp16",
        "world_size": 8,
        "zero_stage": 1,
    }
    assert user == {
        "hysteresis": 2,
        "initial_scale_power": 12,
        "loss_scale": 0.0,
        "loss_scale_window": 500,
        "micro_batch_size": 4,
        "min_loss_scale": 1.0,
        "precision": "fp16",
        "zero_stage": 1,
    }
    raw = found[0].data["raw"]
    assert raw["activation_checkpointing_config"] == '{ "partition_activations": false, "profile": false }'
    assert "mesh_device" not in str(raw)  # another process's line printed into the block
    assert found[1].data["raw"]["fp16.initial_scale_power"] == "12"
    assert found[1].data["raw"]["steps_per_print"] == "2.000000e+03"


def test_deepspeed_bf16() -> None:
    assert {e.data["config"]["precision"] for e in configs(deepspeed_config(fp16=False))} == {"bf16"}


def test_hf_training_arguments_on_one_line() -> None:
    (event,) = configs([HF_ONE_LINE])
    assert event.data["source"] == "hf-training-args"
    assert event.data["config"] == {
        "gradient_accumulation_steps": 8,
        "load": None,
        "lr": 5e-05,
        "lr_schedule": "linear",
        "lr_warmup": 8.0,
        "micro_batch_size": 4,
        "precision": "fp16",
        "seed": 42,
    }
    raw = event.data["raw"]
    assert raw["fsdp_config"] == "{'min_num_params': 0, 'xla': False}" and raw["mp_parameters"] == ""


def test_hf_training_arguments_one_per_line() -> None:
    (event,) = configs(["Loading the model", *HF_LINES, "***** Running training *****"])
    assert event.line == 2
    assert event.data["config"] == {
        "gradient_accumulation_steps": 4,
        "load": "/ckpt/checkpoint-2000",
        "lr": 0.0003,
        "lr_schedule": "cosine",
        "lr_warmup": 0.03,
        "micro_batch_size": 2,
        "precision": "bf16",
        "seed": 7,
        "train_iters": 5000,
    }
    assert event.data["raw"]["accelerator_config"] == "{'split_batches': False, 'dispatch_batches': None}"


@pytest.mark.parametrize("prefix", ["[default0]:", "0: ", "[rank0]: "])
def test_launcher_prefixes(prefix: str) -> None:
    lines = [*megatron_args(), *deepspeed_config(), *HF_LINES]
    plain = [(e.line, e.data) for e in configs(lines)]
    assert [(e.line, e.data) for e in configs([prefix + line for line in lines])] == plain
    assert len(plain) == 4


def test_a_hard_wrapped_value_is_joined() -> None:
    path = "/lustre/fsx/users/someone/datasets/the_pile/merged_deduplicated/pile_text_document_v2"
    lines = megatron_args(load=path)
    at = next(k for k, line in enumerate(lines) if line.startswith("  load "))
    cut = len(lines[at]) - 30  # the terminal wrapped the line 30 characters before its end
    lines[at : at + 1] = [lines[at][:cut], lines[at][cut:]]
    wrapped_list = megatron_args(data_path="['/data/a_text_document',")
    at = next(k for k, line in enumerate(wrapped_list) if "data_path" in line)
    wrapped_list.insert(at + 1, "'/data/b_text_document']")
    assert configs(lines)[0].data["config"]["load"] == path
    assert configs(wrapped_list)[0].data["config"]["data_path"] == "['/data/a_text_document', '/data/b_text_document']"


def test_a_block_cut_by_the_end_of_the_log_is_still_read() -> None:
    lines = megatron_args()[:-2]  # no end line: the process was killed while printing
    (event,) = configs(lines)
    assert event.data["config"]["precision"] == "fp16" and event.data["config"]["zero_stage"] == 0
    (user,) = configs(deepspeed_config()[:-6])[1:]  # the JSON ends in the middle of `fp16`
    assert user.data["config"]["initial_scale_power"] == 12


def test_a_block_cut_short_by_other_lines_ends_and_they_are_read() -> None:
    """Without its end line, a block ends after lines that are not its own, which the other
    parsers read: here Megatron's records (7-digit steps: `iteration  1000000/` has two spaces)."""
    records = [megatron_line(1_000_000 + k, 2.0, 1.0, total=2_000_000) for k in range(30)]
    lines = [*megatron_args()[:-2], *records]
    stream = LogStream(new_parsers())
    stream.feed("".join(f"{line}\n" for line in lines).encode())
    stream.close()
    taken = stream.take()
    assert [e.data["source"] for e in taken.events if e.kind is EventKind.CONFIG] == ["megatron-args"]
    assert len(taken.records) == 30


def test_two_starts_are_two_events_and_ranks_copies_one() -> None:
    first = megatron_args()
    second = megatron_args(fp16="False", bf16="True", no_load_optim="True")
    lines = [*first, *first, *megatron_records(10, 30), *second, *megatron_records(300, 10)]
    found = configs(lines)
    assert [(e.step, e.data["config"]["precision"]) for e in found] == [(None, "fp16"), (300, "bf16")]
    hf_copies = [HF_ONE_LINE, HF_ONE_LINE.replace("node1", "node2"), HF_ONE_LINE[:300]]  # the last one cut short
    assert len(configs(hf_copies)) == 1


def test_a_start_right_after_another_block_opens_a_new_one() -> None:
    """A block whose end line is missing ends at the next block's first line."""
    lines = [*megatron_args()[:-2], *megatron_args(seed="42")]
    assert [e.data["config"]["seed"] for e in configs(lines)] == [1234, 42]


def test_a_block_cut_short_is_written_before_the_events_after_it() -> None:
    """A block is written when it ends (here at a line another parser made an event of), at its
    first line: before the events of the lines after it."""
    loading = " loading checkpoint from /ckpt/run1 at iteration 2000"
    whole = events([*megatron_args()[:-2], "> building index ...", loading, *megatron_records(2010, 25)])
    assert [(e.kind, e.line) for e in whole[:2]] == [(EventKind.CONFIG, 2), (EventKind.CHECKPOINT_LOAD, 30)]


@pytest.mark.parametrize("chunk", [97, 4096])
def test_the_events_are_the_same_in_any_chunks(chunk: int) -> None:
    """Also where a block after records read in bulk (the format known) spans two chunks."""
    restart = [*megatron_args(seed="7"), *deepspeed_config(), *HF_LINES]
    lines = [*megatron_args(), *megatron_records(10, 25), *restart, *megatron_records(260, 25)]
    whole = [(e.kind, e.line, e.data) for e in events(lines)]
    assert [(e.get("source"), e.get("config", {}).get("seed")) for _, _, e in whole] == [
        ("megatron-args", 1234),
        ("megatron-args", 7),
        ("deepspeed-config", None),
        ("deepspeed-json", None),
        ("hf-training-args", 7),
    ]
    assert [(e.kind, e.line, e.data) for e in events(lines, chunk=chunk)] == whole


def test_a_traceback_showing_code_that_builds_training_arguments_is_still_an_error() -> None:
    lines = [
        "Traceback (most recent call last):",
        '  File "train.py", line 31, in <module>',
        "    args = TrainingArguments(",
        "TypeError: __init__() got an unexpected keyword argument 'evaluation_strategy'",
    ]
    found = events(lines)
    assert [e.kind for e in found] == [EventKind.ERROR]


def test_lines_that_merely_mention_the_keywords_are_no_block() -> None:
    lines = [
        "parsing arguments --- done",
        "usage: pretrain_gpt.py [-h] ... -- arguments -- are invalid",
        "warning: TrainingArguments() got deprecated field",
        *megatron_records(10, 5),
    ]
    assert configs(lines) == []


def _log(tmp_path: Path) -> Path:
    log = tmp_path / "train.log"
    lines = [*megatron_args(), *deepspeed_config(), *megatron_records(10, 30)]
    log.write_text("".join(f"[default0]:{line}\n" for line in lines))
    return log


def test_check_json_gives_each_files_configs(tmp_path: Path) -> None:
    log = _log(tmp_path)
    p = no_traceback(run_cli("check", "--output", "json", str(log)))
    (entry,) = strict_json(p.stdout)["files"]
    found = entry["configs"]
    assert [(c["line"], c["step"], c["source"]) for c in found] == [
        (2, None, "megatron-args"),
        (31, None, "deepspeed-config"),
        (44, None, "deepspeed-json"),
    ]
    assert found[0]["config"]["precision"] == "fp16" and "raw" not in found[0]


def test_export_configs_writes_json_lines(tmp_path: Path) -> None:
    log, out = _log(tmp_path), tmp_path / "configs.jsonl"
    p = no_traceback(run_cli("export", str(log), "--configs", "--out", str(out)))
    assert p.returncode == 0 and p.stdout.startswith(f"wrote 3 configs to {out}"), p.stdout + p.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["source"] for r in rows] == ["megatron-args", "deepspeed-config", "deepspeed-json"]
    assert rows[0]["raw"]["lr"] == "0.00015" and rows[0]["config"]["lr"] == 0.00015
    assert rows[1]["ts"] == pytest.approx(1709366401.885)
    bad = no_traceback(run_cli("export", str(log), "--configs", "--out", str(tmp_path / "c.csv")))
    assert bad.returncode != 0 and "--configs writes JSON lines" in bad.stderr


def _real_logs() -> list[Path]:
    return sorted(p for folder in real_folders() for p in folder.rglob("*.log"))


_HEADERS = {
    "megatron-args": re.compile(r"-{3,} arguments -{3,}"),
    "deepspeed-config": re.compile(r"DeepSpeedEngine configuration"),
    "hf-training-args": re.compile(r"TrainingArguments\("),
}


def test_real_logs_blocks_are_read() -> None:
    """Every real log that prints a block has its event; each event's canonical keys say what
    its raw keys say; ranks' copies before a record are one event."""
    logs = _real_logs()
    if not logs:
        pytest.skip("real samples not present")
    seen: dict[str, int] = {}
    for log in logs:
        text = log.read_text(errors="replace")
        found = configs(text.splitlines())
        sources = [e.data["source"] for e in found]
        for source, header in _HEADERS.items():
            printed = len(header.findall(text))
            assert (sources.count(source) > 0) == (printed > 0), (log.name, source)
            assert sources.count(source) <= printed, (log.name, source)
            seen[source] = seen.get(source, 0) + sources.count(source)
        for event in found:
            _agrees_with_raw(event.data["config"], event.data["raw"], log.name)
    assert all(seen.get(source) for source in _HEADERS), seen


def _agrees_with_raw(config: dict[str, Any], raw: dict[str, str], name: str) -> None:
    assert set(config) <= set(KEYS), name
    for key in ("lr", "seed", "world_size", "hysteresis"):
        if raw.get(key) not in (None, "None") and key in config:
            assert config[key] == float(raw[key]), (name, key)
    if raw.get("fp16") == "True":
        assert config["precision"] == "fp16", name

"""The FSDP trainers' configuration dumps become `config` events: OLMo's `TrainConfig(...)` and
torchtitan's `Running with args: {...}` (one repr on one line, nested configs as dotted keys),
torchrun's launch configs (the node count) and NeMo's experiment YAML; the logit-drift hint names
the reduce dtype and the nodes they printed, end to end through `gradwatch check`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gradwatch.events import EventKind
from gradwatch.parsers._config_repr import flat_repr
from gradwatch.synth import Anomaly, RunSpec, generate
from tests.conftest import check_json
from tests.test_config_blocks import configs, events

#: OLMo's logger header (olmo/util.py `setup_logging`, tabs as the synth's OLMo records print them)
OLMO = "2024-03-07 08:00:02.114 node-308:0  train:89  INFO    "
TITAN = "[rank0]:[titan] 2025-03-02 08:00:01,000 - root - INFO - "
TORCHRUN = "[2024-03-07 08:00:00,549] torch.distributed.launcher.api: [INFO] "


def olmo_config(precision: str = "amp_bf16", fsdp: str = "pure", strategy: str = "'fsdp'") -> list[str]:
    """OLMo's `log.info("Configuration:")` then `log.info(cfg)`: the dataclass repr on one line
    (its StrEnum members print quoted, torch's ShardingStrategy as an enum member)."""
    repr_ = (
        "TrainConfig(run_name='olmo-1b', seed=6198, epoch=0, dry_run=False, model=ModelConfig(d_model=2048, "
        "n_heads=16, vocab_size=50280, embedding_size=50304, init_fn='mitchell', precision=None), "
        "optimizer=OptimizerConfig(name='adamw', learning_rate=0.0004, weight_decay=0.1, betas=(0.9, 0.95)), "
        "scheduler=SchedulerConfig(name='cosine_with_warmup', t_warmup=2000, t_max=None, alpha_f=0.1), "
        "data=DataConfig(paths=['s3://bucket/part-0.npy', 's3://bucket/part-1.npy'], datasets=None, num_workers=16), "
        "evaluators=[EvaluatorConfig(label='c4', type='lm', data=DataConfig(paths=None, "
        "datasets={'c4-validation': ['s3://bucket/val.npy']}))], tokenizer=TokenizerConfig("
        "identifier='tokenizers/allenai_gpt-neox-olmo-dolma-v1_5.json', truncate_direction='right'), "
        "save_folder='/ckpt/olmo-1b', load_path='/ckpt/olmo-1b/step1000', reset_optimizer_state=False, "
        "max_duration=739328, global_train_batch_size=2048, device_train_batch_size=16, "
        f"device_train_microbatch_size=8, precision='{precision}', fsdp=FSDPConfig(use_orig_params=True, "
        f"sharding_strategy=<ShardingStrategy.FULL_SHARD: 1>, wrapping_strategy=None, precision='{fsdp}'), "
        f"softmax_auxiliary_loss=True, distributed_strategy={strategy})"
    )
    return [OLMO + "Configuration:", OLMO + repr_]


def test_olmo_config_under_its_rich_handler() -> None:
    """On a terminal OLMo logs through rich: time, level, `[logger:line, rank=N]`, the message."""
    lines = [f"[2024-03-07 08:00:02] INFO     [train:89, rank=0] {line.removeprefix(OLMO)}" for line in olmo_config()]
    assert only_config(lines)["fsdp_reduce_dtype"] == "bfloat16"


def torchrun_launch(nodes: int, per_node: int = 8) -> list[str]:
    """torchrun's launch configs (torch/distributed/launcher/api.py), each line with its header."""
    entries = [
        ("entrypoint", "scripts/train.py"),
        ("min_nodes", str(nodes)),
        ("max_nodes", str(nodes)),
        ("nproc_per_node", str(per_node)),
        ("run_id", "olmo-1b"),
        ("rdzv_backend", "c10d"),
        ("rdzv_endpoint", "10.1.96.108:29500"),
        ("rdzv_configs", "{'timeout': 900}"),
        ("max_restarts", "0"),
    ]
    return [
        TORCHRUN + "Starting elastic_operator with launch configs:",
        *(f"{TORCHRUN}  {key:<17}: {value}" for key, value in entries),
    ]


def titan_args(reduce: str = "float32", shard: int = -1) -> list[str]:
    """torchtitan's `Running with args: {job_config.to_dict()}` (`--job.print_args`)."""
    return [
        TITAN + "Running with args: {'job': {'config_file': './train_configs/llama3_8b.toml', 'print_args': True}, "
        "'model': {'name': 'llama3', 'flavor': '8B', 'hf_assets_path': './assets/hf/Llama-3.1-8B'}, "
        "'optimizer': {'name': 'AdamW', 'lr': 0.0003, 'eps': 1e-08}, 'lr_scheduler': {'warmup_steps': 200, "
        "'decay_ratio': None, 'decay_type': 'linear', 'min_lr_factor': 0.0}, 'training': {'dataset': 'c4', "
        "'dataset_path': None, 'local_batch_size': 1, 'global_batch_size': -1, 'seq_len': 8192, 'steps': 1000, "
        f"'mixed_precision_param': 'bfloat16', 'mixed_precision_reduce': '{reduce}', 'seed': 42}}, "
        "'parallelism': {'data_parallel_replicate_degree': 1, "
        f"'data_parallel_shard_degree': {shard}, 'tensor_parallel_degree': 2, 'pipeline_parallel_degree': 1, "
        "'context_parallel_degree': 1}, 'checkpoint': {'enable_checkpoint': True, 'initial_load_path': None}}",
        TITAN + "Starting job: Llama 3 8B training",
    ]


def only_config(lines: list[str]) -> dict[str, Any]:
    (event,) = configs(lines)
    config: dict[str, Any] = event.data["config"]
    return config


def test_olmo_train_config_is_one_event_with_the_fsdp_reduce_dtype() -> None:
    (event,) = configs(olmo_config())
    assert (event.line, event.data["source"]) == (2, "olmo-config")
    assert event.data["config"] == {
        "data_path": "['s3://bucket/part-0.npy', 's3://bucket/part-1.npy']",
        "fsdp_reduce_dtype": "bfloat16",
        "global_batch_size": 2048,
        "load": "/ckpt/olmo-1b/step1000",
        "load_optimizer": True,
        "lr": 0.0004,
        "lr_schedule": "cosine_with_warmup",
        "lr_warmup": 2000.0,
        "micro_batch_size": 8,
        "precision": "bf16",
        "seed": 6198,
        "tokenizer": "tokenizers/allenai_gpt-neox-olmo-dolma-v1_5.json",
        "train_iters": 739328,
        "vocab_size": 50280,
    }
    raw = event.data["raw"]
    assert raw["fsdp.precision"] == "'pure'" and raw["fsdp.sharding_strategy"] == "<ShardingStrategy.FULL_SHARD: 1>"
    assert raw["evaluators"].startswith("[EvaluatorConfig(label='c4'")  # (a list stays as printed)


@pytest.mark.parametrize(
    ("precision", "fsdp", "strategy", "reduce"),
    [
        ("amp_bf16", "mixed", "'fsdp'", "float32"),  # `mixed`: params in bf16, gradients reduced in fp32
        ("amp_fp16", "pure", "'fsdp'", "float16"),
        ("amp_bf16", "pure", "None", "bfloat16"),  # (older OLMo: no strategy printed, FSDP it is)
        ("amp_bf16", "pure", "'ddp'", None),  # DDP: no FSDP reduction
    ],
)
def test_olmo_reduce_dtype_follows_its_fsdp_precision(
    precision: str, fsdp: str, strategy: str, reduce: str | None
) -> None:
    lines = olmo_config(precision, fsdp, strategy)
    if strategy == "None":
        lines[-1] = lines[-1].replace(", distributed_strategy=None", "")
    assert only_config(lines).get("fsdp_reduce_dtype") == reduce


def test_a_repr_cut_short_still_gives_what_it_holds() -> None:
    head, line = olmo_config()
    cut = line[: line.index("precision='pure'") + len("preci")]  # (it ends inside `fsdp=FSDPConfig(`)
    config = only_config([head, cut])
    assert config["precision"] == "bf16" and config["seed"] == 6198 and "fsdp_reduce_dtype" not in config


def test_code_that_builds_a_train_config_is_no_block() -> None:
    lines = [
        "Traceback (most recent call last):",
        '  File "scripts/train.py", line 310, in <module>',
        "    cfg = TrainConfig.load(yaml_path, [clean_opt(s) for s in args_list])",
        "    return TrainConfig(run_name=name, seed=seed)",
        "olmo.exceptions.OLMoConfigurationError: Missing key run_name",
    ]
    assert configs(lines) == []


def test_torchtitan_args_give_the_reduce_dtype_and_the_world_of_its_degrees() -> None:
    (event,) = configs(titan_args("bfloat16", shard=64))
    assert event.data["source"] == "torchtitan-config"
    assert event.data["config"] == {
        "data_path": "c4",
        "fsdp_reduce_dtype": "bfloat16",
        "load": None,
        "lr": 0.0003,
        "lr_schedule": "linear",
        "lr_warmup": 200.0,
        "micro_batch_size": 1,
        "precision": "bf16",
        "seed": 42,
        "tokenizer": "./assets/hf/Llama-3.1-8B",
        "train_iters": 1000,
        "world_size": 128,
    }
    assert event.data["raw"]["parallelism.data_parallel_shard_degree"] == "64"
    # a shard degree of -1 takes the rest of the world: its size is not printed
    assert "world_size" not in only_config(titan_args())


def test_torchrun_launch_configs_give_the_nodes_and_the_next_line_is_read_on() -> None:
    record = f"{OLMO.replace('train:89', 'olmo.train:908')}[step=1/10,epoch=0]"
    found = events([*torchrun_launch(32), record, "    train/CrossEntropyLoss=10.77"])
    (event,) = [e for e in found if e.kind is EventKind.CONFIG]
    assert (event.line, event.data["source"], event.data["config"]) == (
        1,
        "torchrun-launch",
        {"nodes": 32, "world_size": 256},
    )
    assert event.data["raw"]["rdzv_endpoint"] == "10.1.96.108:29500"
    elastic = [line.replace(": 32", ": 4") if "min_nodes" in line else line for line in torchrun_launch(32)]
    assert only_config(elastic) == {"nodes": 32}  # (an elastic 4:32 run: its world is not known)


def test_nested_reprs_flatten_to_dotted_keys() -> None:
    assert flat_repr("a=1, b=B(c='x, y', d={'e': [1, 2]}), f=<E.G: 1>") == {
        "a": "1",
        "b.c": "'x, y'",
        "b.d.e": "[1, 2]",
        "f": "<E.G: 1>",
    }
    assert flat_repr("'deep': " + "{'k': " * 50 + "1" + "}" * 50)  # (no recursion error)
    assert flat_repr("not a repr at all") == {}


NEMO = "[NeMo I 2023-01-18 07:39:41 megatron_gpt_pretraining:{}] "
NEMO_YAML = """name: megatron_gpt
restore_from_path: null
trainer:
  devices: 8
  num_nodes: 4
  precision: bf16-mixed
  max_steps: 300000
exp_manager:
  checkpoint_callback_params:
    monitor: val_loss
model:
  micro_batch_size: 4
  global_batch_size: 256
  rampup_batch_size: null
  seed: 1234
  fsdp: true
  fsdp_grad_reduce_dtype: bf16
  tokenizer:
    library: megatron
    type: GPT2BPETokenizer
    model: null
  data:
    data_prefix:
    - 0.5
    - /data/pile_00_text_document
    splits_string: 900,50,50
  optim:
    name: distributed_fused_adam
    lr: 0.0002
    sched:
      name: CosineAnnealing
      warmup_steps: 500
      min_lr: 2.0e-05
"""


def nemo_config() -> list[str]:
    """NeMo 1.x: `logging.info("\\n\\n*** Experiment configuration ***")` then `OmegaConf.to_yaml(cfg)`,
    each message's lines after the first indented by its formatter."""
    banner = [NEMO.format(36), "    ", "    ************** Experiment configuration ***********"]
    return [*banner, NEMO.format(37), *(f"    {line}" for line in NEMO_YAML.splitlines()), "    "]


def test_nemo_yaml_is_one_event_with_dotted_keys_and_its_next_message_is_read_on() -> None:
    after = "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    found = events([*nemo_config(), *nemo_config(), after])  # (two ranks print it)
    (event,) = [e for e in found if e.kind is EventKind.CONFIG]
    assert (event.line, event.data["source"]) == (3, "nemo-yaml")
    assert event.data["config"] == {
        "data_path": "[0.5, /data/pile_00_text_document]",
        "fsdp_reduce_dtype": "bfloat16",
        "global_batch_size": 256,
        "load": None,
        "lr": 0.0002,
        "lr_schedule": "CosineAnnealing",
        "lr_warmup": 500.0,
        "micro_batch_size": 4,
        "min_lr": 2e-05,
        "nodes": 4,
        "precision": "bf16",
        "rampup_batch_size": None,
        "seed": 1234,
        "tokenizer": "GPT2BPETokenizer",
        "train_iters": 300000,
        "world_size": 32,
    }
    assert event.data["raw"]["exp_manager.checkpoint_callback_params.monitor"] == "val_loss"
    assert [(e.kind, e.line) for e in found[1:]] == [(EventKind.ERROR, 2 * len(nemo_config()) + 1)]


def test_nemo_yaml_keeps_its_nesting_behind_srun_labels() -> None:
    """`srun --label` puts `0: ` before each line: the indentation after it is the YAML's own."""
    labelled = [f"0: {line}" for line in nemo_config()]
    (event,) = [e for e in events(labelled) if e.kind is EventKind.CONFIG]
    assert event.data["raw"]["exp_manager.checkpoint_callback_params.monitor"] == "val_loss"
    assert (event.data["config"]["nodes"], event.data["config"]["min_lr"]) == (4, 2e-05)


def olmo_run(path: Path, nodes: int, drift: bool) -> Path:
    """An OLMo run on `nodes` nodes with bf16 FSDP reduction: torchrun's launch configs, OLMo's
    configuration, then its records (z-loss on); the output-logit norm drifts from step 1,800 when
    `drift`, the loss staying flat."""
    anomalies = (Anomaly("logit_norm_drift", 1800),) if drift else ()
    records = "".join(generate(RunSpec(fmt="olmo", steps=3000, seed=6, z_loss=True, anomalies=anomalies)))
    head = [*torchrun_launch(nodes), *olmo_config()]
    path.write_text("".join(f"{line}\n" for line in head) + records)
    return path


def test_the_32_node_runs_drift_is_flagged_with_its_reduce_dtype_and_nodes_the_4_node_run_is_quiet(
    tmp_path: Path,
) -> None:
    big = olmo_run(tmp_path / "olmo-32-nodes.log", 32, drift=True)
    small = olmo_run(tmp_path / "olmo-4-nodes.log", 4, drift=False)
    report = check_json(str(big), str(small))
    files = {Path(f["path"]).name: f for f in report["files"]}
    alerts = {name: [a for a in report["alerts"] if Path(a["path"]).name == name] for name in files}
    drifts = [a for a in alerts[big.name] if a["detector"] == "logit_norm_drift"]
    assert drifts and all(a["severity"] in ("warning", "critical") for a in drifts), alerts[big.name]
    hint = drifts[0]["hint"]
    assert "bfloat16 (fsdp_reduce_dtype) on 32 nodes, 256 GPUs" in hint and "reduce_dtype=float32" in hint, hint
    assert [c["source"] for c in files[big.name]["configs"]] == ["torchrun-launch", "olmo-config"]
    assert [a for a in alerts[small.name] if a["severity"] in ("warning", "critical")] == []
    assert files[small.name]["configs"][0]["config"] == {"nodes": 4, "world_size": 32}


@pytest.mark.parametrize("chunk", [97, 4096, 1 << 20])
def test_the_events_are_the_same_in_any_chunks(chunk: int) -> None:
    lines = [*torchrun_launch(4), *olmo_config(), *titan_args(), *nemo_config(), "Training complete"]
    found = [(e.line, e.data["source"], e.data["config"]) for e in configs(lines, chunk)]
    assert [(line, source) for line, source, _ in found] == [
        (1, "torchrun-launch"),
        (12, "olmo-config"),
        (13, "torchtitan-config"),
        (17, "nemo-yaml"),
    ]
    assert found == [(e.line, e.data["source"], e.data["config"]) for e in configs(lines)]


#: OLMo-core's scripts: `rich.print(config)` on rank 0, the dataclass pretty-printed a field a line
OLMO_CORE_CONFIG = """ExperimentConfig(
    run_name='olmo2-7b',
    model=TransformerConfig(
        d_model=4096,
        vocab_size=100278,
        n_layers=32,
    ),
    dataset=NumpyFSLDatasetConfig(
        tokenizer=TokenizerConfig(
            vocab_size=100278,
            identifier='allenai/dolma2-tokenizer',
        ),
        paths=['s3://bucket/part-0.npy', 's3://bucket/part-1.npy'],
    ),
    train_module=TransformerTrainModuleConfig(
        rank_microbatch_size=8192,
        optim=SkipStepAdamWConfig(
            group_overrides=[
                OptimGroupOverride(params=['embeddings.weight'], opts={'weight_decay': 0.0})
            ],
            lr=0.0003,
            betas=(0.9, 0.95),
        ),
        scheduler=CosWithWarmup(warmup_steps=2000, alpha_f=0.1),
        dp_config=TransformerDataParallelConfig(
            name=<DataParallelType.hsdp: 'hsdp'>,
            param_dtype=<DType.bfloat16: 'bfloat16'>,
            reduce_dtype=<DType.float32: 'float32'>,
        ),
    ),
    init_seed=12536,
    load_path=None,
)"""


def test_olmo_cores_pretty_printed_config_is_one_event() -> None:
    marker = "[2025-02-20 15:18:04] INFO     [olmo_core.train.callbacks.console_logger:62, rank=0] [step=1/7,epoch=1]"
    lines = [f"[rank0]:{line}" for line in OLMO_CORE_CONFIG.splitlines()]
    (event,) = [e for e in events([*lines, marker, "    train/CE loss=11.03"]) if e.kind is EventKind.CONFIG]
    assert (event.line, event.data["source"]) == (1, "olmo-config")
    assert event.data["config"] == {
        "data_path": "['s3://bucket/part-0.npy', 's3://bucket/part-1.npy']",
        "fsdp_reduce_dtype": "float32",
        "load": None,
        "lr": 0.0003,
        "lr_warmup": 2000.0,
        "precision": "bf16",
        "seed": 12536,
        "tokenizer": "allenai/dolma2-tokenizer",
        "vocab_size": 100278,
    }

"""From a configuration block's keys as printed to the canonical keys of `run_config.KEYS`.

Each block shape names things its own way (`fp16 .... True`, `fp16_enabled`, `"fp16": {"enabled":
true}`, `fp16=True`); `canonical` reads the raw mapping of one block (key -> value as text) into
the few settings gradwatch compares between starts. A key whose value cannot be read as its kind
says (`auto`, a garbled number) is left out; a value printed as `None`/`null` is kept as None (the
run was told "not set", which differs from a start that set it).
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Callable
from typing import Any

_NONE = frozenset({"none", "null", ""})
#: `SchedulerType.LINEAR`, `IntervalStrategy.NO`, `<DType.bfloat16: 'bfloat16'>`: the enum's member is the value
_ENUM = re.compile(r"^[A-Z]\w*\.(\w+)$|^<[A-Z]\w*\.(\w+): [^<>]*>$")
#: DeepSpeed's `dynamic_loss_scale_args`: `{'init_scale': 4096, 'scale_window': 500, ...}`
_DICT_ENTRY = re.compile(r"'(\w+)':\s*([^,}]+)")


def _unquote(text: str) -> str:
    return text.strip().strip("'\"").strip()


def _is_none(text: str) -> bool:
    return _unquote(text).lower() in _NONE


def as_bool(text: str) -> bool | None:
    """`True`, `false`, `"true"`; None for `None`; ValueError for anything else (`auto`)."""
    value = _unquote(text).lower()
    if value in _NONE:
        return None
    if value in ("true", "false"):
        return value == "true"
    raise ValueError(text)


def as_float(text: str) -> float | None:
    if _is_none(text):
        return None
    value = float(_unquote(text))
    if not math.isfinite(value):
        raise ValueError(text)
    return value


def as_int(text: str) -> int | None:
    """An integral number, also as printed by Python (`1000.0`) or JSON (`2.000000e+03`)."""
    value = as_float(text)
    if value is None:
        return None
    if value != int(value):
        raise ValueError(text)
    return int(value)


def as_text(text: str) -> str | None:
    """The value as printed (quotes off, an enum's member lowercased), None for `None`/`null`."""
    if _is_none(text):
        return None
    value = _unquote(text)
    m = _ENUM.match(value)
    return (m.group(1) or m.group(2)).lower() if m else value


def as_power(text: str) -> int | None:
    """A loss scale (`4294967296`) as the power of two it is (32); ValueError if it is none."""
    value = as_float(text)
    if value is None:
        return None
    power = math.log2(value) if value > 0 else math.nan
    if power != round(power):
        raise ValueError(text)
    return round(power)


Convert = Callable[[str], Any]


class _Reading:
    """The canonical keys read so far from one block's raw mapping."""

    def __init__(self, raw: dict[str, str]) -> None:
        self.raw = raw
        self.config: dict[str, Any] = {}

    def value(self, key: str, convert: Convert) -> Any:
        """The raw key's value converted; None where it is absent, `None` or unreadable."""
        text = self.raw.get(key)
        if text is None:
            return None
        try:
            return convert(text)
        except (ValueError, OverflowError):
            return None

    def take(self, canonical: str, convert: Convert, *keys: str) -> None:
        """Set `canonical` from the first of `keys` that the block printed and that reads."""
        for key in keys:
            if key in self.raw:
                try:
                    self.config[canonical] = convert(self.raw[key])
                except (ValueError, OverflowError):
                    continue
                return

    def set(self, canonical: str, value: Any) -> None:
        if value is not None:
            self.config[canonical] = value

    def precision(self, fp16: str, bf16: str) -> None:
        """fp16 or bf16 from the two flags; fp32 where the fp16 flag is printed false and the bf16
        one is too, or is not printed (a version before bf16)."""
        half, brain = self.value(fp16, as_bool), self.value(bf16, as_bool)
        if half:
            self.config["precision"] = "fp16"
        elif brain:
            self.config["precision"] = "bf16"
        elif half is False:
            self.config["precision"] = "fp32"


def _megatron(r: _Reading) -> None:
    r.precision("fp16", "bf16")
    for key in ("lr", "min_lr", "min_loss_scale"):
        r.take(key, as_float, key)
    integers = ("global_batch_size", "micro_batch_size", "seed", "world_size", "zero_stage", "train_iters")
    for key in (*integers, "loss_scale_window", "hysteresis"):  # (`1000.0` in some forks: as_int reads it)
        r.take(key, as_int, key)
    r.take("nodes", as_int, "nnodes", "num_nodes")
    r.take("lr_schedule", as_text, "lr_decay_style")
    r.take("override_lr_scheduler", as_bool, "override_lr_scheduler")
    r.take("rampup_batch_size", as_text, "rampup_batch_size")
    r.take("finetune", as_bool, "finetune")
    r.take("load", as_text, "load")
    r.take("initial_scale_power", as_power, "initial_loss_scale")
    r.take("vocab_size", as_int, "padded_vocab_size")
    if "loss_scale" in r.raw:  # Megatron prints None for a dynamic scale: 0, as DeepSpeed says it
        scale = r.value("loss_scale", as_float)
        r.config["loss_scale"] = scale or 0.0
    if "no_load_optim" in r.raw:
        r.config["load_optimizer"] = not r.value("no_load_optim", as_bool)
    warmup_iters = r.value("lr_warmup_iters", as_int)
    fraction = r.value("lr_warmup_fraction", as_float)
    if warmup_iters:
        r.config["lr_warmup"] = float(warmup_iters)
    elif fraction is not None:
        r.config["lr_warmup"] = fraction
    elif r.value("lr_warmup_samples", as_int):
        r.take("lr_warmup_samples", as_int, "lr_warmup_samples")
    elif "lr_warmup_iters" in r.raw:
        r.config["lr_warmup"] = 0.0
    data = "data_path" if not _is_none(r.raw.get("data_path", "")) else "train_data_path"  # (split sets)
    r.take("data_path", as_text, data)
    r.set("tokenizer", _tokenizer(r, "tokenizer_type", "tokenizer_model", "vocab_file"))


def _tokenizer(r: _Reading, kind_key: str, *model_keys: str) -> str | None:
    """The tokenizer's type and its model (the first of `model_keys` set), as one text."""
    kind = r.value(kind_key, as_text)
    model = next((m for m in (r.value(key, as_text) for key in model_keys) if m), None)
    return " ".join(t for t in (kind, model) if t) or None


def _dynamic_scale(r: _Reading, key: str) -> None:
    """DeepSpeed's `dynamic_loss_scale_args` dict into the loss-scale keys."""
    args = dict(_DICT_ENTRY.findall(r.raw.get(key, "")))
    for name, canonical, convert in (
        ("init_scale", "initial_scale_power", as_power),
        ("scale_window", "loss_scale_window", as_int),
        ("delayed_shift", "hysteresis", as_int),
        ("min_scale", "min_loss_scale", as_float),
    ):
        if name in args:
            with contextlib.suppress(ValueError, OverflowError):
                r.set(canonical, convert(args[name]))


def _deepspeed_engine(r: _Reading) -> None:
    r.precision("fp16_enabled", "bfloat16_enabled" if "bfloat16_enabled" in r.raw else "bf16_enabled")
    r.take("global_batch_size", as_int, "train_batch_size")
    r.take("micro_batch_size", as_int, "train_micro_batch_size_per_gpu")
    r.take("gradient_accumulation_steps", as_int, "gradient_accumulation_steps")
    r.take("world_size", as_int, "world_size")
    r.take("zero_stage", as_int, "zero_optimization_stage")
    r.take("loss_scale", as_float, "loss_scale")
    r.take("initial_scale_power", as_power, "initial_dynamic_scale")
    _dynamic_scale(r, "dynamic_loss_scale_args")


def _deepspeed_json(r: _Reading) -> None:
    half = "fp16.enabled"
    brain = "bf16.enabled" if "bf16.enabled" in r.raw else "bfloat16.enabled"
    if half in r.raw or brain in r.raw:
        r.precision(half, brain)
    r.take("global_batch_size", as_int, "train_batch_size")
    r.take("micro_batch_size", as_int, "train_micro_batch_size_per_gpu")
    r.take("gradient_accumulation_steps", as_int, "gradient_accumulation_steps")
    r.take("zero_stage", as_int, "zero_optimization.stage")
    r.take("loss_scale", as_float, "fp16.loss_scale")
    r.take("initial_scale_power", as_int, "fp16.initial_scale_power")
    r.take("loss_scale_window", as_int, "fp16.loss_scale_window")
    r.take("hysteresis", as_int, "fp16.hysteresis")
    r.take("min_loss_scale", as_float, "fp16.min_loss_scale")
    r.take("lr", as_float, "optimizer.params.lr")
    r.take("lr_schedule", as_text, "scheduler.type")
    r.take("lr_warmup", as_float, "scheduler.params.warmup_num_steps")
    r.take("train_iters", as_int, "scheduler.params.total_num_steps")


def _hf_training_args(r: _Reading) -> None:
    r.precision("fp16", "bf16")
    r.take("lr", as_float, "learning_rate")
    r.take("seed", as_int, "seed")
    r.take("micro_batch_size", as_int, "per_device_train_batch_size")
    r.take("gradient_accumulation_steps", as_int, "gradient_accumulation_steps")
    r.take("lr_schedule", as_text, "lr_scheduler_type")
    r.take("load", as_text, "resume_from_checkpoint")
    steps, ratio = r.value("warmup_steps", as_float), r.value("warmup_ratio", as_float)
    r.set("lr_warmup", steps if steps or ratio is None else ratio)  # (HF: steps win over a ratio)
    max_steps = r.value("max_steps", as_int)
    if max_steps is not None and max_steps > 0:  # -1: as many as the epochs make
        r.config["train_iters"] = max_steps


#: a precision as the FSDP trainers print it (OLMo's `amp_bf16`, torchtitan's `bfloat16`)
_PRECISIONS = {
    **{name: "bf16" for name in ("bf16", "bfloat16")},
    **{name: "fp16" for name in ("fp16", "float16", "16")},
    **{name: "fp32" for name in ("fp32", "float32", "32")},
}
#: OLMo's autocast precision -> the dtype its `pure` FSDP precision reduces in
_AUTOCAST_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def as_precision(text: str) -> str | None:
    """`amp_bf16`, `bfloat16`, `torch.bfloat16` as 'bf16' ('fp16', 'fp32'); ValueError otherwise."""
    value = as_text(text)
    if value is None:
        return None
    name = value.lower().removeprefix("amp_").removeprefix("torch.")
    if name not in _PRECISIONS:
        raise ValueError(text)
    return _PRECISIONS[name]


def as_dtype(text: str) -> str | None:
    """A torch dtype as its name: `torch.bfloat16`, `'bf16'` -> 'bfloat16'; ValueError otherwise."""
    precision = as_precision(text)
    return None if precision is None else _AUTOCAST_DTYPE[precision]


def _olmo(r: _Reading) -> None:
    """OLMo's `TrainConfig` (olmo/config.py): FSDP reduces in the autocast dtype under its `pure`
    precision (the default), in float32 under `mixed`. OLMo-core's configs are told apart by
    their `train_module`."""
    if any(key.startswith("train_module.") for key in r.raw):
        _olmo_core(r)
        return
    r.take("precision", as_precision, "precision")
    r.take("lr", as_float, "optimizer.learning_rate")
    r.take("lr_schedule", as_text, "scheduler.name")
    r.take("lr_warmup", as_float, "scheduler.t_warmup")
    r.take("seed", as_int, "seed")
    r.take("global_batch_size", as_int, "global_train_batch_size")
    r.take("micro_batch_size", as_int, "device_train_microbatch_size")
    r.take("train_iters", as_int, "max_duration")  # (a duration in tokens, `2e12T`, is none)
    r.take("load", as_text, "load_path")
    r.take("data_path", as_text, "data.paths")
    r.take("tokenizer", as_text, "tokenizer.identifier")
    r.take("vocab_size", as_int, "model.vocab_size")
    if r.value("load_path", as_text) is not None and "reset_optimizer_state" in r.raw:
        r.set("load_optimizer", _negated(r.value("reset_optimizer_state", as_bool)))
    sharded = r.value("distributed_strategy", as_text) in (None, "fsdp") and "fsdp.precision" in r.raw
    autocast = r.config.get("precision")
    fsdp = r.value("fsdp.precision", as_text)
    if sharded and fsdp == "mixed":
        r.config["fsdp_reduce_dtype"] = "float32"
    elif sharded and fsdp == "pure" and autocast is not None:
        r.config["fsdp_reduce_dtype"] = _AUTOCAST_DTYPE[autocast]


def _olmo_core(r: _Reading) -> None:
    """OLMo-core's experiment config (its scripts' `ExperimentConfig`): the data-parallel config
    names FSDP's parameter and reduce dtypes. Its batch sizes count tokens, not samples: not read."""
    r.take("precision", as_precision, "train_module.autocast_precision", "train_module.dp_config.param_dtype")
    r.take("fsdp_reduce_dtype", as_dtype, "train_module.dp_config.reduce_dtype")
    r.take("lr", as_float, "train_module.optim.lr")
    r.take("lr_warmup", as_float, "train_module.scheduler.warmup_steps", "train_module.scheduler.warmup")
    r.take("seed", as_int, "init_seed", "data_loader.seed")
    r.take("load", as_text, "load_path", "trainer.load_path")
    r.take("tokenizer", as_text, "dataset.tokenizer.identifier")
    r.take("vocab_size", as_int, "model.vocab_size")
    r.take("data_path", as_text, "dataset.paths", "dataset.mix")


def _negated(flag: bool | None) -> bool | None:
    return None if flag is None else not flag


#: torchtitan's parallel degrees: the world is their product (`ParallelDims`; -1: the rest of it)
_TITAN_DEGREES = (
    "parallelism.data_parallel_replicate_degree",
    "parallelism.data_parallel_shard_degree",
    "parallelism.context_parallel_degree",
    "parallelism.tensor_parallel_degree",
    "parallelism.pipeline_parallel_degree",
)


def _torchtitan(r: _Reading) -> None:
    """torchtitan's `JobConfig.to_dict()` (sections `training`, `parallelism`, `optimizer`, ...;
    older versions kept the degrees and the warm-up under `training`)."""
    r.take("precision", as_precision, "training.mixed_precision_param", "parallelism.mixed_precision_param")
    r.take("fsdp_reduce_dtype", as_dtype, "training.mixed_precision_reduce", "parallelism.mixed_precision_reduce")
    r.take("lr", as_float, "optimizer.lr")
    r.take("lr_schedule", as_text, "lr_scheduler.decay_type")
    r.take("lr_warmup", as_float, "lr_scheduler.warmup_steps", "training.warmup_steps")
    r.take("seed", as_int, "training.seed")
    r.take("micro_batch_size", as_int, "training.local_batch_size", "training.batch_size")
    r.take("train_iters", as_int, "training.steps")
    path = r.value("training.dataset_path", as_text)  # (None: the dataset named)
    r.take("data_path", as_text, "training.dataset_path" if path else "training.dataset")
    r.take("tokenizer", as_text, "model.hf_assets_path", "model.tokenizer_path")
    r.take("load", as_text, "checkpoint.initial_load_path")
    batch = r.value("training.global_batch_size", as_int)
    if batch is not None and batch > 0:  # -1: one micro-batch per rank
        r.config["global_batch_size"] = batch
    degrees = [r.value(k, as_int) or r.value(k.replace("parallelism.", "training."), as_int) for k in _TITAN_DEGREES]
    if all(d is not None and d > 0 for d in degrees):
        r.config["world_size"] = math.prod(d for d in degrees if d is not None)


def _torchrun(r: _Reading) -> None:
    """torchrun's launch configs (torch/distributed/launcher/api.py): `max_nodes` nodes (an
    elastic `min:max` run may have fewer) of `nproc_per_node` processes."""
    nodes, per_node = r.value("max_nodes", as_int), r.value("nproc_per_node", as_int)
    r.set("nodes", nodes)
    if nodes is not None and per_node is not None and r.value("min_nodes", as_int) == nodes:
        r.config["world_size"] = nodes * per_node


def as_lightning_precision(text: str) -> str | None:
    """Lightning's precision (`bf16-mixed`, `16-mixed`, `bf16`, `16`, `32`, `32-true`) as 'bf16',
    'fp16' or 'fp32'; ValueError otherwise."""
    value = as_text(text)
    if value is None:
        return None
    bits = value.lower().split("-")[0]
    if bits not in ("bf16", "16", "32", "64"):
        raise ValueError(text)
    return {"bf16": "bf16", "16": "fp16"}.get(bits, "fp32")


def _nemo(r: _Reading) -> None:
    """NeMo's experiment YAML (`trainer:` Lightning's settings, `model:` Megatron's; NeMo 1.x
    configs such as megatron_gpt_config.yaml)."""
    r.take("precision", as_lightning_precision, "trainer.precision")
    r.take("nodes", as_int, "trainer.num_nodes")
    r.take("train_iters", as_int, "trainer.max_steps")
    r.take("micro_batch_size", as_int, "model.micro_batch_size")
    r.take("global_batch_size", as_int, "model.global_batch_size")
    r.take("rampup_batch_size", as_text, "model.rampup_batch_size")
    r.take("seed", as_int, "model.seed")
    r.take("lr", as_float, "model.optim.lr")
    r.take("min_lr", as_float, "model.optim.sched.min_lr")
    r.take("lr_schedule", as_text, "model.optim.sched.name")
    r.take("lr_warmup", as_float, "model.optim.sched.warmup_steps", "model.optim.sched.warmup_ratio")
    r.take("data_path", as_text, "model.data.data_prefix")
    r.set("tokenizer", _tokenizer(r, "model.tokenizer.type", "model.tokenizer.model"))
    r.take("load", as_text, "restore_from_path")
    r.take("initial_scale_power", as_power, "model.native_amp_init_scale")
    r.take("loss_scale_window", as_int, "model.native_amp_growth_interval")
    r.take("hysteresis", as_int, "model.hysteresis")
    devices = r.value("trainer.devices", as_int)
    if devices is not None and r.config.get("nodes") is not None:  # (`devices: auto`: not known)
        r.config["world_size"] = r.config["nodes"] * devices
    if r.value("model.fsdp", as_bool):
        r.take("fsdp_reduce_dtype", as_dtype, "model.fsdp_grad_reduce_dtype")


#: block source -> its reader
_READERS: dict[str, Callable[[_Reading], None]] = {
    "megatron-args": _megatron,
    "deepspeed-config": _deepspeed_engine,
    "deepspeed-json": _deepspeed_json,
    "hf-training-args": _hf_training_args,
    "olmo-config": _olmo,
    "torchtitan-config": _torchtitan,
    "torchrun-launch": _torchrun,
    "nemo-yaml": _nemo,
}


def canonical(source: str, raw: dict[str, str]) -> dict[str, Any]:
    """The canonical keys (`run_config.KEYS`) that a block of `source` printed, normalised."""
    reading = _Reading(raw)
    reader = _READERS.get(source)
    if reader is not None:
        reader(reading)
    return dict(sorted(reading.config.items()))

"""What a run was told at a start: the canonical keys of a `config` event.

Every trainer prints its configuration at start-up in a shape of its own (Megatron's
`arguments` block, DeepSpeed's engine configuration and JSON, the Hugging Face
`TrainingArguments(...)`, OLMo's, torchtitan's and NeMo's dumps). Parsers read such a block into
one `EventKind.CONFIG` event per start whose data holds:

- `config`: the canonical keys below that the block said (values normalised as listed);
- `raw`: every key as printed, with its value as text (what a user greps for);
- `source`: which block it was (`megatron-args`, `deepspeed-config`, `hf-training-args`, ...).

Detectors that need the configuration (the restart audit, hints) read the latest config event;
nothing else carries configuration state.
"""

from __future__ import annotations

#: canonical key -> what its value is
KEYS: dict[str, str] = {
    "precision": "'fp16', 'bf16' or 'fp32' (the training's compute precision)",
    "lr": "float: the peak learning rate",
    "min_lr": "float: the learning rate at the schedule's end",
    "lr_schedule": "str: the decay style (cosine, linear, ...)",
    "lr_warmup": "float: warm-up, in steps (>= 1) or as a fraction of training (< 1)",
    "lr_warmup_samples": "int: warm-up, in samples (Megatron's `lr_warmup_samples`)",
    "override_lr_scheduler": "bool: the schedule is taken from the arguments, not the checkpoint",
    "global_batch_size": "int: samples per optimizer step",
    "micro_batch_size": "int: samples per GPU per micro-step",
    "gradient_accumulation_steps": "int: micro-steps per optimizer step",
    "rampup_batch_size": "str: the batch ramp-up as printed (start, increment, samples)",
    "seed": "int",
    "world_size": "int: processes (GPUs)",
    "nodes": "int",
    "zero_stage": "int: DeepSpeed ZeRO stage",
    "fsdp_reduce_dtype": "str: the dtype FSDP reduces gradients in (bfloat16, float32)",
    "loss_scale": "float: a static loss scale; 0 means dynamic",
    "initial_scale_power": "int: a dynamic loss scale starts at 2**this",
    "loss_scale_window": "int: steps without overflow before the scale grows",
    "hysteresis": "int: overflows tolerated before the scale falls",
    "min_loss_scale": "float",
    "load": "str: the checkpoint path the run loads from",
    "load_optimizer": "bool: whether optimizer state is loaded with the checkpoint",
    "finetune": "bool: load the weights only, reset the step and the optimizer",
    "data_path": "str: the training data, as printed",
    "tokenizer": "str: the tokenizer's type or path",
    "vocab_size": "int",
    "train_iters": "int: the planned optimizer steps",
}

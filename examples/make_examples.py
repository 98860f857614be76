"""Write the example logs in examples/logs/ (deterministic: the same files on every run).

    python examples/make_examples.py

The logs are synthetic, made by gradwatch.synth in the real line formats of each trainer (see
../shared/formats.md), small enough to ship, and each tells one story that README uses.
"""

from __future__ import annotations

from pathlib import Path

from gradwatch.synth import Anomaly, RunSpec, write_log

HERE = Path(__file__).resolve().parent / "logs"

EXAMPLES: dict[str, RunSpec] = {
    # a healthy fp16 Megatron-DeepSpeed run: start-up loss-scale calibration and the normal
    # overflow sawtooth, which must raise no warning
    "megatron-ds-fp16-healthy.log": RunSpec(fmt="megatron-deepspeed", steps=800, seed=7),
    # an fp16 run continued from a checkpoint: the grad norm spikes, the loss scale halves down
    # to the floor after a cascade of overflows, and the loss jumps
    "megatron-ds-fp16-resume-collapse.log": RunSpec(
        fmt="megatron-deepspeed",
        start_step=24001,
        steps=700,
        seed=8,
        calibration=False,
        anomalies=(
            Anomaly("grad_norm_spike", 24300, magnitude=2.0),
            Anomaly("loss_scale_collapse", 24303, magnitude=2.0),
        ),
    ),
    # an OLMo run whose z-loss (the output-logit norm proxy) grows while the loss looks fine
    "olmo-zloss-drift.log": RunSpec(
        fmt="olmo", steps=1600, seed=9, z_loss=True, anomalies=(Anomaly("logit_norm_drift", 600, duration=900),)
    ),
    # a Hugging Face Trainer fine-tune whose loss collapses to 0 with a NaN grad norm (label fault)
    "hf-trainer-nan.log": RunSpec(
        fmt="hf-trainer", steps=3000, log_interval=10, seed=10, anomalies=(Anomaly("nonfinite", 2200),)
    ),
}


def main() -> None:
    HERE.mkdir(parents=True, exist_ok=True)
    for name, spec in EXAMPLES.items():
        labels = write_log(HERE / name, spec)
        print(f"{name}: {(HERE / name).stat().st_size // 1024} KiB, labels {[(a.kind, a.step) for a in labels]}")


if __name__ == "__main__":
    main()

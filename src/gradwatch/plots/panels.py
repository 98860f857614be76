"""Which metrics get a panel, on which scale, and which way is trouble.

Why one table: the HTML report, the PNG figure and check's sparklines must agree on how a metric
is read (a grad norm spans decades, a loss scale moves in powers of two, a loss-scale or throughput
*drop* is the bad direction), so they all look it up here.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from gradwatch.errors import UsageError


class Scale(str, Enum):
    LINEAR = "linear"
    LOG10 = "log10"
    LOG2 = "log2"


@dataclass(frozen=True)
class Panel:
    """One plot: its id, title, scale, and the metrics drawn on it.

    With `first_only`, only the first metric the log has is drawn (throughput: tokens/s, else
    TFLOP/s, else seconds per step); otherwise every metric present gets its own line.
    """

    id: str
    title: str
    scale: Scale
    metrics: tuple[str, ...]
    first_only: bool = False
    #: draw the fp16 overflow events of the log on this panel
    overflows: bool = False


PANELS: tuple[Panel, ...] = (
    Panel("loss", "loss", Scale.LINEAR, ("loss", "val_loss")),
    Panel("grad_norm", "grad norm (log10)", Scale.LOG10, ("grad_norm",)),
    Panel("loss_scale", "loss scale (log2), overflows marked", Scale.LOG2, ("loss_scale",), overflows=True),
    Panel("lr", "learning rate", Scale.LINEAR, ("lr",)),
    Panel("logit_norm", "output-logit norm", Scale.LINEAR, ("logit_norm",)),
    Panel("z_loss", "z-loss", Scale.LINEAR, ("z_loss",)),
    Panel("throughput", "throughput", Scale.LINEAR, ("tps", "tflops", "step_time_s"), first_only=True),
)

#: Units shown next to a metric's name where the name alone does not say it.
UNITS = {"tps": "tokens/s", "tflops": "TFLOP/s per GPU", "step_time_s": "s per step", "mfu": "%"}

#: Metrics that hold their value until the trainer changes it: drawn as steps, never as ramps.
STEPS = frozenset({"loss_scale"})

_SCALES = {"grad_norm": Scale.LOG10, "loss_scale": Scale.LOG2, "ppl": Scale.LOG10}
#: Metrics whose trouble is a fall (loss-scale collapse, throughput drop), not a rise.
FALL_IS_TROUBLE = frozenset({"loss_scale", "tps", "tflops", "mfu"})


def scale_of(metric: str) -> Scale:
    return _SCALES.get(metric, Scale.LINEAR)


def label(metric: str) -> str:
    """A metric's name with its unit, for legends and titles."""
    unit = UNITS.get(metric)
    return f"{metric} ({unit})" if unit else metric


def select(names: list[str] | None) -> tuple[Panel, ...]:
    """The panels for `--metrics` (metric or panel ids); all of them when not given."""
    if not names:
        return PANELS
    known = {p.id for p in PANELS} | {m for p in PANELS for m in p.metrics}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(f"--metrics: unknown {', '.join(unknown)}; choose from {', '.join(sorted(known))}")
    return tuple(p for p in PANELS if p.id in names or any(m in names for m in p.metrics))

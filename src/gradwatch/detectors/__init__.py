"""Detector registry: ids to classes, in the order their alerts are reported.

Plugin detectors register after the built-in ones (see `gradwatch.plugins`).
"""

from __future__ import annotations

import inspect
import re

from gradwatch.detectors.base import Detector, DetectorConfig
from gradwatch.detectors.grad_norm_spike import GradNormSpike
from gradwatch.detectors.logit_norm_drift import LogitNormDrift
from gradwatch.detectors.loss_collapse import LossCollapse
from gradwatch.detectors.loss_divergence import LossDivergence
from gradwatch.detectors.loss_plateau import LossPlateau
from gradwatch.detectors.loss_scale_collapse import LossScaleCollapse
from gradwatch.detectors.loss_spike import LossSpike
from gradwatch.detectors.nonfinite import Nonfinite
from gradwatch.detectors.resume_config import ResumeConfig
from gradwatch.detectors.resume_regression import ResumeRegression
from gradwatch.detectors.skipped_steps import SkippedSteps
from gradwatch.detectors.stall import Stall
from gradwatch.detectors.throughput_drop import ThroughputDrop
from gradwatch.detectors.trainer_error import TrainerError
from gradwatch.plugins import registry

__all__ = ["DETECTORS", "Detector", "DetectorConfig", "register"]

DETECTORS: dict[str, type[Detector]] = {}


def register(cls: type[Detector]) -> type[Detector]:
    """Add a detector class, checked now rather than at its first batch (pluggy-style).

    Raises `PluginError` naming the plugin and the mismatch: not a `Detector`, no `id` or
    `description`, a `Config` that is not a `DetectorConfig` dataclass with a default for every
    field, `update` not implemented, or an id another class holds.
    """
    registry.add(DETECTORS, "detector", "id", cls, _problem(cls))
    return cls


_ID = re.compile(r"[a-z][a-z0-9_]*\Z")


def _problem(cls: object) -> str | None:
    """What keeps `cls` from being a detector, in words; None when it fits."""
    if not (isinstance(cls, type) and issubclass(cls, Detector)):
        return "is not a subclass of gradwatch.api.Detector"
    if not (isinstance(getattr(cls, "id", None), str) and _ID.match(cls.id)):
        return "needs `id`: a snake_case str, also its section name under `detectors:` in the config"
    if not isinstance(getattr(cls, "description", None), str):
        return "needs `description`: a one-line str for `gradwatch detectors`"
    config = cls.Config
    if not (isinstance(config, type) and issubclass(config, DetectorConfig)):
        return f"`Config` must subclass gradwatch.api.DetectorConfig, got {config!r}"
    if "__dataclass_fields__" not in vars(config):
        return f"`Config` {config.__qualname__} must be decorated with @dataclass(frozen=True, kw_only=True)"
    if inspect.isabstract(cls):
        return f"does not implement {', '.join(sorted(cls.__abstractmethods__))}"
    try:
        config()
    except Exception as e:
        return f"`Config()` must work without arguments (a default for every field): {type(e).__name__}: {e}"
    return None


for _cls in (
    Nonfinite,
    TrainerError,
    GradNormSpike,
    LossSpike,
    LossDivergence,
    LossCollapse,
    LossPlateau,
    LossScaleCollapse,
    SkippedSteps,
    ResumeRegression,
    ResumeConfig,
    LogitNormDrift,
    Stall,
    ThroughputDrop,
):
    register(_cls)

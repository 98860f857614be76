"""Detector registry: ids to classes, in the order their alerts are reported."""

from __future__ import annotations

from gradwatch.detectors.base import Detector, DetectorConfig
from gradwatch.detectors.grad_norm_spike import GradNormSpike
from gradwatch.detectors.logit_norm_drift import LogitNormDrift
from gradwatch.detectors.loss_collapse import LossCollapse
from gradwatch.detectors.loss_divergence import LossDivergence
from gradwatch.detectors.loss_scale_collapse import LossScaleCollapse
from gradwatch.detectors.loss_spike import LossSpike
from gradwatch.detectors.nonfinite import Nonfinite
from gradwatch.detectors.resume_regression import ResumeRegression
from gradwatch.detectors.skipped_steps import SkippedSteps
from gradwatch.detectors.stall import Stall
from gradwatch.detectors.throughput_drop import ThroughputDrop

__all__ = ["DETECTORS", "Detector", "DetectorConfig", "register"]

DETECTORS: dict[str, type[Detector]] = {}


def register(cls: type[Detector]) -> type[Detector]:
    """Add a detector class; refuses an id that is taken by another class."""
    if cls.id in DETECTORS and DETECTORS[cls.id] is not cls:
        raise ValueError(f"detector id {cls.id!r} is already registered by {DETECTORS[cls.id]!r}")
    DETECTORS[cls.id] = cls
    return cls


for _cls in (
    Nonfinite,
    GradNormSpike,
    LossSpike,
    LossDivergence,
    LossCollapse,
    LossScaleCollapse,
    SkippedSteps,
    ResumeRegression,
    LogitNormDrift,
    Stall,
    ThroughputDrop,
):
    register(_cls)

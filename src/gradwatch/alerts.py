"""Alerts are data: what a detector found, where, and what to do about it."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from enum import IntEnum
from typing import Any


class Severity(IntEnum):
    """How bad: `info` (context, or an incident is over), `warning`, `critical`; ordered for --fail-on."""

    INFO = 0
    WARNING = 1
    CRITICAL = 2

    def __str__(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> Severity:
        try:
            return cls[text.upper()]
        except KeyError:
            raise ValueError(f"unknown severity {text!r} (info, warning or critical)") from None


@dataclass(frozen=True)
class Alert:
    """One incident: which detector, how bad, where (step, file, line), the numbers, and what to do.

    Detectors build them with `Detector.alert`, which fills in `detector` and `path`.
    """

    detector: str
    severity: Severity
    step: int | None
    metric: str | None
    value: float | None
    baseline: float | None
    threshold: float | None
    message: str
    hint: str
    line: int | None = None
    path: str | None = None
    #: the evidence file written for it with --snapshot-dir (None: none)
    snapshot: str | None = None
    #: the id of the incident it belongs to (`gradwatch.incidents`; None: none, or not grouped yet)
    incident: str | None = None
    #: every file of a run of several files (`--run`) that raised this same alert, `path` first;
    #: empty when only `path` did
    paths: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe dict: non-finite numbers become null so the output stays valid JSON."""
        out = asdict(self)
        out["severity"] = str(self.severity)
        out["paths"] = list(self.paths)
        for key in ("value", "baseline", "threshold"):
            v = out[key]
            out[key] = float(v) if v is not None and math.isfinite(v) else None
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Alert:
        """The inverse of `to_json` (non-finite numbers stay None), for alerts kept in state files."""
        known = {f.name for f in fields(cls)}
        kept = {k: v for k, v in data.items() if k in known}
        return cls(**{**kept, "severity": Severity.parse(data["severity"]), "paths": tuple(kept.get("paths", ()))})

    def sort_key(self) -> tuple[str, int, int]:
        return (self.path or "", self.line or 0, self.step or 0)

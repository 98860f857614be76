"""Alerts are data: what a detector found, where, and what to do about it."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from enum import IntEnum
from typing import Any


class Severity(IntEnum):
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

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe dict: non-finite numbers become null so the output stays valid JSON."""
        out = asdict(self)
        out["severity"] = str(self.severity)
        for key in ("value", "baseline", "threshold"):
            v = out[key]
            out[key] = float(v) if v is not None and math.isfinite(v) else None
        return out

    def sort_key(self) -> tuple[str, int, int]:
        return (self.path or "", self.line or 0, self.step or 0)

"""Generic JSON lines: one JSON object per line, keys mapped to canonical names by an alias table.

Line shapes covered:

    {"step": 10, "loss": 2.31, "grad_norm": 0.8, "lr": 3e-4}
    {"iteration": 11, "train/loss": NaN, "gradient_norm": Infinity}
    {"global_step": 12, "train": {"loss": "nan"}}            nested objects: keys joined with `/`

Only lines that start with `{"` (after the launcher prefix) are tried; a line that is not valid
JSON is left for the other parsers. `NaN`/`Infinity` (which Python's json accepts) and the strings
"nan"/"inf" are non-finite values. Without a step key a record gets one more than the previous
record's step. An object whose only known metric is the learning rate and that has no step key is
not a record (a configuration dump, not a training log).

A record's time is the line's own timestamp (a logger prefix) or else a `ts`, `timestamp` or
`_timestamp` (W&B) key: epoch seconds or milliseconds, or an ISO date string. Without it a JSON
log has no clock, and a hang between two records could not be seen.

The alias table is `JsonlParser.aliases` (`DEFAULT_ALIASES`); `JsonlParser(aliases=...)` adds or
overrides entries (the YAML config uses it). Targets must be `step` or a canonical metric name.
"""

from __future__ import annotations

import json
import math
from typing import Any

from gradwatch.errors import ConfigError
from gradwatch.events import EventKind
from gradwatch.parsers._text import is_nonfinite, number, timestamp
from gradwatch.parsers.base import ParseOutput, Parser
from gradwatch.records import METRICS, is_metric

DEFAULT_ALIASES: dict[str, str] = {
    "step": "step",
    "iteration": "step",
    "global_step": "step",
    "iter": "step",
    "loss": "loss",
    "train_loss": "loss",
    "train/loss": "loss",
    "grad_norm": "grad_norm",
    "gradient_norm": "grad_norm",
    "grad-norm": "grad_norm",
    "loss_scale": "loss_scale",
    "lr": "lr",
    "learning_rate": "lr",
    "logit_norm": "logit_norm",
    "output_logit_norm": "logit_norm",
    "z_loss": "z_loss",
    "ppl": "ppl",
    "perplexity": "ppl",
    "tps": "tps",
    "tokens_per_second": "tps",
    "tflops": "tflops",
    "mfu": "mfu",
    "val_loss": "val_loss",
}
#: keys holding the record's wall-clock time (not metrics)
TIME_KEYS = frozenset(("ts", "timestamp", "_timestamp"))
_MAX_DEPTH = 3
_MAX_STEP = 10**18  # a larger (or negative) step is garbage and would not fit int64


def _flatten(obj: dict[str, Any], prefix: str, into: dict[str, Any], depth: int) -> None:
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            if depth < _MAX_DEPTH:
                _flatten(value, name + "/", into, depth + 1)
        else:
            into[name] = value


def _epoch(value: Any) -> float | None:
    """Seconds since the epoch from a JSON time value (seconds, milliseconds or an ISO string)."""
    if isinstance(value, str):
        return timestamp(value)
    v = _value(value)
    if v is None or not math.isfinite(v):
        return None
    if 1e12 <= v < 1e14:  # milliseconds
        v /= 1000.0
    return v if 1e8 <= v < 1e11 else None


def _value(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        try:
            return float(value)
        except OverflowError:  # an int beyond float range
            return None
    if isinstance(value, str):
        try:
            return number(value)
        except ValueError:
            return None
    return None


class JsonlParser(Parser):
    name = "jsonl"
    scan = r"\{"
    description = 'JSON lines `{"step": N, "loss": X, ...}` with a configurable key alias table'

    #: JSON key -> `step` or a canonical metric name; a subclass may replace the defaults here
    aliases: dict[str, str] = DEFAULT_ALIASES

    def __init__(self, aliases: dict[str, str] | None = None) -> None:
        merged = dict(type(self).aliases)
        for key, target in (aliases or {}).items():
            if target != "step" and not is_metric(target):
                raise ConfigError(
                    f"jsonl alias {key!r}: {target!r} is not `step` or a metric name; "
                    f"use one of: step, {', '.join(METRICS)}"
                )
            merged[key] = target
        self.aliases = merged
        self._lower = {k.lower(): v for k, v in merged.items()}
        self._step: int | None = None

    def parse(self, text: str, line: int, ts: float | None, out: ParseOutput) -> bool:
        if '{"' not in text:
            return False
        body = text.strip()
        if not body.startswith('{"'):
            return False
        try:
            obj = json.loads(body)
        except (ValueError, RecursionError):
            return False
        if not isinstance(obj, dict):
            return False
        flat: dict[str, Any] = {}
        _flatten(obj, "", flat, 1)
        step: int | None = None
        metrics: dict[str, float] = {}
        for key, raw in flat.items():
            target = self.aliases.get(key) or self._lower.get(key.lower())
            if target is None:
                if ts is None and key in TIME_KEYS:
                    ts = _epoch(raw)
                continue
            v = _value(raw)
            if v is None:
                continue
            if target == "step":
                if step is None and 0 <= v < _MAX_STEP:  # NaN fails too
                    step = int(v)
            elif target not in metrics:
                metrics[target] = v
        if not metrics or (step is None and metrics.keys() == {"lr"}):
            return False
        if step is None:
            step = (self._step or 0) + 1
        self._step = step
        nonfinite = [k for k, v in metrics.items() if is_nonfinite(v)]
        out.record(self.name, step, line, ts, metrics, nonfinite)
        if "val_loss" in metrics:
            out.event(EventKind.VALIDATION, line, step, ts, val_loss=metrics["val_loss"])
        return True

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

Bulk path: a run writes the same keys in the same order on every line, so the first record of a
flat shape (number or null values, a step key) becomes a template, and once the file is locked to
this parser, lines of exactly that shape with plain numbers are read in bulk: one regex pass and
one numeric conversion per block. NaN, strings, nested objects, other keys or spacing, a
`val_loss` (an event) go line by line. Such records carry their step, so they do not depend on
earlier lines; a step-less record read one by one takes `out.last_step`, the step of the latest
record before it, which in a locked file is this parser's.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np

from gradwatch.errors import ConfigError
from gradwatch.events import EventKind
from gradwatch.parsers._text import is_nonfinite, number, timestamp
from gradwatch.parsers.base import Block, BulkTrack, Hits, ParseOutput, Parser, TableHits, number_table
from gradwatch.parsers.jsonl_rows import Layout, find
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

# Bulk-path values: a JSON number that float() and numpy read alike and that stays finite (no
# bare `-0`, which json reads as the int 0), a step exact in float64, keys that need no escaping.
_NUMBER = r"(?:-?[1-9]\d{0,16}|0|-0(?=[.eE]))(?:\.\d+)?(?:[eE][+-]?\d{1,2})?"
_STEP_VALUE = r"(0|[1-9]\d{0,14})"
_PLAIN_KEY = re.compile(r"[\w./:-]+\Z", re.ASCII)


def _of_matches(matches: list[re.Match[str]]) -> TableHits:
    """Record lines the template regex found, every value converted in one call."""
    if not matches:
        return TableHits.empty(0)
    table = number_table(list(chain.from_iterable(m.groups() for m in matches)), len(matches), nan="null")
    at = np.array([m.start() for m in matches], dtype=np.int64)  # a line start: the regex begins with ^
    return TableHits(at, at, table[:, 0].astype(np.int64), table)


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


def _epochs(values: np.ndarray) -> np.ndarray:
    """`_epoch` of a column of numbers (NaN for a null or an implausible time)."""
    seconds = np.where((values >= 1e12) & (values < 1e14), values / 1000.0, values)
    return np.where((seconds >= 1e8) & (seconds < 1e11), seconds, np.nan)


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


@dataclass(frozen=True)
class _Template:
    """One record shape: its keys in order, a regex for whole lines of it, where each value goes."""

    keys: tuple[str, ...]
    #: whole record lines; group 1 is the step, then one group per entry of `targets`
    block: re.Pattern[str]
    #: a metric name, or "ts" for the time key
    targets: tuple[str, ...]
    #: per group, what its values may be (`jsonl_rows.KINDS`); None where some value is not a
    #: group (a key read for nothing), so that the text between the values is not fixed
    kinds: tuple[str, ...] | None = None


def _value_pattern(target: str | None, anchor: bool) -> str:
    """The regex of one key's value: a group for a metric or the time, none for other keys.

    `val_loss` must be null (a logged one is an event); the anchor metric must be a number, so that
    every bulk line is a record (one whose metrics are all null is not)."""
    if target == "val_loss":
        return "null"
    if target is None:
        return f"(?:{_NUMBER}|null)"
    return f"({_NUMBER})" if anchor else f"({_NUMBER}|null)"


def _compile_template(obj: dict[str, Any], targets: dict[str, str | None]) -> _Template | None:
    """A template for records of the shape of `obj`, whose keys map to `targets`, if it has one.

    Only flat records of numbers and nulls with a step key qualify, where each metric and the time
    have one key each (several keys for one target would need the per-line order rules). The first
    step key is the step; another one is read as an ignored key, as the per-line path does.
    """
    keys = tuple(obj)
    step_key = next((k for k in keys if targets[k] == "step"), None)
    named = [t for t in targets.values() if t is not None and t != "step"]
    anchor = next((k for k in keys if targets[k] not in (None, "step", "ts", "val_loss") and obj[k] is not None), None)
    if (
        step_key is None
        or anchor is None
        or len(named) != len(set(named))
        or not all(_PLAIN_KEY.match(k) for k in keys)
        or not all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in obj.values())
    ):
        return None
    pieces = []
    for key in keys:
        target = targets[key]
        if key == step_key:
            value = _STEP_VALUE.replace("(", "(?:", 1)  # captured by the lookahead below
        else:
            value = _value_pattern(None if target == "step" else target, key == anchor)
        pieces.append(f'"{re.escape(key)}": ?{value}')
    before_step = "".join(piece + ", ?" for piece in pieces[: keys.index(step_key)])
    step = rf'\{{{before_step}"{re.escape(step_key)}": ?{_STEP_VALUE}'
    block = re.compile(rf"^(?={step})\{{{', ?'.join(pieces)}\}}[ \t\r]*$", re.M | re.ASCII)  # json: ASCII digits
    captured = tuple(t for t in targets.values() if t is not None and t not in ("step", "val_loss"))
    fixed = all(k == step_key or targets[k] not in (None, "step") for k in keys)
    kinds = ("step", *("number" if k == anchor else "nullable" for k in keys if targets[k] not in ("step", "val_loss")))
    return _Template(keys, block, captured, kinds if fixed else None)


class JsonlParser(Parser):
    name = "jsonl"
    scan = r"\{"
    description = 'JSON lines `{"step": N, "loss": X, ...}` with a configurable key alias table'

    #: JSON key -> `step` or a canonical metric name; a subclass may replace the defaults here
    aliases: dict[str, str] = DEFAULT_ALIASES
    #: a template's layout, once measured (a class default, so that parsers pickled in older
    #: scan states have it)
    _layout: tuple[_Template, Layout | None] | None = None

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
        self._template: _Template | None = None
        self._bulk_template: _Template | None = None  # of the pending matches (a record may change it)
        self._layout = None
        self._bulk = BulkTrack()

    def parse(self, text: str, line: int, ts: float | None, out: ParseOutput) -> bool:
        self._bulk.seen(line)
        if self._bulk.locked:  # bulk records before this line are only known by the stream's step
            self._step = out.last_step
        took = self._parse(text, line, ts, out)
        self._bulk.count(self.name, out)
        return took

    def _parse(self, text: str, line: int, ts: float | None, out: ParseOutput) -> bool:
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
            target = self._target(key)
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
        else:
            self._learn(obj)
        return True

    def carried(self, out: ParseOutput) -> tuple[object, ...] | None:
        """Once the file is locked to this parser, a record without a step counts on from
        `out.last_step`, its only tie to the lines before. (Before, the file is not split.)"""
        return (out.last_step,) if self._bulk.locked else None

    def _target(self, key: str) -> str | None:
        """What a key names: `step` or a metric (by the alias table), else None."""
        return self.aliases.get(key) or self._lower.get(key.lower())

    def _learn(self, obj: dict[str, Any]) -> None:
        """A record of another shape than the template's makes a new template (if it can have one)."""
        if self._template is not None and tuple(obj) == self._template.keys:
            return
        targets = {k: self._target(k) or ("ts" if k in TIME_KEYS else None) for k in obj}
        template = _compile_template(obj, targets)
        if template is not None:
            self._template = template
            self._bulk.changed()

    def can_bulk(self) -> bool:
        return self._bulk.locked and self._template is not None

    def bulk_shape(self) -> object | None:
        return self._bulk.shape if self.can_bulk() else None

    def bulk_matches(self, block: Block) -> TableHits:
        """Record lines of the block of the template's shape (the bulk path; see LogStream):
        found by their layout (`jsonl_rows`) where the block is ASCII, else by the regex, which
        also reads the lines the layout does not fit."""
        template = self._bulk_template = self._template
        if template is None or not self.can_bulk():
            self._bulk.handed(0, retry=False)
            return TableHits.empty(0)
        text = block.text
        layout = self._layout_of(template, text)
        if layout is None:
            hits = _of_matches(list(template.block.finditer(text)))
        else:
            rows = find(layout, block.codes, block.newlines)
            hits = TableHits(rows.line_starts, rows.line_starts, rows.values[:, 0].astype(np.int64), rows.values)
            odd = [m for start, end in rows.odd if (m := template.block.search(text, start, end)) is not None]
            if odd:
                hits = hits.merged(_of_matches(odd))
        self._bulk.handed(len(hits), retry=False)
        return hits

    def _layout_of(self, template: _Template, text: str) -> Layout | None:
        """The layout of the template's lines, measured on its first line in `text` (kept)."""
        if self._layout is not None and self._layout[0] is template:
            return self._layout[1]
        first = template.block.search(text) if template.kinds is not None else None
        if first is None:
            return None  # none in this block: ask again in the next one
        layout = Layout.of(first, template.kinds)  # type: ignore[arg-type]
        self._layout = (template, layout)
        return layout

    def bulk_records(self, text: str, hits: Hits, linenos: np.ndarray, out: ParseOutput) -> None:
        """Bulk hits as one columnar chunk: step, then the template's targets."""
        template = self._bulk_template
        assert template is not None and isinstance(hits, TableHits)
        table, n = hits.values, len(hits)
        metrics = {t: table[:, 1 + j] for j, t in enumerate(template.targets) if t != "ts"}
        ts = _epochs(table[:, 1 + template.targets.index("ts")]) if "ts" in template.targets else np.full(n, np.nan)
        steps = hits.steps
        nonfinite = np.full(n, "", dtype=object)  # no NaN or infinity in a bulk line
        out.record_columns(self.name, steps, linenos, ts, metrics, nonfinite)
        self._bulk.count(self.name, out)

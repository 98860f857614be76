"""Megatron-LM and Megatron-DeepSpeed: the `iteration N/M | key: value | ...` lines in all forms.

Covers the 2020 form without colons (`lm loss NAN`), the 2021-23 form, the current timestamped
form with throughput, the argonne fork's `key=value` form, tr11's seconds instead of milliseconds,
`lm-loss`, and records hard-wrapped over several physical lines. Validation blocks, checkpoint
load/save, "will start from random" and the padded vocab size become events.

A record that has a loss scale or grad norm but no loss field is a NaN step: Megatron omits the
loss when it is not finite (tr8-104B iteration 9027). During fp16 start-up calibration the loss is
omitted too, but those records report skipped iterations, so they are not flagged.
"""

from __future__ import annotations

import contextlib
import re

from gradwatch.events import EventKind
from gradwatch.parsers._text import norm_key, number
from gradwatch.parsers.base import ParseOutput, Parser

# normalised field name -> (canonical metric, scale factor)
_FIELDS: dict[str, tuple[str, float]] = {
    "consumedsamples": ("samples", 1.0),
    "consumedtokens": ("tokens", 1.0),
    "elapsedtimeperiteration(ms)": ("step_time_s", 1e-3),
    "elapsedtimeperiterationms": ("step_time_s", 1e-3),
    "elapsedtimeperiteration(s)": ("step_time_s", 1.0),
    "elapsedtimeperiterations": ("step_time_s", 1.0),
    "learningrate": ("lr", 1.0),
    "lmloss": ("loss", 1.0),
    "loss": ("loss", 1.0),
    "zloss": ("z_loss", 1.0),
    "lossscale": ("loss_scale", 1.0),
    "gradnorm": ("grad_norm", 1.0),
    "numberofskippediterations": ("skipped", 1.0),
    "numberofnaniterations": ("nan_count", 1.0),
    "tflops": ("tflops", 1.0),
    "throughputpergpu(tflop/s/gpu)": ("tflops", 1.0),
    "tokenspergpupersecond(tgs)": ("tps", 1.0),
    "tokenspergpupersecondtgs": ("tps", 1.0),
    "[lm]tflops": ("tflops", 1.0),
}
# 2020 form without colons: `learning rate 9.773E-06 | lm loss NAN | loss scale 4.0`
_NO_COLON = re.compile(r"^(.*?[a-z)\]])\s+(\S+)$")
_ITERATION = re.compile(r"\biteration[=:]?\s*(\d+)\s*/\s*(\d+)")
_VALIDATION = re.compile(r"\b(?:validation|valid) loss at iteration\s+(\d+)\s*\|(.*)")
_LOADED = re.compile(r"(?:successfully loaded|loading)(?: distributed)? checkpoint from .*? at iteration\s+(\d+)")
_SAVED = re.compile(r"saving checkpoint at iteration\s+(\d+)")
_VOCAB = re.compile(r"padded vocab \(size: (\d+)\).*?new size: (\d+)")
_LOSS_VALUE = re.compile(r"lm loss value[:=]\s*(\S+)")
_MAX_WRAPPED_LINES = 3
_UNSEEN = object()
_INF, _NEG_INF = float("inf"), float("-inf")


def _is_complete(text: str) -> bool:
    """A Megatron record ends with `|` (or `| ` before the newline was stripped)."""
    return text.rstrip().endswith("|")


class MegatronParser(Parser):
    name = "megatron"
    scan = r"iteration|checkpoint|padded vocab"
    description = "Megatron-LM and Megatron-DeepSpeed `iteration N/M | ...` lines (all forks and eras)"

    def __init__(self) -> None:
        self._pending: tuple[str, int, float | None] | None = None
        self._pending_parts = 0
        self._seen_loss = False
        self._key_cache: dict[str, object] = {}  # raw field name -> _FIELDS entry (or None)
        self._template: _Template | None = None
        self.total_steps: int | None = None

    @property
    def collecting(self) -> bool:
        return self._pending is not None

    def parse(self, text: str, line: int, ts: float | None, out: ParseOutput) -> bool:
        if self._pending is not None:
            if self._continues(text):
                head, first_line, first_ts = self._pending
                joined = head + text
                self._pending_parts += 1
                if _is_complete(joined) or self._pending_parts >= _MAX_WRAPPED_LINES:
                    self._pending = None
                    self._record(joined, first_line, first_ts, out)
                else:
                    self._pending = (joined, first_line, first_ts)
                return True
            self.flush(out)
        if "iteration" not in text:
            return self._other(text, line, ts, out)
        m = _ITERATION.search(text)
        if m is None or "|" not in text:
            return self._other(text, line, ts, out)
        if not _is_complete(text) and "number of nan" not in text and "nan_iterations" not in text:
            self._pending, self._pending_parts = (text, line, ts), 1
            return True
        self._record(text, line, ts, out)
        return True

    @staticmethod
    def _continues(text: str) -> bool:
        """A hard-wrapped continuation: more `|`-separated fields, not a new kind of line."""
        stripped = text.lstrip()
        return "|" in text and not stripped.startswith(("[", "(", "time (ms)")) and not _ITERATION.match(stripped)

    def flush(self, out: ParseOutput) -> None:
        if self._pending is not None:
            text, line, ts = self._pending
            self._pending = None
            self._record(text, line, ts, out)

    def _record(self, text: str, line: int, ts: float | None, out: ParseOutput) -> None:
        m = _ITERATION.search(text)
        assert m is not None
        step = int(m.group(1))
        self.total_steps = int(m.group(2))
        body = text[m.end() :]
        template = self._template
        found = template.match(body) if template is not None else None
        if found is None:
            metrics, nonfinite = self._fields(body)
            self._template = _compile_template(body)
        else:
            metrics, nonfinite = {}, []
            for (name, scale), value in zip(template.specs, found.groups()):  # type: ignore[union-attr]
                try:
                    v = float(value)
                except ValueError:
                    try:
                        v = number(value)
                    except ValueError:
                        continue
                v *= scale
                if v != v or v in (_INF, _NEG_INF):
                    nonfinite.append(name)
                metrics[name] = v
        if metrics.get("loss_scale") == -1.0:  # 2021 pipeline runs print -1.0 as "not computed"
            del metrics["loss_scale"]
        if "loss" in metrics:
            self._seen_loss = True
        elif (
            ("loss_scale" in metrics or "grad_norm" in metrics)
            and not metrics.get("skipped")
            and (self._seen_loss or metrics.get("nan_count"))
        ):
            nonfinite.append("loss")  # Megatron omits the loss field when the loss is NaN
        out.record(self.name, step, line, ts, metrics, nonfinite)

    def _fields(self, body: str) -> tuple[dict[str, float], list[str]]:
        """Every known `key: value` field of a record body, whatever its order and form."""
        metrics: dict[str, float] = {}
        nonfinite: list[str] = []
        cache = self._key_cache
        for field in body.split("|"):
            i = field.rfind(":")
            if i < 0:
                i = field.rfind("=")
            if i < 0:
                key, value = self._split_field(field)  # 2020 form: `lm loss NAN`
                if key is None:
                    continue
            else:
                key, value = field[:i], field[i + 1 :]
            spec = cache.get(key, _UNSEEN)
            if spec is _UNSEEN:
                spec = _FIELDS.get(norm_key(key.strip()))
                if len(cache) > 4096:
                    cache.clear()
                cache[key] = spec
            if spec is None:
                continue
            try:
                v = float(value)
            except ValueError:
                try:
                    v = number(value)
                except ValueError:
                    continue
            name, scale = spec  # type: ignore[misc]
            v *= scale
            if v != v or v in (_INF, _NEG_INF):
                nonfinite.append(name)
            metrics[name] = v
        return metrics, nonfinite

    @staticmethod
    def _split_field(field: str) -> tuple[str | None, str]:
        field = field.strip()
        if not field:
            return None, ""
        for sep in (":", "="):
            i = field.rfind(sep)
            if i > 0:
                return field[:i], field[i + 1 :]
        m = _NO_COLON.match(field)
        if m:
            return m.group(1), m.group(2)
        return None, ""

    def _other(self, text: str, line: int, ts: float | None, out: ParseOutput) -> bool:
        """The rare Megatron lines that are events, not records."""
        if "loss at iteration" in text:
            m = _VALIDATION.search(text)
            if m:
                step = int(m.group(1))
                lv = _LOSS_VALUE.search(m.group(2))
                metrics: dict[str, float] = {}
                if lv:
                    with contextlib.suppress(ValueError):
                        metrics["val_loss"] = number(lv.group(1).rstrip("|"))
                out.record(self.name, step, line, ts, metrics)
                out.event(EventKind.VALIDATION, line, step, ts, **metrics)
                return True
        if "checkpoint" in text:
            m = _LOADED.search(text)
            if m:
                step = int(m.group(1))
                out.event(EventKind.CHECKPOINT_LOAD, line, step, ts, iteration=step)
                return True
            m = _SAVED.search(text)
            if m:
                out.event(EventKind.CHECKPOINT_SAVE, line, int(m.group(1)), ts)
                return True
            if "will not load any checkpoints and will start from random" in text:
                out.event(EventKind.START_FROM_RANDOM, line, None, ts)
                return True
        if "padded vocab" in text:
            m = _VOCAB.search(text)
            if m:
                out.event(EventKind.VOCAB, line, None, ts, size=int(m.group(1)), padded=int(m.group(2)))
                return True
        return False


class _Template:
    """A compiled regex for one exact sequence of record fields, and what each group holds.

    A run prints the same fields in the same order on every record, so after the first record a
    single regex match reads all values; a record of another shape (a NaN step without its loss
    field, a cut line) misses the template and takes the general path.
    """

    __slots__ = ("match", "specs")

    def __init__(self, pattern: re.Pattern[str], specs: list[tuple[str, float]]) -> None:
        self.match = pattern.match
        self.specs = specs


def _compile_template(body: str) -> _Template | None:
    pieces: list[str] = []
    specs: list[tuple[str, float]] = []
    for part in body.split("|"):
        i, sep = part.rfind(":"), ":"
        if i < 0:
            i, sep = part.rfind("="), "="
        if i < 0:
            if part.strip():
                return None  # the 2020 form without colons: no template
            pieces.append(r"\s*")
            continue
        key = part[:i].strip()
        if not key:
            return None
        head = r"\s*" + r"\s*".join(map(re.escape, key.split())) + r"\s*" + re.escape(sep)
        spec = _FIELDS.get(norm_key(key))
        if spec is None:
            pieces.append(head + r"[^|]*")
        else:
            pieces.append(head + r"([^|]*)")
            specs.append(spec)
    if not specs:
        return None
    return _Template(re.compile(r"\|".join(pieces) + r"$"), specs)

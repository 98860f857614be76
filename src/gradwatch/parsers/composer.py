"""Composer / llm-foundry ConsoleLogger: a progress marker, then `\\t Train key: value` lines.

Line shapes covered (composer `loggers/console_logger.py`):

    [batch=1/3]:                         max_duration in batches (also `[token=N/M]:` ...)
    [epoch=1][batch=5/100]:              max_duration in epochs: batch counts within the epoch
    \t Train loss/train/total: 12.0570   tab + space (docs copies indent with spaces)
    [Eval batch=10/10] Eval on eval data:
    \t Eval metrics/eval/LanguageCrossEntropy: 2.9000
    [metric][batch=0]: metrics/train/LanguageCrossEntropy: 2.31    older loggers: one metric a line

In the older one-line form, the lines of one batch make one record; a key it already holds (the
next epoch's lines under the same batch count) begins the next record.

The record ends at the first line that is not a `Train`/`Eval` metric line; that line is left for
the other parsers. srun's `0:   ` prefix swallows the indentation, so indentation is not required.
The step is the global batch: `[batch=N/M]` directly; otherwise `time/batch + 1` when logged
(composer logs `time/batch` before the batch is counted), else `(epoch-1)*M + n` for epoch markers,
else one more than the previous record. Eval blocks become a record with `val_loss` at the last
training step, plus a validation event.
`Loading checkpoint from <path>` (no trailing `...`, which is OLMo's) is a checkpoint-load event.

Composer prints no step time and no timestamps, but SpeedMonitor's `time/train` is the training
wall clock in hours: its growth between two training records over the batches between them is the
mean step time (`step_time_s`, as Megatron's elapsed time per iteration), so a hang that ended is
visible. It is printed to 4 decimals (0.36 s), so a difference is used once it spans at least
`_MIN_CLOCK_TICKS` of them (at most 10% off); until then the earlier record stays the reference.
"""

from __future__ import annotations

import contextlib
import re

from gradwatch.events import EventKind
from gradwatch.parsers._text import is_nonfinite, number
from gradwatch.parsers.base import ParseOutput, Parser

_MARKER = re.compile(r"(?:\[epoch=(\d{1,6})\])?\[(\w+)=(\d{1,18})(?:/(\d{1,12}))?\]:\s*$")
_EVAL_MARKER = re.compile(r"\[Eval batch=\d+/\d+\] Eval on .* data:\s*$")
_METRIC = re.compile(r"^\s*(Train|Eval) (.+?): (.*)$")
_INLINE = re.compile(r"\[\w+\]\[batch=(\d{1,18})(?:/\d{1,12})?\]:\s*(\S+): (.*?)\s*$")
_LOADING = re.compile(r"Loading checkpoint from (\S+)\s*$")
_CLOCK_KEY = "time/train"
_CLOCK_TICK_H = 1e-4  # `time/train` is printed in hours with 4 decimals
_MIN_CLOCK_TICKS = 10

_TRAIN_KEYS: dict[str, str] = {
    "loss/train/total": "loss",
    "l2_norm/grad/global": "grad_norm",
    "metrics/train/LanguagePerplexity": "ppl",
    "Perplexity": "ppl",
    "throughput/device/tokens_per_sec": "tps",
    "time/token": "tokens",
    "time/sample": "samples",
}
# used only when the preferred key is absent from the record
_TRAIN_FALLBACK: dict[str, str] = {
    "metrics/train/LanguageCrossEntropy": "loss",
    "LanguageCrossEntropy": "loss",
    "throughput/tokens_per_sec": "tps",  # all devices; the per-device value is preferred
}


class _Open:
    """The record being read."""

    __slots__ = ("step", "exact", "line", "ts", "metrics", "fallback", "time_batch", "is_eval", "clock_h", "keys")

    def __init__(self, step: int | None, line: int, ts: float | None, is_eval: bool, exact: bool = False) -> None:
        self.step = step
        self.exact = exact  # `[batch=N/M]`: N is the global batch
        self.line = line
        self.ts = ts
        self.is_eval = is_eval
        self.metrics: dict[str, float] = {}
        self.fallback: dict[str, float] = {}
        self.time_batch: float | None = None
        self.clock_h: float | None = None  # `time/train`, hours
        self.keys: set[str] | None = None  # of the one-line form: the keys read so far


class ComposerParser(Parser):
    name = "composer"
    segment_safe = True
    scan = r"=\d{1,18}(?:/\d{1,12})?\]:|Eval on|Loading checkpoint from"
    description = "Composer / llm-foundry `[batch=N/M]:` marker + `Train key: value` lines"

    def __init__(self) -> None:
        self._open: _Open | None = None
        self._last_step: int | None = None
        self._clock: tuple[int, float] | None = None  # (step, time/train hours) of the reference record

    @property
    def collecting(self) -> bool:
        return self._open is not None

    def carried(self, out: ParseOutput) -> tuple[object, ...] | None:
        """The reference record of the step time: it may lie further back than a warm-up, where
        `time/train` grows by less than its printed precision from record to record."""
        return (self._clock,)

    def parse(self, text: str, line: int, ts: float | None, out: ParseOutput) -> bool:
        if "][batch=" in text and (inline := _INLINE.search(text)) is not None:
            self._inline(inline, line, ts, out)
            return True
        if self._open is not None:
            if ": " in text and self._metric_line(text):
                return True
            self.flush(out)
        if "]:" in text:
            m = _MARKER.search(text)
            if m is not None:
                exact = m.group(1) is None and m.group(2) == "batch"
                self._open = _Open(self._marker_step(m), line, ts, is_eval=False, exact=exact)
                return True
        if "Eval on" in text:
            if _EVAL_MARKER.search(text):
                self._open = _Open(self._last_step, line, ts, is_eval=True)
                return True
            return False
        if "Loading checkpoint from" in text:
            m = _LOADING.search(text)
            if m is None or m.group(1).endswith("..."):
                return False
            out.event(EventKind.CHECKPOINT_LOAD, line, None, ts, path=m.group(1))
            return True
        return False

    def _inline(self, m: re.Match[str], line: int, ts: float | None, out: ParseOutput) -> None:
        """A line of the one-line form: it joins the record of its batch, or begins the next."""
        step, key = int(m.group(1)), m.group(2)
        rec = self._open
        if rec is None or rec.keys is None or rec.step != step or key in rec.keys:
            self.flush(out)
            rec = self._open = _Open(step, line, ts, is_eval=False, exact=True)
            rec.keys = set()
        rec.keys.add(key)
        self._train_metric(key, m.group(3))

    @staticmethod
    def _marker_step(m: re.Match[str]) -> int | None:
        epoch, unit, count, total = m.group(1), m.group(2), int(m.group(3)), m.group(4)
        if unit != "batch":
            return None  # taken from `time/batch` when the record is closed
        if epoch is None:
            return count
        if total is None:
            return None
        return (int(epoch) - 1) * int(total) + count

    def _metric_line(self, text: str) -> bool:
        assert self._open is not None
        m = _METRIC.match(text)
        if m is None or (m.group(1) == "Eval") != self._open.is_eval:
            return False
        key, value = m.group(2), m.group(3)
        rec = self._open
        if rec.is_eval:
            if key.endswith("LanguageCrossEntropy") and "val_loss" not in rec.metrics:
                self._put(rec.metrics, "val_loss", value)
            return True
        self._train_metric(key, value)
        return True

    def _train_metric(self, key: str, value: str) -> None:
        """One `key: value` of the open training record."""
        rec = self._open
        assert rec is not None
        if key == "time/batch":
            try:
                tb = number(value)
            except ValueError:
                tb = float("nan")
            if 0 <= tb < 1e18:  # NaN fails too
                rec.time_batch = tb
        elif key == _CLOCK_KEY:
            with contextlib.suppress(ValueError):
                rec.clock_h = number(value)
        canonical = _TRAIN_KEYS.get(key)
        if canonical is None and key.startswith("lr-"):
            canonical = "lr"
        if canonical is not None:
            if canonical not in rec.metrics:
                self._put(rec.metrics, canonical, value)
        elif key in _TRAIN_FALLBACK:
            self._put(rec.fallback, _TRAIN_FALLBACK[key], value)

    @staticmethod
    def _put(into: dict[str, float], name: str, value: str) -> None:
        with contextlib.suppress(ValueError):  # a quoted string or a table is not a number
            into[name] = number(value)

    def _step_time(self, step: int, clock_h: float, metrics: dict[str, float]) -> None:
        """Set `step_time_s` from the growth of `time/train` since the reference record."""
        ref = self._clock
        if ref is None or step <= ref[0] or not clock_h >= ref[1]:  # a restart resets the clock
            self._clock = (step, clock_h)
            return
        if clock_h - ref[1] < _MIN_CLOCK_TICKS * _CLOCK_TICK_H:
            return
        metrics.setdefault("step_time_s", (clock_h - ref[1]) * 3600.0 / (step - ref[0]))
        self._clock = (step, clock_h)

    def flush(self, out: ParseOutput) -> None:
        rec, self._open = self._open, None
        if rec is None:
            return
        metrics = rec.metrics
        for name, v in rec.fallback.items():
            metrics.setdefault(name, v)
        if not metrics:
            return
        step = rec.step
        if not rec.exact and rec.time_batch is not None and not rec.is_eval:
            step = int(rec.time_batch) + 1
        if step is None and not rec.is_eval:
            step = (self._last_step or 0) + 1
        if not rec.is_eval and step is not None and rec.clock_h is not None:
            self._step_time(step, rec.clock_h, metrics)
        nonfinite = [k for k, v in metrics.items() if is_nonfinite(v)]
        out.record(self.name, step, rec.line, rec.ts, metrics, nonfinite)
        if rec.is_eval:
            out.event(EventKind.VALIDATION, rec.line, step, rec.ts, val_loss=metrics["val_loss"])
        else:
            self._last_step = step

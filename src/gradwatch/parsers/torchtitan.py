"""torchtitan: one metrics line per logged step, printed by every rank.

Line shapes covered (torchtitan `components/metrics.py`, `components/checkpoint.py`, `train.py`):

    [titan] 2026-05-18 16:04:50,821 - root - INFO - step: 18  loss:  3.54399  grad_norm:  0.7675
        memory:  9.46GiB(64.99%)  tps: 7,322  tflops: 0.52  mfu: 0.17%     (one line in the log)
    2025-02-03 13:39:06,055 - root - INFO - step:  1  loss: 12.2384  memory: ...  mfu: N/A
    [titan] ... - validate step: 100  loss: 3.1234  memory: ...  tps: ...
    Loading the checkpoint at step 400.  /  Loading the checkpoint from <id>.
    Training starts at step 401.
    Finished saving the checkpoint (or staging if async is enabled)in 1.23 seconds.

ANSI colours and `[rankN]:` prefixes are removed by `clean()`. The same step printed by several
ranks one after the other becomes one record. `mfu` is kept in percent as printed; `N/A` is not
logged. The memory field (max reserved) has no canonical metric and is not read; validation
records carry only `val_loss`. In a line cut before its `mfu` field the last value is not read.
"""

from __future__ import annotations

import re

from gradwatch.events import EventKind
from gradwatch.parsers._text import is_nonfinite, number, timestamp
from gradwatch.parsers.base import ParseOutput, Parser

_STEP = re.compile(r"(?:\b(validate)\s+)?\bstep:\s*(\d{1,18})\s+loss:\s*(\S+)")
_FIELDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("grad_norm", re.compile(r"\bgrad_norm:\s*(\S+)")),
    ("tps", re.compile(r"\btps:\s*([\d,.]+|nan|inf)")),
    ("tflops", re.compile(r"\btflops:\s*([\d,.]+|nan|inf)")),
    ("mfu", re.compile(r"\bmfu:\s*([\d.]+|nan|inf)%")),
)
_LOAD_AT = re.compile(r"Loading the checkpoint at step (\d{1,18})\b")
_LOAD_FROM = re.compile(r"Loading the checkpoint from (.+?)\.?\s*$")
_STARTS = re.compile(r"Training starts at step (\d{1,18})\b")


class TorchtitanParser(Parser):
    name = "torchtitan"
    scan = r"step:|checkpoint|Training starts"
    description = "torchtitan `step: N  loss: X  grad_norm: ...  tps: ...  mfu: ...%` lines"

    def __init__(self) -> None:
        self._last_step: int | None = None  # of the previous training record (rank dedupe)
        self._last_val_step: int | None = None
        self._last_load: int | None = None
        self._loading: str | None = None
        self._last_save: int | None = None

    def parse(self, text: str, line: int, ts: float | None, out: ParseOutput) -> bool:
        if "step:" in text and "loss:" in text:
            return self._metrics(text, line, ts, out)
        if "checkpoint" in text or "Training starts" in text:
            return self._checkpoint(text, line, self._ts(text, ts, out), out)
        return False

    @staticmethod
    def _ts(text: str, ts: float | None, out: ParseOutput) -> float | None:
        """The time after the `[titan] ` tag, which hides it from the stream's timestamp()."""
        if ts is None and text.startswith("[titan] "):
            ts = timestamp(text[8:])
            if ts is not None:
                out.last_ts = ts
        return ts

    def _metrics(self, text: str, line: int, ts: float | None, out: ParseOutput) -> bool:
        m = _STEP.search(text)
        if m is None:
            return False
        validate, step = m.group(1) is not None, int(m.group(2))
        if step == (self._last_val_step if validate else self._last_step):
            return True  # the same step from another rank
        ts = self._ts(text, ts, out)
        metrics: dict[str, float] = {}
        try:
            metrics["val_loss" if validate else "loss"] = number(m.group(3))
        except ValueError:
            return False
        rest = "" if validate else text[m.end() :].rstrip()  # eval tps is not training tps
        # a complete line ends with the mfu field; in a cut one the last value may be cut too
        complete = rest.endswith(("%", "N/A"))
        for name, pattern in _FIELDS:
            f = pattern.search(rest)
            if f is None or (not complete and f.end() == len(rest)):
                continue
            try:
                metrics[name] = number(f.group(1))
            except ValueError:
                continue
        nonfinite = [k for k, v in metrics.items() if is_nonfinite(v)]
        out.record(self.name, step, line, ts, metrics, nonfinite)
        if validate:
            self._last_val_step = step
            out.event(EventKind.VALIDATION, line, step, ts, val_loss=metrics["val_loss"])
        else:
            self._last_step = step
        return True

    def _checkpoint(self, text: str, line: int, ts: float | None, out: ParseOutput) -> bool:
        m = _LOAD_AT.search(text)
        if m:
            self._load(int(m.group(1)), None, line, ts, out)
            return True
        m = _LOAD_FROM.search(text)
        if m:
            self._loading = m.group(1)
            return True
        m = _STARTS.search(text)
        if m:
            start = int(m.group(1))
            if self._loading is not None or start > 1:
                self._load(start - 1, self._loading, line, ts, out)
            self._loading = None
            return True
        if "Finished saving the checkpoint" in text:
            step = out.last_step
            if step is None or step != self._last_save:
                self._last_save = step
                out.event(EventKind.CHECKPOINT_SAVE, line, step, ts)
            return True
        return "Finished loading the checkpoint" in text

    def _load(self, step: int, path: str | None, line: int, ts: float | None, out: ParseOutput) -> None:
        """One load event per resume, though every rank prints the lines."""
        if step == self._last_load:
            return
        self._last_load = step
        self._last_step = self._last_val_step = None  # the resumed run may repeat a step
        data: dict[str, object] = {"iteration": step}
        if path is not None:
            data["path"] = path
        out.event(EventKind.CHECKPOINT_LOAD, line, step, ts, **data)

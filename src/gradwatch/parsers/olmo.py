"""OLMo and OLMo-core console metrics: a `[step=N/M,...]` marker, then indented `key=value` lines.

Line shapes covered:

    2024-08-06 10:00:05.520 host:0  olmo.train:908  INFO    [step=2/739328,epoch=0]
        optim/total_grad_norm=0.0002
        train/CrossEntropyLoss=1.7872662283480167e-06
        throughput/total_tokens=2,097,152
    [2025-02-20 15:18:04] INFO     [olmo_core...console_logger:62, rank=0] [step=1/7,epoch=1]
        train/CE loss=11.03
        optim/LR (group 0)=1.00E-05

The record ends at the next line that is not a metric line; that line is left for the other
parsers. OLMo-core adds `,eta=...` to the marker when known, and prints bare markers between
metric intervals: they produce no record. Numbers follow OLMo's `format_float` (thousands commas,
`str()` below 1e-4, `nan`). A launcher prefix such as srun's `0:     ` swallows the indentation,
so an unindented `group/name=value` line also continues a record.

Checkpoint lines (OLMo `olmo/train.py`, OLMo-core `trainer.py`/checkpointer callback):
`Loading checkpoint from <path>...` (remembered), `Will resume training from step N, epoch E`
(load event with the step), `Checkpoint successfully loaded` (load event when no step was given),
`Checkpoint saved to <path>` and `Saving checkpoint for step N to '<path>'...` (save events).
"""

from __future__ import annotations

import re

from gradwatch.events import EventKind
from gradwatch.parsers._text import is_nonfinite, number
from gradwatch.parsers.base import ParseOutput, Parser

# `[step=N/M]` (early OLMo), `,epoch=E`, OLMo-core `,eta=...`; rich's handler may add `file.py:123`
_MARKER = re.compile(r"\[step=(\d{1,18})/(?:\d+|\?+|None)(?:,epoch=\d+)?(?:,eta=[^\]]*)?\]\s*(?:[\w.-]+:\d+\s*)?$")
# an unindented continuation (indentation eaten by a launcher prefix): `group/name=value`
_BARE_METRIC = re.compile(r"^[A-Za-z][\w ().-]*/[^=]*=\S+\s*$")
_RESUME = re.compile(r"Will resume training from step (\d{1,18})\b")
_SAVE_STEP = re.compile(r"Saving checkpoint for step (\d{1,18}) to '?([^']*?)'?(?:\.\.\.)?\s*$")
_LOADING = re.compile(r"Loading checkpoint from '?(.*?)'?\.\.\.\s*$")
_SAVED = re.compile(r"Checkpoint saved to (\S+)")

# lower-cased key without spaces/underscores -> canonical metric
_KEYS: dict[str, str] = {
    "train/crossentropyloss": "loss",
    "train/celoss": "loss",
    "optim/totalgradnorm": "grad_norm",
    "train/zloss": "z_loss",
    "train/perplexity": "ppl",
    "train/ppl": "ppl",
    "throughput/totaltokens": "tokens",
    "throughput/device/tokenspersecond": "tps",
    "throughput/device/tps": "tps",
    "optim/stepskipped": "skipped",
}


def _key(name: str) -> str:
    return name.strip().lower().replace(" ", "").replace("_", "")


class OlmoParser(Parser):
    name = "olmo"
    segment_safe = True
    scan = r"\[step=|heckpoint|resume training"
    description = "OLMo / OLMo-core `[step=N/M,epoch=E]` marker + indented `key=value` metric lines"

    def __init__(self) -> None:
        # the open record: (step, line, ts, metrics, nonfinite)
        self._open: tuple[int, int, float | None, dict[str, float], list[str]] | None = None
        self._loading: str | None = None  # path of a `Loading checkpoint from` not yet resolved
        self._last_save: int | None = None

    @property
    def collecting(self) -> bool:
        return self._open is not None

    def parse(self, text: str, line: int, ts: float | None, out: ParseOutput) -> bool:
        if self._open is not None:
            if "=" in text and self._metric_line(text):
                return True
            self.flush(out)
        if "[step=" in text:
            m = _MARKER.search(text)
            if m is None:
                return False
            step = int(m.group(1))
            self._open = (step, line, ts, {}, [])
            out.last_step = step
            return True
        if "heckpoint" in text or "resume training" in text:
            return self._checkpoint(text, line, ts, out)
        return False

    def _metric_line(self, text: str) -> bool:
        """Add one `key=value` line to the open record; False when the line is not one."""
        assert self._open is not None
        if not text[:1].isspace() and _BARE_METRIC.match(text) is None:
            return False
        key, sep, value = text.strip().partition("=")
        if not sep or not key:
            return False
        k = _key(key)
        canonical = _KEYS.get(k)
        if canonical is None and k.startswith("optim/lr"):
            canonical = "lr"
        metrics, nonfinite = self._open[3], self._open[4]
        if canonical is not None and canonical not in metrics:
            try:
                v = number(value)
            except ValueError:
                return True  # a metric line whose value we do not read (e.g. a duration)
            metrics[canonical] = v
            if is_nonfinite(v):
                nonfinite.append(canonical)
        return True

    def flush(self, out: ParseOutput) -> None:
        if self._open is None:
            return
        step, line, ts, metrics, nonfinite = self._open
        self._open = None
        if metrics:  # a bare marker (no metric lines) is progress, not a record
            out.record(self.name, step, line, ts, metrics, nonfinite)

    def _checkpoint(self, text: str, line: int, ts: float | None, out: ParseOutput) -> bool:
        m = _RESUME.search(text)
        if m:
            step = int(m.group(1))
            out.event(EventKind.CHECKPOINT_LOAD, line, step, ts, iteration=step, path=self._loading)
            self._loading = None
            return True
        if "Loading checkpoint from" in text:
            m = _LOADING.search(text)
            if m is None:  # no trailing `...`: Composer's line, not ours
                return False
            self._loading = m.group(1)
            return True
        if "Checkpoint successfully loaded" in text:
            if self._loading is not None:  # OLMo: no step was printed
                out.event(EventKind.CHECKPOINT_LOAD, line, out.last_step, ts, path=self._loading)
                self._loading = None
            return True
        m = _SAVE_STEP.search(text)
        if m:
            step = int(m.group(1))
            self._last_save = step
            out.event(EventKind.CHECKPOINT_SAVE, line, step, ts, path=m.group(2))
            return True
        m = _SAVED.search(text)
        if m:
            if self._last_save is None:  # not already reported by `Saving checkpoint for step N`
                out.event(EventKind.CHECKPOINT_SAVE, line, out.last_step, ts, path=m.group(1))
            self._last_save = None
            return True
        return False

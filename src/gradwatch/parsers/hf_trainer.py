"""Hugging Face Trainer / Accelerate: the logged dict printed by `ProgressCallback.on_log`.

Line shapes covered:

    {'loss': 2.1048, 'grad_norm': 2.1349170207977295, 'learning_rate': 4.99e-05, 'epoch': 0.0}
    {'loss': '0.91', 'grad_norm': '0.8618', ...}              newer versions quote the values
    {'loss': 0.0, 'grad_norm': nan, ...}                      bare nan / inf
    {‘loss’: 2.1, ...}                                        pasted with typographic quotes
     19%|███▏  | 380/2724 [01:50<08:31, 6.39s/it]{'loss': ...} glued after a tqdm bar
    {'eval_loss': 2.3, 'eval_runtime': 10.1, 'epoch': 0.5}    evaluation: a `val_loss` record
    {'train_runtime': 601.2, ..., 'train_loss': 2.7}           final summary: skipped
      Continuing training from global step 1200                resume (INFO verbosity only)

The dict is read with a regex over `'key': value` pairs, never with eval(). It has no step, so:

- if a tqdm bar was printed earlier on the same physical line (the `\\r`-separated updates before
  the dict, or a bar glued in front of it), its count is the step: the Trainer updates the bar to
  `global_step` before it logs;
- otherwise the step is one more than the previous training dict's (1, 2, 3, ... when no bar is
  ever seen): the ordinal of the logged dict, not `global_step` (that is ordinal x logging_steps).
  A bar on an earlier line is not used: in excerpts and line-buffered captures it is a stale
  snapshot (the esm2 sample prints `18/97` after the dict of step 16 and before the one of 32).

Eval dicts take the step of the latest training dict. After `Continuing training from global step
N`, a count already past N (logging every step, the run had logged steps after its checkpoint
before it died) goes back to N: those steps are replayed. With `logging_steps` > 1 the count is
under N and stays.
"""

from __future__ import annotations

import re

from gradwatch.events import EventKind
from gradwatch.parsers._text import is_nonfinite, number
from gradwatch.parsers.base import ParseOutput, Parser

_Q = "'\u2018\u2019\""
# 'key': value; value = quoted string | bare token, maybe wrapped: tensor(...), np.float64(...)
_PAIR = re.compile(rf"[{_Q}]([^{_Q}]+)[{_Q}]\s*:\s*(?:[\w.]*\()?\s*([{_Q}][^{_Q}]*[{_Q}]|[^,}})\s]+)")
_BAR = re.compile(r"\|\s*(\d{1,18})/(\d+)\s*\[")
_LOSSES = frozenset(("loss", "val_loss", "grad_norm"))
_CONTINUING = re.compile(r"Continuing training from global step (\d{1,18})\b")

_KEYS: dict[str, str] = {
    "loss": "loss",
    "grad_norm": "grad_norm",
    "learning_rate": "lr",
    "eval_loss": "val_loss",
}


class HfTrainerParser(Parser):
    name = "hf_trainer"
    scan = r"\{|Continuing training from"
    description = "Hugging Face Trainer `{'loss': ..., 'grad_norm': ..., 'learning_rate': ...}` dicts"

    def __init__(self) -> None:
        self._step: int | None = None  # step of the latest training dict
        self._bar: tuple[int, int] | None = None  # (physical line, count) of the latest tqdm bar

    def parse(self, text: str, line: int, ts: float | None, out: ParseOutput) -> bool:
        start = -1
        if "{" in text:
            start = text.find("{'")
            if start < 0:
                start = text.find("{\u2018")
        if start < 0:
            if "%|" in text:
                self._see_bar(text, line)  # a `\r` piece before a dict on the same physical line
                return False  # a bar is nobody's record; others may still read the line
            if "Continuing training from" in text:
                return self._resume(text, line, ts, out)
            return False
        if start > 0 and "%|" in text[:start]:
            self._see_bar(text[:start], line)
        return self._dict(text[start:], line, ts, out)

    def _see_bar(self, text: str, line: int) -> None:
        counts = _BAR.findall(text)
        if counts:  # the last bar of a glued run is the newest
            self._bar = (line, int(counts[-1][0]))

    def _dict(self, text: str, line: int, ts: float | None, out: ParseOutput) -> bool:
        end = text.find("}")
        # in a cut line (no `}`) the last value may be cut too: `4.99e-0` for `4.99e-05`
        pairs = _PAIR.findall(text[: end + 1]) if end >= 0 else _PAIR.findall(text)[:-1]
        if not pairs:
            return False
        keys = {k for k, _ in pairs}
        if "train_runtime" in keys:
            return True  # the final summary: averages over the run, not a step
        metrics: dict[str, float] = {}
        for key, value in pairs:
            name = _KEYS.get(key)
            if name is None or name in metrics:
                continue
            try:
                metrics[name] = number(value)
            except ValueError:
                continue
        if not metrics.keys() & _LOSSES:
            # not a training/eval log (e.g. a config dict with an `lr`); a Trainer dict with
            # only custom keys still has `epoch` and is consumed
            return "epoch" in keys
        is_eval = "val_loss" in metrics and "loss" not in metrics
        bar_step = self._bar[1] if self._bar is not None and self._bar[0] == line else None
        if bar_step is not None:
            step = bar_step
        elif is_eval:
            step = self._step if self._step is not None else 0
        else:
            step = (self._step or 0) + 1
        if not is_eval:
            self._step = step
        nonfinite = [k for k, v in metrics.items() if is_nonfinite(v)]
        out.record(self.name, step, line, ts, metrics, nonfinite)
        if "val_loss" in metrics:
            out.event(EventKind.VALIDATION, line, step, ts, val_loss=metrics["val_loss"])
        return True

    def _resume(self, text: str, line: int, ts: float | None, out: ParseOutput) -> bool:
        m = _CONTINUING.search(text)
        if m:
            step = int(m.group(1))
            if self._step is not None and self._step > step:
                self._step = step  # the dicts logged after step N are replayed: count on from N
            out.event(EventKind.CHECKPOINT_LOAD, line, step, ts, iteration=step)
            return True
        # `Continuing training from checkpoint, will skip to saved global_step` / `from epoch N`
        return "Continuing training from checkpoint" in text or "Continuing training from epoch" in text

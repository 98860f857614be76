"""NVIDIA NeMo: the NeMo 2.0 progress printer and NeMo 1.x (Lightning) tqdm bars.

Line shapes covered:

    Training epoch 0, iteration 3/9 | lr: 0.0006 | consumed_samples: 128 | global_batch_size: 32
        | global_step: 3 | reduced_train_loss: 8.595 | train_step_timing in s: 46.84 | val_loss: 4.1
    Epoch 0:   1%|          | 795/77225 [9:07:58<878:01:48, 41.36s/it, loss=3.1, v_num=,
        reduced_train_loss=3.090, global_step=794.0, consumed_samples=1.63e+6]
    [NeMo I 2025-05-22 20:08:53 model_checkpoint:497] Scheduled async checkpoint save for
        <path>-step=18-consumed_samples=9728.0-last.ckpt
    [NeMo I ... model_checkpoint:522] Async checkpoint save for step 19 finalized successfully.
    Epoch 0, global step 100: 'val_loss' reached 2.51 (best 2.51), saving model to '<path>' as top 1
    Resuming training from checkpoint: <path>

(each of the first three is one line in the log)

The step is `global_step` (NeMo 2.0's `iteration` restarts every epoch). NeMo 1.x bars print it as a
Lightning float with three significant digits (`3.1e+4`), so late in a run consecutive records can
share a rounded step. Bars redrawn with the same step and values give one record. The loss is
`reduced_train_loss`, else `train_loss`, else the bar's running-mean `loss=`. `val_loss` stays in
the printed metrics after each validation, so it is recorded (with a validation event) only when
its value changes. Without `global_step` a line gets one more than the previous record's step.
"""

from __future__ import annotations

import re

from gradwatch.events import EventKind
from gradwatch.parsers._text import is_nonfinite, norm_key, number, timestamp
from gradwatch.parsers.base import ParseOutput, Parser

_NEMO2 = re.compile(r"Training epoch \d+, iteration \d+/\d+\s*\|(.*)")
_BAR = re.compile(r"\bEpoch \d+:")
#: `key=value`; or else a run of key characters without `=`, passed over at once: a search for
#: a key from each of its characters would take hours over a megabyte of letters
_PAIR = re.compile(r"([\w/ -]+)=([^,\s\]]*)|[\w/ -]+")
_NEMO_TS = re.compile(r"\[NeMo [A-Z] (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")
_SCHEDULED = re.compile(r"Scheduled async checkpoint save for (\S+)")
_FINALIZED = re.compile(r"Async checkpoint save for step (\d{1,18}) finalized")
_TOPK = re.compile(r"global step (\d{1,18}): .*saving model to '([^']+)'")
_RESUMING = re.compile(
    r"(?:Resuming training from checkpoint:"
    r"|Restored all states from the checkpoint(?: file)? at) (\S+)"
)
_MAX_STEP = 10**18  # a larger `global_step=` is garbage (and would not fit int64)
_PATH_STEP = re.compile(r"\bstep=(\d{1,18})\b")

# norm_key(field) -> canonical; `step` is the step
_KEYS: dict[str, str] = {
    "globalstep": "step",
    "reducedtrainloss": "loss",
    "lr": "lr",
    "consumedsamples": "samples",
    "valloss": "val_loss",
    "gradnorm": "grad_norm",
    "trainsteptimingins": "step_time_s",
    "trainsteptiming": "step_time_s",
}
# losses used when `reduced_train_loss` is absent, best first
_LOSS_FALLBACK = ("trainloss", "loss")


class NemoParser(Parser):
    name = "nemo"
    scan = r"Training epoch|global_step=|heckpoint|saving model to"
    description = "NeMo 2.0 `Training epoch E, iteration i/N | ... | global_step: G` and 1.x bars"

    def __init__(self) -> None:
        self._step: int | None = None
        self._last_bar: tuple[int | None, tuple[tuple[str, float], ...]] | None = None
        self._val_loss: float | None = None
        self._scheduled = False  # an async save announced and not yet finalized
        self._last_load: str | None = None

    def parse(self, text: str, line: int, ts: float | None, out: ParseOutput) -> bool:
        if "Training epoch" in text:
            m = _NEMO2.search(text)
            if m is None:
                return False
            fields = []
            for part in m.group(1).split("|"):
                key, sep, value = part.partition(":")
                if sep:
                    fields.append((key, value))
            self._record(fields, line, ts, out, bar=False)
            return True  # even without a known field: Megatron would misread `iteration i/N |`
        if "global_step=" in text and "Epoch" in text:
            m = _BAR.search(text)
            if m is None:
                return False
            postfix = text[text.rfind("[") + 1 :]  # `elapsed<remaining, rate, k=v, k=v]`
            pairs = [pair for pair in _PAIR.findall(postfix) if pair[0]]
            if "]" not in postfix:  # a cut line: its last value may be cut too
                pairs = pairs[:-1]
            self._record(pairs, line, ts, out, bar=True)
            return True
        if "heckpoint" in text or "saving model to" in text:
            return self._checkpoint(text, line, ts, out)
        return False

    def _record(
        self,
        fields: list[tuple[str, str]],
        line: int,
        ts: float | None,
        out: ParseOutput,
        bar: bool,
    ) -> None:
        """Record one progress line, unless it repeats the previous bar or has no known field."""
        values: dict[str, float] = {}
        fallback: dict[str, float] = {}
        for key, raw in fields:
            k = norm_key(key.strip())
            name = _KEYS.get(k)
            if name is None and k not in _LOSS_FALLBACK:
                continue
            try:
                v = number(raw)
            except ValueError:
                continue
            if name is None:
                fallback[k] = v
            else:
                values.setdefault(name, v)
        step_value = values.pop("step", None)
        if "loss" not in values:
            for k in _LOSS_FALLBACK:
                if k in fallback:
                    values["loss"] = fallback[k]
                    break
        if step_value is not None and 0 <= step_value < _MAX_STEP:  # NaN fails too
            step = int(round(step_value))
        else:
            step = (self._step or 0) + 1
        val = values.pop("val_loss", None)
        if bar:
            drawn = (step, tuple(sorted(values.items())))
            if drawn == self._last_bar and (val is None or val == self._val_loss):
                return  # the same bar redrawn
            self._last_bar = drawn
        new_val = val is not None and val != self._val_loss
        if val is not None and new_val:
            values["val_loss"] = val
            self._val_loss = val
        if not values:
            return
        self._step = step
        nonfinite = [k for k, v in values.items() if is_nonfinite(v)]
        out.record(self.name, step, line, ts, values, nonfinite)
        if new_val:
            out.event(EventKind.VALIDATION, line, step, ts, val_loss=values["val_loss"])

    def _checkpoint(self, text: str, line: int, ts: float | None, out: ParseOutput) -> bool:
        if ts is None:
            t = _NEMO_TS.search(text)
            if t is not None:
                ts = timestamp(t.group(1))
                if ts is not None:
                    out.last_ts = ts
        m = _SCHEDULED.search(text)
        if m:
            path = m.group(1)
            s = _PATH_STEP.search(path)
            step = int(s.group(1)) if s else out.last_step
            self._scheduled = True
            out.event(EventKind.CHECKPOINT_SAVE, line, step, ts, path=path)
            return True
        m = _FINALIZED.search(text)
        if m:
            if not self._scheduled:  # the announcement was not in the log we read
                out.event(EventKind.CHECKPOINT_SAVE, line, int(m.group(1)), ts)
            self._scheduled = False
            return True
        m = _TOPK.search(text)
        if m:
            out.event(EventKind.CHECKPOINT_SAVE, line, int(m.group(1)), ts, path=m.group(2))
            return True
        m = _RESUMING.search(text)
        if m:
            path = m.group(1).strip("'\"")
            if path != self._last_load:
                self._last_load = path
                s = _PATH_STEP.search(path)
                if s:
                    step = int(s.group(1))
                    out.event(EventKind.CHECKPOINT_LOAD, line, step, ts, iteration=step, path=path)
                else:
                    out.event(EventKind.CHECKPOINT_LOAD, line, None, ts, path=path)
            return True
        return False

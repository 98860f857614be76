"""Restart audit: what changed at each restart of a run, each difference named with both values.

A restart is a new start after training records: a `config` event (the run printing what it was
told, again), a checkpoint load, a start from random weights, or the step counter going back or
repeating (a replay from a checkpoint). A start's events up to its first record are one start (a
Megatron arguments block, then the DeepSpeed JSON, then the load). It is judged at its second
record (or at the next start, or the end) against the run before it:

- what it was told (`run_config.KEYS`): each key it printed whose value differs from the latest
  value the run printed before;
- what it says alone: optimizer state not loaded (`load_optimizer` false, `finetune`), the LR
  schedule taken from the arguments (`override_lr_scheduler`), no checkpoint found;
- its records against those before it at the same step (linear between the nearest steps logged
  before; a replay compares equal steps): the learning rate, consumed samples and tokens, and
  samples per step (a batch ramp-up that starts again).

One alert per restart lists every difference; its severity is the worst one's: a warning for a
precision changed to fp16, optimizer state not loaded, no checkpoint found, the lr, samples or
tokens not where the run left them, a batch ramp-up starting again, a changed tokenizer or vocab;
info for the rest (another precision change, an overridden LR schedule, seed, data paths, batch
sizes, world size, ...). A clean restart raises nothing.

The first start of a log is a restart too when `--previous` gave the end of the job before
(`RunEnd`): the common case of one log file per job. Without it, a first start that continues a
run (a checkpoint of a later iteration loaded, or a first step past `resume_min_step`) is judged
on what it says alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

import numpy as np

from gradwatch.alerts import Alert, Severity
from gradwatch.detectors.base import BuiltInConfig, Detector, columns
from gradwatch.detectors.latest_config import config_of
from gradwatch.events import Event, EventKind
from gradwatch.parsers.stream import Batch
from gradwatch.run_config import KEYS

#: events that open (or belong to) a start
_STARTS = (EventKind.CONFIG, EventKind.CHECKPOINT_LOAD, EventKind.START_FROM_RANDOM)
#: what a start says alone, judged by `_alone`, not compared with the start before
_ALONE = frozenset({"load_optimizer", "finetune", "override_lr_scheduler"})
#: keys whose change is a warning: a model trained on other token ids
_WARN_KEYS = frozenset({"tokenizer", "vocab_size"})
#: records after a start that are compared with the run before it
_PROBE = 2
#: the record columns kept from before a restart
_KEPT = ("lr", "samples", "tokens")

_HINTS = {
    "fp16": "continuing a bf16 (or fp32) checkpoint in fp16 overflows: values trained in bf16's range "
    "exceed fp16's 65504, the dynamic loss scale halves step after step and collapses, and the loss "
    "climbs as if training from random; continue in the precision the checkpoint was trained in",
    "optimizer": "without the optimizer state Adam restarts its moments from zero and (fp16) the loss "
    "scaler from its initial scale: expect a grad-norm and loss spike; load the checkpoint with its "
    "optimizer state (drop no_load_optim / finetune, point load at the full checkpoint)",
    "random": "no checkpoint was found, so the run started again from random weights: check the load "
    "path and the checkpoint's `latest` file",
    "lr": "the learning rate did not continue where the run left it: the LR schedule restarted or was "
    "overridden (override_lr_scheduler, a new lr/min_lr/warm-up); use the checkpoint's scheduler "
    "unless the change is meant",
    "data": "the data loader did not continue where the run left it: samples are repeated or skipped; "
    "check that consumed samples were loaded with the checkpoint and the data paths did not change",
    "rampup": "the batch ramp-up started again, as in a fresh run: the consumed samples it is driven by "
    "were not loaded; drop rampup_batch_size for a continuation or load the full checkpoint",
    "override": "override_lr_scheduler takes the LR schedule from the arguments, not the checkpoint: check "
    "that lr, min_lr, warm-up and decay continue where the run was",
    "tokens": "a different tokenizer or vocabulary feeds the model other token ids than it was trained on",
    "changed": "the settings named changed at the restart: check that each change is meant",
}


@dataclass(frozen=True, kw_only=True)
class ResumeConfigConfig(BuiltInConfig):
    positive: ClassVar[tuple[str, ...]] = ("lr_ratio", "batch_ratio", "history")
    lr_ratio: float = 1.5
    data_tolerance: float = 0.01
    batch_ratio: float = 1.5
    history: int = 2000
    resume_min_step: int = 100


@dataclass
class _History:
    """The last records before the open start (steps rising), the columns in `_KEPT`."""

    steps: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    values: dict[str, np.ndarray] = field(default_factory=lambda: {k: np.empty(0) for k in _KEPT})

    def extend(self, steps: np.ndarray, values: dict[str, np.ndarray], keep: int) -> None:
        self.steps = np.concatenate([self.steps, steps])[-keep:]
        self.values = {k: np.concatenate([self.values[k], values[k]])[-keep:] for k in _KEPT}

    def before(self, step: int) -> None:
        """Drop the records at `step` and after: a replay from a checkpoint logs them again."""
        keep = self.steps < step
        self.steps = self.steps[keep]
        self.values = {k: v[keep] for k, v in self.values.items()}

    def expected(self, name: str, step: int) -> tuple[float, float] | None:
        """`name` at `step` as the run before logged it, and its change per step there: linear
        between the nearest logged steps, or on from the last two up to the span logged; None
        where the records before cannot tell."""
        ok = np.isfinite(self.values[name])
        steps, values = self.steps[ok].astype(np.float64), self.values[name][ok]
        if len(steps) < 2 or step < steps[0] or step - steps[-1] > steps[-1] - steps[0]:
            return None
        i = min(max(int(np.searchsorted(steps, step, side="right")), 1), len(steps) - 1)
        slope = (values[i] - values[i - 1]) / (steps[i] - steps[i - 1])
        if step <= steps[-1]:
            return float(np.interp(step, steps, values)), float(slope)
        return float(values[-1] + slope * (step - steps[-1])), float(slope)


class _Row(NamedTuple):
    """A record of a start's first ones."""

    step: int
    line: int
    lr: float
    samples: float
    tokens: float


@dataclass
class _Start:
    """A start: its events up to its first records, and those records."""

    line: int
    restart: bool
    why: str = ""  # the step counter's story, for a start seen only there
    after: str | None = None  # the log before this one, for its first start (`--previous`)
    told: dict[str, dict[str, Any]] = field(default_factory=dict)  # block source -> its canonical keys
    loaded: bool = False
    iteration: int | None = None
    from_random: bool = False
    records: list[_Row] = field(default_factory=list)

    def add(self, ev: Event) -> None:
        if ev.kind is EventKind.CONFIG:
            self.told.setdefault(str(ev.data.get("source", "")), {}).update(config_of(ev))
        elif ev.kind is EventKind.CHECKPOINT_LOAD:
            self.loaded = True
            it = ev.data.get("iteration")
            self.iteration = it if isinstance(it, int) and not isinstance(it, bool) else self.iteration
            if ev.data.get("load_optimizer") is False:  # a load that says it left the optimizer out
                self.told.setdefault("checkpoint-load", {})["load_optimizer"] = False
        else:
            self.from_random = True

    @property
    def config(self) -> dict[str, Any]:
        """Every key the start printed (a later block's value over an earlier one's)."""
        return merged(self.told)

    def reason(self) -> str:
        if self.iteration is not None:
            return f"checkpoint of iteration {self.iteration} loaded"
        if self.loaded:
            return "a checkpoint loaded"
        if self.from_random:
            return "started from random weights"
        return self.why or "configuration printed again"


@dataclass(frozen=True)
class _Finding:
    severity: Severity
    text: str
    hint: str


@dataclass(frozen=True)
class RunEnd:
    """Where a log left its run (`--previous`): the configuration it had printed, block by
    block and key by key, and its last records."""

    path: str
    told: dict[str, dict[str, Any]]
    history: _History
    last_step: int | None


class ResumeConfig(Detector):
    id = "resume_config"
    description = (
        "at a restart: precision, optimizer state, LR schedule, consumed samples, batch ramp-up, seed "
        "or data changed from the start before"
    )
    Config = ResumeConfigConfig
    config: ResumeConfigConfig

    def __init__(self, config: ResumeConfigConfig | None = None, path: str = "") -> None:
        super().__init__(config, path)
        #: per block source, the latest value of each key printed before the open start
        self._told: dict[str, dict[str, Any]] = {}
        self._history = _History()
        self._last_step: int | None = None
        self._start: _Start | None = None  # opened, not judged yet
        self._started = False  # a start was opened in this log
        self._after: str | None = None  # the log before this one (`continue_from`)

    def continue_from(self, end: RunEnd) -> None:
        """This log continues the run that `end` left: its first start is a restart."""
        self._told = {source: dict(keys) for source, keys in end.told.items()}
        self._history, self._last_step = end.history, end.last_step
        self._after = end.path

    def end(self) -> RunEnd:
        """Where this log left the run (after `finish`)."""
        return RunEnd(
            self.path, {source: dict(keys) for source, keys in self._told.items()}, self._history, self._last_step
        )

    def update(self, batch: Batch) -> list[Alert]:
        rec = columns(batch)
        values = {k: rec[k] for k in _KEPT}
        logged = (rec["step"] >= 0) & (np.isfinite(rec["loss"]) | np.isfinite(rec["grad_norm"]))
        for v in values.values():
            logged |= (rec["step"] >= 0) & np.isfinite(v)
        steps, lines = rec["step"][logged], rec["line"][logged]
        values = {k: v[logged] for k, v in values.items()}
        last = self._last_step if self._last_step is not None else np.iinfo(np.int64).min
        back = steps <= np.concatenate([[last], steps[:-1]])
        alerts: list[Alert] = []
        pos = 0
        for ev in (ev for ev in batch.events if ev.kind in _STARTS):
            end = int(np.searchsorted(lines, ev.line))  # the records before the event's line
            alerts += self._records(steps, lines, values, back, pos, end)
            pos = end
            alerts += self._event(ev)
        alerts += self._records(steps, lines, values, back, pos, len(steps))
        return alerts

    def finish(self) -> list[Alert]:
        return self._judge()

    def _event(self, ev: Event) -> list[Alert]:
        alerts: list[Alert] = []
        if self._start is not None and self._start.records:
            alerts += self._judge()  # the start before had its records: this is another one
        if self._start is None:
            self._start = self._open(ev.line)
        self._start.add(ev)
        return alerts

    def _open(self, line: int, why: str = "") -> _Start:
        after = None if self._started else self._after
        restart = self._started or after is not None
        self._started = True
        return _Start(line, restart, why, after)

    def _records(
        self,
        steps: np.ndarray,
        lines: np.ndarray,
        values: dict[str, np.ndarray],
        back: np.ndarray,
        lo: int,
        hi: int,
    ) -> list[Alert]:
        """Records lo..hi-1: those of an open start one by one, the rest into the history in bulk."""
        alerts: list[Alert] = []
        while lo < hi:
            step = int(steps[lo])
            start = self._start
            if start is not None and start.records and back[lo]:
                alerts += self._judge()  # a restart within the probe: judge what came before it
                start = None
            if start is None and (back[lo] or not self._started):
                start = self._start = self._open(int(lines[lo]), self._went_back(step))
            if start is not None:
                start.records.append(_Row(step, int(lines[lo]), *(float(values[k][lo]) for k in _KEPT)))
                self._last_step = step
                if len(start.records) >= _PROBE:
                    alerts += self._judge()
                lo += 1
                continue
            stop = lo + 1 + int(np.argmax(back[lo + 1 : hi])) if back[lo + 1 : hi].any() else hi
            self._history.extend(steps[lo:stop], {k: v[lo:stop] for k, v in values.items()}, self.config.history)
            self._last_step = int(steps[stop - 1])
            lo = stop
        return alerts

    def _went_back(self, step: int) -> str:
        last = self._last_step
        if last is None or step > last:
            return ""
        return f"step {step} logged again" if step == last else f"step went back from {last} to {step}"

    def _judge(self) -> list[Alert]:
        """Judge the open start, then make it the run before the next one."""
        start, self._start = self._start, None
        if start is None:
            return []
        found: list[_Finding] = []
        if start.restart:
            found += self._changed(start.told)
        if start.restart or self._continues(start):
            found += _alone(start)
        if start.restart and start.records:
            found += self._records_moved(start)
        for source, keys in start.told.items():
            self._told.setdefault(source, {}).update(keys)
        if start.records:
            self._history.before(start.records[0].step)
            kept = {k: np.array([getattr(r, k) for r in start.records], dtype=np.float64) for k in _KEPT}
            steps = np.array([r.step for r in start.records], dtype=np.int64)
            self._history.extend(steps, kept, self.config.history)
        if not found:
            return []
        return [self._alert(start, found)]

    def _continues(self, start: _Start) -> bool:
        """Whether a log's first start continues a run (its checkpoint is of a later iteration,
        or its first step is far into training), so that what it says alone matters."""
        if start.iteration is not None and start.iteration > 0:
            return True
        return bool(start.records) and start.records[0].step > self.config.resume_min_step

    def _changed(self, told: dict[str, dict[str, Any]]) -> list[_Finding]:
        """The keys each block printed that differ from what the same block printed before (a
        Megatron argument and the DeepSpeed JSON may rightly disagree: DeepSpeed's wins)."""
        changes: dict[str, tuple[Any, Any]] = {}
        for source, keys in told.items():
            before = self._told.get(source, {})
            for key, new in keys.items():
                if key in before and key not in changes and not _same(before[key], new):
                    changes[key] = (before[key], new)
        found = []
        for key in KEYS:
            if key in _ALONE or key not in changes:
                continue
            old, new = changes[key]
            text = f"{key} {_show(old)} -> {_show(new)}"
            if key == "precision" and new == "fp16":
                found.append(_Finding(Severity.WARNING, text, _HINTS["fp16"]))
            elif key in _WARN_KEYS:
                found.append(_Finding(Severity.WARNING, text, _HINTS["tokens"]))
            else:
                found.append(_Finding(Severity.INFO, text, _HINTS["changed"]))
        return found

    def _records_moved(self, start: _Start) -> list[_Finding]:
        """The start's records against the run's before it at the same steps."""
        cfg, found = self.config, []
        for name, what in (("lr", "lr"), ("samples", "consumed samples"), ("tokens", "consumed tokens")):
            first = next(((r.step, getattr(r, name)) for r in start.records if math.isfinite(getattr(r, name))), None)
            if first is None:
                continue
            step, value = first
            known = self._history.expected(name, step)
            if known is None:
                continue
            then = known[0]
            if name == "lr":
                if then > 0 and not (then / cfg.lr_ratio <= value <= then * cfg.lr_ratio):
                    text = f"lr {then:.4g} before at step {step} -> {value:.4g} after"
                    found.append(_Finding(Severity.WARNING, text, _HINTS["lr"]))
                continue
            slack = cfg.data_tolerance * abs(then) + abs(known[1])  # and a step's worth
            if abs(value - then) > slack:
                moved = "went back" if value < then else "jumped"
                text = f"{what} {moved}: {then:,.0f} before at step {step} -> {value:,.0f} after"
                found.append(_Finding(Severity.WARNING, text, _HINTS["data"]))
        return found + self._batch_fell(start)

    def _batch_fell(self, start: _Start) -> list[_Finding]:
        """Samples per step after the start far below those at the same step before: a batch
        ramp-up that started again."""
        rows = [(r.step, r.samples) for r in start.records if math.isfinite(r.samples)]
        if len(rows) < 2 or rows[1][0] <= rows[0][0]:
            return []
        after = (rows[1][1] - rows[0][1]) / (rows[1][0] - rows[0][0])
        known = self._history.expected("samples", rows[0][0])
        if known is None or not known[1] > 0 or after * self.config.batch_ratio >= known[1]:
            return []
        rampup = start.config.get("rampup_batch_size", merged(self._told).get("rampup_batch_size"))
        told = f" (rampup_batch_size {rampup})" if rampup else ""
        text = f"samples per step {known[1]:,.0f} before -> {after:,.0f} after: the batch ramp-up started again{told}"
        return [_Finding(Severity.WARNING, text, _HINTS["rampup"])]

    def _alert(self, start: _Start, found: list[_Finding]) -> Alert:
        found.sort(key=lambda f: -f.severity)
        step = start.records[0].step if start.records else None
        at = f"restart at step {step}" if step is not None else "restart"
        after = f", after {start.after}" if start.after is not None else ""
        hints = list(dict.fromkeys(f.hint for f in found if f.severity == found[0].severity))  # the worst's
        return self.alert(
            found[0].severity,
            step,
            start.line,
            None,
            None,
            None,
            None,
            f"{at} ({start.reason()}{after}): " + "; ".join(f.text for f in found),
            "; ".join(hints),
        )


def continue_run(detectors: list[Detector], end: RunEnd) -> None:
    """Tell the restart audit among `detectors` (where enabled) that its log continues `end`'s run."""
    for det in detectors:
        if isinstance(det, ResumeConfig):
            det.continue_from(end)


def _alone(start: _Start) -> list[_Finding]:
    """What a start that continues a run says of itself."""
    found = []
    config = start.config
    if start.from_random and not start.loaded:
        found.append(_Finding(Severity.WARNING, "no checkpoint found: started from random weights", _HINTS["random"]))
    if config.get("load_optimizer") is False:
        found.append(
            _Finding(Severity.WARNING, "optimizer state not loaded (load_optimizer false)", _HINTS["optimizer"])
        )
    if config.get("finetune") is True:
        text = "finetune true: weights only, the step and the optimizer state start again"
        found.append(_Finding(Severity.WARNING, text, _HINTS["optimizer"]))
    if config.get("override_lr_scheduler") is True:
        text = "override_lr_scheduler true: the LR schedule is taken from the arguments, not the checkpoint"
        found.append(_Finding(Severity.INFO, text, _HINTS["override"]))
    return found


def merged(told: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The keys of every block (`_Start.told`), a later block's value over an earlier one's."""
    out: dict[str, Any] = {}
    for keys in told.values():
        out.update(keys)
    return out


def _same(old: Any, new: Any) -> bool:
    if isinstance(old, int | float) and isinstance(new, int | float) and not isinstance(old, bool):
        return math.isclose(old, new, rel_tol=1e-9) or old == new
    return bool(old == new)


def _show(value: Any) -> str:
    if value is None or isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)

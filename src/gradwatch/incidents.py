"""Incidents: the alerts that tell one story, grouped across detectors and the files of a run.

Detectors stay independent and raise their own alerts (one per incident of their own: `Incident`
in detectors/base.py). The `Correlator` groups them, as they come (`tail`, `scan`) or all at the
end (`check`), with the same result when they come in the same order (line order within a file):
- one run: a file, or the files given together as one (`--run NAME`), where an alert that
  several ranks print for the same step is one alert naming their files;
- adjacent steps: an alert joins an incident when it is at most `gap_logs` logged steps from it,
  within one stretch of the run between restarts;
- a cause that explains the others: the trouble that begins within `restart_steps` after a restart
  (a checkpoint load, the step counter going back, a new configuration block) is one incident,
  told from the restart. A `trainer_error` ends the incident it joins: the run crashed.

An incident is over when the run has logged more than `gap_logs` steps past it, or restarted
after it. Its headline tells the chain in cause order: the restart, the overflows and the loss
scale, the spikes and trends, the crash. `Note`s tell the notification sinks when an incident
opens, grows worse (escalates) and ends: once each, whatever the number of alerts.
"""

from __future__ import annotations

import dataclasses
import heapq
import re
from array import array
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gradwatch.alerts import Alert, Severity
from gradwatch.config import IncidentConfig
from gradwatch.detectors.base import columns
from gradwatch.events import EventKind
from gradwatch.parsers.stream import Batch

__all__ = ["Correlator", "Incident", "Note", "in_run_order"]

#: Records whose step differences give a run's logging interval (their median).
INTERVAL_RECORDS = 20
#: Info alerts kept, per run, that no incident holds yet: one that opens soon after takes them.
LOOSE_INFO = 50
#: Detectors whose alerts are the restart's story, the fp16 scaler's, and the crash's; the rest
#: (spikes, trends, NaN) come between the scaler and the crash.
RESTART_DETECTORS = ("resume_config", "resume_regression")
SCALER_DETECTORS = ("loss_scale_collapse", "skipped_steps")
CRASH_DETECTOR = "trainer_error"
#: What a spike or trend detector's ratio (value over baseline) is a ratio of, in a headline.
RATIO_NAMES = {
    "grad_norm_spike": "grad norm",
    "loss_spike": "loss",
    "loss_divergence": "loss climbing",
    "logit_norm_drift": "logit norm growing",
}
_TRAILING_NOTE = re.compile(r"\s*\([^()]*\)\s*$")
_HEADLINE_PART_CHARS = 90


@dataclass
class _Restart:
    """Where a file of the run started again, and from which step (None until a record says)."""

    line: int
    step: int | None
    how: str


@dataclass
class _File:
    last_step: int | None = None
    first_step: int | None = None
    records: int = 0
    restarts: list[_Restart] = field(default_factory=list)
    #: `records` when the latest restart was noted
    records_at_restart: int = -1
    #: the line of the file's first configuration block (where a later job's file starts)
    start_line: int | None = None
    #: which job of the run wrote the file: files that started together (ranks, nodes) share it,
    #: a file that starts further on (the `slurm-%j.out` of a requeued job) is the next one's
    job: int = 0

    def restart_at(self, line: int | None) -> _Restart | None:
        """The latest restart at or before `line` (None: the latest of all)."""
        found = None
        for r in self.restarts:
            if line is not None and r.line > line:
                break
            found = r
        return found


@dataclass
class _Slot:
    """One kept alert: it is replaced when other ranks turn out to have raised it too."""

    alert: Alert


@dataclass
class Incident:
    """Alerts of one run that tell one story (see the module docstring)."""

    id: str
    run: str
    #: the step the stretch of the run it happened in resumed from (None: the run's start)
    stretch: int | None
    first_step: int | None
    end_step: int | None
    severity: Severity
    #: the step of its latest alert that is not info: the gap is counted from it (an "it is over"
    #: alert joins the incident but does not stretch it, so that a spike after it is a new one)
    last_hit: int | None = None
    slots: list[_Slot] = field(default_factory=list)
    #: the restart that explains it, when it began within `restart_steps` after one
    cause: _Restart | None = None
    headline: str = ""
    #: "crashed" (a trainer_error), "over" (the run logged past it, or restarted); None: open
    ended: str | None = None

    @property
    def alerts(self) -> list[Alert]:
        return [s.alert for s in self.slots]

    @property
    def paths(self) -> list[str]:
        seen: dict[str, None] = {}
        for a in self.alerts:
            for p in a.paths or (a.path or "",):
                seen.setdefault(p)
        return list(seen)

    def lead(self) -> Alert:
        """The first alert at the incident's severity: what a notification names."""
        return next(a for a in self.alerts if a.severity == self.severity)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "run": self.run,
            "paths": self.paths,
            "severity": str(self.severity),
            "first_step": self.first_step,
            "end_step": self.end_step,
            "ended": self.ended,
            "headline": self.headline,
            "resumed_at": None if self.cause is None else self.cause.step,
            "alerts": [
                {"detector": a.detector, "severity": str(a.severity), "step": a.step, "path": a.path, "line": a.line}
                for a in self.alerts
            ],
        }


@dataclass(frozen=True)
class Note:
    """What the notification sinks tell: an incident `opened`, `escalated` or `ended`.

    `alert` is the alert that opened or escalated it (with its incident id); for `ended`, the
    incident's lead alert. Its JSON is the alert's, plus `event` and `headline`.
    """

    event: str
    incident: str
    headline: str
    alert: Alert

    @property
    def severity(self) -> Severity:
        return self.alert.severity

    def to_json(self) -> dict[str, Any]:
        return {**self.alert.to_json(), "event": self.event, "headline": self.headline}


@dataclass
class _Run:
    name: str
    files: dict[str, _File] = field(default_factory=dict)
    steps_seen: list[int] = field(default_factory=list)  # step differences of the first records
    #: the highest step logged in each stretch (keyed by the step it resumed from)
    reached: dict[int | None, int] = field(default_factory=dict)
    overflow_step: array[int] = field(default_factory=lambda: array("q"))
    overflow_from: array[float] = field(default_factory=lambda: array("d"))
    overflow_to: array[float] = field(default_factory=lambda: array("d"))
    incidents: list[Incident] = field(default_factory=list)
    loose: deque[_Slot] = field(default_factory=lambda: deque(maxlen=LOOSE_INFO))
    #: (detector, severity, step or message) -> the kept alert, for the ranks' copies of it
    copies: dict[tuple[str, str, Any], tuple[_Slot, str]] = field(default_factory=dict)
    ids: dict[str, int] = field(default_factory=dict)

    @property
    def interval(self) -> float:
        return float(np.median(self.steps_seen)) if self.steps_seen else 1.0

    def file(self, path: str) -> _File:
        return self.files.setdefault(path, _File())


class Correlator:
    """Alerts in, incidents out; fed the batches of the run's files too (`observe`), for the
    restarts, overflows and logging interval that alerts do not carry.

    `run`: the name of one run that every file belongs to (`--run NAME`); None: each file is a run.
    Plain data, so that `scan` keeps it between passes (`gradwatch.state`).
    """

    def __init__(self, config: IncidentConfig | None = None, run: str | None = None) -> None:
        self.config = config or IncidentConfig()
        self.run_name = run
        self.runs: dict[str, _Run] = {}
        self.slots: list[_Slot] = []

    # ---- input --------------------------------------------------------------------------------
    def observe(self, path: str, batch: Batch) -> list[Note]:
        """What a batch of `path` says besides alerts; returns the incidents its restarts ended.

        Records go in bulk between the places that need a look of their own: a checkpoint load
        or configuration block (by line), and a step that went back."""
        run = self._run(path)
        f = run.file(path)
        for ev in batch.events:
            if ev.kind is EventKind.OVERFLOW and ev.step is not None:
                run.overflow_step.append(int(ev.step))
                run.overflow_from.append(_scale(ev.data.get("attempted")))
                run.overflow_to.append(_scale(ev.data.get("new")))
        starts = sorted(
            (ev for ev in batch.events if ev.kind in (EventKind.CHECKPOINT_LOAD, EventKind.CONFIG)),
            key=lambda ev: ev.line,
        )
        cols = columns(batch)
        logged = cols["step"] >= 0
        steps, lines = cols["step"][logged], cols["line"][logged]
        before = np.concatenate([[f.last_step if f.last_step is not None else -1], steps[:-1]])
        back = np.flatnonzero(steps < before)
        at_starts = np.searchsorted(lines, [ev.line for ev in starts], side="right")
        cuts = sorted({0, len(steps), *back.tolist(), *at_starts.tolist()})
        notes: list[Note] = []
        e = 0
        for lo, hi in zip(cuts, cuts[1:] + [len(steps)], strict=True):
            while e < len(starts) and (lo >= len(steps) or starts[e].line <= lines[lo]):
                notes += self._start(run, f, path, starts[e].kind, starts[e].line, starts[e].data)
                e += 1
            if lo < hi:
                notes += self._records(run, f, path, steps[lo:hi], int(lines[lo]))
        return notes

    def add(self, alert: Alert) -> tuple[Alert | None, list[Note]]:
        """Group one alert. Returns it with its incident id (None when it is another rank's copy
        of an alert already kept: that one now names this file too) and the notes it caused."""
        run = self._run(alert.path or "")
        if self.run_name is not None:
            kept = run.copies.get(_copy_key(alert))
            if kept is not None and kept[1] != alert.path:
                slot, first = kept
                named = slot.alert.paths or (first,)
                if alert.path not in named:
                    slot.alert = dataclasses.replace(slot.alert, paths=(*named, alert.path or ""))
                return None, []
        slot = _Slot(alert)
        self.slots.append(slot)
        if self.run_name is not None:
            run.copies.setdefault(_copy_key(alert), (slot, alert.path or ""))
        incident = self._incident_for(run, alert)
        if incident is None and alert.severity is Severity.INFO:
            run.loose.append(slot)
            return alert, []
        if incident is None:
            incident = self._open(run, alert)
            self._attach(incident, slot)
            self._take_loose(run, incident)
            event: str | None = "opened"
        else:
            was = incident.severity
            self._attach(incident, slot)
            event = "escalated" if incident.severity > was else None
        if alert.detector == CRASH_DETECTOR and alert.severity is not Severity.INFO and incident.ended != "crashed":
            incident.ended = "crashed"
            event = event or "ended"  # a crash that joins an incident already told ends it
        incident.headline = headline(incident, _Overflows.of(run))
        return slot.alert, [] if event is None else [Note(event, incident.id, incident.headline, slot.alert)]

    def add_all(self, alerts: Iterable[Alert]) -> list[Note]:
        notes: list[Note] = []
        for alert in alerts:
            notes += self.add(alert)[1]
        return notes

    def settle(self) -> list[Note]:
        """Incidents the run has logged past, or restarted after, are over: asked after the alerts
        of what was read (each read of a tail, the end of a scan or a check), so that an alert of
        the steps read still joins its incident first."""
        notes: list[Note] = []
        for run in self.runs.values():
            gap = self._gap(run)
            for inc in run.incidents:
                reached = run.reached.get(inc.stretch)
                past = reached is not None and reached > _end_of(inc) + gap
                if inc.ended is None and (past or self._restarted_after(run, inc)):
                    notes.append(self._end(inc))
        return notes

    # ---- output -------------------------------------------------------------------------------
    @property
    def incidents(self) -> list[Incident]:
        """Every incident, by run, in the order they opened."""
        return [inc for run in self.runs.values() for inc in run.incidents]

    @property
    def alerts(self) -> list[Alert]:
        """Every alert kept, each with its incident id; a copy that other ranks printed is one."""
        return [s.alert for s in self.slots]

    # ---- runs, restarts, records -------------------------------------------------------------
    def _run(self, path: str) -> _Run:
        name = self.run_name if self.run_name is not None else path
        run = self.runs.get(name)
        if run is None:
            run = self.runs[name] = _Run(name)
        return run

    def _start(self, run: _Run, f: _File, path: str, kind: EventKind, line: int, data: dict[str, Any]) -> list[Note]:
        """A checkpoint load or a configuration block: a restart, unless it is the file's own start."""
        if kind is EventKind.CONFIG:
            if f.records == 0:
                f.start_line = line if f.start_line is None else f.start_line
                return []  # the file's first start: a restart only if it is a later job's (`_records`)
            return self._restart(run, f, path, _Restart(line, None, "new configuration"))
        iteration = data.get("iteration")
        step = iteration if isinstance(iteration, int) and not isinstance(iteration, bool) else None
        if step == 0:
            return []  # weights for a new run (a fine-tune's base model), not a resume
        if f.records == 0 and f.start_line is not None:
            line = f.start_line  # the file's start begins at its configuration block
        return self._restart(run, f, path, _Restart(line, step, "checkpoint load"))

    def _restart(self, run: _Run, f: _File, path: str, restart: _Restart) -> list[Note]:
        if f.restarts and f.records == f.records_at_restart:
            last = f.restarts[-1]  # no record since it: a load printed twice, a config block beside its load
            if last.step is None:
                last.step = restart.step
            return []
        f.restarts.append(restart)
        f.records_at_restart = f.records
        return [self._end(inc) for inc in run.incidents if inc.ended is None and self._before(run, inc, path, restart)]

    @staticmethod
    def _before(run: _Run, inc: Incident, path: str, restart: _Restart) -> bool:
        """Whether `inc` happened before `restart` of `path`: earlier in that file, or in the files
        of an earlier job of the run."""
        if any(a.path == path and (a.line or 0) < restart.line for a in inc.alerts):
            return True
        job = run.file(path).job
        return bool(inc.paths) and all(p in run.files and run.files[p].job < job for p in inc.paths)

    def _records(self, run: _Run, f: _File, path: str, steps: np.ndarray, line: int) -> list[Note]:
        """Records of one stretch, in order; the first may have gone back (a restart)."""
        notes: list[Note] = []
        first = int(steps[0])
        if f.records == 0 and self.run_name is not None:
            notes += self._first_records(run, f, path, first, line)
        if f.last_step is not None and first < f.last_step:
            went = f"step went back from {f.last_step:,}"
            notes += self._restart(run, f, path, _Restart(line, max(first - 1, 0), went))
        elif f.last_step is not None and first > f.last_step:
            self._interval(run, np.concatenate([[f.last_step], steps]))
        else:
            self._interval(run, steps)
        restart = f.restarts[-1] if f.restarts else None
        if restart is not None and restart.step is None:
            restart.step = max(first - 1, 0)
        stretch = None if restart is None else restart.step
        highest = int(steps.max())
        run.reached[stretch] = max(run.reached.get(stretch, highest), highest)
        f.last_step = int(steps[-1])
        f.records += len(steps)
        return notes

    def _first_records(self, run: _Run, f: _File, path: str, first: int, line: int) -> list[Note]:
        """A file of the run logs its first step: it started with the files whose first steps are
        within a logging interval of it (ranks, nodes: the same job), or later, as the next job (a
        requeued `slurm-%j.out`), whose start is a restart of the run."""
        f.first_step = first
        others = [g for p, g in run.files.items() if p != path and g.first_step is not None]
        if not others:
            return []
        peers = [g for g in others if abs(first - (g.first_step or 0)) <= run.interval]
        if peers or first < min(g.first_step or 0 for g in others):
            f.job = max((g.job for g in peers), default=0)
            return []
        f.job = 1 + max(g.job for g in others)
        if f.restarts:  # it said where it resumed (a checkpoint load): that is the restart
            return []
        start = line if f.start_line is None else f.start_line
        return self._restart(run, f, path, _Restart(start, max(first - 1, 0), "next job's log"))

    @staticmethod
    def _interval(run: _Run, steps: np.ndarray) -> None:
        if len(run.steps_seen) < INTERVAL_RECORDS:
            diffs = np.diff(steps[: INTERVAL_RECORDS + 1])
            run.steps_seen += diffs[diffs > 0][: INTERVAL_RECORDS - len(run.steps_seen)].tolist()

    def _restarted_after(self, run: _Run, inc: Incident) -> bool:
        """Whether a file of the incident restarted after its alerts there, or a later job's
        file of the run started."""
        jobs = [run.files[p].job for p in inc.paths if p in run.files]
        if jobs and any(f.job > max(jobs) and f.restarts for f in run.files.values()):
            return True
        for path in inc.paths:
            f = run.files.get(path)
            last = max((a.line or 0 for a in inc.alerts if a.path == path), default=0)
            if f is not None and any(r.line > last for r in f.restarts):
                return True
        return False

    @staticmethod
    def _end(inc: Incident) -> Note:
        inc.ended = "over"
        return Note("ended", inc.id, inc.headline, inc.lead())

    def _gap(self, run: _Run) -> float:
        return self.config.gap_logs * run.interval

    # ---- grouping -----------------------------------------------------------------------------
    @staticmethod
    def _restart_of(run: _Run, alert: Alert) -> _Restart | None:
        f = run.files.get(alert.path or "")
        return None if f is None else f.restart_at(alert.line)

    def _stretch_of(self, run: _Run, alert: Alert) -> int | None:
        restart = self._restart_of(run, alert)
        return None if restart is None else restart.step

    def _incident_for(self, run: _Run, alert: Alert) -> Incident | None:
        """The incident `alert` joins: one of its stretch within the gap, or the one its stretch's
        restart explains; an alert without a step joins the run's latest open incident."""
        restart = self._restart_of(run, alert)
        stretch = None if restart is None else restart.step
        candidates = [inc for inc in run.incidents if inc.stretch == stretch and inc.ended != "crashed"]
        if alert.step is None:
            return next((inc for inc in reversed(candidates) if inc.ended is None), None)
        gap = self._gap(run)
        for inc in candidates:
            if inc.first_step is not None and inc.first_step - gap <= alert.step <= _end_of(inc) + gap:
                return inc
        if self._explains(restart, alert.step):
            return next((inc for inc in candidates if inc.cause is restart), None)
        return None

    def _explains(self, restart: _Restart | None, step: int | None) -> bool:
        if restart is None or restart.step is None or step is None:
            return False
        return restart.step <= step <= restart.step + self.config.restart_steps

    def _open(self, run: _Run, alert: Alert) -> Incident:
        where = f"{alert.step}" if alert.step is not None else f"line{alert.line or 0}"
        base = f"{run.name}@{where}"
        n = run.ids[base] = run.ids.get(base, 0) + 1
        restart = self._restart_of(run, alert)
        inc = Incident(
            id=base if n == 1 else f"{base}#{n}",
            run=run.name,
            stretch=None if restart is None else restart.step,
            first_step=alert.step,
            end_step=alert.step,
            severity=alert.severity,
            cause=restart if self._explains(restart, alert.step) else None,
        )
        run.incidents.append(inc)
        return inc

    @staticmethod
    def _attach(inc: Incident, slot: _Slot) -> None:
        a = slot.alert
        inc.slots.append(slot)
        if a.step is not None:
            inc.first_step = a.step if inc.first_step is None else min(inc.first_step, a.step)
            inc.end_step = a.step if inc.end_step is None else max(inc.end_step, a.step)
            if a.severity is not Severity.INFO:
                inc.last_hit = a.step if inc.last_hit is None else max(inc.last_hit, a.step)
        inc.severity = max(inc.severity, a.severity)
        slot.alert = dataclasses.replace(a, incident=inc.id)

    def _take_loose(self, run: _Run, inc: Incident) -> None:
        """Info alerts that came just before the incident, in its stretch: they are part of it."""
        gap = self._gap(run)
        for slot in list(run.loose):
            a = slot.alert
            near = a.step is not None and inc.first_step is not None and abs(a.step - inc.first_step) <= gap
            if near and self._stretch_of(run, a) == inc.stretch:
                run.loose.remove(slot)
                self._attach(inc, slot)


def _end_of(inc: Incident) -> float:
    """Where the incident's gap is counted from: its last hit, else its last step (infinitely far
    back when none of its alerts has a step)."""
    end = inc.last_hit if inc.last_hit is not None else inc.end_step
    return -np.inf if end is None else end


def _scale(value: Any) -> float:
    """A loss scale an overflow event names (NaN where the line did not say)."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else np.nan


def _copy_key(alert: Alert) -> tuple[str, str, Any]:
    return (alert.detector, str(alert.severity), alert.step if alert.step is not None else alert.message)


# ---- headlines -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Overflows:
    step: np.ndarray
    attempted: np.ndarray
    new: np.ndarray

    @classmethod
    def of(cls, run: _Run) -> _Overflows:
        return cls(
            np.frombuffer(run.overflow_step, dtype=np.int64) if len(run.overflow_step) else np.zeros(0, np.int64),
            np.frombuffer(run.overflow_from) if len(run.overflow_from) else np.zeros(0),
            np.frombuffer(run.overflow_to) if len(run.overflow_to) else np.zeros(0),
        )

    def phrase(self, first: int, last: int) -> str | None:
        """ "11 overflows in 11 steps, loss scale 8,192 → 4" for the overflows of steps first..last
        (the ranks' copies of one overflow are one)."""
        at = np.flatnonzero((self.step >= first) & (self.step <= last))
        if not len(at):
            return None
        steps = np.unique(self.step[at])
        span = int(steps[-1] - steps[0]) + 1
        text = f"{len(steps):,} overflow{'s' if len(steps) != 1 else ''} in {span:,} step{'s' if span != 1 else ''}"
        start, end = self.attempted[at[0]], self.new[at[-1]]
        if np.isfinite(start) and np.isfinite(end) and end < start:
            text += f", loss scale {_number(start)} → {_number(end)}"
        return text


def headline(inc: Incident, overflows: _Overflows) -> str:
    """The chain in one sentence: restart; overflows and loss scale; spikes and trends; crash."""
    alerts = [a for a in inc.alerts if a.severity is not Severity.INFO or a.detector == CRASH_DETECTOR]
    alerts = alerts or inc.alerts
    by_detector: dict[str, list[Alert]] = {}
    for a in sorted(alerts, key=lambda a: (a.step is None, a.step or 0)):
        by_detector.setdefault(a.detector, []).append(a)
    parts: list[str] = []
    resumed = [_restart_phrase(a.message) for d in RESTART_DETECTORS for a in by_detector.pop(d, [])]
    if inc.cause is not None and inc.cause.step is not None:
        again = "started again from step 0" if inc.cause.step == 0 else f"resumed at {inc.cause.step:,}"
        told = f"{again} ({inc.cause.how})"
        parts.append(told + (": " + ", ".join(resumed) if resumed else ""))
    elif resumed:
        parts.append("resumed: " + ", ".join(resumed))
    scaler = [a for d in SCALER_DETECTORS for a in by_detector.pop(d, [])]
    told_overflows = None
    if inc.first_step is not None and inc.end_step is not None:
        told_overflows = overflows.phrase(inc.first_step, inc.end_step)
    if told_overflows is not None:
        parts.append(told_overflows)
    elif scaler:
        parts.append(_scaler_phrase(scaler))
    crash = by_detector.pop(CRASH_DETECTOR, [])
    for detector, found in by_detector.items():
        parts.append(_phrase(detector, found))
    parts += [_short(a.message) for a in crash]
    return "; ".join(parts)


def _phrase(detector: str, alerts: list[Alert]) -> str:
    """A spike or trend as its largest ratio ("grad norm 35x"), else its first alert's message."""
    name = RATIO_NAMES.get(detector)
    ratios = [a.value / a.baseline for a in alerts if a.value is not None and a.baseline and a.baseline > 0]
    if name is None or not ratios:
        return _short(alerts[0].message)
    return f"{name} {_ratio(max(ratios))}"


def _restart_phrase(message: str) -> str:
    """What changed at a restart, as its differences' heads: "restart at step 401 (...):
    precision bf16 -> fp16; optimizer state not loaded (load_optimizer false); ..." gives
    "precision bf16 -> fp16, optimizer state not loaded" (the headline says where it resumed)."""
    head, sep, differences = message.partition("): ")
    if not sep or not head.startswith("restart at step"):
        return _short(message)
    return ", ".join(_TRAILING_NOTE.sub("", d.split(": ")[0]).strip() for d in differences.split("; "))


def _scaler_phrase(alerts: list[Alert]) -> str:
    """The loss scale's fall as its lowest value ("loss scale down to 1"), else the first message."""
    values = [a.value for a in alerts if a.value is not None and np.isfinite(a.value)]
    return f"loss scale down to {_number(min(values))}" if values else _short(alerts[0].message)


def _ratio(r: float) -> str:
    return f"{r:,.0f}x" if r >= 10 else f"{r:.1f}x"


def _number(v: float) -> str:
    return f"{v:,.0f}" if v >= 1 and float(v).is_integer() else f"{v:.3g}"


def _short(message: str) -> str:
    """A message without its trailing note in brackets, cut to a headline's length."""
    text = _TRAILING_NOTE.sub("", message).strip() or message
    return text if len(text) <= _HEADLINE_PART_CHARS else text[: _HEADLINE_PART_CHARS - 3] + "..."


# ---- check's order ---------------------------------------------------------------------------------
def in_run_order(per_file: list[list[Alert]]) -> list[Alert]:
    """The alerts of a run's files, each file's in line order, interleaved by step as a tail of
    them all would see them (ranks print the same steps at the same time)."""
    if len(per_file) == 1:
        return per_file[0]
    return list(heapq.merge(*per_file, key=lambda a: -1 if a.step is None else a.step))

"""Stragglers and dead ranks: a file of a run that falls behind while the others go on.

A run given as several files (`--run NAME`: rank files, per-node outputs) logs the same steps in
each file at about the same time. A rank that hangs, dies or crawls (a GPU fault, an OOM kill, a
lost node, a slow disk) shows as its file falling behind the others; no detector of one file can
see that, so it is judged here, across the run's files:

- `check`: a file whose last step is more than `lag_logs` logged steps behind the newest last step
  of the files that started with it;
- `tail`: the same while following, or a file that has logged no step for the stall detector's
  wall-clock limit while another file of the run logged newer steps within it.

Only files with records count (Megatron prints its progress from one rank: the others' files say
nothing about steps), and only files that started together are compared: successive jobs of a run
(`slurm-%j.out` of each requeue) start where the one before ended, which is not a lag.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePath

from gradwatch.alerts import Alert, Severity
from gradwatch.config import StragglerConfig
from gradwatch.pipeline import FileSummary

__all__ = ["DETECTOR", "StragglerWatch", "stragglers"]

DETECTOR = "straggler"
_HINT = (
    "A rank or node whose log falls behind has hung, died or slowed (a GPU or NCCL error, an OOM "
    "kill, a lost node): read that file's last lines and the node's health (dmesg, nvidia-smi, ECC "
    "errors). Output held in a buffer lags too: PYTHONUNBUFFERED=1 writes each line as it is printed."
)


@dataclass(frozen=True)
class _Group:
    """Files of a run that started together (their first steps at most one logging interval
    apart), with that interval: the median of their records' spacing."""

    files: list[FileSummary]
    interval: float

    def ahead(self, f: FileSummary) -> list[FileSummary]:
        return [g for g in self.files if g is not f and _last(g) > _last(f)]


def _groups(files: Sequence[FileSummary]) -> list[_Group]:
    logged = sorted((f for f in files if f.first_step is not None and f.last_step is not None), key=_first)
    groups: list[_Group] = []
    members: list[FileSummary] = []
    for f in [*logged, None]:
        if f is not None and members and _first(f) - _first(members[0]) <= _interval([*members, f]):
            members.append(f)
            continue
        if len(members) > 1:
            groups.append(_Group(members, _interval(members)))
        members = [] if f is None else [f]
    return groups


def _interval(files: Sequence[FileSummary]) -> float:
    """The files' median logging interval, in steps (1 while none says)."""
    paces = [(_last(f) - _first(f)) / (f.records - 1) for f in files if f.records > 1 and _last(f) > _first(f)]
    return statistics.median(paces) if paces else 1.0


def _first(f: FileSummary) -> int:
    assert f.first_step is not None
    return f.first_step


def _last(f: FileSummary) -> int:
    assert f.last_step is not None
    return f.last_step


def _behind(group: _Group, config: StragglerConfig) -> list[tuple[FileSummary, int]]:
    """(file, the group's newest step) for the files more than `lag_logs` logged steps behind."""
    newest = max(_last(f) for f in group.files)
    limit = config.lag_logs * group.interval
    return [(f, newest) for f in group.files if newest - _last(f) > limit]


def stragglers(files: Sequence[FileSummary], config: StragglerConfig) -> list[Alert]:
    """`check`'s judgement of a run's files, read to their ends: one warning per file far behind."""
    if not config.enabled:
        return []
    return [
        _lag_alert(config, group, f, newest, f"the other files of the run reached {newest:,}")
        for group in _groups(files)
        for f, newest in _behind(group, config)
    ]


class StragglerWatch:
    """`tail`'s judgement of a run's files, asked at every wake-up; one alert per file and step."""

    def __init__(self, config: StragglerConfig) -> None:
        self.config = config
        self._told: dict[str, int] = {}

    def look(
        self, files: Sequence[FileSummary], last_step_at: Mapping[str, float], limits: Mapping[str, float], now: float
    ) -> list[Alert]:
        """`last_step_at`: when each file last logged a step; `limits`: each file's stall limit in
        seconds (the stall detector's; inf while it does not know the pace)."""
        if not self.config.enabled:
            return []
        found: dict[str, Alert] = {}
        for group in _groups(files):
            for f, newest in _behind(group, self.config):
                said = f"the other files of the run are at {newest:,}"
                found[f.path] = _lag_alert(self.config, group, f, newest, said)
            for f in group.files:
                at, limit = last_step_at.get(f.path), limits.get(f.path, float("inf"))
                if f.path in found or at is None or now - at <= limit:
                    continue
                going = [g for g in group.ahead(f) if now - last_step_at.get(g.path, -float("inf")) <= limit]
                if going:
                    found[f.path] = _silence_alert(f, max(_last(g) for g in going), now - at, limit)
        new = [a for path, a in found.items() if self._told.get(path) != a.step]
        self._told.update({a.path or "": a.step or 0 for a in new})
        return new


def _lag_alert(config: StragglerConfig, group: _Group, f: FileSummary, newest: int, said: str) -> Alert:
    limit = config.lag_logs * group.interval
    return Alert(
        DETECTOR,
        Severity.WARNING,
        _last(f),
        "step",
        float(_last(f)),
        float(newest),
        limit,
        f"{_name(f)} fell behind at step {_last(f):,}; {said} (more than {config.lag_logs} logged steps on)",
        _HINT,
        path=f.path,
    )


def _silence_alert(f: FileSummary, newest: int, silent: float, limit: float) -> Alert:
    return Alert(
        DETECTOR,
        Severity.WARNING,
        _last(f),
        "step_time_s",
        silent,
        None,
        limit,
        f"{_name(f)} fell silent after step {_last(f):,}; the other files of the run went on to {newest:,} "
        f"(no step for {silent:,.0f} s, limit {limit:,.0f} s)",
        _HINT,
        path=f.path,
    )


def _name(f: FileSummary) -> str:
    """The file's name (the alert's path gives it in full)."""
    return PurePath(f.path).name

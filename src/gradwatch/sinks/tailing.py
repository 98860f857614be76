"""What a `gradwatch tail` run tells its outputs, and the interface those outputs implement.

Three outputs (a line per alert, JSON lines, a live view) receive the same facts: alerts, the
incidents they make up as these open, escalate and end (`gradwatch.incidents.Note`), notices
about files (added, rotated, truncated, missing, unreadable) and `--on-alert` failures, a status
now and then, and a summary at the end. They are plain dataclasses so that the outputs know
nothing about followers or detectors.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from gradwatch.alerts import Alert, Severity
from gradwatch.incidents import Note
from gradwatch.parsers.stream import Batch
from gradwatch.pipeline import FileCheck, FileSummary

__all__ = ["Notice", "TailSink", "TailStatus", "TailSummary", "counts_text", "incident_json", "severity_counts"]


def counts_text(counts: dict[str, int]) -> str:
    return f"{counts['critical']} critical, {counts['warning']} warning, {counts['info']} info"


@dataclass(frozen=True)
class Notice:
    """Something that happened to a file, or to an `--on-alert` command."""

    #: added, rotated, truncated, missing, unreadable, on-alert failed, snapshot failed, metrics (its URL)
    kind: str
    path: str
    detail: str = ""
    at: float = field(default_factory=time.time)

    def to_json(self) -> dict[str, Any]:
        return {"type": "notice", "kind": self.kind, "path": self.path, "detail": self.detail, "time": self.at}

    def __str__(self) -> str:
        return f"{self.kind}: {self.path}" + (f" ({self.detail})" if self.detail else "")


@dataclass(frozen=True)
class TailStatus:
    """How following goes, for the status line."""

    #: "inotify", or "polling every 0.25 s (why)"
    mode: str
    files: int
    lines: int
    records: int
    lines_per_s: float
    #: seconds since bytes last arrived (None: nothing yet)
    idle_s: float | None
    alerts: dict[str, int]
    at: float = field(default_factory=time.time)

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "status",
            "mode": self.mode,
            "files": self.files,
            "lines": self.lines,
            "records": self.records,
            "lines_per_s": round(self.lines_per_s, 2),
            "idle_s": None if self.idle_s is None else round(self.idle_s, 2),
            "alerts": self.alerts,
            "time": self.at,
        }

    def __str__(self) -> str:
        idle = "no data yet" if self.idle_s is None else f"last data {_ago(self.idle_s)}"
        files = f"{self.files} file{'s' if self.files != 1 else ''}"
        return (
            f"{self.mode} · {files} · {_count(self.lines, 'line')} ({self.lines_per_s:.1f}/s) · "
            f"{_count(self.records, 'record')} · {idle} · {counts_text(self.alerts)}"
        )


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'s' if n != 1 else ''}"


def _ago(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s ago"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


@dataclass(frozen=True)
class TailSummary:
    """The end of a run: per-file totals, alert counts, and why it stopped."""

    files: list[FileSummary]
    alerts: dict[str, int]
    exit_code: int
    #: "interrupted", "end of input", or "--exit-on critical"
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "summary",
            "reason": self.reason,
            "files": [
                {
                    "path": f.path,
                    "format": f.format,
                    "layout": f.layout,
                    "records": f.records,
                    "first_step": f.first_step,
                    "last_step": f.last_step,
                    "lines": f.lines,
                }
                for f in self.files
            ],
            "alerts": self.alerts,
            "exit_code": self.exit_code,
        }

    def __str__(self) -> str:
        records = sum(f.records for f in self.files)
        n = len(self.files)
        return (
            f"tail stopped ({self.reason}): {n} file{'s' if n != 1 else ''}, {_count(records, 'record')}; "
            f"{counts_text(self.alerts)} (exit {self.exit_code})"
        )


class TailSink(Protocol):
    """An output of `gradwatch tail`. Called from one thread only."""

    def start(self, status: TailStatus) -> None:
        """Following begins (history has been read)."""

    def batch(self, check: FileCheck, batch: Batch) -> None:
        """A file produced records (live views keep their recent values)."""

    def alert(self, alert: Alert) -> None: ...

    def incident(self, note: Note) -> None:
        """An incident opened, escalated or ended."""

    def notice(self, notice: Notice) -> None: ...

    def status(self, status: TailStatus, periodic: bool) -> None:
        """Called at every wake-up; `periodic` marks the ones due for a status line."""

    def close(self, summary: TailSummary) -> None:
        """The end of the run."""


def incident_json(note: Note) -> dict[str, Any]:
    """An incident note as a JSON line: what changed, the incident, and the alert that changed it."""
    a = note.alert
    return {
        "type": "incident",
        "event": note.event,
        "incident": note.incident,
        "severity": str(note.severity),
        "headline": note.headline,
        "detector": a.detector,
        "step": a.step,
        "path": a.path,
        "time": time.time(),
    }


def severity_counts(alerts: list[Alert]) -> dict[str, int]:
    return {str(s): sum(a.severity == s for a in alerts) for s in Severity}

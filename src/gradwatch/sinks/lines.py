"""Line outputs of `gradwatch tail`: a text line per alert and incident note, or a JSON object per line.

Both are written as things happen and flushed at once, because something downstream (a pager
script, `jq`, a log collector) is waiting for them. Text goes through rich `Text` objects (never
markup) after `safe_text`, so a log line cannot style or drive the terminal; colour follows rich's
rules (none when piped, none with NO_COLOR) unless `--color` says otherwise. JSON escapes control
characters by itself.
"""

from __future__ import annotations

import json
import time
from typing import Any, TextIO

from rich.console import Console
from rich.text import Text

from gradwatch.alerts import Alert
from gradwatch.incidents import Note
from gradwatch.parsers.stream import Batch
from gradwatch.pipeline import FileCheck
from gradwatch.sinks.report import SEVERITY_STYLE
from gradwatch.sinks.safe import safe_text
from gradwatch.sinks.tailing import Notice, TailStatus, TailSummary, incident_json

__all__ = ["JsonlSink", "TextSink", "alert_line", "incident_line"]


def alert_line(alert: Alert, at: float | None = None) -> Text:
    """One line: time, severity, detector, step, where, message and hint."""
    t = Text(no_wrap=True)
    t.append(time.strftime("%H:%M:%S ", time.localtime(at)), style="dim")
    t.append(f"{str(alert.severity).upper():<8}", style=SEVERITY_STYLE[alert.severity])
    t.append(f" {alert.detector}", style="bold")
    if alert.step is not None:
        t.append(f" step {alert.step:,}")
    where = f"{alert.path}:{alert.line}" if alert.line is not None else (alert.path or "")
    t.append(f" {safe_text(where)}", style="dim")
    t.append(f" {safe_text(alert.message)}")
    t.append(f" (hint: {safe_text(alert.hint)})", style="italic dim")
    if alert.snapshot is not None:
        t.append(f" snapshot: {safe_text(alert.snapshot)}", style="dim")
    return t


def incident_line(note: Note, at: float | None = None) -> Text:
    """One line: time, severity, "incident opened" (escalated, ended), its id and headline."""
    t = Text(no_wrap=True)
    t.append(time.strftime("%H:%M:%S ", time.localtime(at)), style="dim")
    t.append(f"{str(note.severity).upper():<8}", style=SEVERITY_STYLE[note.severity])
    t.append(f" incident {note.event}", style="bold")
    t.append(f" {safe_text(note.incident)}", style="dim")
    t.append(f" {safe_text(note.headline)}")
    return t


#: Notices that say something went wrong: `--quiet` keeps them.
_PROBLEMS = frozenset({"unreadable", "on-alert failed", "snapshot failed"})


class TextSink:
    """A line per alert and notice; a status line at start and every `--status-every` seconds.
    `quiet`: the alerts and the notices of problems only (nothing while all is well)."""

    def __init__(self, console: Console, quiet: bool = False) -> None:
        self._console = console
        self._quiet = quiet

    def _line(self, text: Text) -> None:
        self._console.print(text, soft_wrap=True)
        self._console.file.flush()

    def start(self, status: TailStatus) -> None:
        if not self._quiet:
            self._line(Text(f"following: {safe_text(str(status))}", style="dim"))

    def batch(self, check: FileCheck, batch: Batch) -> None:
        pass

    def alert(self, alert: Alert) -> None:
        self._line(alert_line(alert))

    def incident(self, note: Note) -> None:
        if not self._quiet:
            self._line(incident_line(note))

    def notice(self, notice: Notice) -> None:
        problem = notice.kind in _PROBLEMS
        if problem or not self._quiet:
            line = time.strftime("%H:%M:%S ", time.localtime(notice.at)) + safe_text(str(notice))
            self._line(Text(line, style="yellow" if problem else "dim"))

    def status(self, status: TailStatus, periodic: bool) -> None:
        if periodic and not self._quiet:
            self._line(Text(time.strftime("%H:%M:%S ") + safe_text(str(status)), style="dim"))

    def close(self, summary: TailSummary) -> None:
        if not self._quiet:
            self._line(Text(safe_text(str(summary))))


class JsonlSink:
    """A JSON object per line: alerts (check's JSON fields plus "type"), notices, statuses, summary."""

    def __init__(self, out: TextIO) -> None:
        self._out = out

    def _write(self, obj: dict[str, Any]) -> None:
        self._out.write(json.dumps(obj, allow_nan=False) + "\n")
        self._out.flush()

    def start(self, status: TailStatus) -> None:
        self._write(status.to_json())

    def batch(self, check: FileCheck, batch: Batch) -> None:
        pass

    def alert(self, alert: Alert) -> None:
        self._write({"type": "alert", **alert.to_json()})

    def incident(self, note: Note) -> None:
        self._write(incident_json(note))

    def notice(self, notice: Notice) -> None:
        self._write(notice.to_json())

    def status(self, status: TailStatus, periodic: bool) -> None:
        if periodic:
            self._write(status.to_json())

    def close(self, summary: TailSummary) -> None:
        self._write(summary.to_json())

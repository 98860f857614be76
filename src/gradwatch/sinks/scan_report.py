"""The report of one `gradwatch scan`: check's report, plus what was read and what was notified."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from gradwatch.sinks.outbox import Delivery
from gradwatch.sinks.report import Report
from gradwatch.sinks.safe import safe_text


@dataclass
class FileRead:
    """How one file was read in this scan."""

    #: bytes read in this scan (0: nothing new)
    new_bytes: int = 0
    #: where the next scan starts
    offset: int = 0
    #: why it was read from its start: "new" (no usable state), "rotated", "truncated", or
    #: "rewritten" (a gzip log that changed); "cut short": shorter than what was read, but the
    #: same before (read on from where it stops matching); None: resumed where the last scan stopped
    restarted: str | None = None


@dataclass
class ScanReport(Report):
    """Alerts are the ones found in this scan's new bytes (and stalls by the wall clock)."""

    reads: dict[str, FileRead] = field(default_factory=dict)
    delivery: Delivery = field(default_factory=Delivery)
    #: notifications still owed after this scan (retried by the next one)
    owed: int = 0

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        for f in out["files"]:
            read = self.reads.get(f["path"], FileRead())
            f.update(new_bytes=read.new_bytes, offset=read.offset, restarted=read.restarted)
        out["notifications"] = {"sent": self.delivery.sent, "errors": self.delivery.errors, "owed": self.owed}
        return out

    def __rich__(self) -> RenderableType:
        new = sum(r.new_bytes for r in self.reads.values())
        line = Text(f"read {new:,} new bytes", style="dim")
        restarted = [p for p, r in self.reads.items() if r.restarted not in (None, "new")]
        for path in restarted:
            why = self.reads[path].restarted
            how = "read on from where it stops matching" if why == "cut short" else "read from its start"
            line.append(f"; {safe_text(path)} was {why}: {how}", style="yellow")
        if self.delivery.sent or self.owed:
            line.append(f"; notifications sent: {self.delivery.sent}, still owed: {self.owed}", style="dim")
        return Group(super().__rich__(), line)

"""The result of a check over one or more files, and its two renderings: rich text and JSON."""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.table import Table
from rich.text import Text

from gradwatch.alerts import Alert, Severity
from gradwatch.errors import ExitCode
from gradwatch.incidents import Incident
from gradwatch.pipeline import FileSummary
from gradwatch.plugins import failures as plugin_failures
from gradwatch.sinks.safe import safe_text
from gradwatch.sinks.sparkline import WIDTH, sparkline

SEVERITY_STYLE = {Severity.INFO: "cyan", Severity.WARNING: "yellow", Severity.CRITICAL: "bold red"}
#: The metrics shown as "last values", in this order, when the log has them.
SHOWN = (
    "loss",
    "grad_norm",
    "loss_scale",
    "lr",
    "z_loss",
    "logit_norm",
    "ppl",
    "val_loss",
    "step_time_s",
    "tflops",
    "tps",
)


@dataclass
class Report:
    files: list[FileSummary] = field(default_factory=list)
    #: each names its incident (`Alert.incident`); the exit code is theirs (`fail_on`)
    alerts: list[Alert] = field(default_factory=list)
    fail_on: Severity = Severity.WARNING
    #: the alerts grouped into stories (`gradwatch.incidents`), in the order they opened
    incidents: list[Incident] = field(default_factory=list)

    @property
    def exit_code(self) -> ExitCode:
        if any(f.error for f in self.files) or plugin_failures.any_failed():
            return ExitCode.USAGE
        if any(a.severity >= self.fail_on for a in self.alerts):
            return ExitCode.ALERTS
        return ExitCode.OK

    def counts(self) -> dict[str, int]:
        return {str(s): sum(a.severity == s for a in self.alerts) for s in Severity}

    def spike_score(self) -> dict[str, float | None]:
        """OLMo 2's spike score over all files: percent of steps more than 7 sigma out."""
        out: dict[str, float | None] = {}
        for m in ("loss", "grad_norm"):
            spikes = sum(f.spike_score.spikes[m] for f in self.files)
            counted = sum(f.spike_score.counted[m] for f in self.files)
            out[m] = round(100.0 * spikes / counted, 4) if counted else None
        return out

    # ---- JSON -------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        counts = self.counts()
        return {
            "version": 1,
            "files": [
                {
                    "path": f.path,
                    "format": f.format,
                    "layout": f.layout,
                    "records": f.records,
                    "first_step": f.first_step,
                    "last_step": f.last_step,
                    "spike_score": f.spike_score.percent(),
                    "error": f.error,
                    "configs": list(f.configs),
                }
                for f in self.files
            ],
            "incidents": [i.to_json() for i in self.incidents],
            "alerts": [a.to_json() for a in self.alerts],
            "summary": {
                "incidents": len(self.incidents),
                "alerts": len(self.alerts),
                "warning": counts["warning"],
                "critical": counts["critical"],
                "exit_code": int(self.exit_code),
                "spike_score": self.spike_score(),
            },
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), allow_nan=False, indent=2)

    # ---- text -------------------------------------------------------------------------------
    def __rich__(self) -> RenderableType:
        parts: list[RenderableType] = []
        labels = {inc.id: f"incident {n}" for n, inc in enumerate(self.incidents, 1)}
        if self.incidents:
            parts.append(_incident_list(self.incidents, labels))
        for f in self.files:
            parts.append(self._file_block(f, [a for a in self.alerts if a.path == f.path], labels))
        parts.append(self._summary_line())
        return Group(*parts)

    def _file_block(self, f: FileSummary, alerts: list[Alert], labels: dict[str, str]) -> RenderableType:
        head = Text()
        head.append(safe_text(f.path), style="bold")
        if f.records == 0:  # (a crash before the first record still has its alert)
            error = _indent(Text(safe_text(f.error or "no training metrics found"), style="red"))
            return Group(head, error, *([_indent(_alert_list(alerts, labels))] if alerts else []), Text(""))
        steps = f"steps {f.first_step:,}-{f.last_step:,}" if f.first_step is not None else "no steps"
        head.append(f"  {f.format_text}  {f.records:,} record{'s' if f.records != 1 else ''}  {steps}", style="dim")
        body: list[RenderableType] = [head]
        if f.error:
            body.append(_indent(Text(safe_text(f.error), style="red")))
        names = [m for m in SHOWN if m in f.last_values]
        if names:
            body.append(_indent(Text("last values", style="dim")))
            body.append(_indent(_last_values(f, names)))
            body.append(_indent(Text(f"shape over {steps} (worst value per cell)", style="dim")))
            body.append(_indent(_Shapes(f, names)))
        if alerts:
            body.append(_indent(_alert_list(alerts, labels)))
        else:
            body.append(Text("  no alerts", style="green"))
        body.append(Text(""))
        return Group(*body)

    def alerts_only(self) -> RenderableType | None:
        """The alerts, each naming its file and line, and nothing else (`--quiet`); None when
        there is none, so that nothing at all is printed."""
        return _alert_list(self.alerts, {}) if self.alerts else None

    def input_errors(self) -> list[str]:
        """Why a file could not be read (missing, unreadable, no known format), one message each:
        said on stderr whatever the output, so that a report redirected to a file still tells
        the console."""
        return [f.error for f in self.files if f.error]

    def _summary_line(self) -> Text:
        c = self.counts()
        t = Text()
        n_files = len(self.files)
        t.append(f"{n_files} file{'s' if n_files != 1 else ''} checked: ")
        t.append(
            f"{c['critical']} critical",
            style=SEVERITY_STYLE[Severity.CRITICAL] if c["critical"] else "",
        )
        t.append(", ")
        t.append(
            f"{c['warning']} warning",
            style=SEVERITY_STYLE[Severity.WARNING] if c["warning"] else "",
        )
        t.append(f", {c['info']} info")
        n_incidents = len(self.incidents)
        t.append(f" in {n_incidents} incident{'s' if n_incidents != 1 else ''}")
        bad = sum(1 for f in self.files if f.records == 0 or f.error)
        if bad:
            t.append(f"; {bad} file{'s' if bad != 1 else ''} unreadable or without metrics", style="red")
        t.append(f"  (exit {int(self.exit_code)})", style="dim")
        return t


def _last_values(f: FileSummary, names: list[str]) -> RenderableType:
    """Each name over its value, right-aligned, in as many rows as the terminal's width needs
    (one table row cut the names and values of a narrow terminal to `grad…` and `2.1…`)."""
    from rich.columns import Columns

    cells = []
    for name in names:
        value = _fmt(f.last_values[name])
        cell = Text(justify="right")
        cell.append(name, style="dim")
        cell.append(f"\n{value}")
        cells.append(cell)
    return Columns(cells, padding=(0, 2))


def _incident_list(incidents: list[Incident], labels: dict[str, str]) -> RenderableType:
    """The stories first: per incident its severity, steps, id and whether it is over, then its
    headline and what its alerts were, so that the detail below is read knowing the chain."""
    parts: list[RenderableType] = [Text("incidents", style="bold")]
    for inc in incidents:
        heading = Text()
        heading.append(f"{inc.severity!s:<8}", style=SEVERITY_STYLE[inc.severity])
        heading.append(f"  {labels[inc.id]}", style="bold")
        heading.append(f"  {_steps(inc.first_step, inc.end_step)}")
        state = {"crashed": "the run crashed", "over": "over"}.get(inc.ended or "", "still open at the end")
        heading.append(f"  ({state})", style="dim")
        what = Text(safe_text(inc.headline), overflow="fold")
        counts = Counter(a.detector for a in inc.alerts if a.severity is not Severity.INFO)
        named = ", ".join(d if n == 1 else f"{d} x{n}" for d, n in counts.items())
        info = sum(a.severity is Severity.INFO for a in inc.alerts)
        what.append(f"\n{named}" + (f" (+{info} info)" if info else ""), style="dim")
        what.append(f"\n{safe_text(inc.id)}", style="dim")
        paths = inc.paths
        if len(paths) > 1:
            what.append(f"\nfiles: {safe_text(', '.join(paths))}", style="dim")
        parts += [_indent(heading), _indent(what, 6)]
    parts.append(Text(""))
    return Group(*parts)


def _steps(first: int | None, end: int | None) -> str:
    if first is None or end is None:
        return "no step"
    return f"step {first:,}" if first == end else f"steps {first:,}-{end:,}"


def _alert_list(alerts: list[Alert], labels: dict[str, str]) -> RenderableType:
    """One heading line per alert (severity, `step N`, detector, incident; aligned), its text indented
    below at the terminal's full width: a table's last column left 40 of 80 columns to the text
    and folded the `file:line` that people copy."""
    digits = max((len(f"{a.step:,}") for a in alerts if a.step is not None), default=0)
    width = digits + len("step ") if digits else 0
    parts: list[RenderableType] = []
    for a in alerts:
        heading = Text()
        heading.append(f"{a.severity!s:<8}", style=SEVERITY_STYLE[a.severity])
        step = "" if a.step is None else f"step {a.step:>{digits},}"
        heading.append(f"  {step:<{width}}  ")
        heading.append(a.detector, style="bold")
        if a.incident in labels:
            heading.append(f"  {labels[a.incident]}", style="dim")
        what = Text(safe_text(a.message), overflow="fold")
        where = f"{a.path}:{a.line}" if a.line is not None else (a.path or "")
        what.append(f"\n{safe_text(where)}", style="dim")
        if len(a.paths) > 1:
            what.append(f"\nalso in: {safe_text(', '.join(a.paths[1:]))}", style="dim")
        if a.snapshot is not None:
            what.append(f"\nsnapshot: {safe_text(a.snapshot)}", style="dim")
        what.append(f"\nhint: {safe_text(a.hint)}", style="italic dim")
        parts += [heading, _indent(what, 4)]
    return Group(*parts)


@dataclass
class _Shapes:
    """Per metric: its sparkline and its range, every sparkline over the same steps (a resume
    included), as wide as the terminal leaves room for (up to `sparkline.WIDTH` cells): cut short,
    a sparkline loses the steps where the spike is. Where even 20 cells leave no room for the
    range, the range goes on its own line."""

    file: FileSummary
    names: list[str]

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        spans = [r for b in self.file.shapes.values() if (r := b.x_range()) is not None]
        steps = (min(r[0] for r in spans), max(r[1] for r in spans)) if spans else (0.0, 0.0)
        rows = []
        for name in self.names:
            buckets = self.file.shapes.get(name)
            if buckets is not None and len(buckets):
                whole = buckets.envelope(1)
                rows.append((name, buckets, f"{_fmt(whole.lo[0])} .. {_fmt(whole.hi[0])}"))
        if not rows:
            return
        name_width = max(len(name) for name, _, _ in rows)
        room = options.max_width - name_width - 2
        range_width = max(len(span) for _, _, span in rows)
        stacked = room - range_width - 2 < 20
        cells = max(min(WIDTH, room if stacked else room - range_width - 2), 1)
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="dim")
        grid.add_column()
        if not stacked:
            grid.add_column(style="dim")
        for name, buckets, span in rows:
            line = sparkline(buckets, name, steps, cells)
            if stacked:
                grid.add_row(name, line)
                grid.add_row("", Text(span, style="dim"))
            else:
                grid.add_row(name, line, span)
        yield grid


def _fmt(v: float) -> str:
    if not math.isfinite(v):
        return str(v)
    if v != 0 and (abs(v) >= 1e5 or abs(v) < 1e-3):
        return f"{v:.3e}"
    return f"{v:.4g}"


def _indent(renderable: RenderableType, by: int = 2) -> RenderableType:
    from rich.padding import Padding

    return Padding(renderable, (0, 0, 0, by), expand=False)  # (no spaces to the terminal's edge)


def render_text(report: Report, console: Console) -> None:
    console.print(report)

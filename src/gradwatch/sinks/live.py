"""The live view of `gradwatch tail`: a full-screen rich `Live` that redraws as the log grows.

Top to bottom: per file, a header (file, format, step/total and ETA when the trainer prints the
total) and one row per key metric (latest value, a sparkline of the recent window, a colour for its
state), as many files as leave the alerts a few rows (the most recently active ones); then
the alerts panel (newest first, each with its hint), the latest file notice, and the status line
(how following works, lines/s, age of the last data). Everything is laid out from the terminal's
size at each redraw, so it fits 80x24 and follows resizes. Log content reaches the screen only
through `safe_text` and `Text` objects: never as markup, never as escape sequences.

Redraws happen on the caller's thread (`auto_refresh=False`), so the view never reads state that
another thread is changing.
"""

from __future__ import annotations

import math
import os
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
from rich.console import Console, ConsoleOptions, RenderResult
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from gradwatch.alerts import Alert, Severity
from gradwatch.detectors.base import columns
from gradwatch.incidents import Note
from gradwatch.parsers.stream import Batch
from gradwatch.pipeline import FileCheck
from gradwatch.sinks.lines import alert_line
from gradwatch.sinks.report import SEVERITY_STYLE
from gradwatch.sinks.safe import safe_text
from gradwatch.sinks.tailing import Notice, TailStatus, TailSummary

__all__ = ["LiveSink", "LiveView", "MetricWindow", "sparkline"]

#: Recent values kept per metric: wider than any terminal's sparkline.
WINDOW = 240
#: Rows of the metrics table: label, canonical metrics (first one logged wins), log scale.
ROWS: tuple[tuple[str, tuple[str, ...], bool], ...] = (
    ("loss", ("loss",), False),
    ("grad norm", ("grad_norm",), True),
    ("loss scale", ("loss_scale",), True),
    ("lr", ("lr",), False),
    ("throughput", ("tflops", "tps", "step_time_s"), False),
)
_UNITS = {"tflops": "TFLOP/s", "tps": "tok/s", "step_time_s": "s/step"}
_BARS = "▁▂▃▄▅▆▇█"
#: Shortest interval between two redraws for new data (an alert or a notice redraws at once).
_MIN_REDRAW_S = 0.2
#: Rows the alerts panel keeps when several files' blocks ask for the screen (borders included).
_MIN_PANEL_ROWS = 6


def sparkline(values: Iterable[float], width: int, log: bool = False) -> Text:
    """The last `width` values as bars scaled to their own range; a non-finite value is a red `!`.

    One string, styled only where a value blew up: the live view draws several a redraw.
    """
    vals = list(values)[-width:] if width > 0 else []
    finite = [math.log(v) if log else v for v in vals if math.isfinite(v) and (v > 0 or not log)]
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 0.0)
    chars: list[str] = []
    for v in vals:
        if not math.isfinite(v):
            chars.append("!")
            continue
        if log and v <= 0:
            chars.append(" ")
            continue
        x = math.log(v) if log else v
        level = int((x - lo) / (hi - lo) * (len(_BARS) - 1) + 0.5) if hi > lo else len(_BARS) // 2
        chars.append(_BARS[level])
    out = Text("".join(chars), no_wrap=True)
    for i, char in enumerate(chars):
        if char == "!":
            out.stylize("bold red", i, i + 1)
    return out


@dataclass
class MetricWindow:
    """The recent (step, value) pairs of each metric of one file; NaN marks a value that blew up."""

    values: dict[str, deque[tuple[int, float]]] = field(default_factory=dict)

    def feed(self, batch: Batch) -> None:
        rec = columns(batch)  # shared with the detectors
        if len(rec) == 0:
            return
        last = slice(-WINDOW, None)  # a history batch can hold a million rows
        steps = rec["step"][last]
        blown = rec["nonfinite"][last]
        any_blown = bool((blown != "").any())
        for _, names, _ in ROWS:
            for name in names:
                col = rec[name][last]
                logged = ~np.isnan(col)
                if any_blown:
                    logged |= np.array([name in str(b).split(",") for b in blown])
                if not logged.any():
                    continue
                window = self.values.setdefault(name, deque(maxlen=WINDOW))
                window.extend(zip(steps[logged].tolist(), col[logged].tolist(), strict=True))

    def series(self, names: tuple[str, ...]) -> tuple[str, deque[tuple[int, float]]] | None:
        for name in names:
            if self.values.get(name):
                return name, self.values[name]
        return None


@dataclass
class _FileState:
    window: MetricWindow = field(default_factory=MetricWindow)
    format: str | None = None
    total: int | None = None
    last_step: int | None = None
    #: when it last produced records (the view's count of such batches): the most recent are shown
    active: int = 0


class LiveView:
    """What the live screen shows; rendered at whatever size the terminal has."""

    def __init__(self) -> None:
        self.files: dict[str, _FileState] = {}
        self._batches = 0  # batches with records so far: the clock of `_FileState.active`
        self.alerts: deque[tuple[float, Alert]] = deque(maxlen=200)
        self.notice: Notice | None = None
        self.status: TailStatus | None = None

    def update(self, check: FileCheck, batch: Batch) -> None:
        state = self.files.setdefault(check.summary.path, _FileState())
        state.window.feed(batch)
        state.format = check.stream.format
        state.total = _total_steps(check)
        if check.summary.last_step is not None:
            state.last_step = check.summary.last_step
        if len(batch.records):
            self._batches += 1
            state.active = self._batches

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        height = options.height or options.max_height
        block_rows = 1 + len(ROWS)
        shown = self._shown(max(1, (height - 2 - _MIN_PANEL_ROWS) // block_rows))
        for n, path in enumerate(shown):
            state = self.files.get(path, _FileState())
            yield self._header(path, state, width, first=n == 0, hidden=len(self.files) - len(shown))
            yield self._metrics(path, state, width)
        panel_rows = height - len(shown) * block_rows - 2
        if panel_rows >= 3:
            yield Panel(
                self._alert_lines(panel_rows - 2, hints=panel_rows >= 8),
                title=f"alerts ({len(self.alerts)}), newest first",
                title_align="left",
                height=panel_rows,
                border_style="dim",
            )
        notice = Text(no_wrap=True, overflow="ellipsis")
        if self.notice is not None:
            notice.append(time.strftime("%H:%M:%S ", time.localtime(self.notice.at)) + safe_text(str(self.notice)))
        yield notice
        yield Text(self._status_line(), style="dim", no_wrap=True, overflow="ellipsis")

    def _status_line(self) -> str:
        s = self.status
        if s is None:
            return "reading the history"
        idle = "no data yet" if s.idle_s is None else f"last data {s.idle_s:.1f} s ago"
        files = f"{s.files} file{'s' if s.files != 1 else ''}"
        return safe_text(f"{s.mode} · {files} · {s.lines_per_s:.1f} lines/s · {idle} · Ctrl-C stops")

    def _shown(self, room: int) -> list[str]:
        """The files whose blocks are drawn, in the order they were added: all of them when
        `room` blocks fit, else the most recently active ("" while there is none)."""
        if not self.files:
            return [""]
        paths = list(self.files)
        if len(paths) <= room:
            return paths
        recent = set(sorted(paths, key=lambda p: self.files[p].active)[-room:])
        return [p for p in paths if p in recent]

    def _header(self, path: str, state: _FileState, width: int, first: bool, hidden: int) -> Text:
        """`gradwatch tail FILE (+N files)  FORMAT  step N/TOTAL (P%)  ETA T` (below the first
        file's block, its FILE and the rest only; N: the files not drawn); a long path gives
        way (cut on the left: the file name matters most) so that the run's progress stays."""
        right = Text()
        if first and hidden > 0:
            right.append(f" (+{hidden} file{'s' if hidden > 1 else ''})", style="dim")
        if state.format:
            right.append(f"  {state.format}", style="dim")
        if state.last_step is not None:
            right.append(f"  step {state.last_step:,}")
            if state.total:
                right.append(f"/{state.total:,} ({100 * state.last_step / state.total:.1f}%)")
                eta = _eta(state)
                if eta is not None:
                    right.append(f"  ETA {_duration(eta)}")
        t = Text(no_wrap=True, overflow="ellipsis")
        if first:
            t.append("gradwatch tail ", style="bold")
        name = safe_text(path or "waiting for data")
        room = max(12, width - len(t) - len(right))
        if len(name) > room:
            name = "…" + name[-(room - 1) :]
        t.append(name, style="bold cyan")
        t.append_text(right)
        return t

    def _metrics(self, path: str, state: _FileState, width: int) -> Table:
        table = Table.grid(padding=(0, 1))
        table.add_column(width=10, no_wrap=True)
        table.add_column(width=11, justify="right", no_wrap=True)
        table.add_column(width=8, no_wrap=True)
        spark = max(0, width - 10 - 11 - 8 - 3)
        table.add_column(width=spark, no_wrap=True)
        for label, names, log in ROWS:
            found = state.window.series(names)
            if found is None:
                table.add_row(Text(label, style="dim"), Text("-", style="dim"), "", "")
                continue
            name, window = found
            values = [v for _, v in window]
            latest = self._state(path, names, window)
            style = "green" if latest is None else SEVERITY_STYLE[latest]
            table.add_row(
                Text(label, style=style),
                Text(_number(values[-1]), style=style),
                Text(_UNITS.get(name, ""), style="dim"),
                sparkline(values, spark, log),
            )
        return table

    def _state(self, path: str, names: tuple[str, ...], window: deque[tuple[int, float]]) -> Severity | None:
        """The latest alert on these metrics within the window (a recovery is info); a blown-up
        latest value is critical."""
        if not math.isfinite(window[-1][1]):
            return Severity.CRITICAL
        first = window[0][0]
        for _, a in reversed(self.alerts):
            if a.path == path and a.metric in names and (a.step is None or a.step >= first):
                return a.severity
        return None

    def _alert_lines(self, rows: int, hints: bool) -> Text:
        out = Text(no_wrap=True, overflow="ellipsis")
        used = 0
        for at, a in reversed(self.alerts):
            need = 2 if hints else 1
            if used + need > rows:
                break
            if used:
                out.append("\n")
            out.append_text(self._alert_line(a, at))
            if hints:
                out.append(f"\n  hint: {safe_text(a.hint)}", style="italic dim")
            used += need
        if not self.alerts:
            out.append("no alerts", style="green")
        return out

    def _alert_line(self, a: Alert, at: float) -> Text:
        """Like the text output's line, but the message first: the screen is narrow."""
        t = Text()
        t.append(time.strftime("%H:%M:%S ", time.localtime(at)), style="dim")
        t.append(f"{str(a.severity).upper():<8}", style=SEVERITY_STYLE[a.severity])
        if a.step is not None:
            t.append(f" step {a.step:,}")
        t.append(f" {a.detector}: ", style="bold")
        t.append(safe_text(a.message))
        where = os.path.basename(a.path or "") + (f":{a.line}" if a.line is not None else "")
        t.append(f"  {safe_text(where)}", style="dim")
        return t


def _total_steps(check: FileCheck) -> int | None:
    """The run's total steps when the trainer prints it (Megatron's `iteration N/TOTAL`)."""
    for parser in check.stream.parsers:
        total = getattr(parser, "total_steps", None)
        if parser.name == check.stream.format and isinstance(total, int) and total > 0:
            return total
    return None


def _eta(state: _FileState) -> float | None:
    found = state.window.series(("step_time_s",))
    if found is None or state.total is None or state.last_step is None:
        return None
    times = [v for _, v in found[1] if math.isfinite(v)]
    return max(0, state.total - state.last_step) * float(np.median(times)) if times else None


def _duration(seconds: float) -> str:
    if seconds >= 86400:
        return f"{seconds / 86400:.1f} d"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.0f} min"


def _number(v: float) -> str:
    if not math.isfinite(v):
        return str(v)
    if v != 0 and (abs(v) >= 1e5 or abs(v) < 1e-3):
        return f"{v:.3e}"
    return f"{v:.4g}"


class LiveSink:
    """Shows a `LiveView` full screen; at the end, leaves the alerts and a summary in the scrollback."""

    def __init__(self, console: Console) -> None:
        self._console = console
        self._view = LiveView()
        self._live = Live(self._view, console=console, screen=True, auto_refresh=False)
        self._started = False
        self._last_draw = 0.0
        self._alerts: list[tuple[float, Alert]] = []  # all of them, for the scrollback at the end

    def _draw(self, soon: bool = False) -> None:
        """Redraw now, or with `soon` only when the last redraw is `_MIN_REDRAW_S` old."""
        if soon and time.monotonic() - self._last_draw < _MIN_REDRAW_S:
            return
        if not self._started:
            self._live.start()
            self._started = True
        self._live.refresh()
        self._last_draw = time.monotonic()

    def start(self, status: TailStatus) -> None:
        self._view.status = status
        self._draw()

    def batch(self, check: FileCheck, batch: Batch) -> None:
        self._view.update(check, batch)
        self._draw(soon=True)

    def alert(self, alert: Alert) -> None:
        self._alerts.append((time.time(), alert))
        self._view.alerts.append(self._alerts[-1])
        self._draw()

    def notice(self, notice: Notice) -> None:
        self._view.notice = notice
        self._draw()

    def incident(self, note: Note) -> None:
        """Shown where notices are: the latest incident note, its headline as the detail."""
        self.notice(Notice(f"incident {note.event}", note.incident, note.headline))

    def status(self, status: TailStatus, periodic: bool) -> None:
        self._view.status = status
        self._draw(soon=not periodic)

    def close(self, summary: TailSummary) -> None:
        if self._started:
            self._live.stop()
        for at, alert in self._alerts:
            self._console.print(alert_line(alert, at), soft_wrap=True)
        self._console.print(Text(safe_text(str(summary))), soft_wrap=True)

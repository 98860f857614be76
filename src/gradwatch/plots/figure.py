"""Renderer-neutral figures: panels with lines, alert markers and event ticks, in data units.

Why a model between the series and the renderers: the HTML (inline SVG) and the PNG (matplotlib)
must show the same panels with the same markers, and the tests count markers against alerts; so
what is drawn where is decided once, here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from gradwatch.alerts import Alert, Severity
from gradwatch.plots.panels import Panel, Scale, label, scale_of
from gradwatch.plots.series import RunSeries

#: Bins across a panel: about one per pixel of the HTML panel's plot area.
BINS = 1000
#: Line colours (a `Line.color` indexes this, wrapping), and marker colours, shared by both renderers.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f")
SEVERITY_COLOR = {Severity.INFO: "#3b82c4", Severity.WARNING: "#e69500", Severity.CRITICAL: "#d62728"}
OVERFLOW_COLOR = "#d62728"


@dataclass(frozen=True)
class Line:
    """One series on a panel: a polyline in data units (`color` indexes the renderer's palette)."""

    label: str
    xs: np.ndarray
    ys: np.ndarray
    color: int
    dashed: bool = False


@dataclass(frozen=True)
class Marker:
    """An alert at its step; `y` is its value when that can be drawn on the panel, else None (top)."""

    x: float
    y: float | None
    severity: Severity
    number: int  #: the alert's row in the table (1-based)
    text: str  #: untrusted (log content): renderers escape it


@dataclass(frozen=True)
class PanelData:
    id: str
    title: str
    scale: Scale
    x_range: tuple[float, float]
    x_label: str = "step"
    lines: list[Line] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)
    #: x of events drawn as ticks along the bottom (fp16 overflows), already one per bin at most
    ticks: np.ndarray = field(default_factory=lambda: np.empty(0))


@dataclass(frozen=True)
class Section:
    """The panels of one report or comparison, with a one-line heading for the PNG."""

    heading: str
    panels: list[PanelData]


def _line(
    run: RunSeries, metric: str, name: str, scale: Scale, x_range: tuple[float, float], color: int, dashed: bool = False
) -> Line:
    """The metric's min/max envelope over the panel's bins (non-positive values dropped on log scales)."""
    xs, ys = run.series[metric].envelope(BINS, x_range).polyline()
    if scale is not Scale.LINEAR:
        keep = ys > 0
        xs, ys = xs[keep], ys[keep]
    return Line(name, xs, ys, color, dashed)


def _drawable(run: RunSeries, metric: str, scale: Scale) -> Scale:
    """A log scale only where there is a positive value to draw (placeholders like -1 fall back)."""
    if scale is Scale.LINEAR:
        return scale
    buckets = run.series[metric]
    return scale if len(buckets) and buckets.envelope(1).hi[0] > 0 else Scale.LINEAR


def report_panels(run: RunSeries, panels: tuple[Panel, ...], first: int = 1) -> list[PanelData]:
    """One panel per selected panel that the log has data for; every alert with a step gets a marker.

    Alerts are numbered from `first` in their order (several logs share one page and its numbers).
    """
    x_range = run.x_range() or (0.0, 1.0)
    out: list[PanelData] = []
    for panel in panels:
        names = [m for m in panel.metrics if run.logged(m)]
        if panel.first_only:
            names = names[:1]
        if not names:
            continue
        scale = _drawable(run, names[0], panel.scale)
        lines = [_line(run, m, m, scale, x_range, i, dashed=i > 0) for i, m in enumerate(names)]
        title = panel.title if not panel.first_only else f"{panel.title}: {label(names[0])}"
        ticks = run.overflows.envelope(BINS, x_range).lo_x if panel.overflows else np.empty(0)
        out.append(PanelData(panel.id, title, scale, x_range, lines=lines, ticks=ticks))
    if out:
        _place_alerts(run.alerts, out, first)
    return out


def _alert_text(a: Alert) -> str:
    return f"{a.severity} at step {a.step:,}: {a.message}" if a.step is not None else f"{a.severity}: {a.message}"


def _place_alerts(alerts: list[Alert], panels: list[PanelData], first: int) -> None:
    """Each alert on the panel of its metric (the first panel when that is not drawn)."""
    by_metric = {line.label: p for p in panels for line in p.lines}
    for number, a in enumerate(alerts, first):
        if a.step is None:
            continue
        panel = by_metric.get(a.metric or "", panels[0])
        y = a.value if a.metric in {line.label for line in panel.lines} else None
        if y is not None and (not math.isfinite(y) or (panel.scale is not Scale.LINEAR and y <= 0)):
            y = None
        panel.markers.append(Marker(float(a.step), y, a.severity, number, _alert_text(a)))


def compare_panels(runs: list[RunSeries], labels: list[str], metrics: list[str], x: str) -> list[PanelData]:
    """One panel per metric, each run a line on it (runs that do not log the metric are left out)."""
    spans = [r for run in runs if (r := run.x_range()) is not None]
    x_range = (min(s[0] for s in spans), max(s[1] for s in spans)) if spans else (0.0, 1.0)
    out = []
    for metric in metrics:
        having = [(i, run) for i, run in enumerate(runs) if run.logged(metric)]
        if not having:
            continue
        scale = scale_of(metric)
        if any(_drawable(run, metric, scale) is Scale.LINEAR for _, run in having):
            scale = Scale.LINEAR
        lines = [_line(run, metric, labels[i], scale, x_range, i) for i, run in having]
        out.append(PanelData(metric, label(metric), scale, x_range, x_label=x, lines=lines))
    return out

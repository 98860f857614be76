"""Renderer-neutral figures: panels with lines, alert markers, overflows and NaN bands, in data units.

Why a model between the series and the renderers: the HTML (plotly) and the PNG (matplotlib)
must show the same panels with the same markers, and the tests count markers against alerts; so
what is drawn where is decided once, here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from gradwatch.alerts import Alert, Severity
from gradwatch.plots.gaps import bands, broken, find_gaps
from gradwatch.plots.panels import STEPS, Panel, Scale, label, scale_of
from gradwatch.plots.series import RunSeries

#: Bins across a panel: two per pixel of a 1,000-pixel plot area, so that a zoom to half still shows every bin.
BINS = 2000
#: Line colours (a `Line.color` indexes this, wrapping), and marker colours, shared by both renderers.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f")
SEVERITY_COLOR = {Severity.INFO: "#3b82c4", Severity.WARNING: "#e69500", Severity.CRITICAL: "#d62728"}
OVERFLOW_COLOR = "#d62728"
#: shades over a panel (RGBA): steps whose values were NaN or infinite, and steps with no records
NONFINITE_COLOR = "#d6272838"
GAP_COLOR = "#7878781a"


@dataclass(frozen=True)
class Line:
    """One series on a panel: a polyline in data units, NaN where it breaks (`color` indexes the palette)."""

    label: str
    xs: np.ndarray
    ys: np.ndarray
    color: int
    dashed: bool = False
    #: drawn as steps (the value holds until the next point): a loss scale, a metric that only jumps
    steps: bool = False


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
    #: fp16 overflows (x, the loss scale they left), at most one per bin
    overflows: tuple[np.ndarray, np.ndarray] = field(default_factory=lambda: (np.empty(0), np.empty(0)))
    #: (first, last) x of stretches where a metric of the panel was NaN or infinite
    bands: list[tuple[float, float]] = field(default_factory=list)
    #: (last x before, first x after) of stretches that the log has no records for
    gaps: list[tuple[float, float]] = field(default_factory=list)


@dataclass(frozen=True)
class Section:
    """The panels of one report or comparison, with a one-line heading for the PNG."""

    heading: str
    panels: list[PanelData]


#: Share of consecutive points that may differ for a series to count as one that only jumps.
_JUMPS_AT_MOST = 0.2


def only_jumps(ys: np.ndarray) -> bool:
    """A series that holds its value between changes (a step schedule, a counter): drawn as steps."""
    return len(ys) >= 3 and float(np.mean(np.diff(ys) != 0)) <= _JUMPS_AT_MOST


def _line(
    run: RunSeries,
    metric: str,
    name: str,
    scale: Scale,
    x_range: tuple[float, float],
    color: int,
    dashed: bool = False,
    steps: bool = False,
) -> Line:
    """The metric's min/max envelope over the panel's bins (non-positive values dropped on log
    scales), broken where the log has a gap and where the metric was not finite."""
    buckets = run.series[metric] if run.logged(metric) else run.event_scale
    xs, ys = buckets.envelope(BINS, x_range).polyline()
    if scale is not Scale.LINEAR:
        keep = ys > 0
        xs, ys = xs[keep], ys[keep]
    steps = steps or only_jumps(ys)
    bad = run.nonfinite.get(metric)
    nonfinite = bad.envelope(BINS, x_range).lo if bad is not None and len(bad) else np.empty(0)
    middles = [(a + b) / 2 for a, b in find_gaps(run.records, run.interval)]
    xs, ys = broken(xs, ys, np.concatenate([middles, nonfinite]))
    return Line(name, xs, ys, color, dashed, steps)


def _bands(run: RunSeries, metrics: list[str]) -> list[tuple[float, float]]:
    return sorted(b for m in metrics if m in run.nonfinite for b in bands(run.nonfinite[m], run.interval))


def _drawable(run: RunSeries, metric: str, scale: Scale) -> Scale:
    """A log scale only where there is a positive value to draw (placeholders like -1 fall back)."""
    if scale is Scale.LINEAR:
        return scale
    buckets = run.series[metric] if run.logged(metric) else run.event_scale
    return scale if len(buckets) and buckets.envelope(1).hi[0] > 0 else Scale.LINEAR


def _metrics_of(run: RunSeries, panel: Panel) -> tuple[list[str], str]:
    """The panel's metrics that the run has, and the panel's title: a loss-scale panel falls back
    on the scale that overflow messages told, for trainers that log no scale in their records."""
    names = [m for m in panel.metrics if run.logged(m)]
    if panel.first_only:
        names = names[:1]
    if not names and panel.overflows and len(run.event_scale):
        return ["loss_scale"], f"{panel.title}, from the overflow messages"
    return names, panel.title if not panel.first_only or not names else f"{panel.title}: {label(names[0])}"


def report_panels(run: RunSeries, panels: tuple[Panel, ...], first: int = 1) -> list[PanelData]:
    """One panel per selected panel that the log has data for; every alert with a step gets a marker.

    Alerts are numbered from `first` in their order (several logs share one page and its numbers).
    """
    x_range = run.x_range() or (0.0, 1.0)
    out: list[PanelData] = []
    for panel in panels:
        names, title = _metrics_of(run, panel)
        if not names:
            continue
        scale = _drawable(run, names[0], panel.scale)
        lines = [_line(run, m, m, scale, x_range, i, i > 0, m in STEPS) for i, m in enumerate(names)]
        overflows = (np.empty(0), np.empty(0))
        if panel.overflows:
            env = run.overflows.envelope(BINS, x_range)
            overflows = (env.lo_x, env.lo)
        out.append(
            PanelData(
                panel.id,
                title,
                scale,
                x_range,
                lines=lines,
                overflows=overflows,
                bands=_bands(run, names),
                gaps=find_gaps(run.records, run.interval),
            )
        )
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
        lines = [_line(run, metric, labels[i], scale, x_range, i, steps=metric in STEPS) for i, run in having]
        nonfinite = sorted(b for _, run in having for b in _bands(run, [metric]))
        out.append(PanelData(metric, label(metric), scale, x_range, x_label=x, lines=lines, bands=nonfinite))
    return out

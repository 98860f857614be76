"""The panels as one plotly figure: stacked panels on one shared step axis.

Why plotly (plotly.js, inlined from the `plotly` package): its "x unified" hover over subplots
that share an axis reads every panel's values at the cursor, a drag zooms all panels to a step
range, and step lines, NaN breaks, bands and numbered markers are settings, not code of ours. The
figure is plain data (JSON): nothing here imports plotly.

Every text from a log or a file name (alert messages, run labels) is HTML-escaped: plotly renders
its texts as a subset of HTML.
"""

from __future__ import annotations

import math
from html import escape
from typing import Any

import numpy as np

from gradwatch.plots.figure import (
    GAP_COLOR,
    NONFINITE_COLOR,
    OVERFLOW_COLOR,
    PALETTE,
    SEVERITY_COLOR,
    Line,
    Marker,
    PanelData,
)
from gradwatch.plots.panels import Scale

PANEL_PX = 210  #: height of one panel, its title included
_MARGIN = {"l": 70, "r": 20, "t": 30, "b": 40}
_GAP = 34  #: pixels between panels (the next panel's title sits there)
_MAX_POWER_TICKS = 8
_MIN_BAND = 0.004  #: of the step axis: a band of one step in a long run still shows

#: what the page hands `Plotly.newPlot` besides data and layout
CONFIG = {"displaylogo": False, "responsive": True, "modeBarButtonsToRemove": ["select2d", "lasso2d"]}


def figure(panels: list[PanelData]) -> dict[str, Any]:
    """`{"data": [...], "layout": {...}}`; panel k (1-based) is on y axis k, all on x axis "x"."""
    height = _MARGIN["t"] + _MARGIN["b"] + len(panels) * PANEL_PX
    plot = height - _MARGIN["t"] - _MARGIN["b"]
    data: list[dict[str, Any]] = []
    layout: dict[str, Any] = {
        "height": height,
        "margin": _MARGIN,
        "hovermode": "x unified",
        "hoversubplots": "axis",  # the hover shows every panel on the shared axis
        "dragmode": "zoom",
        "font": {"family": "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", "size": 12},
        "plot_bgcolor": "white",
        "annotations": [],
        "shapes": [],
        "meta": {"panels": [p.id for p in panels]},  # which panel each y axis is (for tests and readers)
    }
    layout["xaxis"] = {
        "range": _x_range(panels),
        "anchor": f"y{len(panels)}",
        "title": {"text": escape(panels[0].x_label) if panels else "step", "standoff": 6},
        "hoverformat": ",",
        "showgrid": True,
        "gridcolor": "#eee",
        "linecolor": "#bbb",
        "mirror": "all",
        "zeroline": False,
        "showspikes": True,
        "spikemode": "across",
        "spikethickness": 1,
        "spikecolor": "#999",
        "spikedash": "solid",
    }
    span = layout["xaxis"]["range"][1] - layout["xaxis"]["range"][0]
    named: set[str] = set()  # lines in the legend (one entry per run of a comparison, whatever its panels)
    for k, p in enumerate(panels, 1):
        top = 1 - (k - 1) * PANEL_PX / plot
        bottom = top - (PANEL_PX - _GAP) / plot
        axis = "y" if k == 1 else f"y{k}"
        layout[f"yaxis{k}"] = _y_axis(p, (max(bottom, 0.0), top))
        layout["annotations"].append(_title(p, top, plot))
        for line in p.lines:
            data.append(_trace(line, axis, len(p.lines) > 1 and line.label not in named))
            named |= {line.label} if len(p.lines) > 1 else set()
        if len(p.overflows[0]):
            data.append(_overflows(p, axis))
        layout["shapes"] += [_band(b, axis, span, NONFINITE_COLOR, "NaN/inf") for b in p.bands]
        layout["shapes"] += [_band(g, axis, 0, GAP_COLOR, "no records") for g in p.gaps]
        for m in p.markers:
            layout["shapes"].append(_marker_line(m, axis))
            layout["annotations"].append(_marker(m, p.scale, axis))
    layout["showlegend"] = bool(named)
    layout["legend"] = {
        "orientation": "h",
        "x": 1,
        "xanchor": "right",
        "y": 1,
        "yanchor": "bottom",
        "bgcolor": "rgba(0,0,0,0)",
    }
    return {"data": data, "layout": layout}


def _x_range(panels: list[PanelData]) -> list[float]:
    """The steps drawn and the bands, with a margin of 1% so that the first and last points show."""
    x0, x1 = panels[0].x_range if panels else (0.0, 1.0)
    for p in panels:
        for lo, hi in p.bands:
            x0, x1 = min(x0, lo), max(x1, hi)
    pad = (x1 - x0) * 0.01 if x1 > x0 else 0.5
    return [x0 - pad, x1 + pad]


def _flat_range(p: PanelData) -> dict[str, Any]:
    """An explicit range around a linear panel's one value (plotly would centre [-1, 1] on it)."""
    ys = np.concatenate([line.ys for line in p.lines]) if p.lines else np.empty(0)
    ys = ys[np.isfinite(ys)]
    if not len(ys) or ys.min() != ys.max():
        return {}
    v = float(ys[0])
    pad = abs(v) * 0.1 or 1.0
    return {"range": [v - pad, v + pad]}


def _values(a: np.ndarray) -> list[float | None]:
    """JSON numbers, null where not finite (a break in the line)."""
    return [v if math.isfinite(v) else None for v in a.tolist()]


def _trace(line: Line, axis: str, legend: bool) -> dict[str, Any]:
    color = PALETTE[line.color % len(PALETTE)]
    trace: dict[str, Any] = {
        "type": "scatter",
        "mode": "lines",
        "name": escape(line.label),
        "x": _values(line.xs),
        "y": _values(line.ys),
        "xaxis": "x",
        "yaxis": axis,
        "connectgaps": False,
        "line": {"color": color, "width": 1.3, "shape": "hv" if line.steps else "linear"},
        "hovertemplate": "%{y:.6~g}",
        "showlegend": legend,
        "legendgroup": escape(line.label),
    }
    if line.dashed:
        trace["line"]["dash"] = "dash"
    alone = _isolated(line.ys)
    if alone.any():  # a point between two breaks draws no line: it gets a dot
        trace["mode"] = "lines+markers"
        trace["marker"] = {"size": np.where(alone, 5, 0).tolist(), "color": color}
    return trace


def _isolated(ys: np.ndarray) -> np.ndarray:
    ok = np.isfinite(ys)
    before = np.concatenate([[False], ok[:-1]])
    after = np.concatenate([ok[1:], [False]])
    return ok & ~before & ~after


def _overflows(p: PanelData, axis: str) -> dict[str, Any]:
    xs, ys = p.overflows
    return {
        "type": "scatter",
        "mode": "markers",
        "name": "overflow",
        "x": _values(xs),
        "y": _values(ys),
        "xaxis": "x",
        "yaxis": axis,
        "marker": {"symbol": "x-thin-open", "size": 7, "color": OVERFLOW_COLOR, "line": {"width": 1.5}},
        "hovertemplate": "at %{x:,}, scale now %{y:,}",
        "showlegend": False,
    }


def _y_axis(p: PanelData, domain: tuple[float, float]) -> dict[str, Any]:
    axis: dict[str, Any] = {
        "domain": list(domain),
        "anchor": "x",
        "showgrid": True,
        "gridcolor": "#eee",
        "linecolor": "#bbb",
        "mirror": True,
        "zeroline": False,
        "exponentformat": "e",
        "automargin": True,
    }
    if p.scale is Scale.LINEAR:
        axis.update(_flat_range(p))
    else:
        axis["type"] = "log"
    if p.scale is Scale.LOG2:
        axis.update(_power_of_two_ticks(p))
    return axis


def _power_of_two_ticks(p: PanelData) -> dict[str, Any]:
    """Ticks at powers of two (plotly's log axes tick powers of ten): a loss scale reads as 2^16."""
    ys = np.concatenate([line.ys for line in p.lines]) if p.lines else np.empty(0)
    ys = ys[np.isfinite(ys) & (ys > 0)]
    if not len(ys):
        return {}
    lo, hi = math.floor(math.log2(ys.min())), math.ceil(math.log2(ys.max()))
    every = max(1, math.ceil((hi - lo + 1) / _MAX_POWER_TICKS))
    exps = list(range(lo, hi + 1, every))
    return {"tickvals": [2.0**e for e in exps], "ticktext": [f"2<sup>{e}</sup>" for e in exps]}


def _title(p: PanelData, top: float, plot: int) -> dict[str, Any]:
    return {
        "text": f"<b>{escape(p.title)}</b>",
        "xref": "paper",
        "yref": "paper",
        "x": 0,
        "y": top + 4 / plot,
        "xanchor": "left",
        "yanchor": "bottom",
        "showarrow": False,
        "font": {"size": 13},
    }


def _band(band: tuple[float, float], axis: str, span: float, color: str, text: str) -> dict[str, Any]:
    """A shaded stretch of steps over the panel's height, at least `_MIN_BAND` of `span` wide."""
    lo, hi = band
    widen = max(0.0, _MIN_BAND * span - (hi - lo)) / 2
    return {
        "type": "rect",
        "xref": "x",
        "yref": f"{axis} domain",
        "x0": lo - widen,
        "x1": hi + widen,
        "y0": 0,
        "y1": 1,
        "fillcolor": color,
        "line": {"width": 0},
        "layer": "below",
        "label": {"text": text, "textposition": "top center", "font": {"size": 10, "color": "#555"}},
    }


def _marker_line(m: Marker, axis: str) -> dict[str, Any]:
    return {
        "type": "line",
        "xref": "x",
        "yref": f"{axis} domain",
        "x0": m.x,
        "x1": m.x,
        "y0": 0,
        "y1": 1,
        "line": {"color": SEVERITY_COLOR[m.severity], "width": 1, "dash": "dot"},
    }


def _marker(m: Marker, scale: Scale, axis: str) -> dict[str, Any]:
    """The alert's number in its severity's colour, pointing at its value (or the panel's top);
    the alert's text on hover, its row of the table on a click."""
    at: dict[str, Any] = {"yref": f"{axis} domain", "y": 0.97}
    if m.y is not None:
        at = {"yref": axis, "y": math.log10(m.y) if scale is not Scale.LINEAR else m.y}
    color = SEVERITY_COLOR[m.severity]
    return {
        **at,
        "xref": "x",
        "x": m.x,
        "text": f"<b>{m.number}</b>",
        "hovertext": escape(m.text),
        "showarrow": True,
        "arrowhead": 0,
        "arrowcolor": color,
        "ax": 0,
        "ay": -22,
        "bgcolor": color,
        "bordercolor": color,
        "borderpad": 2,
        "font": {"color": "white", "size": 12},
        "name": f"alert-{m.number}",  # the page's script opens this table row on a click
        "captureevents": True,
    }

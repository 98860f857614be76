"""The panels as one static PNG, drawn with matplotlib (the optional extra `gradwatch[plot]`).

matplotlib is imported only here and only when a PNG is asked for; `require_matplotlib` is called
before any log is read, so a missing extra costs the user one line, not a long wait.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from gradwatch.errors import UsageError
from gradwatch.plots.axes import tick_labels
from gradwatch.plots.figure import (
    GAP_COLOR,
    NONFINITE_COLOR,
    OVERFLOW_COLOR,
    PALETTE,
    SEVERITY_COLOR,
    Marker,
    PanelData,
    Section,
)
from gradwatch.plots.panels import Scale

DPI = 100
WIDTH_IN = 12.0
PANEL_IN = 2.2  #: height of one panel row, title and tick labels included
HEADING_IN = 0.6  #: height of a section's heading (two lines)
_MAX_POWER_TICKS = 8


def png_size(sections: list[Section]) -> tuple[int, int]:
    """Width and height in pixels of the PNG for these sections."""
    return round(WIDTH_IN * DPI), round(_height_in(sections) * DPI)


def _height_in(sections: list[Section]) -> float:
    return sum(_section_in(s) for s in sections) + 0.1


def _section_in(section: Section) -> float:
    return HEADING_IN + PANEL_IN * len(section.panels)


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("PNG output needs matplotlib: pip install 'gradwatch[plot]' (or write .html)") from None


#: matplotlib's transforms overflow on an axis spanning values near the largest float (a garbled
#: `1.7E+308`): such values are drawn at this height, as the top of the axis
_DRAWABLE = 1e300


def render_png(sections: list[Section], out: Path) -> None:
    fig = build_figure(sections)
    try:
        with np.errstate(over="ignore", invalid="ignore"):  # its log-scale ticks past such values: inf
            fig.savefig(out, format="png", dpi=DPI)
    except OSError as e:
        raise UsageError(f"cannot write {out}: {e.strerror or e}") from None


def build_figure(sections: list[Section]) -> Any:
    """The matplotlib figure: a heading and a column of panels per section, laid out by matplotlib's
    constrained layout, which keeps every title, tick label and marker inside the image."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(WIDTH_IN, _height_in(sections)), dpi=DPI, facecolor="white", layout="constrained")
    FigureCanvasAgg(fig)
    ratios = [_section_in(s) for s in sections]
    subfigs = fig.subfigures(len(sections), 1, height_ratios=ratios, squeeze=False)[:, 0]
    for sub, section in zip(subfigs, sections, strict=True):
        sub.suptitle(section.heading, x=0.005, ha="left", fontsize=10, weight="bold", wrap=True)
        if not section.panels:
            continue
        axes = sub.subplots(len(section.panels), 1, sharex=True, squeeze=False)[:, 0]
        with np.errstate(over="ignore", invalid="ignore"):
            for ax, panel in zip(axes, section.panels, strict=True):
                _draw(ax, panel)
            axes[-1].set_xlabel(section.panels[-1].x_label, fontsize=9)
    return fig


def _draw(ax: Any, p: PanelData) -> None:
    from matplotlib.ticker import LogLocator

    for lo, hi in p.gaps:
        ax.axvspan(lo, hi, color=GAP_COLOR, lw=0)
    for lo, hi in p.bands:
        ax.axvspan(lo, hi, color=NONFINITE_COLOR, lw=0)
    for line in p.lines:
        color = PALETTE[line.color % len(PALETTE)]
        ys = np.clip(line.ys, -_DRAWABLE, _DRAWABLE)
        style = "steps-post" if line.steps else "default"
        ax.plot(line.xs, ys, color=color, lw=0.9, ls="--" if line.dashed else "-", label=line.label, drawstyle=style)
        alone = _isolated(ys)
        if alone.any():
            ax.plot(line.xs[alone], ys[alone], "o", color=color, ms=3)
    if p.scale is not Scale.LINEAR:
        base = 2 if p.scale is Scale.LOG2 else 10
        ax.set_yscale("log", base=base)
        ax.yaxis.set_major_locator(LogLocator(base=base, numticks=_MAX_POWER_TICKS))
    if len(p.overflows[0]):
        xs, ys = p.overflows
        ax.plot(xs, np.clip(ys, -_DRAWABLE, _DRAWABLE), "x", color=OVERFLOW_COLOR, ms=5, mew=1.2)
    for artist in (*ax.lines, *ax.patches):  # data, clipped to the panel: only decorations need room
        artist.set_in_layout(False)
    for m in p.markers:
        _marker(ax, m)
    ax.set_xlim(*_x_limits(p))
    ax.xaxis.set_major_formatter(tick_labels())
    ax.set_title(p.title, loc="left", fontsize=10)
    ax.tick_params(labelsize=8)
    ax.grid(color="#eeeeee", lw=0.6)
    if len(p.lines) > 1:
        ax.legend(fontsize=8, loc="upper right", frameon=False)


def _x_limits(p: PanelData) -> tuple[float, float]:
    """The panel's steps and NaN bands, with a margin of 1% (as on the page)."""
    x0, x1 = p.x_range
    for lo, hi in p.bands:
        x0, x1 = min(x0, lo), max(x1, hi)
    pad = (x1 - x0) * 0.01 if x1 > x0 else 0.5
    return x0 - pad, x1 + pad


def _isolated(ys: np.ndarray) -> np.ndarray:
    ok = np.isfinite(ys)
    return ok & ~np.concatenate([[False], ok[:-1]]) & ~np.concatenate([ok[1:], [False]])


def _marker(ax: Any, m: Marker) -> None:
    """The alert's number in its severity's colour, above its value (or at the panel's top)."""
    color = SEVERITY_COLOR[m.severity]
    ax.axvline(m.x, color=color, lw=0.8, ls=":")
    if m.y is None:
        at, coords = (m.x, 0.9), ("data", "axes fraction")
    else:
        at, coords = (m.x, float(np.clip(m.y, -_DRAWABLE, _DRAWABLE))), ("data", "data")
    ax.annotate(
        str(m.number),
        at,
        xycoords=coords,
        xytext=(0, 9),
        textcoords="offset points",
        ha="center",
        va="bottom",
        fontsize=8,
        color="white",
        weight="bold",
        bbox={"boxstyle": "round,pad=0.2", "fc": color, "ec": color},
        arrowprops={"arrowstyle": "-", "color": color, "lw": 0.8},
        annotation_clip=True,  # not drawn (nor given room) where the value is off the panel's range
    )

"""The panels as one static PNG, drawn with matplotlib (the optional extra `gradwatch[plot]`).

matplotlib is imported only here and only when a PNG is asked for; `require_matplotlib` is called
before any log is read, so a missing extra costs the user one line, not a long wait.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from gradwatch.errors import UsageError
from gradwatch.plots.axes import short
from gradwatch.plots.figure import OVERFLOW_COLOR, PALETTE, SEVERITY_COLOR, PanelData, Section
from gradwatch.plots.panels import Scale

DPI = 100
WIDTH_IN = 12.0
PANEL_IN = 2.2  #: height of one panel row, title and tick labels included
HEADING_IN = 0.5  #: height of a section's heading
_LEFT, _RIGHT = 0.07, 0.985  # plot area, as fractions of the width
_PAD_TOP_IN, _PAD_BOTTOM_IN = 0.3, 0.5  # inside a panel row: title above, tick labels below


def png_size(sections: list[Section]) -> tuple[int, int]:
    """Width and height in pixels of the PNG for these sections."""
    return round(WIDTH_IN * DPI), round(_height_in(sections) * DPI)


def _height_in(sections: list[Section]) -> float:
    return sum(HEADING_IN + PANEL_IN * len(s.panels) for s in sections) + 0.1


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("PNG output needs matplotlib: pip install 'gradwatch[plot]' (or write .html)") from None


#: matplotlib's transforms overflow on an axis spanning values near the largest float (a garbled
#: `1.7E+308`): such values are drawn at this height, as the top of the axis
_DRAWABLE = 1e300


def render_png(sections: list[Section], out: Path) -> None:
    with np.errstate(over="ignore", invalid="ignore"):  # its log-scale ticks past such values: inf
        _render(sections, out)


def _render(sections: list[Section], out: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    height = _height_in(sections)
    fig = Figure(figsize=(WIDTH_IN, height), dpi=DPI, facecolor="white")
    FigureCanvasAgg(fig)
    top = height - 0.05  # inches from the bottom, moving down
    for section in sections:
        fig.text(_LEFT, (top - 0.3) / height, section.heading, fontsize=11, weight="bold")
        top -= HEADING_IN
        for panel in section.panels:
            bottom = top - PANEL_IN + _PAD_BOTTOM_IN
            rect = (_LEFT, bottom / height, _RIGHT - _LEFT, (PANEL_IN - _PAD_TOP_IN - _PAD_BOTTOM_IN) / height)
            _draw(fig.add_axes(rect), panel)
            top -= PANEL_IN
    try:
        fig.savefig(out, format="png", dpi=DPI)
    except OSError as e:
        raise UsageError(f"cannot write {out}: {e.strerror or e}") from None


def _draw(ax: Any, p: PanelData) -> None:
    from matplotlib.ticker import FuncFormatter

    for line in p.lines:
        color = PALETTE[line.color % len(PALETTE)]
        ys = np.clip(line.ys, -_DRAWABLE, _DRAWABLE)
        ax.plot(line.xs, ys, color=color, lw=0.9, ls="--" if line.dashed else "-", label=line.label)
    if p.scale is not Scale.LINEAR:
        ax.set_yscale("log", base=2 if p.scale is Scale.LOG2 else 10)
    top = ax.get_xaxis_transform()  # x in data, y in axes fractions
    if len(p.ticks):
        ax.vlines(p.ticks, 0, 0.06, transform=top, color=OVERFLOW_COLOR, lw=1)
    for m in p.markers:
        color = SEVERITY_COLOR[m.severity]
        ax.axvline(m.x, color=color, lw=0.8, ls=":")
        if m.y is None:
            ax.plot([m.x], [0.97], marker="v", color=color, ms=7, transform=top)
        else:
            ax.plot([m.x], [np.clip(m.y, -_DRAWABLE, _DRAWABLE)], marker="v", color=color, ms=7)
    x0, x1 = p.x_range
    ax.set_xlim(x0, x1 if x1 > x0 else x0 + 1)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: short(v)))
    ax.set_title(p.title, loc="left", fontsize=10)
    ax.set_xlabel(p.x_label, loc="left", fontsize=8, labelpad=1)
    ax.tick_params(labelsize=8)
    ax.grid(color="#eeeeee", lw=0.6)
    if len(p.lines) > 1:
        ax.legend(fontsize=8, loc="upper right", frameon=False)

"""A panel as inline SVG: no dependency, no network, a few tens of kilobytes however long the run.

Every text that can come from a log or a file name (alert messages, run labels) is escaped. Alert
markers carry `data-alert` (their table row) and link to that row; the panel carries its data range
(`data-x0`, `data-x1`) and plot area (`data-left`, `data-right`) for the page's step readout.
"""

from __future__ import annotations

from html import escape

import numpy as np

from gradwatch.plots.axes import nice_ticks, padded_range, short, transform, y_ticks
from gradwatch.plots.figure import OVERFLOW_COLOR, PALETTE, SEVERITY_COLOR, Line, Marker, PanelData

WIDTH, HEIGHT = 1100, 220
LEFT, RIGHT, TOP, BOTTOM = 74, 16, 30, 30
_CHAR_PX = 7.2  # rough width of one title character, to place the legend after the title


class _Frame:
    """Data to pixel coordinates for one panel."""

    def __init__(self, p: PanelData, y_range: tuple[float, float]) -> None:
        self.x0, self.x1 = p.x_range if p.x_range[1] > p.x_range[0] else (p.x_range[0], p.x_range[0] + 1)
        self.y0, self.y1 = y_range

    def px(self, x: np.ndarray) -> np.ndarray:
        return np.clip(LEFT + (x - self.x0) / (self.x1 - self.x0) * (WIDTH - LEFT - RIGHT), LEFT, WIDTH - RIGHT)

    def py(self, t: np.ndarray) -> np.ndarray:
        top, bottom = TOP, HEIGHT - BOTTOM
        return np.clip(top + (self.y1 - t) / (self.y1 - self.y0) * (bottom - top), top, bottom)


def panel_svg(p: PanelData) -> str:
    with np.errstate(divide="ignore", invalid="ignore"):
        values = [transform(line.ys, p.scale) for line in p.lines]
    y_range = padded_range(np.concatenate(values) if values else np.empty(0), p.scale)
    f = _Frame(p, y_range)
    out = [
        f'<svg class="panel" data-panel="{escape(p.id)}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{escape(p.title)}" data-x0="{f.x0:.12g}" data-x1="{f.x1:.12g}" data-left="{LEFT}" '
        f'data-right="{WIDTH - RIGHT}" data-xlabel="{escape(p.x_label)}">',
        f'<text class="title" x="{LEFT}" y="18">{escape(p.title)}</text>',
    ]
    out += _grid(f, p)
    for line, t in zip(p.lines, values, strict=True):
        out.append(_polyline(f, line, t))
    out += _legend(p)
    if len(p.ticks):
        out.append(_ticks(f, p.ticks))
    out += [_marker(f, m, p) for m in p.markers]
    out.append(f'<line class="cursor" x1="0" x2="0" y1="{TOP}" y2="{HEIGHT - BOTTOM}" visibility="hidden"/>')
    out.append(f'<text class="readout" x="{WIDTH - RIGHT}" y="18" text-anchor="end"></text>')
    out.append("</svg>")
    return "\n".join(out)


def _grid(f: _Frame, p: PanelData) -> list[str]:
    bottom = HEIGHT - BOTTOM
    out = [f'<rect class="frame" x="{LEFT}" y="{TOP}" width="{WIDTH - LEFT - RIGHT}" height="{bottom - TOP}"/>']
    for pos, text in y_ticks(f.y0, f.y1, p.scale):
        y = float(f.py(np.array(pos)))
        out.append(f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>')
        out.append(f'<text class="tick" x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{escape(text)}</text>')
    for v in nice_ticks(f.x0, f.x1, 8):
        x = float(f.px(np.array(v)))
        out.append(f'<line class="grid" x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{bottom}"/>')
        out.append(f'<text class="tick" x="{x:.1f}" y="{bottom + 16}" text-anchor="middle">{short(v)}</text>')
    out.append(f'<text class="tick" x="{LEFT - 6}" y="{bottom + 16}" text-anchor="end">{escape(p.x_label)}</text>')
    return out


def _polyline(f: _Frame, line: Line, t: np.ndarray) -> str:
    xs, ys = f.px(line.xs), f.py(t)
    points = " ".join(f"{x:.1f},{y:.1f}" for x, y in zip(xs.tolist(), ys.tolist(), strict=True))
    dash = ' stroke-dasharray="5 3"' if line.dashed else ""
    color = PALETTE[line.color % len(PALETTE)]
    return (
        f'<polyline class="series" data-series="{escape(line.label)}" fill="none" stroke="{color}"{dash} '
        f'points="{points}"/>'
    )


def _legend(p: PanelData) -> list[str]:
    if len(p.lines) < 2:
        return []
    x = LEFT + len(p.title) * _CHAR_PX + 24
    out = []
    for line in p.lines:
        color = PALETTE[line.color % len(PALETTE)]
        out.append(f'<rect x="{x:.0f}" y="10" width="14" height="3" fill="{color}"/>')
        out.append(f'<text class="legend" x="{x + 18:.0f}" y="16">{escape(line.label)}</text>')
        x += 18 + len(line.label) * _CHAR_PX + 16
    return out


def _ticks(f: _Frame, at: np.ndarray) -> str:
    bottom = HEIGHT - BOTTOM
    d = "".join(f"M{x:.1f} {bottom}v-8" for x in f.px(at).tolist())
    return (
        f'<path class="overflows" data-overflows="{len(at)}" stroke="{OVERFLOW_COLOR}" d="{d}">'
        "<title>fp16 overflow (skipped step, loss scale halved)</title></path>"
    )


def _marker(f: _Frame, m: Marker, p: PanelData) -> str:
    x = float(f.px(np.array(m.x)))
    if m.y is None:
        y = TOP + 2.0
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            y = float(f.py(transform(np.array(m.y), p.scale)))
    color = SEVERITY_COLOR[m.severity]
    return (
        f'<a href="#alert-{m.number}"><g class="alert" data-alert="{m.number}" data-severity="{m.severity}" '
        f'data-step="{m.x:g}"><title>{escape(m.text)}</title>'
        f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{HEIGHT - BOTTOM}" stroke="{color}" '
        'stroke-dasharray="2 3"/>'
        f'<path d="M{x:.1f} {y:.1f}l-6 -10h12z" fill="{color}"/></g></a>'
    )

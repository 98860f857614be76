"""Axis arithmetic for the SVG panels: value transforms, ranges, "nice" ticks and short labels.

matplotlib does all of this for the PNG; the HTML report draws its own SVG so that it needs no
plotting library, and this is the part of a plotting library it needs.
"""

from __future__ import annotations

import math

import numpy as np

from gradwatch.plots.panels import Scale

_MAX_TICKS = 6


def transform(values: np.ndarray, scale: Scale) -> np.ndarray:
    """Data values to axis units (exponents on log scales)."""
    if scale is Scale.LOG10:
        return np.log10(values)
    if scale is Scale.LOG2:
        return np.log2(values)
    return values


def padded_range(values: np.ndarray, scale: Scale) -> tuple[float, float]:
    """The axis range (axis units) holding `values`, with a margin; a flat series gets a band around it."""
    finite = values[np.isfinite(values)]
    if len(finite) == 0:
        return 0.0, 1.0
    lo, hi = float(finite.min()), float(finite.max())
    if hi == lo:
        pad = 0.5 if scale is not Scale.LINEAR else max(abs(lo) * 0.1, 1e-12)
        return lo - pad, hi + pad
    pad = (hi - lo) * 0.05
    return lo - pad, hi + pad


def nice_ticks(lo: float, hi: float, target: int = 5) -> list[float]:
    """Round values (1, 2 or 5 times a power of ten) inside [lo, hi]."""
    raw = hi / target - lo / target  # (not (hi - lo) / target: that overflows near the largest float)
    if not (hi > lo and math.isfinite(raw)):
        return [lo]
    mag = 10.0 ** math.floor(math.log10(raw))
    if mag == 0:  # a span among the smallest subnormal floats
        return [lo]
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step)
    return [i * step for i in range(first, math.floor(hi / step) + 1)]


def y_ticks(lo: float, hi: float, scale: Scale) -> list[tuple[float, str]]:
    """(position in axis units, label) pairs: powers of the base on log scales, when there are two."""
    if scale is not Scale.LINEAR:
        exps = list(range(math.ceil(lo), math.floor(hi) + 1))
        if len(exps) >= 2:
            every = math.ceil(len(exps) / _MAX_TICKS)
            base = 2 if scale is Scale.LOG2 else 10
            return [(float(e), _power(base, e)) for e in exps[::every]]
        values = nice_ticks(_inverse(lo, scale), _inverse(hi, scale))
        return [(float(transform(np.array(v), scale)), short(v)) for v in values if v > 0]
    return [(v, short(v)) for v in nice_ticks(lo, hi)]


def _inverse(t: float, scale: Scale) -> float:
    return 10.0**t if scale is Scale.LOG10 else 2.0**t


def _power(base: int, e: int) -> str:
    if base == 2:
        return f"2^{e}"
    return short(10.0**e) if -2 <= e < 12 else f"1e{e}"


def short(v: float) -> str:
    """A compact label: 250k, 1.5M, 3T for big numbers; 3 significant digits otherwise."""
    a = abs(v)
    for unit, size in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if a >= size:
            return f"{v / size:.3g}{unit}"
    if a != 0 and a < 1e-2:
        return f"{v:.2g}"
    return f"{v:.3g}"


def number(v: float) -> str:
    """A table value: 4 significant digits, scientific when very large or small, "-" for NaN."""
    if not np.isfinite(v):
        return "-" if np.isnan(v) else str(v)
    if v != 0 and (abs(v) >= 1e5 or abs(v) < 1e-3):
        return f"{v:.3e}"
    return f"{v:.4g}"

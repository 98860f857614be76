"""Numbers as the pictures print them: axis values, short tick labels, table values.

The interactive page leaves ticks to plotly; the PNG's step axis uses `TickLabels`, whose labels
are short (250k, 1.5M) yet never the same for two ticks, whatever the range: a run zoomed to ten
steps around 24,300 is labelled 24,300 ... 24,310, not "24.3k" ten times.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gradwatch.plots.panels import Scale

#: significant digits tried, fewest first, until every tick has its own label
_DIGITS = range(3, 16)


def transform(values: np.ndarray, scale: Scale) -> np.ndarray:
    """Data values to axis units (exponents on log scales)."""
    if scale is Scale.LOG10:
        return np.log10(values)
    if scale is Scale.LOG2:
        return np.log2(values)
    return values


def short(v: float, digits: int = 3) -> str:
    """A compact label: 250k, 1.5M, 3T for big numbers; `digits` significant digits otherwise."""
    a = abs(v)
    for unit, size in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if a >= size:
            return f"{v / size:.{digits}g}{unit}"
    if a != 0 and a < 1e-2:
        return f"{v:.{max(2, digits - 1)}g}"
    return f"{v:.{digits}g}"


def distinct_labels(values: list[float]) -> list[str]:
    """`short` labels with as many digits as it takes for no two ticks to read the same."""
    labels: list[str] = []
    for digits in _DIGITS:
        labels = [short(v, digits) for v in values]
        if len(set(labels)) == len(labels):
            break
    return labels


def tick_labels() -> Any:
    """A matplotlib formatter that labels a whole axis at once with `distinct_labels`."""
    from matplotlib.ticker import Formatter

    class TickLabels(Formatter):  # type: ignore[misc]
        def __call__(self, x: float, pos: int | None = None) -> str:
            return short(x)

        def format_ticks(self, values: Any) -> list[str]:
            return distinct_labels([float(v) for v in values])

    return TickLabels()


def number(v: float) -> str:
    """A table value: 4 significant digits, scientific when very large or small, "-" for NaN."""
    if not np.isfinite(v):
        return "-" if np.isnan(v) else str(v)
    if v != 0 and (abs(v) >= 1e5 or abs(v) < 1e-3):
        return f"{v:.3e}"
    return f"{v:.4g}"

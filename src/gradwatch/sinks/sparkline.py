"""A metric's shape over the run in a few unicode blocks, so that a CI log shows more than last values.

Each cell is the worst value of its stretch of steps (the maximum; the minimum where a fall is the
trouble: loss scale, throughput), so a one-step spike or a collapse is still visible in 40 cells.
Grad norm and loss scale are drawn on a log scale, as in the report's panels.
"""

from __future__ import annotations

import numpy as np

from gradwatch.downsample import MinMaxBuckets
from gradwatch.plots.axes import transform
from gradwatch.plots.panels import FALL_IS_TROUBLE, Scale, scale_of

BLOCKS = "▁▂▃▄▅▆▇█"
WIDTH = 40


def sparkline(buckets: MinMaxBuckets, metric: str, x_range: tuple[float, float], width: int = WIDTH) -> str:
    """`width` cells over `x_range`, the same steps for every metric of a run so that columns line up.

    A cell with nothing logged, or nothing drawable on a log scale, is a space.
    """
    env = buckets.envelope(width, x_range)
    values = np.full(width, np.nan)
    values[env.bin] = env.lo if metric in FALL_IS_TROUBLE else env.hi
    scale = scale_of(metric)
    if scale is not Scale.LINEAR:
        values = transform(np.where(values > 0, values, np.nan), scale)
    finite = values[np.isfinite(values)]
    if len(finite) == 0:
        return ""
    lo, hi = float(finite.min()), float(finite.max())
    span = hi - lo if hi > lo else 1.0
    levels = np.rint((np.nan_to_num(values, nan=lo) - lo) / span * (len(BLOCKS) - 1)).astype(int)
    return "".join(
        " " if not np.isfinite(v) else BLOCKS[k] for v, k in zip(values.tolist(), levels.tolist(), strict=True)
    )

"""Min/max downsampling with bounded memory: a long series kept as at most `capacity` buckets.

Why min *and* max: a plot or sparkline of a million steps has a thousand pixels; averaging a bucket
would hide the one-step spike that the picture is for. Buckets have a width in x units that doubles
(merging neighbours) whenever the x range outgrows `capacity`, so memory stays bounded however long
the log is, values may arrive in any x order (a resume replays steps), and every batch costs a few
vectorised numpy passes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Envelope", "MinMaxBuckets"]


@dataclass(frozen=True)
class Envelope:
    """Per bin, in x order: the bin's index, its minimum and maximum and where each occurred."""

    bin: np.ndarray
    lo_x: np.ndarray
    lo: np.ndarray
    hi_x: np.ndarray
    hi: np.ndarray

    def __len__(self) -> int:
        return len(self.lo)

    def polyline(self) -> tuple[np.ndarray, np.ndarray]:
        """The points to draw: each bin's min and max in the order they happened (one point if equal)."""
        lo_first = self.lo_x <= self.hi_x
        xs = np.column_stack([np.where(lo_first, self.lo_x, self.hi_x), np.where(lo_first, self.hi_x, self.lo_x)])
        ys = np.column_stack([np.where(lo_first, self.lo, self.hi), np.where(lo_first, self.hi, self.lo)])
        keep = np.ones(xs.shape, dtype=bool)
        keep[:, 1] = (xs[:, 0] != xs[:, 1]) | (ys[:, 0] != ys[:, 1])
        return xs[keep], ys[keep]


class MinMaxBuckets:
    """The minimum and maximum of y per bucket of x, never more than `capacity` buckets.

    Small additions are queued and merged a few hundred records at a time (or when read): a merge
    costs a dozen numpy calls whatever its size, and a live tail adds one record per metric many
    times a second. Queueing changes nothing, since the buckets do not depend on the batching.
    """

    #: points added but not merged yet, and how many; class defaults, so that buckets pickled in a
    #: scan state before the queue existed still load
    _queued: tuple[tuple[np.ndarray, np.ndarray], ...] = ()
    _queued_points = 0

    def __init__(self, capacity: int) -> None:
        if capacity < 2:
            raise ValueError(f"capacity must be at least 2, got {capacity}")
        self.capacity = capacity
        self.width = 1.0  #: x units per bucket, a power of two
        self._x_span = (np.inf, -np.inf)  # the exact extent: bucket points only keep where extremes were
        self._key = np.empty(0, dtype=np.int64)
        self._lo_x = np.empty(0)
        self._lo = np.empty(0)
        self._hi_x = np.empty(0)
        self._hi = np.empty(0)

    def __len__(self) -> int:
        self._merge_queued()
        return len(self._key)

    def add(self, x: np.ndarray, y: np.ndarray) -> None:
        """Add points; a non-finite y (NaN: not logged; inf: cannot be drawn) or a negative x (no step) is skipped."""
        if len(y) == 0:
            return
        # copies: the caller's arrays may change before the queue is merged; a zero is +0.0 (which
        # of two equal zeros a reduction keeps, and so the sign, would depend on how it was done)
        self._queued += ((np.array(x, dtype=np.float64), np.asarray(y, dtype=np.float64) + 0.0),)
        self._queued_points += len(y)
        if len(self._queued) >= _QUEUE_ADDS or self._queued_points >= _QUEUE_POINTS:
            self._merge_queued()

    def _merge_queued(self) -> None:
        """Fold the queued points into the buckets."""
        if not self._queued:
            return
        queued, self._queued, self._queued_points = self._queued, (), 0
        if len(queued) == 1:
            x, y = queued[0]
        else:
            x, y = np.concatenate([q[0] for q in queued]), np.concatenate([q[1] for q in queued])
        ok = np.isfinite(y) & (x >= 0)
        if not ok.all():
            x, y = x[ok], y[ok]
        if len(y) == 0:
            return
        self._x_span = (min(self._x_span[0], float(x.min())), max(self._x_span[1], float(x.max())))
        keys = np.floor(x / self.width).astype(np.int64)
        new = _few_buckets(keys, x, y)
        if new is None:
            new = (keys, x, y, x, y)
        self._key, self._lo_x, self._lo, self._hi_x, self._hi = _reduce(
            *(np.concatenate([old, added]) for old, added in zip(self._columns(), new, strict=True))
        )
        while (span := int(self._key[-1] - self._key[0]) + 1) > self.capacity:
            # floor: never past the narrowest width that fits, so the buckets do not depend on batching
            shift = max(1, int(np.log2(span / self.capacity)))
            self.width *= float(1 << shift)
            self._key, self._lo_x, self._lo, self._hi_x, self._hi = _reduce(
                self._key >> shift, self._lo_x, self._lo, self._hi_x, self._hi
            )

    def _columns(self) -> _Columns:
        return self._key, self._lo_x, self._lo, self._hi_x, self._hi

    def x_range(self) -> tuple[float, float] | None:
        """The smallest and largest x seen (None before the first point)."""
        self._merge_queued()
        return self._x_span if len(self._key) else None

    def envelope(self, bins: int, x_range: tuple[float, float] | None = None) -> Envelope:
        """At most `bins` equal-width bins over `x_range` (default: the data's), empty bins left out."""
        self._merge_queued()
        span = x_range or self.x_range()
        if span is None or not len(self._key):
            return Envelope(np.empty(0, dtype=np.int64), np.empty(0), np.empty(0), np.empty(0), np.empty(0))
        x0, x1 = span
        centre = (np.minimum(self._lo_x, self._hi_x) + np.maximum(self._lo_x, self._hi_x)) / 2
        scale = bins / (x1 - x0) if x1 > x0 else 0.0
        keys = np.clip(np.floor((centre - x0) * scale), 0, bins - 1).astype(np.int64)
        return Envelope(*_reduce(keys, self._lo_x, self._lo, self._hi_x, self._hi))


#: Queued additions, and queued points, that make `MinMaxBuckets` merge its queue.
_QUEUE_ADDS = 256
_QUEUE_POINTS = 4096

_Columns = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _few_buckets(keys: np.ndarray, x: np.ndarray, y: np.ndarray) -> _Columns | None:
    """The points as `_reduce` would make them buckets, where they fall in few buckets in key
    order (a batch of a long run: the 128 buckets of a million steps are 8,192 steps wide): the
    minimum and maximum of each bucket's slice, with where each first occurs. None otherwise."""
    if len(keys) < _FEW_BUCKETS_FROM or int(keys[-1]) - int(keys[0]) >= len(keys) // 64 or (np.diff(keys) < 0).any():
        return None
    bounds = np.searchsorted(keys, np.arange(int(keys[0]), int(keys[-1]) + 2)).tolist()
    rows = [(a, b) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]
    at_lo = [a + int(y[a:b].argmin()) for a, b in rows]
    at_hi = [a + int(y[a:b].argmax()) for a, b in rows]
    return keys[[a for a, _ in rows]], x[at_lo], y[at_lo], x[at_hi], y[at_hi]


#: Points from which `_few_buckets` is worth its Python loop.
_FEW_BUCKETS_FROM = 1024


def _reduce(key: np.ndarray, lo_x: np.ndarray, lo: np.ndarray, hi_x: np.ndarray, hi: np.ndarray) -> _Columns:
    """Rows with equal keys become one, sorted by key: min with its x, max with its x (first on ties)."""
    if len(key) > 1 and not (key[1:] >= key[:-1]).all():
        order = np.argsort(key, kind="stable")
        key, lo_x, lo, hi_x, hi = key[order], lo_x[order], lo[order], hi_x[order], hi[order]
    new_key = np.empty(len(key), dtype=bool)  # (not np.r_: its set-up was most of a small reduce)
    new_key[:1] = True
    np.not_equal(key[1:], key[:-1], out=new_key[1:])
    starts = np.flatnonzero(new_key)
    if len(starts) == len(key):
        return key, lo_x, lo, hi_x, hi
    group_lo = np.minimum.reduceat(lo, starts)
    group_hi = np.maximum.reduceat(hi, starts)
    sizes = np.diff(starts, append=len(key))
    index = np.arange(len(key))
    at_lo = np.minimum.reduceat(np.where(lo == np.repeat(group_lo, sizes), index, len(key)), starts)
    at_hi = np.minimum.reduceat(np.where(hi == np.repeat(group_hi, sizes), index, len(key)), starts)
    return key[starts], lo_x[at_lo], group_lo, hi_x[at_hi], group_hi

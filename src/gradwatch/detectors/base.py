"""The detector contract, and the small pieces every detector shares.

A detector owns its state, consumes one `Batch` at a time (records in line order plus events) and
returns alerts. The invariant that the tests hold every detector to: feeding a file in one batch
or in many small ones gives exactly the same alerts. Detectors therefore compute baselines from
the stream itself (carrying the tail of a window across batches), never from batch-local views.
"""

from __future__ import annotations

import dataclasses
import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import bottleneck as bn
import numpy as np

from gradwatch.alerts import Alert, Severity
from gradwatch.parsers.stream import Batch, BatchFacts
from gradwatch.records import Columns

if TYPE_CHECKING:
    import pandas as pd


class ColumnBatch(Batch):
    """A `Batch` of numpy columns (`Columns`) that all its readers share, its `records` frame
    built when first read: by a plugin's detector or a live view, not by the built-in detectors,
    which read the columns.

    `FileCheck` hands one to every detector; a plugin sees an ordinary `Batch` (made as one, or
    by `dataclasses.replace`, it takes its columns out of the frame it is given).
    """

    def __init__(self, records: pd.DataFrame | None = None, *, columns: Columns | None = None, **facts: Any) -> None:
        BatchFacts.__init__(self, **facts)
        self.columns = Columns(records) if columns is None else columns

    @classmethod
    def of_columns(cls, facts: BatchFacts, columns: Columns) -> ColumnBatch:
        """The batch of `facts` and these records."""
        return cls(columns=columns, **{f.name: getattr(facts, f.name) for f in dataclasses.fields(BatchFacts)})

    @classmethod
    def of(cls, batch: Batch) -> ColumnBatch:
        """`batch` with its columns, taken out of its frame as they are read."""
        if isinstance(batch, ColumnBatch):
            return batch
        return cls(batch.records, **{f.name: getattr(batch, f.name) for f in dataclasses.fields(BatchFacts)})

    @property  # type: ignore[misc]  # (mypy: a dataclass field overridden by a property; it is read as one)
    def records(self) -> pd.DataFrame:
        return self.columns.frame

    @records.setter
    def records(self, frame: pd.DataFrame) -> None:
        self.columns = Columns(frame)


def columns(batch: Batch) -> Columns:
    """The numpy columns of `batch`'s records: shared when it is a `ColumnBatch`, else taken out now."""
    return batch.columns if isinstance(batch, ColumnBatch) else Columns(batch.records)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DetectorConfig:
    """Base of every detector's config: `enabled` is common to all."""

    enabled: bool = True


#: the largest integer a built-in setting takes (past it, numpy's int64 overflows mid-run)
_LARGEST_INT = 2**62


@dataclasses.dataclass(frozen=True, kw_only=True)
class BuiltInConfig(DetectorConfig):
    """A built-in detector's config: every number finite (an integer at most 2**62) and not
    negative, and those named in `positive` (windows, ratios whose logarithm is taken) above 0,
    so that a config out of range is one clear error (`gradwatch.config`), not a traceback in
    the middle of a run."""

    positive: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            above = f.name in self.positive
            whole = isinstance(value, int)
            fits = value <= _LARGEST_INT if whole else math.isfinite(value)
            if not fits or value < 0 or (above and value == 0):
                need = "above 0" if above else "of 0 or more"
                what = f"an integer {need} and at most 2**62" if whole else f"a finite number {need}"
                raise ValueError(f"{f.name} must be {what}, got {value!r}")


class Detector(ABC):
    """One kind of trouble. Subclasses set `id`, `description`, `Config`, and implement `update`.

    State lives in plain attributes (numbers, strings, lists, numpy arrays, small objects of
    gradwatch's own): `gradwatch scan` saves them as data between runs (`gradwatch.state`), so no
    open files, locks or lambdas. A detector whose state needs more defines `state_dict()` and
    `load_state_dict()`; bump `STATE_VERSION` when what it saves changes meaning.
    """

    id: ClassVar[str]
    description: ClassVar[str]
    Config: ClassVar[type[DetectorConfig]] = DetectorConfig
    #: the version of what `gradwatch scan` saves of it: a saved state of another is not resumed
    STATE_VERSION: ClassVar[int] = 1

    def __init__(self, config: Any = None, path: str = "") -> None:
        self.config = config if config is not None else self.Config()
        self.path = path

    @abstractmethod
    def update(self, batch: Batch) -> list[Alert]:
        """Consume the next stretch of the log; return the alerts it raised."""

    def finish(self) -> list[Alert]:
        """End of input: alerts that only the end can decide (a run that stopped logging)."""
        return []

    def alert(
        self,
        severity: Severity,
        step: int | None,
        line: int | None,
        metric: str | None,
        value: float | None,
        baseline: float | None,
        threshold: float | None,
        message: str,
        hint: str,
    ) -> Alert:
        """An `Alert` from this detector on its file; numpy numbers become plain ones, a step < 0 None."""
        return Alert(
            detector=self.id,
            severity=severity,
            step=None if step is None or step < 0 else int(step),
            metric=metric,
            value=_num(value),
            baseline=_num(baseline),
            threshold=_num(threshold),
            message=message,
            hint=hint,
            line=None if line is None else int(line),
            path=self.path,
        )

    @staticmethod
    def escalated(alert: Alert, first_step: int | None) -> Alert:
        """`alert` as the escalation of the open incident that began at `first_step` (an
        `Incident.scan` "escalate"): its message says that it is the same incident, grown worse."""
        since = "" if first_step is None else f", since step {first_step}"
        message = f"{alert.message} (escalated to {alert.severity}: same incident{since})"
        return dataclasses.replace(alert, message=message)


def _num(v: float | None) -> float | None:
    return None if v is None else float(v)


def prev_window_median(
    tail: np.ndarray, values: np.ndarray, window: int, wanted: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Median of the `window` values before each of `values`, seeded by `tail` from earlier batches.

    Returns (medians, new tail). A value with no predecessor gets NaN. Because the tail carries the
    last `window` values across calls, the result does not depend on where batches were cut.
    `wanted`: a mask of the values whose median is needed, the others get NaN. A detector that
    rules most values out with the window's bounds (`prev_window_lowest`, `prev_window_highest`)
    has few medians computed.
    """
    joined = np.concatenate([tail, values])
    if wanted is None:
        few = len(values) <= SMALL_BATCH  # a live tail's batch of a record or two: pandas' set-up would dominate
        wanted_at = np.arange(len(values)) if few else None
    else:
        wanted_at = np.flatnonzero(wanted)
        if len(wanted_at) * _MEDIANS_ONE_BY_ONE > len(values) > SMALL_BATCH:
            wanted_at = None  # too many: the moving median costs less
    if wanted_at is None:
        before = np.concatenate([[np.nan], moving_median(joined, window)[:-1]])[
            len(tail) :
        ]  # each value's predecessors
        if wanted is not None:
            before[~wanted] = np.nan
        return before, joined[-window:]
    med = np.full(len(values), np.nan)
    for i in wanted_at.tolist():
        end = len(tail) + i
        window_values = joined[max(0, end - window) : end]
        window_values = window_values[~np.isnan(window_values)]
        if len(window_values):
            med[i] = median(window_values)
    return med, joined[-window:]


def prev_window_lowest(tail: np.ndarray, values: np.ndarray, window: int) -> np.ndarray:
    """The smallest of the `window` values before each of `values` (as `prev_window_median` takes
    them, NaN ignored; NaN where there are none): a bound of the median at a fraction of its cost,
    so that a detector can tell which medians it needs (`wanted`)."""
    lowest = _prev_window(bn.move_min, tail, values, window)
    lowest[lowest < -_HALF_LARGEST] = -np.inf  # the mean of two middle values there overflows: no bound
    return lowest


def prev_window_highest(tail: np.ndarray, values: np.ndarray, window: int) -> np.ndarray:
    """The largest of the `window` values before each of `values`: `prev_window_lowest`'s other bound."""
    highest = _prev_window(bn.move_max, tail, values, window)
    highest[highest > _HALF_LARGEST] = np.inf
    return highest


def _prev_window(move: Callable[..., np.ndarray], tail: np.ndarray, values: np.ndarray, window: int) -> np.ndarray:
    """bottleneck's moving `move` over the `window` values before each of `values`."""
    joined = np.concatenate([tail, values])
    moved = move(joined, min(window, len(joined)), min_count=1)
    if len(tail):
        return moved[len(tail) - 1 : -1]
    return np.concatenate([[np.nan], moved[:-1]])


_HALF_LARGEST = float(np.finfo(np.float64).max) / 2


#: `prev_window_median` computes wanted medians one by one while they are at most one value in
#: this many: one costs 8-10 us, the moving median of 32,768 values 1.3-2 ms (as 160-200 of them)
_MEDIANS_ONE_BY_ONE = 128


def moving_median(values: np.ndarray, window: int, min_count: int = 1) -> np.ndarray:
    """For each value, the median of it and the `window - 1` values before it, NaN ignored (NaN
    where fewer than `min_count` are left): pandas' rolling median, bit for bit, from
    bottleneck's double heap in C, several times faster (the detectors' main cost on archives)."""
    values = np.asarray(values, dtype=np.float64)
    if min_count > len(values):
        return np.full(len(values), np.nan)
    return bn.move_median(values, min(window, len(values)), min_count=min_count) + 0.0  # (-0.0 is 0.0)


def median(values: np.ndarray) -> float:
    """`np.median` of a 1-d array without NaN, for the small-batch paths (NaN when it is empty:
    a config may ask for a window of no values).

    The same value (the middle one, or the mean of the two middle ones), at a fraction of the
    cost: np.median's generic set-up costs ten times the partition it does on a window of 128,
    and its first call imports numpy.ma. A zero median is 0.0, as in `moving_median` (which
    middle zero a partition or a heap picks decides the sign of -0.0 otherwise).
    """
    if not len(values):
        return float("nan")
    k = len(values) // 2
    if len(values) % 2:
        return float(np.partition(values, k)[k]) + 0.0
    part = np.partition(values, (k - 1, k))
    with np.errstate(over="ignore"):  # two middle values beyond half the largest float: inf, as bottleneck has it
        return float((part[k - 1] + part[k]) / 2) + 0.0


#: Batches up to this size take plain numpy paths in the window code (same results): a live tail's
#: batch of a record or two, where pandas' rolling set-up costs far more than the arithmetic.
SMALL_BATCH = 8


class Incident:
    """One alert per incident and severity: open on the first hit, closed after `quiet` clean rows.

    `hit(index)` returns True when the hit opens a new incident (the caller raises its alert);
    `closes_before(index)` tells whether the open incident ended before row `index`. Row indices
    count finite rows of the detector's metric over the whole stream, so batch edges do not matter.

    An incident that grows worse escalates (`scan` with severities): a hit above every severity
    raised for the open incident is one more alert, so that a grad norm going from 20x to 5,000x
    its baseline reaches `--exit-on critical`; a hit at a severity already raised stays quiet.
    """

    def __init__(self, quiet: int) -> None:
        self.quiet = quiet
        self.open = False
        self.first_step: int | None = None
        self.last_hit = -1
        self.severity = Severity.INFO  # the highest raised for the open incident

    def closes_before(self, index: int) -> bool:
        return self.open and index - self.last_hit > self.quiet

    def hit(self, index: int, step: int) -> bool:
        opened = not self.open or index - self.last_hit > self.quiet
        if opened:
            self.open, self.first_step = True, step
        self.last_hit = index
        return opened

    def close(self) -> int | None:
        """Mark the incident over; returns the step it started at."""
        self.open = False
        return self.first_step

    def scan(
        self, start: int, n: int, hits: np.ndarray, steps: np.ndarray, severities: np.ndarray | None = None
    ) -> list[tuple[str, int, int | None]]:
        """Walk one batch of `n` rows (global indices start..start+n-1) with hits at `hits`.

        Returns ("open", position, step) for each hit that opens an incident and ("close",
        position, first step of the incident) for the row at which an open incident has been
        quiet long enough. With `severities` (a `Severity` value per hit), also ("escalate",
        position, first step of the incident) for a hit that is worse than any raised for its
        incident: at most one alert per severity and incident.
        """
        out: list[tuple[str, int, int | None]] = []
        levels = [Severity.INFO] * len(hits) if severities is None else severities.tolist()
        for pos, level in zip(hits.tolist(), levels, strict=True):
            index = start + pos
            if self.closes_before(index):
                out.append(("close", self.last_hit + self.quiet + 1 - start, self.close()))
            if self.hit(index, int(steps[pos])):
                self.severity = Severity(level)
                out.append(("open", pos, int(steps[pos])))
            elif level > self.severity:
                self.severity = Severity(level)
                out.append(("escalate", pos, self.first_step))
        if self.open and self.last_hit + self.quiet + 1 < start + n:
            out.append(("close", self.last_hit + self.quiet + 1 - start, self.close()))
        return out

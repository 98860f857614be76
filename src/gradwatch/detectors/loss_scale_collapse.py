"""fp16 dynamic loss scale collapse: the scaler halving again and again instead of recovering.

Sources, in line order: overflow events (DeepSpeed's OVERFLOW / "Reducing dynamic loss scale",
apex's, fairseq's, FP16_Optimizer's), and the loss scale printed in records (Megatron's own fp16).
A drop is measured against the last known scale, so a record that merely repeats the scale an
overflow line already announced is not a second drop; an overflow whose trainer prints only the
new scale (apex, fairseq) is measured against the scale known before it.

Normal and silent: the start-up calibration (the scale starts at 2^16 or 2^32 and halves on the
first steps, `calibration_steps`), and the sawtooth (an isolated overflow, then regrowth).
Alerts: `consecutive_halvings` halvings on consecutive logged steps; an overflow rate over
`max_overflow_rate` in the last `rate_window` steps; the scale at or under `floor` after a drop or
an overflow (a scale that sits at its minimum while steps are still skipped has collapsed, whether
or not the log showed it fall), critical at 1 or under, once per stay at the floor (a warning
that falls on to 1 escalates once); and "Current loss scale already at minimum" (DeepSpeed) or
"Minimum loss scale reached" (fairseq), which are critical. Overflows whose step is unknown (apex
prints none) are judged only by the floor and the minimum: calibration cannot be told apart
without steps.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from gradwatch.alerts import Alert, Severity
from gradwatch.detectors.base import BuiltInConfig, Detector, columns
from gradwatch.detectors.latest_config import LatestConfig
from gradwatch.events import EventKind
from gradwatch.parsers.stream import Batch

_HINT = (
    "fp16 gradients keep overflowing: right after a resume this points at optimizer or loss-scaler "
    "state that was not restored; otherwise look for a loss/grad-norm spike at these steps, lower "
    "the learning rate, or train in bf16"
)
#: the loss-scale settings a hint names, in DeepSpeed's `fp16` section's order (a loss_scale of 0,
#: dynamic, goes without saying)
_SETTINGS = ("loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis", "min_loss_scale")


def hint(told: dict[str, Any]) -> str:
    """The hint, naming the fp16 loss-scale settings the log printed and what each does here."""
    said = [f"{k}={_number(told[k])}" for k in _SETTINGS if told.get(k) is not None and (k != "loss_scale" or told[k])]
    if not said:
        return _HINT
    notes = []
    static = told.get("loss_scale")
    if isinstance(static, int | float) and static > 0:
        notes.append(f"a static loss scale ({_number(static)}) never adapts: use 0 (dynamic)")
    power = told.get("initial_scale_power")
    if isinstance(power, int) and 0 <= power <= 64 and not static:  # (a garbled power is no number to print)
        notes.append(f"a run that lost its scaler state starts again at 2**{power} = {2**power:,}")
    window = told.get("loss_scale_window")
    if isinstance(window, int):
        notes.append(f"it grows back only after {window:,} steps without overflow")
    return f"{_HINT}; this run's fp16 settings: {', '.join(said)}" + "".join(f"; {n}" for n in notes)


def _number(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


@dataclass(frozen=True, kw_only=True)
class LossScaleCollapseConfig(BuiltInConfig):
    positive: ClassVar[tuple[str, ...]] = ("rate_window",)
    consecutive_halvings: int = 3
    floor: float = 8.0
    calibration_steps: int = 100
    max_overflow_rate: float = 0.2
    rate_window: int = 100
    quiet_steps: int = 200


class LossScaleCollapse(Detector):
    id = "loss_scale_collapse"
    description = "fp16 loss scale halving repeatedly, at a floor, or overflowing too often"
    Config = LossScaleCollapseConfig
    config: LossScaleCollapseConfig
    #: the severity raised for the current stay at the floor, and the step it began at (None: the
    #: scale is above the floor, or no alert came yet); a class default for states pickled before
    _floor_alert: tuple[Severity, int] | None = None
    #: the run's configuration for the hint (a class default for states pickled before it)
    _told: LatestConfig | None = None

    def __init__(self, config: LossScaleCollapseConfig | None = None, path: str = "") -> None:
        super().__init__(config, path)
        self._scale: float | None = None
        self._chain = 0.0  # halvings in the current run of consecutive overflow steps
        self._chain_step: int | None = None  # last step of that run
        self._interval: int | None = None
        self._final_interval: int | None = None
        self._last_record_scale = float("nan")
        self._last_record_step: int | None = None
        self._overflow_steps: deque[int] = deque()
        self._quiet_until = -(10**18)

    def update(self, batch: Batch) -> list[Alert]:
        if self._told is None:
            self._told = LatestConfig()
        self._told.read(batch.events)
        rec = columns(batch)
        items: list[tuple[int, int, float | None, float | None, bool, int | None, int | None]] = []
        ev_lines: list[int] = []
        for ev in batch.events:
            if ev.kind is EventKind.OVERFLOW:
                step = ev.step if ev.step is not None else -1
                items.append((ev.line, step, ev.data.get("attempted"), ev.data["new"], True, None, None))
            elif ev.kind is EventKind.SCALE_INCREASE and ev.step is not None:
                items.append((ev.line, ev.step, ev.data["old"], ev.data["new"], False, None, None))
            elif ev.kind is EventKind.SCALE_AT_MINIMUM:
                items.append((ev.line, ev.step if ev.step is not None else -1, None, -1.0, True, None, None))
            else:
                continue
            ev_lines.append(ev.line)
        scale = rec["loss_scale"]
        ok = np.isfinite(scale)
        if ok.any():
            items += self._record_items(scale[ok], rec["step"][ok], rec["line"][ok], ev_lines)
        items.sort(key=lambda item: item[0])
        alerts: list[Alert] = []
        for line, step, old, new, overflow, last_record_step, interval in items:
            if last_record_step is not None:  # the state as if every record before had been seen
                self._last_record_step = last_record_step if last_record_step >= 0 else None
                self._interval = interval if interval is not None and interval > 0 else None
            alert = self._observe(line, step, old, new, overflow)
            if alert is not None:
                alerts.append(alert)
        if ok.any():
            self._last_record_step = int(rec["step"][ok][-1])
            self._interval = self._final_interval
        return alerts

    def _record_items(
        self, scale: np.ndarray, steps: np.ndarray, lines: np.ndarray, ev_lines: list[int]
    ) -> list[tuple[int, int, float | None, float | None, bool, int | None, int | None]]:
        """The records whose scale or spacing can change anything; the rest repeat the last scale.

        Each item carries the previous record's step and the log interval before it, so that
        skipping the repeats does not change what `_observe` concludes.
        """
        prev_step = np.concatenate([[self._last_record_step if self._last_record_step is not None else -1], steps[:-1]])
        prev_scale = np.concatenate([[self._last_record_scale], scale[:-1]])
        gaps = np.where(prev_step >= 0, steps - prev_step, 0)
        positive = np.where(gaps > 0, gaps, np.iinfo(np.int64).max)
        start_interval = self._interval if self._interval is not None else np.iinfo(np.int64).max
        interval_after = np.minimum.accumulate(np.concatenate([[start_interval], positive]))
        interval_before = interval_after[:-1]
        self._final_interval = None if interval_after[-1] == np.iinfo(np.int64).max else int(interval_after[-1])
        self._last_record_scale = float(scale[-1])
        look = (scale != prev_scale) | (gaps <= 0) | (gaps != interval_before)
        for line in ev_lines:  # the record after an overflow line shows its effect
            i = int(np.searchsorted(lines, line))
            if i < len(look):
                look[i] = True
        look[1:] |= look[:-1].copy()  # and the record after any of these may end a cascade
        if self._chain_step is not None:
            look[0] = True
        no_interval = np.iinfo(np.int64).max
        return [
            (
                int(lines[i]),
                int(steps[i]),
                None,
                float(scale[i]),
                False,
                int(prev_step[i]),
                None if interval_before[i] == no_interval else int(interval_before[i]),
            )
            for i in np.flatnonzero(look).tolist()
        ]

    def _hint(self, line: int) -> str:
        return hint(self._told.at(line) if self._told is not None else {})

    def _observe(self, line: int, step: int, old: float | None, new: float | None, overflow: bool) -> Alert | None:
        if new == -1.0:
            return self.alert(
                Severity.CRITICAL,
                step,
                line,
                "loss_scale",
                self._scale,
                None,
                None,
                "loss scale already at its minimum: the trainer stops the run",
                self._hint(line),
            )
        is_record = not overflow and old is None
        contiguous = True
        if is_record:
            if self._last_record_step is not None:
                gap = step - self._last_record_step
                if gap > 0:
                    self._interval = gap if self._interval is None else min(self._interval, gap)
                # the same step again, or a step back, is another run or a restart
                contiguous = 0 < gap <= (self._interval or gap)
            self._last_record_step = step
        known = self._scale if old is None else old
        if is_record and not contiguous:
            known = None  # steps between the two records were not logged: their drops are unknown
        if new is None:
            return None
        self._scale = new
        drop = math.log2(known / new) if known and 0 < new < known else 0.0
        if drop == 0.0 and not overflow:
            if known is not None and new > known:
                self._floor_alert = None
            if is_record and self._chain_step is not None and step > self._chain_step:
                self._chain, self._chain_step = 0.0, None  # a clean step ends a cascade
            return None
        window = self.config.rate_window
        self._overflow_steps.append(step)
        while self._overflow_steps and self._overflow_steps[0] <= step - window:
            self._overflow_steps.popleft()
        interval = self._interval or 1
        if self._chain_step is not None and step - self._chain_step <= interval:
            self._chain += drop
        else:
            self._chain = drop
        self._chain_step = step
        return self._judge(line, step, new, known)

    def _judge(self, line: int, step: int, scale: float, before: float | None) -> Alert | None:
        cfg = self.config
        if scale <= cfg.floor:
            alert = self._at_floor_alert(line, step, scale, before)
            if alert is not None or self._floor_alert is not None:
                return alert  # (a cascade at the floor is the incident its alert reported)
        if step <= cfg.calibration_steps or step <= self._quiet_until:
            return None
        rate = len(self._overflow_steps) / cfg.rate_window
        if self._chain >= cfg.consecutive_halvings:
            self._quiet_until = step + cfg.quiet_steps
            return self.alert(
                Severity.WARNING,
                step,
                line,
                "loss_scale",
                scale,
                None,
                None,
                f"loss scale halved {self._chain:.0f} times on consecutive logged steps, now {scale:g}",
                self._hint(line),
            )
        if rate > cfg.max_overflow_rate:
            self._quiet_until = step + cfg.quiet_steps
            return self.alert(
                Severity.WARNING,
                step,
                line,
                "loss_scale",
                scale,
                None,
                cfg.max_overflow_rate,
                f"{len(self._overflow_steps)} overflows in the last {cfg.rate_window} steps "
                f"(rate {rate:.2f} > {cfg.max_overflow_rate:g}); loss scale now {scale:g}",
                self._hint(line),
            )
        return None

    def _at_floor_alert(self, line: int, step: int, scale: float, before: float | None) -> Alert | None:
        """The scale is at or under the floor after a drop or an overflow: one alert per stay
        there, and one more where a warning's scale falls on to 1 or under (the same incident)."""
        cfg = self.config
        severity = Severity.CRITICAL if scale <= 1 else Severity.WARNING
        raised = self._floor_alert
        if raised is not None and severity <= raised[0]:
            return None
        alert = self.alert(
            severity,
            step,
            line,
            "loss_scale",
            scale,
            before,
            cfg.floor,
            f"loss scale fell to {scale:g} (floor {cfg.floor:g})"
            if before is not None and scale < before
            else f"loss scale at {scale:g} (floor {cfg.floor:g}) and steps still overflow",
            self._hint(line),
        )
        if raised is None:
            self._floor_alert = (severity, step)
            return alert
        self._floor_alert = (severity, raised[1])
        return self.escalated(alert, raised[1] if raised[1] >= 0 else None)

"""Loss plateau: a run that does not learn, its loss still at its start-up level after a long stretch.

A learning rate of 0 (a scheduler or config bug), parameters left out of the optimizer (frozen
layers, LoRA adapters not attached), every step skipped, or labels that no longer match their
inputs leave the loss where it began while the steps go on, and no other detector sees anything
wrong: nothing spikes, nothing is NaN.

The run is judged once, at the first record at least `min_steps` optimizer steps after the first
logged loss and at least `min_records` logged losses in, so that short logs are never judged; and
only when the log starts at the run's start (first loss at step `start_step` or before): a resumed
or excerpted log starts on a plateau that training reached. Start level: the median of the first
`block` losses; current level: the median of the last `block`. The run does not learn when
- the current level is still at `init_fraction` of ln(vocab) or more (the random-init loss; vocab
  from the log's `padded vocab (size: N)` line or `vocab_size`): critical; or
- the loss is flat within noise: even allowing `z` standard errors of the two medians (noise from
  the record-to-record differences), it fell by less than `tolerance` of its start level: a
  warning. A noisy run is never called flat: it may be learning under its noise.
A loss that ever goes to 0 or below is no likelihood (reinforcement-learning objectives, sentinels)
and is not judged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from gradwatch.alerts import Alert, Severity
from gradwatch.detectors.base import BuiltInConfig, Detector, columns, median
from gradwatch.events import EventKind
from gradwatch.parsers.stream import Batch

_HINT = (
    "the loss has not moved from where it started: check that the learning rate is not 0 (scheduler, "
    "warm-up, a misread config), that the parameters are trainable and in the optimizer (frozen layers, "
    "LoRA adapters not attached), that steps are not all skipped (fp16 loss scale) or clipped to nothing, "
    "that labels still match their inputs (not masked, shifted or shuffled apart), and that the data "
    "loader is not serving one repeated batch"
)

#: the standard error of a median of normal values, in standard errors of their mean
_MEDIAN_SE = math.sqrt(math.pi / 2)


@dataclass(frozen=True, kw_only=True)
class LossPlateauConfig(BuiltInConfig):
    positive: ClassVar[tuple[str, ...]] = ("block", "min_records")
    min_steps: int = 1000
    min_records: int = 50
    start_step: int = 500
    block: int = 20
    tolerance: float = 0.02
    z: float = 3.0
    vocab_size: int | None = None
    init_fraction: float = 0.9


class LossPlateau(Detector):
    id = "loss_plateau"
    description = "loss still at its start-up level (near ln(vocab), or flat within noise) after 1000+ steps"
    Config = LossPlateauConfig
    config: LossPlateauConfig

    def __init__(self, config: LossPlateauConfig | None = None, path: str = "") -> None:
        super().__init__(config, path)
        self._vocab = self.config.vocab_size
        self._first_step: int | None = None
        self._start = np.empty(0)  # the first `block` losses
        self._tail = np.empty(0)  # the last `block` losses
        self._seen = 0
        self._judged = False

    def update(self, batch: Batch) -> list[Alert]:
        if self._judged:
            return []
        rec = columns(batch)
        loss = rec["loss"]
        ok = np.isfinite(loss)
        loss, steps, lines = loss[ok], rec["step"][ok], rec["line"][ok]
        if not len(loss):
            self._take_vocab(batch, None)
            return []
        if self._first_step is None:
            self._first_step = int(steps[0])
            if not 0 <= self._first_step <= self.config.start_step:  # a resume, an excerpt, or no step counter
                self._judged = True
                return []
        cfg = self.config
        due = (np.arange(self._seen + 1, self._seen + len(loss) + 1) >= cfg.min_records) & (
            steps - self._first_step >= cfg.min_steps
        )
        end = int(np.argmax(due)) + 1 if due.any() else len(loss)  # the losses up to the judgement
        if (loss[:end] <= 0).any():  # no likelihood: not judged
            self._judged = True
            return []
        self._start = np.concatenate([self._start, loss[: min(end, max(0, cfg.block - self._seen))]])
        self._tail = np.concatenate([self._tail, loss[:end]])[-cfg.block :]
        self._seen += end
        self._take_vocab(batch, int(lines[end - 1]))
        if not due.any():
            return []
        self._judged = True
        alert = self._judge(int(steps[end - 1]), int(lines[end - 1]))
        return [alert] if alert is not None else []

    def _take_vocab(self, batch: Batch, until_line: int | None) -> None:
        """The vocabulary size the log states, up to `until_line` (None: the whole batch)."""
        if self.config.vocab_size is not None:
            return
        for ev in batch.events:
            if ev.kind is EventKind.VOCAB and (until_line is None or ev.line <= until_line):
                self._vocab = int(ev.data["size"])

    def _judge(self, step: int, line: int) -> Alert | None:
        cfg = self.config
        start, current = median(self._start), median(self._tail)
        steps_text = f"{step - (self._first_step or 0)} steps and {self._seen} logged losses"
        if self._vocab is not None and self._vocab >= 2:
            init = math.log(self._vocab)
            if current >= cfg.init_fraction * init:
                return self.alert(
                    Severity.CRITICAL,
                    step,
                    line,
                    "loss",
                    current,
                    init,
                    cfg.init_fraction * init,
                    f"loss {current:.4g} is still near the random-init level ln({self._vocab})={init:.2f} "
                    f"after {steps_text} (median of the last {len(self._tail)})",
                    _HINT,
                )
        diffs = np.concatenate([np.diff(self._start), np.diff(self._tail)])
        noise = 1.4826 * median(np.abs(diffs - median(diffs))) / math.sqrt(2.0)  # per record
        stderr = _MEDIAN_SE * noise * math.sqrt(1 / len(self._start) + 1 / len(self._tail))
        fell = start - current
        if fell + cfg.z * stderr >= cfg.tolerance * start:
            return None
        return self.alert(
            Severity.WARNING,
            step,
            line,
            "loss",
            current,
            start,
            (1 - cfg.tolerance) * start,
            f"loss {current:.4g} is flat at its start-up level {start:.4g} after {steps_text} "
            f"({-fell / start:+.1%} since; noise {noise:.3g} per record)",
            _HINT,
        )

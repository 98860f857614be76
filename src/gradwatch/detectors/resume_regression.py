"""Resume regression: after a restart from a checkpoint, the run is worse than where it stopped.

A resume is seen as a checkpoint-load line, the step going backwards or repeating (a run that died
after logging step N and replays it from the checkpoint at N-1 logs N twice; the parsers already
merge the copies that several ranks print), or a log whose first record is already far into
training. The first `probe` records after it are compared with:
- the random-init loss level ln(vocab) (vocab from the log's `padded vocab (size: N)` line, else
  `vocab_size`, else GPT-2's 50257): a loss back near it means the weights did not load
  (ALCF AuroraGPT iteration 136004: 12.3 where validation said 2.7);
- the loss and grad norm before the restart in the same log: far above them means optimizer or
  loss-scaler state was lost, or the checkpoint was reshaped badly (BLOOM tr11 TP1/PP72: 10x);
- when there is no "before" in the log: a first grad norm several times the next ones, falling
  step after step, is the transient of a freshly reset optimizer (BLOOM tr11 94768).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from gradwatch.alerts import Alert, Severity
from gradwatch.detectors.base import BuiltInConfig, Detector, columns
from gradwatch.events import Event, EventKind
from gradwatch.parsers.stream import Batch

GPT2_VOCAB = 50257
_HINT = (
    "the run did not resume where it stopped: check that the checkpoint loaded with its optimizer "
    "and loss-scaler state (not weights only), that tokenizer and vocab match, that a reshaped or "
    "universal checkpoint converted correctly, and that the LR schedule did not restart its warm-up"
)


@dataclass(frozen=True, kw_only=True)
class ResumeRegressionConfig(BuiltInConfig):
    vocab_size: int | None = None
    probe: int = 3
    init_fraction: float = 0.8
    init_check_min_step: int = 1000
    resume_min_step: int = 100
    pre_window: int = 20
    loss_rise: float = 0.2
    loss_delta: float = 0.3
    grad_ratio: float = 5.0
    transient_ratio: float = 3.0


@dataclass
class _Probe:
    reason: str
    load_line: int | None = None  # the checkpoint load's line, and the step it resumes from
    load_step: int | None = None
    step: int | None = None
    line: int | None = None
    losses: list[float] = field(default_factory=list)
    grads: list[float] = field(default_factory=list)
    rows: int = 0


class ResumeRegression(Detector):
    id = "resume_regression"
    description = (
        "after a resume, loss back near init level or far above, or grad norm many times, its pre-resume level"
    )
    Config = ResumeRegressionConfig
    config: ResumeRegressionConfig

    def __init__(self, config: ResumeRegressionConfig | None = None, path: str = "") -> None:
        super().__init__(config, path)
        self._vocab = self.config.vocab_size
        self._pre_loss: deque[float] = deque(maxlen=self.config.pre_window)
        self._pre_grad: deque[float] = deque(maxlen=self.config.pre_window)
        self._last_step: int | None = None
        self._probe: _Probe | None = None
        self._failing = False  # the last resume judged failed, and no record since that was not judged

    def update(self, batch: Batch) -> list[Alert]:
        rec = columns(batch)
        loss, grad = rec["loss"], rec["grad_norm"]
        logged = np.isfinite(loss) | np.isfinite(grad)
        loss, grad = loss[logged], grad[logged]
        steps, lines = rec["step"][logged], rec["line"][logged]
        events = [ev for ev in batch.events if ev.kind in (EventKind.CHECKPOINT_LOAD, EventKind.VOCAB)]
        # records that may start a probe: the first one, and steps going backwards
        prev = np.concatenate([[self._last_step if self._last_step is not None else -1], steps[:-1]])
        special = steps <= prev  # a step logged again is a replay from a checkpoint too
        if self._last_step is None and len(steps):
            special[0] = True
        alerts: list[Alert] = []
        pos, n, e = 0, len(steps), 0
        triggers = np.flatnonzero(special).tolist()
        t = 0
        while pos < n or e < len(events):
            if self._probe is not None and pos < n and (e >= len(events) or lines[pos] < events[e].line):
                alerts += self._record(int(steps[pos]), int(lines[pos]), float(loss[pos]), float(grad[pos]))
                pos += 1
                continue
            while t < len(triggers) and triggers[t] < pos:
                t += 1
            stop = triggers[t] if t < len(triggers) else n  # next record that needs a look of its own
            if e < len(events):  # (never before `pos`: a record and an event of one line, `\r`-joined)
                stop = max(pos, min(stop, int(np.searchsorted(lines, events[e].line))))
            self._extend(loss[pos:stop], grad[pos:stop], steps[pos:stop])  # ordinary records in bulk
            pos = stop
            if e < len(events) and (pos >= n or events[e].line <= lines[pos]):  # an event first on its line
                self._event(events[e])
                e += 1
            elif pos < n:
                alerts += self._record(int(steps[pos]), int(lines[pos]), float(loss[pos]), float(grad[pos]))
                pos += 1
        return alerts

    def _extend(self, loss: np.ndarray, grad: np.ndarray, steps: np.ndarray) -> None:
        """Records with nothing to judge: they only move the pre-resume level."""
        if len(steps) == 0:
            return
        w = self.config.pre_window
        self._failing = False  # training went on: a failed resume after this is a new incident
        self._pre_loss.extend(loss[np.isfinite(loss)][-w:].tolist())
        self._pre_grad.extend(grad[np.isfinite(grad) & (grad > 0)][-w:].tolist())
        self._last_step = int(steps[-1])

    def _event(self, ev: Event) -> None:
        if ev.kind is EventKind.VOCAB:
            if self.config.vocab_size is None:
                self._vocab = int(ev.data["size"])
        elif self._probe is None or self._probe.rows:
            resumed_from = ev.data.get("iteration")
            self._probe = _Probe(
                "a checkpoint was loaded", ev.line, resumed_from if isinstance(resumed_from, int) else None
            )

    def _record(self, step: int, line: int, loss: float, grad: float) -> list[Alert]:
        cfg = self.config
        last, self._last_step = self._last_step, step
        alerts: list[Alert] = []
        went_back = last is not None and step <= last
        if self._probe is not None and self._before_load(self._probe, step, line, last):
            # a record `\r`-joined to the load's line that came before it: still the level before
            self._pre_loss.extend(self._probe.losses)
            self._pre_grad.extend(self._probe.grads)
            self._probe = _Probe(self._probe.reason, self._probe.load_line, self._probe.load_step)
            if line == self._probe.load_line:
                self._record_before(loss, grad)
                return alerts
        elif self._probe is not None and self._probe.rows and went_back:
            alerts += self._close_probe(self._probe)  # a restart within the probe: judge what came before it
        if self._probe is None:
            if last is None and step > cfg.resume_min_step:
                self._probe = _Probe(f"the log starts at step {step}")
            elif last is not None and went_back:
                went = f"{step} was logged again" if step == last else f"went back from {last} to {step}"
                self._probe = _Probe(f"the step {went}")
        probe = self._probe
        if probe is None:
            self._record_before(loss, grad)
            return alerts
        if probe.step is None:
            probe.step, probe.line = step, line
        probe.rows += 1
        if loss == loss:
            probe.losses.append(loss)
        if grad == grad and grad > 0:
            probe.grads.append(grad)
        if probe.rows >= cfg.probe:
            alerts += self._close_probe(probe)
        return alerts

    def _close_probe(self, probe: _Probe) -> list[Alert]:
        """Judge the records after a resume; they are then the level the next resume is held to.
        A failed resume restarted again and failing again (a crash loop) is the same incident."""
        self._probe = None
        alert = self._judge(probe)
        again, self._failing = self._failing, alert is not None
        if again:
            alert = None
        self._pre_loss.clear()
        self._pre_grad.clear()
        self._pre_loss.extend(probe.losses)
        self._pre_grad.extend(probe.grads)
        return [] if alert is None else [alert]

    @staticmethod
    def _before_load(probe: _Probe, step: int, line: int, last: int | None) -> bool:
        """Whether a record on the load's line, or the probe's one row taken from it, came before
        the load: its step is at or before the checkpoint's, or the next record goes back below it.
        (The pieces of a `\r`-joined line share its number; their order within it is not kept.)"""
        if line == probe.load_line and probe.rows == 0:
            return probe.load_step is not None and step <= probe.load_step
        return probe.rows == 1 and probe.line == probe.load_line and last is not None and step <= last

    def _record_before(self, loss: float, grad: float) -> None:
        """A record with nothing to judge: it moves the level before a resume."""
        self._failing = False  # (as `_extend`)
        if loss == loss:
            self._pre_loss.append(loss)
        if grad == grad and grad > 0:
            self._pre_grad.append(grad)

    def _judge(self, p: _Probe) -> Alert | None:
        cfg = self.config
        init = math.log(self._vocab or GPT2_VOCAB)
        # (medians of at most `pre_window` floats: statistics' is 30x quicker than numpy's there, and
        # a log that restarts at every other line judges as many probes as it has records)
        pre_loss = statistics.median(self._pre_loss) if len(self._pre_loss) >= 3 else None
        pre_grad = statistics.median(self._pre_grad) if len(self._pre_grad) >= 3 else None
        first_loss = p.losses[0] if p.losses else None
        first_grad = p.grads[0] if p.grads else None
        step = p.step or 0
        if (
            first_loss is not None
            and first_loss >= cfg.init_fraction * init
            and (
                (pre_loss is not None and pre_loss < cfg.init_fraction * init)
                or (pre_loss is None and step >= cfg.init_check_min_step)
            )
        ):
            return self._alert(
                Severity.CRITICAL,
                p,
                "loss",
                first_loss,
                pre_loss,
                init,
                f"loss {first_loss:.4g} after resume is at the random-init level ln(vocab)={init:.2f}" + _was(pre_loss),
            )
        if (
            first_loss is not None
            and pre_loss is not None
            and first_loss >= pre_loss * (1 + cfg.loss_rise)
            and first_loss - pre_loss >= cfg.loss_delta
        ):
            ratio = f"{first_loss / pre_loss:.2f}x" if pre_loss > 0 else "above"  # a run may log a loss of 0.0
            return self._alert(
                Severity.WARNING,
                p,
                "loss",
                first_loss,
                pre_loss,
                pre_loss * (1 + cfg.loss_rise),
                f"loss {first_loss:.4g} after resume is {ratio} its level before ({pre_loss:.4g})",
            )
        if first_grad is not None and pre_grad is not None and first_grad >= cfg.grad_ratio * pre_grad:
            return self._alert(
                Severity.WARNING,
                p,
                "grad_norm",
                first_grad,
                pre_grad,
                cfg.grad_ratio * pre_grad,
                f"grad norm {first_grad:.4g} after resume is {first_grad / pre_grad:.1f}x its "
                f"level before ({pre_grad:.4g})",
            )
        if pre_grad is None and len(p.grads) >= 3:
            rest = statistics.median(p.grads[1:])
            falling = all(a > b for a, b in zip(p.grads, p.grads[1:], strict=False))
            if falling and rest > 0 and p.grads[0] >= cfg.transient_ratio * rest:
                return self._alert(
                    Severity.WARNING,
                    p,
                    "grad_norm",
                    p.grads[0],
                    rest,
                    cfg.transient_ratio * rest,
                    f"grad norm {p.grads[0]:.4g} right after resume is {p.grads[0] / rest:.1f}x the next "
                    f"steps' ({rest:.4g}) and falling: the optimizer state looks reset",
                )
        return None

    def _alert(
        self,
        sev: Severity,
        p: _Probe,
        metric: str,
        value: float,
        baseline: float | None,
        threshold: float,
        message: str,
    ) -> Alert:
        return self.alert(
            sev,
            p.step,
            p.line,
            metric,
            value,
            baseline,
            threshold,
            f"{message} ({p.reason})",
            _HINT,
        )


def _was(pre: float | None) -> str:
    return f", {pre:.4g} before the restart" if pre is not None else ""

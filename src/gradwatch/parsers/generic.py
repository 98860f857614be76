"""The generic reader: training logs of trainers that have no parser of their own.

It is offered only the lines that every other parser left (it comes last), and its records are
the file's only where no named trainer's parser found any (`Parser.fallback`): it never competes
with a parser that knows the file. A record is a line, or a block of lines, with a step counter and
at least one training metric of a known name (`generic_names`), in the shapes real logs use:

    Iter 10: Train loss 1.363, Learning Rate 1.000e-05, It/sec 1.022     mlx-lm        `key value`
    iter 1152 step 144: loss 11.4630, iter time: 1260.82ms               litgpt        `key: value`
    epoch 001:    100 / 1975 loss=12.834, num_updates=100, gnorm=1.448   fairseq       `key=value`
    Epoch(train) [1][ 10/381]  lr: 1.9997e-04  time: 1.4288  loss: 1.24  MMEngine      bracketed counter
    Epoch 0:   0%|   | 1/5005 [00:03<5:11:31, 0.27it/s, loss=1.41e+5]   Lightning     progress bar
    Epoch 2/10  then  9595/9595 [=====] - 1s - loss: nan - acc: 0.41     Keras         the epoch line's step
    --> STEP: 29/104 -- GLOBAL_STEP: 217050  then  | > loss: nan (nan)   Coqui         a block of rows
    | train/ |  |  then  |    loss | 0.0336 |                            Stable-Baselines3  a table
    epoch,train_loss,eval_loss  then  3,2.31,2.45                        CSV with a header row
    209,nan,4.16,7.72,24.0                                               CSV without one

Steps: the finest counter the line prints (`generic_names.COUNTERS`); an epoch is the step only
where nothing finer is printed. A line with a counter and no metric (`Epoch 2/10`) gives its step
to the metric lines after it that have none of their own. A log that prints no counter at all
counts its records (the step is then an ordinal, and `layout` says so). Where a CSV has no header,
its columns have no names: a non-finite value in one is counted (`nan_count`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gradwatch.parsers._text import number
from gradwatch.parsers.base import ParseOutput, Parser
from gradwatch.parsers.generic_fields import (
    Field,
    bare_pair,
    csv_cells,
    fields,
    is_border,
    is_evaluation,
    is_name,
    is_number,
    progress,
    table_row,
)
from gradwatch.parsers.generic_names import EPOCH_RANK, PROGRESS_RANK, Names

#: Lines longer than this are no metric lines (a config dump on one line, a tensor printed whole).
MAX_LINE = 4096
#: Metrics that make a line a training record (a line of timings alone is not one).
_JUDGED = frozenset(("loss", "val_loss", "grad_norm", "lr", "loss_scale", "ppl", "z_loss", "logit_norm", "nan_count"))
#: Metrics whose value is a plain number: a percentage or a time is another quantity.
_UNITLESS = frozenset(("loss", "val_loss", "grad_norm", "lr", "loss_scale", "ppl", "z_loss", "logit_norm"))
#: Digits a step may have (int64).
_MAX_STEP_DIGITS = 18


@dataclass
class _Reading:
    """What one line or block says: its counter (with its rank and name) and its metrics."""

    step: int | None = None
    rank: int = 99
    counter: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    nonfinite: list[str] = field(default_factory=list)
    #: the first value of a loss of the trainer's own naming, used where no loss has a known name
    loss_like: tuple[float, bool] | None = None
    #: a counter printed with a value that cannot be a step (a fraction, more digits than int64)
    garbled: bool = False
    #: where the loss's name begins in the line
    loss_at: int = 0

    def count(self, key: str, rank: int, step: int) -> None:
        if rank < self.rank:
            self.step, self.rank, self.counter = step, rank, key

    def add(self, names: Names, item: Field, prefix: str = "") -> None:
        """Read one named number: a counter, a metric, or nothing we know."""
        meaning = names.meaning(prefix + item.key.rstrip("."))
        rank, metric = meaning.rank, meaning.metric
        if rank is not None:
            if item.value.isdigit() and len(item.value) <= _MAX_STEP_DIGITS:
                self.count(item.key, rank, int(item.value))
            else:
                self.garbled = True
            return
        try:
            value = number(item.value)
        except ValueError:
            return
        if metric is not None:
            if metric.name in self.metrics or (metric.name in _UNITLESS and item.unit):
                return
            self.metrics[metric.name] = metric.value(value, item.unit)
            if metric.name == "loss":
                self.loss_at = item.at
            if not math.isfinite(value):
                self.nonfinite.append(metric.name)
        elif self.loss_like is None and not item.unit and meaning.loss_like:
            self.loss_like = (value, not math.isfinite(value))
            self.loss_at = item.at

    def finish(self) -> None:
        """Where no loss has a known name, the first of the trainer's own naming stands in."""
        if "loss" not in self.metrics and self.loss_like is not None:
            value, bad = self.loss_like
            self.metrics["loss"] = value
            if bad:
                self.nonfinite.append("loss")

    def relabel_as_evaluation(self) -> None:
        """The line reports an evaluation: its loss is a validation loss."""
        loss = self.metrics.pop("loss")
        self.metrics.setdefault("val_loss", loss)
        self.nonfinite = ["val_loss" if name == "loss" else name for name in self.nonfinite]

    @property
    def judged(self) -> bool:
        return not _JUDGED.isdisjoint(self.metrics)


class GenericParser(Parser):
    name = "generic"
    description = "any other trainer: a step counter and named metrics (`key: value`, bars, tables, CSV)"
    #: every line with a metric name, a counter or a table/CSV shape (see `parse`); no class in
    #: brackets, so that RE2 searches blocks that are not ASCII too (`keywords._shadow_pattern`)
    scan = (
        r"oss|OSS|tep|TEP|ter|TER|poch|POCH|atch|ATCH|pdates|norm|lr|LR|earning|cale|ppl|PPL|erplexity"
        r"|\| |\w,\w|\d,-|\d,\+|\d,\."
    )
    auxiliary = True
    fallback = True

    def __init__(self, synonyms: dict[str, str] | None = None) -> None:
        self.names = Names(synonyms)
        self._pending: int | None = None  # the step of a counter line without metrics
        self._counted = False  # whether the log printed a counter yet
        self._ordinal = 0
        self._block: list[tuple[str, Field]] = []  # (section prefix, row) of an open block
        self._block_line = 0
        self._section = ""
        self._header: list[str] | None = None  # a CSV's column names
        self._first_epoch: int | None = None  # 0 or 1: how the log numbers its epochs
        #: how the latest record was read, for `gradwatch check` and reports
        self.layout: str | None = None

    @property
    def collecting(self) -> bool:
        return bool(self._block)

    def parse(self, text: str, line: int, ts: float | None, out: ParseOutput) -> bool:
        if self._block:
            if len(text) <= MAX_LINE and self._block_row(text, line):
                return True
            self._close_block(out)
            return False  # the line goes to every parser again, this one last
        if len(text) > MAX_LINE or not text.strip():
            return False
        if self._block_row(text, line):
            return True
        cells = csv_cells(text)
        if cells is not None:
            return self._csv(cells, line, ts, out)
        return self._line(text, line, ts, out)

    def flush(self, out: ParseOutput) -> None:
        if self._block:
            self._close_block(out)

    # -- one line of pairs -------------------------------------------------------------------

    def _line(self, text: str, line: int, ts: float | None, out: ParseOutput) -> bool:
        items = fields(text)
        if not items:
            return False
        reading = _Reading()
        for item in items:
            reading.add(self.names, item)
        bar = progress(text)
        epoch = reading.step if reading.rank == EPOCH_RANK else None
        if bar is not None:
            if bar.shape == "Iter [i/n]":
                reading.count("Iter", 2, bar.n)
            elif bar.epoch is not None and bar.total:
                reading.count("Epoch [e][i/n]", PROGRESS_RANK, self._epochs_before(bar.epoch) * bar.total + bar.n)
            elif bar.epoch is not None:
                reading.count("Epoch [e]", EPOCH_RANK, bar.epoch)
            elif epoch is not None and bar.total:  # Lightning: `Epoch 3: ... | 45/100 [`
                reading.count("Epoch N + bar", PROGRESS_RANK, self._epochs_before(epoch) * bar.total + bar.n)
            elif reading.step is None and self._pending is None:  # a bar on its own: its count
                reading.count("bar", PROGRESS_RANK, bar.n)
        reading.finish()
        if "loss" in reading.metrics and is_evaluation(text, reading.loss_at):
            reading.relabel_as_evaluation()
        return self._write(reading, line, ts, out, _shape(items))

    def _epochs_before(self, epoch: int) -> int:
        """How many whole epochs come before `epoch` as the log counts them: from 0 where its
        first epoch is 0 (Lightning, DeiT), else from 1 (MMEngine's `Epoch(train) [1][...]`)."""
        if self._first_epoch is None:
            self._first_epoch = 0 if epoch == 0 else 1
        return max(epoch - self._first_epoch, 0)

    # -- blocks of rows (tables, one `key: value` per line) -----------------------------------

    def _block_row(self, text: str, line: int) -> bool:
        """Whether `text` is a row of a block (a table row or one `key: value`): if so, it joins
        the open block (or opens one). A table's border is none: it ends the block. The block's
        record is at its last row (the first may be one the keyword search passed over)."""
        if is_border(text):
            return False
        row = table_row(text)
        if row is not None:
            key, value = row
            if not value:  # a section: `| train/ |   |`
                self._section = key if key.endswith("/") else key + "/"
                self._block.append((self._section, Field(key, "nan")))  # (holds the block open)
            else:
                self._block.append((self._section, Field(key, value, "", "|")))
        elif (pair := bare_pair(text)) is not None:
            self._block.append(("", pair))
        else:
            return False
        self._block_line = line
        return True

    def _close_block(self, out: ParseOutput) -> None:
        rows, self._block, self._section = self._block, [], ""
        reading = _Reading()
        for prefix, item in rows:
            if item.key != prefix.rstrip("/") or item.value != "nan":  # not a section row
                reading.add(self.names, item, prefix)
        reading.finish()
        table = any(item.sep == "|" for _, item in rows)
        self._write(reading, self._block_line, None, out, "table" if table else "`key: value` rows")

    # -- CSV ------------------------------------------------------------------------------------

    def _csv(self, cells: list[str], line: int, ts: float | None, out: ParseOutput) -> bool:
        if all(is_name(c) for c in cells):
            self._header = [c.strip("'\"") for c in cells]
            return True
        if not all(is_number(c) for c in cells):
            return False
        reading = _Reading()
        if self._header is not None and len(self._header) == len(cells):
            for key, cell in zip(self._header, cells, strict=True):
                reading.add(self.names, Field(key, cell))
            reading.finish()
            return self._write(reading, line, ts, out, "CSV")
        if not cells[0].isdigit() or len(cells[0]) > _MAX_STEP_DIGITS:
            return False
        reading.count("first column", PROGRESS_RANK, int(cells[0]))
        reading.metrics["nan_count"] = float(sum(not math.isfinite(number(c)) for c in cells[1:]))
        return self._write(reading, line, ts, out, "CSV without a header")

    # -- records -----------------------------------------------------------------------------

    def _write(self, reading: _Reading, line: int, ts: float | None, out: ParseOutput, shape: str) -> bool:
        """Record what a line or block said; a counter without metrics is remembered instead."""
        if reading.step is not None:
            self._counted = True
            if not reading.judged:
                self._pending = reading.step
                return True
            self._pending = None
            step, counter = reading.step, f"step from `{reading.counter}`"
        elif not reading.judged or reading.garbled:
            return False
        elif self._pending is not None:
            step, counter = self._pending, "step from the counter line before"
        elif not self._counted:
            self._ordinal += 1
            step, counter = self._ordinal, "no step printed: records counted"
        else:
            return False  # a summary line of a log that counts its steps elsewhere
        out.record(self.name, step, line, ts, reading.metrics, reading.nonfinite)
        self.layout = f"{shape}, {counter}"
        return True


def _shape(items: list[Field]) -> str:
    """How a line writes its pairs: `key: value`, `key=value` or `key value` (the most used)."""
    seps = [item.sep for item in items]
    sep = max(("=", ":", " "), key=seps.count)
    return {"=": "`key=value`", ":": "`key: value`", " ": "`key value`"}[sep]

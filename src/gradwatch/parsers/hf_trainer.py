"""Hugging Face Trainer / Accelerate: the logged dict printed by `ProgressCallback.on_log`.

Line shapes covered:

    {'loss': 2.1048, 'grad_norm': 2.1349170207977295, 'learning_rate': 4.99e-05, 'epoch': 0.0}
    {'loss': '0.91', 'grad_norm': '0.8618', ...}              newer versions quote the values
    {'loss': 0.0, 'grad_norm': nan, ...}                      bare nan / inf
    {‘loss’: 2.1, ...}                                        pasted with typographic quotes
     19%|███▏  | 380/2724 [01:50<08:31, 6.39s/it]{'loss': ...} glued after a tqdm bar
    {'eval_loss': 2.3, 'eval_runtime': 10.1, 'epoch': 0.5}    evaluation: a `val_loss` record
    {'train_runtime': 601.2, ..., 'train_loss': 2.7}           final summary: skipped
      Continuing training from global step 1200                resume (INFO verbosity only)

The dict is read with a regex over `'key': value` pairs, never with eval(). Its step is the
optimizer step where the log tells it (`hf_steps`):

- a tqdm bar printed earlier on the same physical line (the `\\r`-separated updates before the
  dict, or a bar glued in front of it): the Trainer updates the bar to `global_step` before it logs;
- a `global_step` or `step` key in the dict;
- DeepSpeed's `step=N, skipped=K` counter since the previous dict, if newer than it: the latest
  that `DeepSpeedParser` wrote (`out.skip_counts`; in bulk, the block's own, found as it reads
  them). Counter lines are not this parser's keyword: the stream reads them a block at once
  (`DeepSpeedParser.aux_lines`), and writes them before each line it reads one by one, in line
  order, as the plain path does (a log that prints one every step spent 40% of its time reading
  them one by one for this parser);
- else the previous dict's step plus the steps between the last two dicts told theirs (1 until
  then: the dict's ordinal). `layout` says which the file's steps are.

A bar on an earlier line is not used: in excerpts and line-buffered captures it is a stale
snapshot (a capture may print `18/97` after the dict of step 16 and before the one of 32, or each
dict's own count after it, which is the previous dict's count before the next one).

Eval dicts take the step of the latest training dict. After `Continuing training from global step
N`, a count already past N (logging every step, the run had logged steps after its checkpoint
before it died) goes back to N: those steps are replayed. With `logging_steps` > 1 the count is
under N and stays.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from itertools import chain, islice

import numpy as np

from gradwatch.events import EventKind, SkipCountBuilder
from gradwatch.parsers._arrow import arrow, numpy_of
from gradwatch.parsers._bytes import line_starts
from gradwatch.parsers._text import is_nonfinite, number
from gradwatch.parsers.base import Block, BulkTrack, Hits, ParseOutput, Parser, TableHits, number_table
from gradwatch.parsers.hf_rows import Layout, find, lines_holding
from gradwatch.parsers.hf_steps import COUNTER, Count, counted_steps, counters_in
from gradwatch.parsers.keywords import line_array

_Q = "'\u2018\u2019\""
# 'key': value; value = quoted string | bare token, maybe wrapped: tensor(...), np.float64(...)
_PAIR = re.compile(rf"[{_Q}]([^{_Q}]+)[{_Q}]\s*:\s*(?:[\w.]*\()?\s*([{_Q}][^{_Q}]*[{_Q}]|[^,}})\s]+)")
_BAR = re.compile(r"\|\s*(\d{1,18})/(\d+)\s*\[")
_LOSSES = frozenset(("loss", "val_loss", "grad_norm"))
_CONTINUING = re.compile(r"Continuing training from global step (\d{1,18})\b")
#: keys of a dict that tell its step
_STEP_KEYS = ("global_step", "step")
#: `layout` of a file whose dicts' steps the log told (one at least), or did not
_TOLD = "optimizer steps"
_ORDINAL = "steps: dict ordinals"

_KEYS: dict[str, str] = {
    "loss": "loss",
    "grad_norm": "grad_norm",
    "learning_rate": "lr",
    "eval_loss": "val_loss",
}
# Bulk path: a value as Python prints a float or int that float() and numpy read alike and that
# stays finite, which RE2 reads as `re` does with re.ASCII (`hf_rows` runs it on whole blocks).
_NUMBER = r"-?\d{1,17}(?:\.\d+)?(?:e[+-]?\d{1,2})?"
# Segments: the count of the tqdm bar on the line after a dict, from which a worker guesses how
# many dicts came before (`HfTrainerParser.guess`)
_BAR_AFTER = r"(?=[^\n]*\n *\d{1,3}%\|[^|\n\r]*\| (\d{1,15})/\d)"
_PLAIN_KEY = re.compile(r"[\w./-]+\Z", re.ASCII)
_EVAL = "{'eval_loss': "
#: what every resume line begins with: the count may change there
_RESUME = "Continuing training from"


@dataclass(frozen=True)
class _Template:
    """One training dict shape: its keys in order and regexes for it.

    The regexes for blocks are made when first asked, under names of their own: a scan state
    pickled by an earlier gradwatch holds its templates with what they were then, which does
    not shadow them (its `block` regex also read the bar after a dict, as group 1).
    """

    keys: tuple[str, ...]
    #: a dict of this shape, its values as groups named as in `names`
    line: re.Pattern[str]
    names: tuple[str, ...]

    @cached_property
    def dict_lines(self) -> re.Pattern[str]:
        """The dicts of this shape alone on their lines, in a block."""
        return re.compile(rf"^{self.line.pattern}[ \t\r]*$", re.M | re.ASCII)

    @cached_property
    def with_bar(self) -> re.Pattern[str]:
        """`dict_lines` for a dict with a tqdm bar on the next line, its count group 1."""
        return re.compile(f"^{_BAR_AFTER}{self.dict_lines.pattern[1:]}", re.M | re.ASCII)

    @cached_property
    def dict_layout(self) -> Layout:
        """What `dict_lines` matches as RE2 reads it (`hf_rows`)."""
        return Layout(f"{{'{self.keys[0]}': ".encode(), self.dict_lines.pattern)


def _body(keys: tuple[str, ...]) -> str:
    """The regex of a training dict with these keys: a group named for each value read (the loss
    a number, the others a number or None); the other keys' values a number or None."""
    pieces = []
    for key in keys:
        name = _KEYS.get(key)
        value = _NUMBER if name == "loss" else f"{_NUMBER}|None"
        pieces.append(f"'{re.escape(key)}': " + (f"(?P<{name}>{value})" if name else f"(?:{value})"))
    return r"\{" + ", ".join(pieces) + r"\}"


def _compile_template(pairs: list[tuple[str, str]], text: str) -> _Template | None:
    """The template of a training dict with these `pairs`, if `text` (the dict) is of plain form:
    distinct simple keys, numbers and None, a number for the loss, no evaluation loss."""
    keys = tuple(k for k, _ in pairs)
    if len(set(keys)) != len(keys) or not all(_PLAIN_KEY.match(k) for k in keys) or "eval_loss" in keys:
        return None
    if any(k in keys for k in _STEP_KEYS):
        return None  # its step is read one by one
    body = _body(keys)
    line = re.compile(body, re.ASCII)
    if "loss" not in keys or not line.fullmatch(text):
        return None
    return _Template(keys, line, tuple(_KEYS[k] for k in keys if k in _KEYS))


def _pairs(text: str) -> list[tuple[str, str]]:
    """The `'key': value` pairs of the dict `text` begins with; in a cut line (no `}`) all but
    the last, whose value may be cut too (`4.99e-0` for `4.99e-05`)."""
    end = text.find("}")
    return _PAIR.findall(text[: end + 1]) if end >= 0 else _PAIR.findall(text)[:-1]


def _metrics(pairs: list[tuple[str, str]]) -> dict[str, float]:
    """A dict's values that are metrics: the first of each name that reads as a number."""
    metrics: dict[str, float] = {}
    for key, value in pairs:
        name = _KEYS.get(key)
        if name is None or name in metrics:
            continue
        try:
            metrics[name] = number(value)
        except ValueError:
            continue
    return metrics


def _told_step(pairs: list[tuple[str, str]]) -> int | None:
    """The step a dict's `global_step` or `step` key tells, if it holds a whole number."""
    for key, value in pairs:
        if key in _STEP_KEYS:
            try:
                step = number(value)
            except ValueError:
                continue
            if step.is_integer() and 0 <= step < 2**63:
                return int(step)
    return None


def _is_eval(metrics: dict[str, float]) -> bool:
    """An evaluation record: it takes the latest training dict's step (one whose `eval_loss` is
    no number is counted as a training dict, if it has another loss)."""
    return "val_loss" in metrics and "loss" not in metrics


def _safe_eval(text: str, start: int, end: int) -> bool:
    """An evaluation dict alone on its line, as `_dict` reads it: it takes the step of the latest
    training dict and changes nothing, so bulk dicts may go on after it."""
    line = text[start:end]
    return line.startswith(_EVAL) and "\r" not in line and _is_eval(_metrics(_pairs(line)))


class HfTrainerParser(Parser):
    name = "hf_trainer"
    scan = rf"\{{|{_RESUME}"
    description = "Hugging Face Trainer `{'loss': ..., 'grad_norm': ..., 'learning_rate': ...}` dicts"
    #: the dict count and the global step at the latest resume (none: the run's start), which a
    #: guess counts on from (`guess`); a class default, for parsers pickled in older scan states
    _resumed_at: tuple[int, int] = (0, 0)
    #: the rest of the count after the latest training dict (`hf_steps.Count`, whose step is
    #: `_step`), and the line of that dict or of a resume after it, which a counter must be after
    #: (None: the bulk dict the stream passed last, whose line is `out.last_record_line` at the
    #: next call); class defaults for older pickles
    _stride = 1
    _told = False
    _dict_line: int | None = 0
    #: DeepSpeed's counters (`out.skip_counts`, as of the latest call that was given `out`): where
    #: `bulk_matches` looks for the latest before a block
    _counters: SkipCountBuilder | None = None
    #: the state after each hit of the latest `bulk_matches` (positions, strides, told) and the hit
    #: whose state `bulk_passed` set last
    _bulk_state: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    _passed: tuple[object, int] | None = None

    def __init__(self) -> None:
        self._step = 0  # step of the latest training dict (0 before the first: the next one is 1)
        self._bar: tuple[int, int] | None = None  # (physical line, count) of the latest tqdm bar
        self._template: _Template | None = None
        self._bulk_template: _Template | None = None  # of the pending matches (a record may change it)
        self._bulk = BulkTrack()
        # out.last_step is not this parser's step: after a resume line, or an evaluation dict that
        # took a bar's count. Until the next training dict nothing is synced or read in bulk.
        self._desync = False

    def parse(self, text: str, line: int, ts: float | None, out: ParseOutput) -> bool:
        self._bulk.seen(line)
        self._see(out)
        if self._bulk.locked and not self._desync and out.last_step is not None:
            self._step = out.last_step  # bulk dicts before this line are only known by the stream's step
        took = self._parse(text, line, ts, out)
        self._bulk.count(self.name, out)
        if self._bulk.locked:
            self._sync(out.last_step != self._step)
        return took

    def _sync(self, desync: bool) -> None:
        """Note whether `out.last_step` is this parser's step; once it is again, bulk may resume."""
        if self._desync and not desync:
            self._bulk.changed()
        self._desync = desync

    def _parse(self, text: str, line: int, ts: float | None, out: ParseOutput) -> bool:
        start = -1
        if "{" in text:
            start = text.find("{'")
            if start < 0:
                start = text.find("{\u2018")
        if start < 0:
            if "%|" in text:
                self._see_bar(text, line)  # a `\r` piece before a dict on the same physical line
                return False  # a bar is nobody's record; others may still read the line
            if _RESUME in text:
                return self._resume(text, line, ts, out)
            return False
        if start > 0 and "%|" in text[:start]:
            self._see_bar(text[:start], line)
        return self._dict(text[start:], line, ts, out)

    def _see_bar(self, text: str, line: int) -> None:
        counts = _BAR.findall(text)
        if counts:  # the last bar of a glued run is the newest
            self._bar = (line, int(counts[-1][0]))

    def _dict(self, text: str, line: int, ts: float | None, out: ParseOutput) -> bool:
        end = text.find("}")
        pairs = _pairs(text)
        if not pairs:
            return False
        keys = {k for k, _ in pairs}
        if "train_runtime" in keys:
            return True  # the final summary: averages over the run, not a step
        metrics = _metrics(pairs)
        if not metrics.keys() & _LOSSES:
            # not a training/eval log (e.g. a config dict with an `lr`); a Trainer dict with
            # only custom keys still has `epoch` and is consumed
            return "epoch" in keys
        is_eval = _is_eval(metrics)
        told = _told_step(pairs)
        if told is None and self._bar is not None and self._bar[0] == line:
            told = self._bar[1]
        if is_eval:
            step = self._step if told is None else told
        else:
            count = self._count()
            self._set(count.after(self._counter()) if told is None else count.at(told), line)
            step = self._step
            self._learn(pairs, text[: end + 1])
            self._bulk.passed()
        nonfinite = [k for k, v in metrics.items() if is_nonfinite(v)]
        out.record(self.name, step, line, ts, metrics, nonfinite)
        if "val_loss" in metrics:
            out.event(EventKind.VALIDATION, line, step, ts, val_loss=metrics["val_loss"])
        return True

    def _count(self) -> Count:
        return Count(self._step, self._stride, self._told)

    def _see(self, out: ParseOutput) -> None:
        """A call given `out`: its counters are those to look at; a bulk dict passed is at its line."""
        self._counters = out.skip_counts
        if self._dict_line is None:
            self._dict_line = out.last_record_line

    def _counter(self) -> int | None:
        """DeepSpeed's latest counter, if it came after the latest training dict (and resume)."""
        latest = self._counters.latest if self._counters is not None else None
        if latest is None or self._dict_line is None or latest[0] <= self._dict_line:
            return None
        return latest[1]

    def _set(self, count: Count, line: int | None) -> None:
        """The count after a training dict at `line` (None: see `_dict_line`): DeepSpeed's counters
        before it are used up."""
        self._step, self._stride, self._told, self._dict_line = count.step, count.stride, count.told, line
        if count.told:
            self.layout = _TOLD
        elif self.layout is None:
            self.layout = _ORDINAL

    def _resume(self, text: str, line: int, ts: float | None, out: ParseOutput) -> bool:
        m = _CONTINUING.search(text)
        if m:
            step = int(m.group(1))
            self._dict_line, self._told = line, False  # the dead run's counters; no stride across the gap
            if self._step > step:
                self._step = step  # the dicts logged after step N are replayed: count on from N
            self._resumed_at = (self._step, step)
            out.event(EventKind.CHECKPOINT_LOAD, line, step, ts, iteration=step)
            return True
        # `Continuing training from checkpoint, will skip to saved global_step` / `from epoch N`
        return "Continuing training from checkpoint" in text or "Continuing training from epoch" in text

    def _learn(self, pairs: list[tuple[str, str]], text: str) -> None:
        """A training dict of another shape than the template's makes a new template (if it can)."""
        if self._template is not None and tuple(k for k, _ in pairs) == self._template.keys:
            return
        template = _compile_template(pairs, text)
        if template is not None:
            self._template = template
            self._bulk.changed()

    def carried(self, out: ParseOutput) -> tuple[object, ...] | None:
        """Once the file is locked to this parser, its count of training dicts and whether the
        stream's step is that count: all a dict takes from the lines before it but for a tqdm bar
        or a resume line, which a segment's warm-up reads. (Before, the file is not split.)"""
        if not self._bulk.locked:
            return None
        self._see(out)
        return (self._step, self._stride, self._told, self._counter(), self._desync, out.last_step)

    def hint(self) -> object | None:
        return self._resumed_at if self._resumed_at != (0, 0) else None

    def take_hint(self, hint: object) -> None:
        if isinstance(hint, tuple) and len(hint) == 2:
            self._resumed_at = (int(hint[0]), int(hint[1]))

    def guess(self, text: str, out: ParseOutput) -> None:
        """The count is that of a sequential read if the dicts before `text` were counted as the
        bars count steps: the first two dicts of the template's shape with a bar on the next
        line tell how many steps a dict stands for (`logging_steps`), and the first bar's count
        divided by it is that dict's number, counted on from the latest resume this parser saw
        or was told of (`take_hint`): after one, the bars count from its global step, and the
        dicts from the count then."""
        self._see(out)
        template = self._template
        if template is None or not self._bulk.locked:
            return
        counts = [int(m.group(1)) for m in islice(template.with_bar.finditer(text), 2)]
        if not counts:
            return
        every = counts[1] - counts[0] if len(counts) == 2 and counts[1] > counts[0] else 1
        count, resumed_step = self._resumed_at
        if counts[0] % every == 0 and counts[0] > resumed_step and not COUNTER.search(text):
            first = count + counts[0] // every - resumed_step // every
        else:  # (DeepSpeed's counters tell the dicts' steps, which the bars count)
            first = counts[0]
        self._step = out.last_step = first - 1
        self._stride, self._told = 1, False  # the lines read next tell them, not counters before
        latest = out.skip_counts.latest
        self._dict_line = max(out.last_record_line, latest[0] if latest else 0)
        self._desync = False

    def can_bulk(self) -> bool:
        return self._bulk.locked and self._template is not None and not self._desync

    def bulk_shape(self) -> object | None:
        return self._bulk.shape if self.can_bulk() else None

    def bulk_matches(self, block: Block) -> TableHits:
        """Dicts of the template's shape alone on their lines, up to the first line that could
        change the count (the bulk path; see LogStream and the module docstring), found by RE2
        (`hf_rows`), each counted on (`hf_steps`) after DeepSpeed's counters before it."""
        template = self._bulk_template = self._template
        if template is None or not self.can_bulk():
            self._bulk.handed(0, retry=False)
            return TableHits.empty(0)
        found = _dicts(template, block)
        at, odd = _counters(block)
        taken = min(self._cut(block, found), int(np.searchsorted(found.at, odd)))
        self._bulk.handed(taken, retry=taken < len(found))
        hits = found.subset(np.arange(taken))
        counters = np.full(taken, -1, dtype=np.int64)
        if len(at[0]):
            latest = np.searchsorted(at[0], hits.at) - 1  # each dict's latest counter before it
            new = latest > np.concatenate([[-1], latest[:-1]])  # since the dict before
            counters[new] = at[1][latest[new]]
        fresh = self._counter()
        if taken and counters[0] < 0 and fresh is not None:
            counters[0] = fresh
        hits.steps, strides, told = counted_steps(self._count(), counters)
        self._bulk_state = (hits.at, strides, told)
        return hits

    def bulk_passed(self, hits: Hits, k: int) -> None:
        """The next line read one by one comes after bulk dict `k`: the count is as after it (once:
        a counter read one by one since is kept)."""
        state = self._bulk_state
        passed = self._passed
        if state is None or (passed is not None and passed[0] is state and passed[1] == k):
            return
        self._passed = (state, k)
        self._take(state, k, hits.step(k), None)  # (its line is the stream's at the next call)

    def _take(self, state: tuple[np.ndarray, np.ndarray, np.ndarray], k: int, step: int, line: int | None) -> None:
        """The count after bulk dict `k` of `bulk_matches`' latest, whose step is `step`, at `line`."""
        _, strides, told = state
        self._set(Count(step, int(strides[k]), bool(told[k])), line)

    def _cut(self, block: Block, found: TableHits) -> int:
        """How many of the dicts `found` come before the first line that must be read one by one
        and may change the count: another dict (not an evaluation alone on its line), a resume."""
        text = block.text
        resume = text.find(_RESUME)
        escaped = block.escaped_lines(lambda piece: _RESUME in piece)
        if len(escaped):  # a resume line that only cleaning shows
            first = int(line_starts(block.newlines, escaped[:1])[0])
            resume = first if resume < 0 else min(resume, first)
        cut = len(found) if resume < 0 else int(np.searchsorted(found.at, resume))
        for start, end in lines_holding(block.codes, block.newlines, ord("{"), found.at):
            if not _safe_eval(text, start, end):
                return min(cut, int(np.searchsorted(found.at, start)))
        return cut

    def bulk_records(self, text: str, hits: Hits, linenos: np.ndarray, out: ParseOutput) -> None:
        """Bulk dicts as one columnar chunk, with the steps they were counted when matched."""
        template = self._bulk_template
        assert template is not None and isinstance(hits, TableHits)
        steps, n = hits.steps, len(hits)
        metrics = {name: hits.values[:, j] for j, name in enumerate(template.names)}
        nonfinite = np.full(n, "", dtype=object)  # no nan or inf in a bulk dict
        out.record_columns(self.name, steps, linenos, np.full(n, np.nan), metrics, nonfinite)
        self._see(out)
        if self._bulk.newest(linenos) and self._bulk_state is not None:
            state = self._bulk_state
            self._take(state, int(np.searchsorted(state[0], hits.at[-1])), int(steps[-1]), int(linenos[-1]))
        elif n and self.layout is None:
            self.layout = _ORDINAL  # (the count it holds says so already, but for the first dicts)
        self._bulk.count(self.name, out)


def _counters(block: Block) -> tuple[tuple[np.ndarray, np.ndarray], int]:
    """DeepSpeed's counters in a block, as its parser reads them one by one (the first of each
    line) and the stream writes them before a dict: (where each begins, its count); and where the
    first line begins whose counter only the per-line path reads as it should (`_ODD_COUNTER_LINE`),
    or the block's length."""
    text = block.text
    none = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)), len(text)
    if "step=" not in text:
        return none
    found = counters_in(text)
    if not found:
        return none
    at = np.array([a for a, _ in found], dtype=np.int64)
    lines = np.searchsorted(block.newlines, at)
    first = np.diff(lines, prepend=-1) > 0
    at, lines = at[first], lines[first]
    counts = np.array([-1 if c is None else c for (_, c), keep in zip(found, first.tolist(), strict=True) if keep])
    _, pc = arrow()
    odd = numpy_of(pc.match_substring_regex(line_array(block.codes, block.newlines, lines), _ODD_COUNTER_LINE))
    odd |= counts < 0
    first_odd = int(line_starts(block.newlines, lines[odd][:1])[0]) if odd.any() else len(text)
    return (at, counts.astype(np.int64)), first_odd


#: a counter's line that DeepSpeed's parser may not read as a counter alone: another parser may
#: take it first, its overflow branch reads it, or cleaning changes it (RE2, one search a block)
_ODD_COUNTER_LINE = r"[{\r\x1b]|verflow|loss scale"


def _dicts(template: _Template, block: Block) -> TableHits:
    """The block's lines that `template.dict_lines` matches, with their groups as numbers (those of
    `template.names`; no steps): found by RE2 (`hf_rows`); the regex reads those RE2 does not."""
    text = block.text
    rows = find(template.dict_layout, block.codes, block.newlines)
    hits = TableHits(rows.line_starts, rows.line_starts, np.zeros(len(rows.line_starts), dtype=np.int64), rows.values)
    odd = [m for start in rows.odd if (m := template.dict_lines.match(text, start)) is not None]
    if not odd:
        return hits
    table = number_table(list(chain.from_iterable(m.groups() for m in odd)), len(odd), nan="None")
    at = np.array([m.start() for m in odd], dtype=np.int64)
    return hits.merged(TableHits(at, at, np.zeros(len(odd), dtype=np.int64), table))

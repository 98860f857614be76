"""Megatron-LM and Megatron-DeepSpeed: the `iteration N/M | key: value | ...` lines in all forms.

Covers the 2020 form without colons (`lm loss NAN`), the 2021-23 form, the current timestamped
form with throughput, the argonne fork's `key=value` form, tr11's seconds instead of milliseconds,
`lm-loss`, and records hard-wrapped over several physical lines. Validation blocks, checkpoint
load/save, "will start from random" and the padded vocab size become events.

The same iteration printed by several ranks, one copy after the other, is one record.

A record that has a loss scale or grad norm but no loss field is a NaN step: Megatron omits the
loss when it is not finite (tr8-104B iteration 9027). During fp16 start-up calibration the loss is
omitted too, but those records report skipped iterations, so they are not flagged.
"""

from __future__ import annotations

import bisect
import contextlib
import re
import typing
from dataclasses import dataclass

import numpy as np

from gradwatch.events import EventKind
from gradwatch.parsers._bytes import shaped_like
from gradwatch.parsers._text import clean, digit_numbers, norm_key, number, timestamp, timestamps
from gradwatch.parsers.base import MAX_STEP, Block, Hits, ParseOutput, Parser, TableHits
from gradwatch.parsers.megatron_rows import Layout, find

# normalised field name -> (canonical metric, scale factor)
_FIELDS: dict[str, tuple[str, float]] = {
    "consumedsamples": ("samples", 1.0),
    "consumedtokens": ("tokens", 1.0),
    "elapsedtimeperiteration(ms)": ("step_time_s", 1e-3),
    "elapsedtimeperiterationms": ("step_time_s", 1e-3),
    "elapsedtimeperiteration(s)": ("step_time_s", 1.0),
    "elapsedtimeperiterations": ("step_time_s", 1.0),
    "learningrate": ("lr", 1.0),
    "lmloss": ("loss", 1.0),
    "loss": ("loss", 1.0),
    "zloss": ("z_loss", 1.0),
    "lossscale": ("loss_scale", 1.0),
    "gradnorm": ("grad_norm", 1.0),
    "numberofskippediterations": ("skipped", 1.0),
    "numberofnaniterations": ("nan_count", 1.0),
    "tflops": ("tflops", 1.0),
    "throughputpergpu(tflop/s/gpu)": ("tflops", 1.0),
    "tokenspergpupersecond(tgs)": ("tps", 1.0),
    "tokenspergpupersecondtgs": ("tps", 1.0),
    "[lm]tflops": ("tflops", 1.0),
}
# 2020 form without colons: `learning rate 9.773E-06 | lm loss NAN | loss scale 4.0`
_NO_COLON = re.compile(r"^(.*?[a-z)\]])\s+(\S+)$")
_ITERATION = re.compile(r"\biteration[=:]?\s*(\d+)\s*/\s*(\d+)")
_VALIDATION = re.compile(r"\b(?:validation|valid) loss at iteration\s+(\d+)\s*\|(.*)")
_LOADED = re.compile(r"(?:successfully loaded|loading)(?: distributed)? checkpoint from .*? at iteration\s+(\d+)")
_SAVED = re.compile(r"saving checkpoint at iteration\s+(\d+)")
_VOCAB = re.compile(r"padded vocab \(size: (\d+)\).*?new size: (\d+)")
_LOSS_VALUE = re.compile(r"lm loss value[:=]\s*(\S+)")
_MAX_WRAPPED_LINES = 3
#: records remembered for the rank dedupe of bulk records (`_remember`) at most: a bound on
#: memory only, far above the records read one by one in a block between bulk ones
_RECENT_RECORDS = 1 << 14
_UNSEEN = object()
_INF, _NEG_INF = float("inf"), float("-inf")


def _is_complete(text: str) -> bool:
    """A Megatron record ends with `|` (or `| ` before the newline was stripped)."""
    return text.rstrip().endswith("|")


class MegatronParser(Parser):
    name = "megatron"
    segment_safe = True
    scan = r"iteration|checkpoint|padded vocab"
    description = "Megatron-LM and Megatron-DeepSpeed `iteration N/M | ...` lines (all forks and eras)"

    # class defaults, so that parsers pickled in a scan state before they existed still load
    #: the shape the bulk reader looks for (`_seek`), and that of the record read one by one before
    _sought: _Template | None = None
    _previous_shape: _Template | None = None
    #: whether a record was read in bulk since the last one read one by one
    _bulk_between = False
    #: of the block's bulk hits, the first whose record keeps its loss (`_losses_kept`)
    _first_loss: int | None = None

    def __init__(self) -> None:
        self._pending: tuple[str, int, float | None] | None = None
        self._pending_parts = 0
        self._seen_loss = False
        self._key_cache: dict[str, object] = {}  # raw field name -> _FIELDS entry (or None)
        self._template: _Template | None = None  # the shape of the latest record read one by one
        self._bulk_template: _Template | None = None
        self._last_record_step: int | None = None
        # (line, step) of the records since the last one before the block read in bulk, in line
        # order, for the rank dedupe of bulk records, which the stream may hand over only after
        # later records were read line by line (however many: see `bulk_matches`)
        self._recent: list[tuple[int, int]] = []
        self.total_steps: int | None = None

    @property
    def collecting(self) -> bool:
        return self._pending is not None

    def parse(self, text: str, line: int, ts: float | None, out: ParseOutput) -> bool:
        if self._pending is not None:
            if self._continues(text):
                head, first_line, first_ts = self._pending
                joined = head + text
                self._pending_parts += 1
                if _is_complete(joined) or self._pending_parts >= _MAX_WRAPPED_LINES:
                    self._pending = None
                    self._record(joined, first_line, first_ts, out)
                else:
                    self._pending = (joined, first_line, first_ts)
                return True
            self._emit_pending(out)
        if "iteration" not in text:
            return self._other(text, line, ts, out)
        m = _ITERATION.search(text)
        if m is None or "|" not in text:
            return self._other(text, line, ts, out)
        if not _is_complete(text) and "number of nan" not in text and "nan_iterations" not in text:
            self._pending, self._pending_parts = (text, line, ts), 1
            return True
        self._record(text, line, ts, out)
        return True

    @staticmethod
    def _continues(text: str) -> bool:
        """A hard-wrapped continuation: more `|`-separated fields, not a new kind of line."""
        stripped = text.lstrip()
        return "|" in text and not stripped.startswith(("[", "(", "time (ms)")) and not _ITERATION.match(stripped)

    def flush(self, out: ParseOutput) -> None:
        """End of input. A record still open here was cut mid-line (records end with `|`): its last,
        unterminated field may hold a shortened number (`9.54` of `9.541234E-01`), so it is dropped."""
        if self._pending is not None:
            text, line, ts = self._pending
            self._pending = (text[: text.rfind("|") + 1], line, ts)
            self._emit_pending(out)

    def _emit_pending(self, out: ParseOutput) -> None:
        if self._pending is not None:
            text, line, ts = self._pending
            self._pending = None
            self._record(text, line, ts, out)

    def _record(self, text: str, line: int, ts: float | None, out: ParseOutput) -> None:
        m = _ITERATION.search(text)
        assert m is not None
        step = int(m.group(1))
        self.total_steps = int(m.group(2))
        if step == self._last_record_step:
            return  # the same iteration printed again by another rank
        self._last_record_step = step
        self._remember(line, step)
        body = text[m.end() :]
        template = self._template
        found = template.line.match(body) if template is not None else None
        if found is None:
            metrics, nonfinite = self._fields(body)
            self._template = _compile_template(text, m)
        else:
            metrics, nonfinite = {}, []
            for spec, value in zip(template.specs, found.groups(), strict=False):  # type: ignore[union-attr]
                _put(metrics, nonfinite, spec, value)
        if metrics.get("loss_scale") == -1.0:  # 2021 pipeline runs print -1.0 as "not computed"
            del metrics["loss_scale"]
        if metrics.get("loss") == 0.0 and metrics.get("skipped"):
            del metrics["loss"]  # every iteration of the interval was skipped: the mean of nothing
        if "loss" in metrics:
            self._seen_loss = True
        elif (
            ("loss_scale" in metrics or "grad_norm" in metrics)
            and not metrics.get("skipped")
            and (self._seen_loss or metrics.get("nan_count"))
        ):
            nonfinite.append("loss")  # Megatron omits the loss field when the loss is NaN
        out.record(self.name, step, line, ts, metrics, nonfinite)
        self._seek()

    def _seek(self) -> None:
        """After a record read one by one: whether the bulk reader now looks for its shape.

        It does where it could not read in bulk yet, or where the record before was of this
        shape too, none read in bulk between them: the run's shape has changed. A record of
        another shape among the run's usual ones (an iteration skipped by fp16, printed without
        its grad norm) is read one by one, as it is anyway. Sought, it cost two rescans of the
        block's rest, there and back at the next record; past the limit of rescans the rest of
        the block was read one by one (a sixth of a Megatron-LM log's records).
        """
        shape = self._template
        if not _reads_in_bulk(self._sought) or (shape is self._previous_shape and not self._bulk_between):
            self._sought = shape
        self._previous_shape, self._bulk_between = shape, False

    def can_bulk(self) -> bool:
        return self._pending is None and _reads_in_bulk(self._sought)

    def bulk_shape(self) -> object | None:
        return self._sought if self.can_bulk() else None

    def bulk_matches(self, block: Block) -> TableHits:
        """Record lines of `block` of the shape sought (`_seek`; the bulk path, see LogStream).

        Lines are found by their layout at numpy speed (`megatron_rows`); the regex reads those
        that the layout does not fit.
        """
        del self._recent[:-1]  # the block's hits are told apart from the last record before it on
        t = self._sought
        width = len(t.specs) if t is not None else 0
        if t is None or not self.can_bulk():
            return TableHits.empty(2 + width)
        self._bulk_template = t  # per-line records of the same block may change what is sought
        text = block.text
        if t.layout is None:
            return _of_matches(text, list(t.block.finditer(text)), width)
        rows = find(t.layout, block.codes, block.newlines, "\r" in text or "\x1b" in text)
        found = TableHits(rows.at, rows.line_starts, rows.values[:, 0].astype(np.int64), rows.values)
        odd = [m for start, end in rows.odd if (m := t.block.search(text, start, end)) is not None]
        hits = found.merged(_of_matches(text, odd, width)) if odd else found
        kept = _losses_kept(t, hits.values)
        self._first_loss = int(np.argmax(kept)) if kept.any() else None
        return hits

    def bulk_passed(self, hits: Hits, k: int) -> None:
        self._last_record_step = hits.step(k)
        self._bulk_between = True
        if self._first_loss is not None and k >= self._first_loss:
            self._seen_loss = True  # as the record's line, read one by one, would have set it

    def bulk_records(self, text: str, hits: Hits, linenos: np.ndarray, out: ParseOutput) -> None:
        """Turn bulk hits into one columnar chunk of records."""
        t = self._bulk_template
        assert t is not None and isinstance(hits, TableHits)
        steps = hits.steps
        total = hits.values[-1, 1]
        self.total_steps = int(total) if total < 2.0**53 else None  # NaN, inf and inexact ones: not known
        metrics: dict[str, np.ndarray] = {}
        flagged: dict[str, np.ndarray] = {}
        for j, (name, scale) in enumerate(t.specs):
            values = hits.values[:, 2 + j] * scale
            metrics[name] = values
            flagged[name] = ~np.isfinite(values)
        if "loss_scale" in metrics:
            metrics["loss_scale"][metrics["loss_scale"] == -1.0] = np.nan
        kept = _losses_kept(t, hits.values)
        metrics["loss"][~kept] = np.nan
        n = len(hits)
        nonfinite = np.full(n, "", dtype=object)
        any_bad = np.zeros(n, dtype=bool)
        for mask in flagged.values():
            any_bad |= mask
        for row in np.flatnonzero(any_bad).tolist():
            nonfinite[row] = ",".join(name for name, mask in flagged.items() if mask[row])
        ts = np.full(n, np.nan)
        # room for a date and time (17 characters at least) before `iteration`: the line's time,
        # read from the whole line as the per-line path does (its length counts); Megatron-LM's
        # ` [date] ` all at once
        dated = np.flatnonzero(hits.at - hits.line_starts >= 17)
        times, read = _bracketed_times(text, hits.line_starts[dated])
        ts[dated[read]] = times[read]
        for row in dated[~read].tolist():
            start = int(hits.line_starts[row])
            stamp = timestamp(clean(text[start : text.find("\n", start)]))
            if stamp is not None:
                ts[row] = stamp
        if kept.any():
            self._seen_loss = True
        # the same iteration printed again by another rank, right after the first copy
        fresh = steps != self._previous_steps(linenos, steps)
        self._remember(int(linenos[-1]), int(steps[-1]))
        self._last_record_step = self._recent[-1][1]
        if not fresh.all():
            steps, ts, nonfinite = steps[fresh], ts[fresh], nonfinite[fresh]
            metrics = {name: values[fresh] for name, values in metrics.items()}
            linenos = linenos[fresh]
        if len(steps):
            out.record_columns(self.name, steps, linenos, ts, metrics, nonfinite)

    def _previous_steps(self, lines: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """The step of the record before each of these bulk records (-2: none known)."""
        # line -1 / step -2 first: "no record before" is an entry like the others
        known_lines = np.array([-1, *(line for line, _ in self._recent)], dtype=np.int64)
        known_steps = np.array([-2, *(step for _, step in self._recent)], dtype=np.int64)
        k = np.searchsorted(known_lines, lines) - 1  # the last known record before each line
        known_line, known_step = known_lines[k], known_steps[k]
        bulk_line = np.concatenate([[-1], lines[:-1]])
        bulk_step = np.concatenate([[-2], steps[:-1]])
        return np.where(known_line > bulk_line, known_step, bulk_step)

    def _remember(self, line: int, step: int) -> None:
        recent = self._recent
        bisect.insort(recent, (line, step if 0 <= step <= MAX_STEP else -1))  # garbage is no step
        if len(recent) > _RECENT_RECORDS:
            del recent[: _RECENT_RECORDS // 2]

    def _fields(self, body: str) -> tuple[dict[str, float], list[str]]:
        """Every known `key: value` field of a record body, whatever its order and form."""
        metrics: dict[str, float] = {}
        nonfinite: list[str] = []
        cache = self._key_cache
        for field in body.split("|"):
            i = field.rfind(":")
            if i < 0:
                i = field.rfind("=")
            if i < 0:
                key, value = self._split_field(field)  # 2020 form: `lm loss NAN`
                if key is None:
                    continue
            else:
                key, value = field[:i], field[i + 1 :]
            spec = cache.get(key, _UNSEEN)
            if spec is _UNSEEN:
                spec = _FIELDS.get(norm_key(key.strip()))
                if len(cache) > 4096:
                    cache.clear()
                cache[key] = spec
            if spec is not None:
                _put(metrics, nonfinite, typing.cast(tuple[str, float], spec), value)
        return metrics, nonfinite

    @staticmethod
    def _split_field(field: str) -> tuple[str | None, str]:
        field = field.strip()
        if not field:
            return None, ""
        for sep in (":", "="):
            i = field.rfind(sep)
            if i > 0:
                return field[:i], field[i + 1 :]
        m = _NO_COLON.match(field)
        if m:
            return m.group(1), m.group(2)
        return None, ""

    def _other(self, text: str, line: int, ts: float | None, out: ParseOutput) -> bool:
        """The rare Megatron lines that are events, not records."""
        if "loss at iteration" in text:
            m = _VALIDATION.search(text)
            if m:
                step = int(m.group(1))
                lv = _LOSS_VALUE.search(m.group(2))
                metrics: dict[str, float] = {}
                if lv:
                    with contextlib.suppress(ValueError):
                        metrics["val_loss"] = number(lv.group(1).rstrip("|"))
                out.record(self.name, step, line, ts, metrics)
                out.event(EventKind.VALIDATION, line, step, ts, **metrics)
                return True
        if "checkpoint" in text:
            m = _LOADED.search(text)
            if m:
                step = int(m.group(1))
                out.event(EventKind.CHECKPOINT_LOAD, line, step, ts, iteration=step)
                return True
            m = _SAVED.search(text)
            if m:
                out.event(EventKind.CHECKPOINT_SAVE, line, int(m.group(1)), ts)
                return True
            if "will not load any checkpoints and will start from random" in text:
                out.event(EventKind.START_FROM_RANDOM, line, None, ts)
                return True
        if "padded vocab" in text:
            m = _VOCAB.search(text)
            if m:
                out.event(EventKind.VOCAB, line, None, ts, size=int(m.group(1)), padded=int(m.group(2)))
                return True
        return False


@dataclass(frozen=True)
class _Template:
    """Regexes for one exact sequence of record fields, and what each group holds.

    A run prints the same fields in the same order on every record, so after the first record a
    single regex match reads all values; a record of another shape (a NaN step without its loss
    field, a cut line) misses the template and takes the general path. `block` finds whole
    records of this shape inside a block of lines at C speed, and `layout` at numpy speed (the
    bulk path).
    """

    line: re.Pattern[str]
    block: re.Pattern[str]
    specs: tuple[tuple[str, float], ...]
    layout: Layout | None


#: The most fields a record line of a template may have: real ones have 10 to 30.
_MAX_TEMPLATE_FIELDS = 200


def _compile_template(text: str, iteration: re.Match[str]) -> _Template | None:
    """The template of the record `text` whose `iteration N/M` is `iteration`."""
    line_pieces: list[str] = []
    block_pieces: list[str] = []
    specs: list[tuple[str, float]] = []
    wanted: list[int] = []  # the fields after the first pipe that are read
    parts = text[iteration.end() :].split("|")
    if len(parts) > _MAX_TEMPLATE_FIELDS:
        return None  # no trainer's (the regex of thousands of fields would take seconds to compile)
    for index, part in enumerate(parts):
        i, sep = part.rfind(":"), ":"
        if i < 0:
            i, sep = part.rfind("="), "="
        if i < 0:
            if part.strip():
                return None  # the 2020 form without colons: no template
            line_pieces.append(r"\s*")
            block_pieces.append(r"[ \t]*")
            continue
        key = part[:i].strip()
        if not key:
            return None
        # words apart by spaces, which `norm_key` drops, as the per-field reading (`_fields`) does:
        # a key the template takes is one of the same field (`lm  loss`), not another one
        # (`consumed tokens` for `consume\td tokens`, whose tab `norm_key` keeps)
        words = [re.escape(word) for word in key.split(" ") if word]
        spec = _FIELDS.get(norm_key(key))
        value = r"[^|]*" if spec is None else r"([^|]*)"
        line_pieces.append(r"\s*" + r" *".join(words) + r"\s*" + re.escape(sep) + value)
        block_value = r"[^|\n]*" if spec is None else r"([^|\n]*)"
        block_pieces.append(r"[ \t]*" + r" *".join(words) + r"[ \t]*" + re.escape(sep) + block_value)
        if spec is not None:
            specs.append(spec)
            wanted.append(index - 1)
    if not specs:
        return None
    line = re.compile(r"\|".join(line_pieces) + r"$")
    block = re.compile(r"\biteration[=:]?[ \t]*(\d+)[ \t]*/[ \t]*(\d+)" + r"\|".join(block_pieces) + r"[ \t\r]*$", re.M)
    simple = wanted[0] >= 0 and wanted[-1] < len(parts) - 2  # neither before the first pipe nor after the last
    layout = Layout.of(text, iteration.start(), wanted) if simple else None
    return _Template(line, block, tuple(specs), layout)


def _bracketed_times(text: str, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Of the lines of `text` that begin at `starts`, those that begin `[YYYY-MM-DD HH:MM:SS]`
    after one space or none (Megatron-LM's records), and their times as `timestamp` reads them
    from the cleaned line (NaN where it reads none): all at once. Returns (times, which lines).

    No launcher prefix begins so, and an escape sequence after the date leaves it as it is: such
    a line is what `clean` leaves of it, as far as the time goes."""
    if not len(starts):
        return np.zeros(0), np.zeros(0, dtype=bool)
    codes = np.frombuffer(text.encode("latin-1", errors="replace"), dtype=np.uint8)  # a byte a character
    begin = starts + (codes[starts] == ord(" "))
    window = codes[np.minimum(begin[:, None] + np.arange(len(_BRACKETED)), len(codes) - 1)]
    ok = (begin + len(_BRACKETED) <= len(codes)) & shaped_like(window, _BRACKETED)
    fields = np.zeros((len(starts), 7), dtype=np.int64)  # (no fraction of a second: `]` follows)
    fields[:, :6] = digit_numbers(window, _BRACKETED_NUMBERS)
    return timestamps(fields), ok


#: Megatron-LM's time before a record, its digits as zeros: year, month, day, hour, minute, second
_BRACKETED = b"[0000-00-00 00:00:00]"
_BRACKETED_NUMBERS = ((1, 5), (6, 8), (9, 11), (12, 14), (15, 17), (18, 20))


def _losses_kept(template: _Template, values: np.ndarray) -> np.ndarray:
    """Per bulk hit (its row of `values`), whether its record keeps its loss, as `_record` has it:
    not the 0.0 of an interval whose iterations were all skipped."""
    names = [name for name, _ in template.specs]
    if "skipped" not in names:
        return np.ones(len(values), dtype=bool)
    loss, skipped = values[:, 2 + names.index("loss")], values[:, 2 + names.index("skipped")]
    return ~((loss == 0.0) & (skipped > 0))


def _reads_in_bulk(template: _Template | None) -> bool:
    """Only a template with a loss field is read in bulk: a record without one may be a NaN step,
    which needs the per-line rules."""
    return template is not None and any(name == "loss" for name, _ in template.specs)


def _of_matches(text: str, matches: list[re.Match[str]], width: int) -> TableHits:
    """Record lines the template regex found (the lines the layout does not fit), numbers
    converted column by column: step, total, then the template's `width` fields.

    A line with a value that is no number (empty, two words) is left out: the per-line path
    reads it, which takes the field as not printed (a NaN step, if it was the loss).
    """
    if not matches:
        return TableHits.empty(2 + width)
    table = np.array([m.groups() for m in matches], dtype=str)
    numbers = np.empty((len(matches), 2 + width))
    # a step of 19+ digits is garbage, not a step (and beyond int64): no step, as per line
    steps = np.where(np.char.str_len(table[:, 0]) > 18, "-1", table[:, 0]).astype(np.int64)
    numbers[:, 0] = steps
    numbers[:, 1] = np.where(np.char.str_len(table[:, 1]) < 19, table[:, 1], "nan").astype(np.float64)
    # the text before `iteration` as the layout search checks it (`megatron_rows`); no NUL,
    # which numpy's strings drop at their ends
    readable = np.array([_plain_prefix(text, m) and "\0" not in m.group() for m in matches], dtype=bool)
    for j in range(width):
        numbers[:, 2 + j], unreadable = _to_floats(table[:, 2 + j])
        readable &= ~unreadable
    if not readable.all():
        keep = np.flatnonzero(readable)
        matches = [matches[k] for k in keep.tolist()]
        steps, numbers = steps[keep], numbers[keep]
    at = np.array([m.start() for m in matches], dtype=np.int64)
    line_starts = np.array([text.rfind("\n", 0, m.start()) + 1 for m in matches], dtype=np.int64)
    return TableHits(at, line_starts, steps, numbers)


def _plain_prefix(text: str, match: re.Match[str]) -> bool:
    """Whether the line of `match` is read alike per line before its `iteration`: no carriage
    return, no escape, no earlier `iteration` (see `megatron_rows`)."""
    prefix = text[text.rfind("\n", 0, match.start()) + 1 : match.start()]
    return "\r" not in prefix and "\x1b" not in prefix and "iteration" not in prefix


def _put(metrics: dict[str, float], nonfinite: list[str], spec: tuple[str, float], value: str) -> None:
    """Read one field's value into `metrics` (scaled), noting nan/inf; an unreadable value is skipped."""
    try:
        v = float(value)
    except ValueError:
        try:
            v = number(value)
        except ValueError:
            return
    name, scale = spec
    v *= scale
    if v != v or v in (_INF, _NEG_INF):
        nonfinite.append(name)
    metrics[name] = v


def _to_floats(column: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Strings to floats in one go; values that are not numbers become NaN (and are reported)."""
    try:
        return column.astype(np.float64), np.zeros(len(column), dtype=bool)
    except ValueError:
        values = np.full(len(column), np.nan)
        unreadable = np.zeros(len(column), dtype=bool)
        for i, text in enumerate(column.tolist()):
            try:
                values[i] = number(text)
            except ValueError:
                unreadable[i] = True
        return values, unreadable

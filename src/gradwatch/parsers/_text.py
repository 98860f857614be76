"""Text helpers shared by the parsers: launcher prefixes, ANSI escapes, numbers, timestamps."""

from __future__ import annotations

import calendar
import math
import re

import numpy as np

# Launcher prefixes seen in real logs, outermost first: torch.distributed `[default7]:`, `[rank0]:`,
# srun --label `0: ` (one space: what follows is the line's own indentation, a YAML's nesting), LUMI
# `nid005143:0 out: `, Ray `(pretraining, pid=4112) `. They may nest.
PREFIXES = (
    r"(?:\[(?:default|rank)\d+\]:\s?|\d{1,5}:\s|nid\d+:\d+ (?:out|err): |\([\w.-]+, pid=\d+(?:, ip=[\d.]+)?\)\s)+"
)
_PREFIX = re.compile(f"^{PREFIXES}")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
_TS = re.compile(r"^\[?(\d{4})-(\d\d)-(\d\d)[ T_-](\d\d):?(\d\d):?(\d\d)(?:[.,](\d{1,6}))?")


def clean(text: str) -> str:
    """Strip ANSI escapes and launcher prefixes, keep the payload."""
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    if text[:1] in "[0123456789n(":
        m = _PREFIX.match(text)
        if m:
            text = text[m.end() :]
    return text


def number(text: str) -> float:
    """Parse a number as trainers print it: `1.2E+00`, `195,153`, `nan`, `NAN`, `inf`, `'0.91'`.

    Raises ValueError when the text is not a number.
    """
    t = text.strip().strip("'\"‘’“”")
    if "," in t:
        t = t.replace(",", "")
    return float(t)


#: The longest run of digits a line read may hold: no trainer prints a number that long (a step
#: beyond int64 has 19 digits), and `int()` refuses more (Python's limit, `sys.int_info`).
MAX_DIGITS = 4300
_HALF_RUN = MAX_DIGITS // 2 + 1
_LONG_RUN = re.compile(rf"(?<!\d)\d{{{MAX_DIGITS + 1}}}")


def holds_long_number(text: str) -> bool:
    """Whether `text` holds more than `MAX_DIGITS` digits in a row (any script's, as `\\d` and
    `int()` read them).

    Cheap for the lines of a log: such a run fills one of the stretches of `_HALF_RUN`
    characters the text is cut into, and `str.isdecimal` stops at a stretch's first non-digit;
    only a text where one stretch is all digits is searched (the look-behind keeps that search
    linear in a long run of digits)."""
    if len(text) <= MAX_DIGITS:
        return False
    stretches = range(0, len(text) - _HALF_RUN + 1, _HALF_RUN)
    if not any(text[at : at + _HALF_RUN].isdecimal() for at in stretches):
        return False
    return _LONG_RUN.search(text) is not None


def is_nonfinite(value: float) -> bool:
    return not math.isfinite(value)


_ts_cache: dict[str, float] = {}


def timestamp(text: str) -> float | None:
    """Seconds since the epoch for a line that starts with a date and time, else None.

    Times are read as UTC: logs rarely say their zone, and only differences matter to us.
    """
    if text[:1] == " ":
        text = text.lstrip(" ")
    if len(text) < 19 or not (text[0].isdigit() or (text[0] == "[" and text[1:2].isdigit())):
        return None
    m = _TS.match(text)
    if not m:
        return None
    y, mo, d, h, mi, s, frac = m.groups()
    key = f"{y}{mo}{d}{h}{mi}"
    base = _ts_cache.get(key)
    if base is None:
        try:
            base = float(calendar.timegm((int(y), int(mo), int(d), int(h), int(mi), 0, 0, 0, 0)))
        except (ValueError, OverflowError):
            return None
        if len(_ts_cache) > 4096:
            _ts_cache.clear()
        _ts_cache[key] = base
    seconds = base + int(s)
    if frac:
        seconds += int(frac) / 10 ** len(frac)
    return seconds


def digit_numbers(window: np.ndarray, spans: tuple[tuple[int, int], ...]) -> np.ndarray:
    """The numbers written in the columns `spans` (start, end) of rows of bytes (`window`, one
    row a line, the digits checked by the caller), as int64. The spans of one width are summed
    digit by digit together: a third of the numpy calls of one sum per span. (Not a matrix
    product: numpy's float one runs in BLAS threads, which spin beside the worker processes.)"""
    if max(end - start for start, end in spans) > 18:
        raise ValueError("a number of more than 18 digits does not fit in int64")
    digits = window.astype(np.int64) - ord("0")
    numbers = np.empty((len(window), len(spans)), dtype=np.int64)
    for width in sorted({end - start for start, end in spans}):
        columns = [k for k, (start, end) in enumerate(spans) if end - start == width]
        starts = np.array([spans[k][0] for k in columns])
        summed = digits[:, starts]
        for place in range(1, width):
            summed = summed * 10 + digits[:, starts + place]
        numbers[:, columns] = summed
    return numbers


def timestamps(fields: np.ndarray) -> np.ndarray:
    """`timestamp` of many lines at once: `fields` holds year, month, day, hour, minute, second and
    milliseconds per row (as numbers); NaN where `timestamp` gives None (no such year or month).

    Computed as `timestamp` does, in the same order, so the values are the same to the last bit.
    """
    year, month, day, hour, minute, second, millis = (fields[:, j].astype(np.int64) for j in range(7))
    y = year - (month <= 2)  # days from the civil date (proleptic Gregorian), as date.toordinal
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (month + np.where(month > 2, -3, 9)) + 2) // 5
    days = era * 146097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719468 + day - 1
    base = ((days * 24 + hour) * 60 + minute) * 60
    seconds = (base.astype(np.float64) + second) + millis / 1000.0
    return np.where((year >= 1) & (month >= 1) & (month <= 12), seconds, np.nan)


def norm_key(key: str) -> str:
    """Normalise a field name so that `lm loss`, `lm-loss`, `lm_loss` and a hard-wrapped `lm lo ss` match."""
    return key.lower().replace(" ", "").replace("_", "").replace("-", "")

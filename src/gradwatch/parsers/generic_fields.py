"""What the generic reader sees in one line: step counters and named numbers.

Trainers without a parser of their own still print their metrics in a handful of shapes:
`key: value`, `key=value`, `key value`, `'key': value`, `| key | value |` table rows, tqdm and
Keras progress bars (`| 450/1000 [`, `128/128 - 5s - loss: 0.52`), bracketed counters
(`Epoch(train) [1][ 10/381]`, `Epoch: [1]  [1480/1504]`, `Iter(train) [ 510/2046]`). This module
turns a line into those pieces; `generic_names` says which of them are steps and metrics.

    >>> fields("Iter 10: Train loss 1.363, Learning Rate 1.000e-05, It/sec 1.022")
    [Field('Iter', '10', ''), Field('Train loss', '1.363', ''), ...]

Values are read as trainers print them: `1.2e+05`, `529,882`, `"3.097"`, `nan`, `inf`, with a
unit glued on (`989.44ms`, `0.27it/s`, `74.13%`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: a number as trainers print it (thousands separators only in groups of three)
NUMBER = (
    r"[-+]?(?:\d{1,3}(?:,\d{3})+(?![\d.])|\d+)(?:\.\d*)?(?:[eE][-+]?\d+)?"
    r"|[-+]?\.\d+(?:[eE][-+]?\d+)?"
    r"|[-+]?(?:nan|NaN|NAN|inf|Inf|INF|Infinity|infinity)(?![A-Za-z])"
)
_UNIT = r"(?:it/s|s/it|ms|sec|min|s|m|h|%)?"
#: one word of a key: a name, maybe with a parenthesised part (`Iter(train)`, `time (ms)`)
_WORD = r"(?:[A-Za-z_][\w./\-]*(?:\([\w/ .\-]*\))?|\([A-Za-z][\w/ .\-]*\))"
_PAIR = re.compile(
    rf"""(?<![\w./\-])['"]?(?P<key>{_WORD}(?:\ {_WORD}){{0,3}}?)['"]?
    (?P<sep>\s*[:=]\s*|\s+)
    (?P<q>['"]?)(?P<value>{NUMBER})(?P=q)(?P<unit>{_UNIT})(?![\w.])""",
    re.VERBOSE,
)
#: a progress count `n/total` as bars and loggers print it: tqdm `| 45/100 [`, Keras `128/128 - `
#: or `128/128 [===`, bracketed `[ 10/381]`, fairseq's `100 / 1975 loss=`
_BAR = re.compile(r"(?:^|\|\s*|\[\s*|\s)(?P<n>\d{1,12})\s?/\s?(?P<total>\d{1,12})(?=\s*[\[\]]|\s+-\s|\s+[A-Za-z])")
#: an epoch in brackets before a bracketed count: `Epoch(train) [1][ 10/381]`, `Epoch: [1]  [1480/1504]`
_BRACKET_EPOCH = re.compile(
    r"(?i)\bepoch\S*?:?\s*\[\s*(?P<epoch>\d{1,9})\s*\](?:\s*\[\s*(?P<n>\d{1,12})\s*/\s*(?P<total>\d{1,12})\s*\])?"
)
#: an iteration counter in brackets: `Iter(train) [ 510/2046]`
_BRACKET_ITER = re.compile(r"(?i)\biter\S*?:?\s*\[\s*(?P<n>\d{1,12})\s*/\s*\d{1,12}\s*\]")
#: a cell that is one number, or one name (a CSV's header)
_NUMBER_ONLY = re.compile(rf"\s*['\"]?(?:{NUMBER})['\"]?\s*\Z")
_NAME_ONLY = re.compile(r"\s*[A-Za-z_][\w./\-]*\s*\Z")


@dataclass(frozen=True)
class Field:
    """A named number on a line: the key as printed, the value's text, the unit glued to it."""

    key: str
    value: str
    unit: str = ""
    #: what stands between key and value: `:`, `=` or a space (for the layout the reader reports)
    sep: str = " "
    #: where the key begins in the line
    at: int = 0


@dataclass(frozen=True)
class Progress:
    """A step counter that is not a `key value` pair: a bar's count, a bracketed epoch/iteration."""

    n: int
    total: int | None = None
    epoch: int | None = None
    #: what printed it, for the layout the reader reports (`bar`, `[e][i/n]`, `Iter [i/n]`)
    shape: str = "bar"


def fields(text: str) -> list[Field]:
    """The named numbers of a line, in order."""
    return [
        Field(m["key"].strip(), m["value"], m["unit"], m["sep"].strip() or " ", m.start("key"))
        for m in _PAIR.finditer(text)
    ]


#: a word that makes a line an evaluation's, where it stands before the line's first metric
#: (fairseq's `| valid on 'valid' subset | loss 4.1 | ...`, `Evaluating: ... loss=...`)
_EVALUATION = re.compile(r"(?i)\b(?:valid|validation|validating|eval|evaluation|evaluating|test|testing)\b")


def is_evaluation(text: str, before: int) -> bool:
    """Whether the line's text before position `before` says it reports an evaluation."""
    return bool(_EVALUATION.search(text, 0, before))


def progress(text: str) -> Progress | None:
    """The line's bracketed epoch/iteration counter or progress-bar count, if it has one."""
    m = _BRACKET_ITER.search(text)
    if m:
        return Progress(int(m["n"]), shape="Iter [i/n]")
    m = _BRACKET_EPOCH.search(text)
    if m:
        if m["n"] is None:
            return Progress(int(m["epoch"]), shape="Epoch [e]")
        return Progress(int(m["n"]), int(m["total"]), int(m["epoch"]), shape="Epoch [e][i/n]")
    m = _BAR.search(text)
    if m:
        return Progress(int(m["n"]), int(m["total"]))
    return None


#: a line that is one `key: value` (or `key = value`) and nothing else, maybe inside a box
#: (`| > loss_disc: nan  (nan)`, Coqui's step blocks) and with a running average after it
_BARE = re.compile(
    rf"""\s*(?:\|\s*>?\s*)?['"]?(?P<key>{_WORD}(?:\ {_WORD}){{0,3}}?)['"]?\s*(?P<sep>[:=])\s*
    (?P<q>['"]?)(?P<value>{NUMBER})(?P=q)(?P<unit>{_UNIT})\s*(?:\([^()]*\))?\s*\|?\s*\Z""",
    re.VERBOSE,
)
#: a table's border: `-------`, `=======`, `+-----+----+`
_BORDER = re.compile(r"\s*[-=+|]{5,}\s*\Z")


def bare_pair(text: str) -> Field | None:
    """The line's one `key: value`, where that is all the line holds."""
    m = _BARE.match(text)
    return Field(m["key"].strip(), m["value"], m["unit"], m["sep"]) if m else None


def is_border(text: str) -> bool:
    return bool(_BORDER.match(text))


def csv_cells(text: str) -> list[str] | None:
    """The cells of a comma-separated row of at least three cells (numbers or names), else None."""
    if text.count(",") < 2 or " " in text.strip().replace(", ", ","):
        return None
    cells = [c.strip() for c in text.strip().split(",")]
    if any(not c for c in cells):
        return None
    return cells


def is_number(cell: str) -> bool:
    return bool(_NUMBER_ONLY.match(cell))


def is_name(cell: str) -> bool:
    return bool(_NAME_ONLY.match(cell)) and not is_number(cell)


def table_row(text: str) -> tuple[str, str] | None:
    """A two-cell table row `| key | value |` (Stable-Baselines3's boxes) as (key, value text);
    a section row `| train/ |   |` gives an empty value."""
    body = text.strip()
    if not (body.startswith("|") and body.endswith("|")) or body.count("|") != 3:
        return None
    key, value = (cell.strip() for cell in body[1:-1].split("|"))
    if not key or (value and not is_number(value)):
        return None
    return key, value

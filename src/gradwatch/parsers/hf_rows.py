"""HF Trainer dicts found and read at RE2 speed, for the bulk path.

The lines that begin with the template's first key (`{'loss': `) are found at numpy speed; each
is matched whole by RE2 with the template regex's own text (which RE2 reads as `re` does with
re.ASCII: no lookarounds, `\\d` is [0-9]), its values taken as named groups and converted by
Arrow's cast in one call. A line that begins so but does not match is handed back (`Rows.odd`)
to the template regex, so what is read here is what the regex would read.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gradwatch.parsers._arrow import arrow, numpy_of
from gradwatch.parsers._bytes import line_starts, text_at
from gradwatch.parsers._tokens import floats, holds, ranges_array


@dataclass(frozen=True)
class Layout:
    """What a dict line of one shape looks like to RE2."""

    #: what the line begins with, e.g. b"{'loss': "
    head: bytes
    #: the whole line: one named group per value read (each a number or None)
    pattern: str


@dataclass
class Rows:
    """Dicts read by `find`, in order: where each line starts, and per line its groups as
    numbers (None is NaN), in the pattern's order."""

    line_starts: np.ndarray
    values: np.ndarray
    #: starts of the lines that begin as a dict of the shape but did not match
    odd: list[int]


def find(layout: Layout, codes: np.ndarray, newlines: np.ndarray) -> Rows:
    """The dict lines of `layout`'s shape in a block (`codes`, a byte per character; `newlines`,
    where its lines end)."""
    pa, pc = arrow()

    starts = line_starts(newlines, np.arange(len(newlines)))
    lines = np.flatnonzero(text_at(codes, starts, layout.head))
    found = pc.extract_regex(ranges_array(codes, starts[lines], newlines[lines]), layout.pattern)
    matched = found.is_valid()
    groups = found.type.num_fields
    tokens = pa.concat_arrays([found.field(j).filter(matched) for j in range(groups)])
    if holds(tokens, "N"):  # only None has one
        tokens = pc.replace_substring(tokens, "None", "nan")
    values = floats(tokens)
    accepted = numpy_of(matched)
    if values is None:  # not expected (every group matches a number's grammar): the regex reads them
        values, accepted = np.zeros(0), np.zeros(len(lines), dtype=bool)
    return Rows(starts[lines[accepted]], values.reshape(groups, -1).T, starts[lines[~accepted]].tolist())


def lines_holding(codes: np.ndarray, newlines: np.ndarray, byte: int, skip: np.ndarray) -> list[tuple[int, int]]:
    """Start and end (its newline) of each line of a block that holds `byte`, but for the lines
    that begin at `skip` (ascending), in order: where a bulk reader looks for odd lines of its kind."""
    lines = np.searchsorted(newlines, np.flatnonzero(codes == byte))
    lines = lines[np.diff(lines, prepend=-1) > 0]  # once each
    lines = lines[~np.isin(lines, np.searchsorted(newlines, skip))]
    return list(zip(line_starts(newlines, lines).tolist(), newlines[lines].tolist(), strict=True))

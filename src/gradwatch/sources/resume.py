"""Going on in a file cut short in place: which of the lines read again were read before.

`scan` finds where a file cut short still matches what it read (`sources.marks`) and goes on from
there (`sources.rotation`): a `Cut`. Within the last ~500 lines read the marks are at every line
end, so the point is exact: the line after it is not the one read there before, and everything
from it on is read as new. The partial line the parsers held (the file's last line, read before
its newline came) is ended first: two versions of a line never merge into one (as `tail` does).

Further back the marks are further apart, and the point is the last one that still matches: the
`Cut.lines` lines after it (the gap to the next mark) may begin with lines read before, up to where
the file was cut, and go on with new ones. The bytes cannot tell where (they are not kept), so the
lines of the gap are read and their steps and events decide:

* a new job's lines show where they begin: a checkpoint load or configuration block (its restart
  lines), a step that goes back (a rollback that logs lower steps), or a step past the last one
  read (a job that went on). The lines of the gap before the first of these were read before
  (they continue the steps read) and are dropped, records and events; nothing after it is;
* no such line in the gap, and the file ends within it: what is there is taken for lines read
  before (a file cut, nothing new yet) and dropped; the lines that come after are new;
* no such line, and the file goes on past the gap: it diverged inside the gap into lines that
  continue the steps, a run resumed without a restart line. Nothing is dropped: never a resumed
  run's new records. The lines read before between the mark and the cut are then read again and
  seen as the restart they were, at the mark: `resume_regression` compares those (the same values
  as before), and the new lines' jump, if any, is left to the spike and trend detectors.

Dropping keeps the alerts of what was read from repeating, and keeps lines read before from
looking like a restart of the run; the price is in the rare case above and in one more: a resumed
run's first lines that continue the steps of the lines cut (no restart line) and end within the
gap are dropped as lines read before, and its resume is seen at the scan after, from its next
record, whose step is below the last one read.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gradwatch.events import EventKind

if TYPE_CHECKING:
    from gradwatch.alerts import Alert
    from gradwatch.parsers.stream import Batch
    from gradwatch.pipeline import FileCheck

__all__ = ["Cut", "end_torn_line", "feed_after_cut"]

#: Events that start a new job: the lines from them on are new.
_STARTS = (EventKind.CHECKPOINT_LOAD, EventKind.CONFIG)


@dataclass(frozen=True)
class Cut:
    """Where a file cut short goes on, and how many lines after it may have been read before
    (0: none, the point is exact)."""

    offset: int
    lines: int


def end_torn_line(check: FileCheck) -> list[Alert]:
    """The partial line held from before the cut ends where it was read: it is not merged with
    the bytes read again."""
    return check.feed(b"\n") if check.stream.has_partial_line else []


def feed_after_cut(check: FileCheck, data: bytes, cut: Cut, last_step: int | None) -> list[Alert]:
    """Feed `data`, the first bytes after `cut.offset`, without what of its first `cut.lines`
    lines was read before (see the module docstring)."""
    if cut.lines == 0 or last_step is None:
        return check.feed(data)
    first = check.stream.lines
    check.parse(data)
    batch = check.stream.take()
    goes_on = check.stream.lines - first > cut.lines  # (past the gap: it diverged inside it)
    return check.feed_batch(_unread(batch, first + cut.lines, last_step, goes_on))


def _unread(batch: Batch, last_line: int, last_step: int, goes_on: bool) -> Batch:
    """`batch` from the first line up to `last_line` that a new job wrote on (see the module
    docstring); all of it when there is none and the file goes on past `last_line`."""
    records = batch.records
    starts = [ev.line for ev in batch.events if ev.kind in _STARTS and ev.line <= last_line]
    new_from = min(starts, default=last_line + 1)
    before = -math.inf
    for step, line in zip(records["step"].tolist(), records["line"].tolist(), strict=True):
        if line >= new_from:
            break
        if step is None or not step >= 0:  # (a record without a step says nothing either way)
            continue
        if step > last_step or step < before:
            new_from = line
            break
        before = step
    if new_from > last_line and goes_on:
        return batch
    kept = records[records["line"] >= new_from]
    return dataclasses.replace(batch, records=kept, events=[ev for ev in batch.events if ev.line >= new_from])

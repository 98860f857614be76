"""The optimizer step of an HF Trainer dict, which the dict does not print.

The log may tell it: a tqdm bar printed on the dict's own line (the Trainer updates it to
`global_step` before it logs), a `global_step`/`step` key, or a DeepSpeed counter
(`step=N, skipped=K`, printed by the engine every `steps_per_print` steps) since the previous
training dict and newer than it. Where nothing tells, a dict is `stride` steps after the previous
one: 1 (its ordinal) until two dicts in a row were told their steps, then the steps between them
(`logging_steps`). `Count` is that rule for one dict; `counted_steps` the same for many at once
(the bulk path), which must give what one by one gives.
"""

from __future__ import annotations

import re
from typing import NamedTuple

import numpy as np

from gradwatch.parsers.deepspeed import PROGRESS

#: DeepSpeed's progress counter, as `DeepSpeedParser` reads it (the first of a line): the counts
#: a dict takes come from what that parser writes (`out.skip_counts`) or from this over a block
COUNTER = PROGRESS
#: the same without its word boundary, which `re` searches for at every position (25x faster
#: over a block, the boundary checked after: `counters_in`), within one line
_COUNTER_BODY = re.compile(PROGRESS.pattern.removeprefix(r"\b").replace(r"[^,\]]", r"[^,\]\n]"))
_WORD = re.compile(r"\w")
#: digits of a count that is surely within int64 (`ParseOutput.skip_count` drops one beyond)
_DIGITS = 18


def counters_in(text: str) -> list[tuple[int, int | None]]:
    """Where each counter of `text` begins, and its step (None: a count that may be beyond
    int64, which DeepSpeed's parser drops), as `COUNTER.finditer` finds them on each line."""
    return [
        (m.start(), int(m.group(1)) if max(len(m.group(1)), len(m.group(2))) <= _DIGITS else None)
        for m in _COUNTER_BODY.finditer(text)
        if not (m.start() and _WORD.match(text, m.start() - 1))
    ]


class Count(NamedTuple):
    """Where the count of training dicts stands after the latest one (a named tuple: the bulk
    path makes one per dict with a counter, 4x faster than a frozen dataclass)."""

    #: its step (0 before the first dict)
    step: int = 0
    #: steps per dict where the log tells nothing
    stride: int = 1
    #: whether the log told its step
    told: bool = False

    def at(self, step: int) -> Count:
        """The next dict, whose step the log tells: a step after a told one sets the stride."""
        stride = step - self.step if self.told and step > self.step else self.stride
        return Count(step, stride, True)

    def after(self, counter: int | None) -> Count:
        """The next dict, after DeepSpeed's latest `counter` since the previous dict (None: none):
        a counter newer than the previous dict is its step."""
        if counter is not None and counter > self.step:
            return self.at(counter)
        return Count(self.step + self.stride, self.stride, False)


def counted_steps(start: Count, counters: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`Count.after` for many dicts: `counters[k]` is the latest counter before dict k since the
    previous one (-1: none). Returns each dict's step, stride and whether it was told, as `Count`
    holds them after it. A loop over the dicts with a counter only (a counter comes every few
    steps at most): the dicts between are `stride` apart."""
    n = len(counters)
    with_counter = np.flatnonzero(counters >= 0)
    steps = np.empty(n, dtype=np.int64)
    strides = np.empty(n, dtype=np.int64)
    told = np.zeros(n, dtype=bool)
    count, last = start, -1
    marks = []  # (dict index, Count after it) at each dict with a counter
    for k, counter in zip(with_counter.tolist(), counters[with_counter].tolist(), strict=True):
        if k > last + 1:  # untold dicts in between
            count = Count(count.step + count.stride * (k - last - 1), count.stride, False)
        count = count.after(counter)
        marks.append((k, count))
        last = k
    # every dict: the latest mark at or before it (or the start), counted on by its stride
    at = np.array([k for k, _ in marks], dtype=np.int64)
    base_step = np.array([start.step] + [c.step for _, c in marks], dtype=np.int64)
    base_stride = np.array([start.stride] + [c.stride for _, c in marks], dtype=np.int64)
    index = np.arange(n, dtype=np.int64)
    mark = np.searchsorted(at, index, side="right")  # 0: the start; j: marks[j - 1]
    since = index - np.concatenate([[-1], at])[mark]
    steps[:] = base_step[mark] + base_stride[mark] * since
    strides[:] = base_stride[mark]
    told[at] = [c.told for _, c in marks]
    return steps, strides, told

"""A file seen truncated is looked at alone between two wake-ups, and more often, for a while.

copytruncate loses what a writer appends between logrotate's copy and its truncate, unless it was
read before the truncate: `wake.QuickLooks` gives such a file looks of its own. The looks are
counted here, never timed: a wait of the real wakers either holds a quick look or it does not,
however loaded the machine is (benchmarks/rotation_stress.py measures what they save).
"""

from __future__ import annotations

import io
import os
import shutil
import time
from pathlib import Path

import pytest

from gradwatch import config
from gradwatch.commands import tail
from gradwatch.sinks.lines import JsonlSink
from gradwatch.sources.follow import Follower
from gradwatch.sources.wake import QUICK_FOR_S, QUICK_LOOK_S, EventWaker, PollWaker, QuickLooks, Waker
from tests.tail_writer import megatron_line
from tests.test_follow import Recorder


class TailEvents(Recorder):
    """What `gradwatch tail` does with a truncation: it tells the quick looks."""

    def __init__(self) -> None:
        super().__init__()
        self.quick: QuickLooks | None = None
        self.looks: list[set[str]] = []

    def file_truncated(self, path: str, resumed_at: int, read_before: int) -> None:
        super().file_truncated(path, resumed_at, read_before)
        assert self.quick is not None
        self.quick.truncated(path)


def copytruncate(log: Path) -> None:
    shutil.copy(log, log.with_name(log.name + ".1"))
    os.truncate(log, 0)


def append(log: Path, text: str) -> None:
    with open(log, "a") as fh:
        fh.write(text)


@pytest.mark.parametrize("waker_kind", ["polling", "inotify"])
def test_a_truncated_file_is_looked_at_alone_between_two_wake_ups(tmp_path: Path, waker_kind: str) -> None:
    """Polling, and inotify with its event lost (nothing watched): within one wait, the truncated
    file's new line is read, the other file's is not (it waits for the wake-up's look at all)."""
    cut, other = tmp_path / "cut.log", tmp_path / "other.log"
    cut.write_text("a1\n")
    other.write_text("b1\n")
    rec = TailEvents()
    follower = Follower([str(cut), str(other)], rec.on_data, rec)

    def look(paths: set[str]) -> None:
        rec.looks.append(paths)
        follower.poll(rescan=False, only=paths)

    rec.quick = QuickLooks(look)
    waker: Waker = PollWaker(0.5, "test", rec.quick) if waker_kind == "polling" else EventWaker(rec.quick)
    try:
        follower.poll(rescan=True)
        copytruncate(cut)
        append(cut, "a2\n")
        follower.poll(rescan=False)  # the wake-up's look: the truncation is seen
        assert ("truncated", f"{cut} at 0") in rec.events
        append(cut, "a3\n")
        append(other, "b2\n")
        waker.wait(0.5)
    finally:
        waker.close()
        follower.close()
    assert rec.looks and all(paths == {str(cut)} for paths in rec.looks), rec.looks
    assert rec.text(cut) == "a1\na2\na3\n" and rec.text(other) == "b1\n"


def test_a_file_never_truncated_gets_no_quick_look(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text("a1\n")
    rec = TailEvents()
    follower = Follower([str(log)], rec.on_data, rec)
    rec.quick = QuickLooks(rec.looks.append)
    follower.poll(rescan=True)
    append(log, "a2\n")
    PollWaker(0.2, "test", rec.quick).wait(0.2)
    follower.close()
    assert rec.looks == [] and rec.text(log) == "a1\n"


def test_the_quick_pace_slows_down_to_the_normal_one() -> None:
    now = [1000.0]
    quick = QuickLooks(lambda paths: None, clock=lambda: now[0])
    assert quick.every(now[0]) is None
    quick.truncated("a.log")

    def pace(after: float) -> float:
        every = quick.every(1000.0 + after)
        assert every is not None
        return every

    assert pace(0.0) == pytest.approx(QUICK_LOOK_S)
    assert pace(0.0) < pace(QUICK_FOR_S / 2) < pace(QUICK_FOR_S - 1) < 10 * QUICK_LOOK_S
    assert quick.every(1000.0 + QUICK_FOR_S) is None  # back to the normal pace
    now[0] = 2000.0
    quick.truncated("a.log")  # truncated again: quick again
    assert quick.every(2000.0) == pytest.approx(QUICK_LOOK_S)


def test_tail_gives_a_copytruncated_log_quick_looks(tmp_path: Path) -> None:
    """The command's wiring: a truncation seen by `gradwatch tail --poll` makes its waker look
    at that log alone within its next wait, and the line written meanwhile is parsed."""
    log = tmp_path / "train.log"
    log.write_text("".join(megatron_line(s) for s in range(1000, 1010)))
    opts = tail.TailOptions(paths=(str(log),), poll=0.5, output="jsonl")
    run = tail._Tail(opts, config.load(), JsonlSink(io.StringIO()), None, time.time)
    try:
        run.follower.poll(rescan=True)
        copytruncate(log)
        append(log, megatron_line(1010))
        run.follower.poll(rescan=False)
        assert run.quick is not None and run.quick.every(time.monotonic()) is not None
        append(log, megatron_line(1011))
        lines = run.checks[str(log)].stream.lines
        run.waker.wait(0.5)
        assert run.checks[str(log)].stream.lines == lines + 1
    finally:
        run.waker.close()
        run.follower.close()

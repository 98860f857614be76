"""Rotation under load, as on a cluster: a trainer appending, logrotate rotating, `gradwatch tail` following.

One run (`stress`) starts a real `gradwatch tail` subprocess on a log that already holds some
history, then a real writer process (this file run as a script) that appends Megatron iteration
lines with increasing steps at a high rate, and rotates the log every `every` seconds the way
logrotate does it:

* `rename`: rename to `log.N` and create an empty `log`; the writer keeps appending to its old
  descriptor for `lag` seconds before it reopens (a `tee -a` pipeline, a logger reopening late);
* `create`: the same, with a writer that reopens at its next line;
* `copytruncate`: copy to `log.N`, then truncate `log`; the writer never reopens;
* `delete`: remove `log` (the harness keeps a descriptor to read what it held at the end); the
  writer appends to the deleted file for `lag` seconds, then creates a new one;
* `shrink`: cut `log` back to the end of a line some lines before its end (a job rolled back to
  a checkpoint); the writer appends on.

Tail reports every step its parser produced through a plugin detector (`LEDGER_PLUGIN`, loaded
with `plugins:` in a config, as users load theirs), so what was read is counted by step. What
should have been read is every step that is still somewhere at the end: in `log` and the
`log.N` files, or in a deleted file. Lines the rotation itself destroyed (written between
copytruncate's copy and its truncate, or cut away before tail read them) are in none of them, so
they are not counted as lost; a line read that was never written would be counted as extra.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.tail_writer import megatron_line  # noqa: E402

KINDS = ("rename", "create", "copytruncate", "delete", "shrink")
#: Steps beyond any run's length, so that `iteration N/TOTAL` stays well formed.
TOTAL_STEPS = 10**8
HISTORY_LINES = 200
FIRST_STEP = 1000
_STEP = re.compile(rb"iteration +(\d+)/")

LEDGER_PLUGIN = """
import os

from gradwatch.api import Detector, register_detector


@register_detector
class StepLedger(Detector):
    id = "step_ledger"
    description = "appends every step it is given to $GRADWATCH_STEP_LEDGER (the rotation stress test)"

    def update(self, batch):
        steps = batch.records["step"].dropna().astype("int64").tolist()
        if steps:
            with open(os.environ["GRADWATCH_STEP_LEDGER"], "a") as fh:
                fh.write("".join(f"{s}\\n" for s in steps))
        return []
"""


@dataclass(frozen=True)
class Result:
    """How one run went, counted by step."""

    kind: str
    mode: str
    rotations: int
    written: int
    #: steps still somewhere at the end (the lines tail could read)
    expected: int
    read: int
    lost: int
    doubled: int
    #: steps read that were never written (torn lines)
    extra: int

    def row(self) -> str:
        return (
            f"{self.kind:<12} {self.mode:<8} {self.rotations:>9,} {self.written:>9,} {self.expected:>9,} "
            f"{self.read:>9,} {self.lost:>6,} {self.doubled:>7,} {self.extra:>5,}"
        )


HEADER = f"{'rotation':<12} {'follow':<8} {'rotations':>9} {'written':>9} {'on disk':>9} {'read':>9} "
HEADER += f"{'lost':>6} {'doubled':>7} {'extra':>5}"


def _steps(data: bytes) -> list[int]:
    return [int(m.group(1)) for m in _STEP.finditer(data)]


def _start_tail(log: Path, work: Path, poll: bool, rotate_wait: float) -> tuple[subprocess.Popen[str], Path]:
    (work / "ledger.py").write_text(LEDGER_PLUGIN)
    (work / "gradwatch.yaml").write_text("plugins: [ledger.py]\n")
    ledger = work / "steps.txt"
    args = ["tail", str(log), "--output", "jsonl", "--config", str(work / "gradwatch.yaml")]
    args += ["--rotate-wait", str(rotate_wait), *(["--poll", "0.25"] if poll else [])]
    tail = subprocess.Popen(
        [sys.executable, "-m", "gradwatch", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "GRADWATCH_STEP_LEDGER": str(ledger)},
    )
    return tail, ledger


def _wait_started(tail: subprocess.Popen[str], out: Path, timeout: float = 30.0) -> threading.Thread:
    """Until the first status (history read, files watched); stdout goes to `out` from then on."""
    started = threading.Event()

    def read() -> None:
        assert tail.stdout is not None
        with open(out, "w") as fh:
            for line in tail.stdout:
                fh.write(line)
                if json.loads(line)["type"] == "status":
                    started.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    if not started.wait(timeout):
        tail.kill()
        raise RuntimeError(f"gradwatch tail did not start: {tail.stderr.read() if tail.stderr else ''}")
    return reader


class _Rotator:
    """logrotate: one kind of rotation every `every` seconds while the writer runs."""

    #: A file younger than this is not rotated (logrotate rotates by the hour or the day): a file
    #: created and deleted between two looks of a polling tail cannot be read by anyone.
    MIN_AGE_S = 1.0

    def __init__(self, log: Path, kind: str) -> None:
        self.log, self.kind, self.count = log, kind, 0
        self.deleted: list[int] = []  # descriptors of deleted files, read at the end
        self._born: dict[int, float] = {}  # inode: when it was first seen at `log`

    def rotate(self) -> None:
        log = self.log
        try:
            ino = log.stat().st_ino
        except FileNotFoundError:
            return  # (deleted, and the writer has not created a new one yet)
        if time.monotonic() - self._born.setdefault(ino, time.monotonic()) < self.MIN_AGE_S:
            return
        self.count += 1
        rotated = log.with_name(f"{log.name}.{self.count}")
        if self.kind in ("rename", "create"):
            os.rename(log, rotated)
            log.touch()
        elif self.kind == "copytruncate":
            shutil.copy(log, rotated)
            os.truncate(log, 0)
        elif self.kind == "delete":
            self.deleted.append(os.open(log, os.O_RDONLY))
            os.remove(log)
        elif self.kind == "shrink":
            with open(log, "rb") as fh:
                fh.seek(max(0, log.stat().st_size - (64 << 10)))
                data = fh.read()
            end = len(data)
            for _ in range(1 + (self.count * 37) % 150):  # 1 to 150 lines back
                end = data.rfind(b"\n", 0, end - 1) + 1
            if end > 0:
                os.truncate(log, log.stat().st_size - (len(data) - end))

    def on_disk(self) -> list[int]:
        """Every step still somewhere: the log, its rotated names, the deleted files."""
        steps: list[int] = []
        for path in sorted(self.log.parent.glob(self.log.name + "*")):
            steps += _steps(path.read_bytes())
        for fd in self.deleted:
            size = os.fstat(fd).st_size
            steps += _steps(os.pread(fd, size, 0))
            os.close(fd)
        return steps


def stress(
    work: Path,
    kind: str,
    poll: bool,
    *,
    rate: float = 2000.0,
    seconds: float = 3.0,
    every: float = 0.6,
    lag: float = 1.0,
    rotate_wait: float = 2.0,
) -> Result:
    """One run in the empty folder `work`; see the module's docstring."""
    log = work / "main_log.txt"
    log.write_text("".join(megatron_line(s, total=TOTAL_STEPS) for s in range(FIRST_STEP, FIRST_STEP + HISTORY_LINES)))
    tail, ledger = _start_tail(log, work, poll, rotate_wait)
    reader = _wait_started(tail, work / "tail.jsonl")
    count = int(rate * seconds)
    reopen = {"rename": lag, "create": 0.0, "delete": lag}.get(kind)
    written = work / "written.txt"
    cmd = [sys.executable, __file__, str(log), "--first", str(FIRST_STEP + HISTORY_LINES), "--count", str(count)]
    cmd += ["--rate", str(rate), "--written", str(written)]
    cmd += [] if reopen is None else ["--reopen-after", str(reopen)]
    writer = subprocess.Popen(cmd)
    rotator = _Rotator(log, kind)
    try:
        while writer.poll() is None:
            time.sleep(every)
            if writer.poll() is None:
                rotator.rotate()
        if writer.returncode != 0:
            raise RuntimeError(f"the writer failed with exit code {writer.returncode}")
        expected = Counter(rotator.on_disk())
        _wait_caught_up(ledger, set(expected), timeout=rotate_wait + 10.0)
    finally:
        writer.kill()
        tail.send_signal(signal.SIGINT)
        try:
            tail.wait(timeout=30)
        except subprocess.TimeoutExpired:
            tail.kill()
        reader.join(timeout=5)
    stderr = tail.stderr.read() if tail.stderr else ""
    if "Traceback" in stderr or tail.returncode not in (0, 1):
        raise RuntimeError(f"gradwatch tail failed (exit {tail.returncode}):\n{stderr}")
    wrote = set(range(FIRST_STEP, FIRST_STEP + HISTORY_LINES)) | {int(s) for s in written.read_text().split()}
    seen = Counter(int(s) for s in ledger.read_text().split())
    return Result(
        kind=kind,
        mode="polling" if poll else "inotify",
        rotations=rotator.count,
        written=len(wrote),
        expected=len(expected),
        read=sum(seen.values()),
        lost=len(set(expected) - set(seen)),
        doubled=sum(n - 1 for n in seen.values()),
        extra=len(set(seen) - wrote),
    )


def _wait_caught_up(ledger: Path, expected: set[int], timeout: float) -> None:
    """Until every expected step was read, or the ledger stopped growing for 2 s, or `timeout`."""
    deadline, last, still_since = time.monotonic() + timeout, -1, time.monotonic()
    while time.monotonic() < deadline:
        text = ledger.read_text() if ledger.exists() else ""
        if expected <= {int(s) for s in text.split()}:
            time.sleep(0.5)  # (a line read twice would come right after)
            return
        if len(text) != last:
            last, still_since = len(text), time.monotonic()
        elif time.monotonic() - still_since > 2.0:
            return
        time.sleep(0.1)


def write(log: str, first: int, count: int, rate: float, reopen_after: float | None, written: str) -> None:
    """The trainer: one flushed line per step at `rate` lines/s. With `reopen_after`, once the log's
    path names another file (or none), it goes on appending to the one it has open for that many
    seconds, then opens the path again; without it, it never reopens (copytruncate, shrink)."""
    fh = open(log, "a", encoding="utf-8")  # noqa: SIM115 - reopened after rotations
    moved_at: float | None = None
    steps: list[int] = []
    start = time.monotonic()
    try:
        for i in range(count):
            if reopen_after is not None:
                moved_at = _moved(fh.fileno(), log, moved_at)
                if moved_at is not None and time.monotonic() - moved_at >= reopen_after:
                    fh.close()
                    fh = open(log, "a", encoding="utf-8")  # noqa: SIM115
                    moved_at = None
            step = first + i
            fh.write(megatron_line(step, total=TOTAL_STEPS))
            fh.flush()
            steps.append(step)
            time.sleep(max(0.0, start + (i + 1) / rate - time.monotonic()))
    finally:
        fh.close()
        Path(written).write_text("".join(f"{s}\n" for s in steps))


def _moved(fd: int, path: str, since: float | None) -> float | None:
    """When the path was first seen naming another file than `fd` (None: it still names it)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return since or time.monotonic()
    own = os.fstat(fd)
    if (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino):
        return None
    return since or time.monotonic()


def main() -> None:
    ap = argparse.ArgumentParser(description="The trainer stand-in of the rotation stress test.")
    ap.add_argument("log")
    ap.add_argument("--first", type=int, required=True)
    ap.add_argument("--count", type=int, required=True)
    ap.add_argument("--rate", type=float, required=True, help="lines per second")
    ap.add_argument("--reopen-after", type=float, default=None, metavar="SECONDS")
    ap.add_argument("--written", required=True, help="where the steps written are listed at the end")
    args = ap.parse_args()
    write(args.log, args.first, args.count, args.rate, args.reopen_after, args.written)


if __name__ == "__main__":
    main()

"""Rotation under load, as on a cluster: a trainer appending, logrotate rotating, gradwatch reading.

One run starts from a log that already holds some history, then a real writer process (this file
run as a script) that appends Megatron iteration lines with increasing steps at a high rate, and
rotates the log every `every` seconds the way logrotate does it:

* `rename`: rename to `log.N` and create an empty `log`; the writer keeps appending to its old
  descriptor for `lag` seconds before it reopens (a `tee -a` pipeline, a logger reopening late);
* `create`: the same, with a writer that reopens at its next line;
* `copytruncate`: copy to `log.N`, then truncate `log`; the writer never reopens;
* `delete`: remove `log` (the harness keeps a descriptor to read what it held at the end); the
  writer appends to the deleted file for `lag` seconds, then creates a new one;
* `shrink`: cut `log` back to the end of a line some lines before its end (a job rolled back to
  a checkpoint); the writer appends on;
* `compress` (`SCAN_KINDS`): `create`, then `log.N` compressed to `log.N.gz` at once (logrotate's
  `compress` without `delaycompress`).

Two readers: `stress` starts a real `gradwatch tail` subprocess before the writer and stops it
once it caught up; `scan_stress` runs a real `gradwatch scan --state` between rotations, as cron
would (a scan, then a rotation when one is due, ...: each scan takes most of a second, and the
writer writes on meanwhile), and twice once the writer is done. Both report every step their
parser produced through a plugin detector (`LEDGER_PLUGIN`, loaded with `plugins:` in a config,
as users load theirs), so what was read is counted by step. What should have been read is every
step that is still somewhere at the end: in `log`, `log.N` and `log.N.gz`, or in a deleted file
(for `scan`: the part of it there when a scan began, since no later scan can open it). Lines the
rotation itself destroyed (written between copytruncate's copy and its truncate, or cut away
before they were read) are in none of them, so they are not counted as lost; a line read that
was never written would be counted as extra.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.tail_writer import megatron_line  # noqa: E402

KINDS = ("rename", "create", "copytruncate", "delete", "shrink")
#: `scan` finds a rotated file compressed since it last read it, too.
SCAN_KINDS = (*KINDS, "compress")
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


HEADER = f"{'rotation':<12} {'reader':<8} {'rotations':>9} {'written':>9} {'on disk':>9} {'read':>9} "
HEADER += f"{'lost':>6} {'doubled':>7} {'extra':>5}"


def _steps(data: bytes) -> list[int]:
    return [int(m.group(1)) for m in _STEP.finditer(data)]


def ledger_config(work: Path) -> tuple[Path, dict[str, str]]:
    """The config that loads the ledger plugin, and the environment that tells it where to write."""
    (work / "ledger.py").write_text(LEDGER_PLUGIN)
    (work / "gradwatch.yaml").write_text("plugins: [ledger.py]\n")
    return work / "gradwatch.yaml", {**os.environ, "GRADWATCH_STEP_LEDGER": str(work / "steps.txt")}


def _start_tail(log: Path, work: Path, poll: bool, rotate_wait: float) -> subprocess.Popen[str]:
    config, env = ledger_config(work)
    args = ["tail", str(log), "--output", "jsonl", "--config", str(config)]
    args += ["--rotate-wait", str(rotate_wait), *(["--poll", "0.25"] if poll else [])]
    return subprocess.Popen(
        [sys.executable, "-m", "gradwatch", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


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
        #: descriptors of deleted files, read at the end, with how much of each a scan could see
        self.deleted: list[tuple[int, int]] = []
        self._born: dict[int, float] = {}  # inode: when it was first seen at `log`
        self._seen: dict[int, int] = {}  # inode: its size when a scan that has ended began
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def scanning(self) -> Iterator[None]:
        """Around a scan: what `log` held when it began, and still holds when it ends (not deleted
        meanwhile), it could read: it has opened the file by then."""
        try:
            st: os.stat_result | None = self.log.stat()
        except FileNotFoundError:
            st = None
        yield
        with self._lock:
            if st is not None and all(fd_ino != st.st_ino for fd_ino in self._deleted_inodes()):
                self._seen[st.st_ino] = max(self._seen.get(st.st_ino, 0), st.st_size)

    def _deleted_inodes(self) -> list[int]:
        return [os.fstat(fd).st_ino for fd, _ in self.deleted]

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
        if self.kind in ("rename", "create", "compress"):
            os.rename(log, rotated)
            log.touch()
            if self.kind == "compress":
                with open(rotated, "rb") as src, gzip.open(f"{rotated}.gz", "wb") as dst:
                    shutil.copyfileobj(src, dst)
                os.remove(rotated)
        elif self.kind == "copytruncate":
            shutil.copy(log, rotated)
            os.truncate(log, 0)
        elif self.kind == "delete":
            with self._lock:
                self.deleted.append((os.open(log, os.O_RDONLY), self._seen.get(ino, 0)))
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

    def on_disk(self, scanned: bool = False) -> list[int]:
        """Every step still somewhere: the log, its rotated names, the deleted files (`scanned`:
        only what they held when a scan last began before they were deleted)."""
        steps: list[int] = []
        for path in sorted(self.log.parent.glob(self.log.name + "*")):
            steps += _steps(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes())
        for fd, seen in self.deleted:
            size = seen if scanned else os.fstat(fd).st_size
            steps += _steps(os.pread(fd, size, 0)[: size if scanned else None])
            os.close(fd)
        return steps


def _history(work: Path) -> Path:
    """The log, with the lines written before reading begins."""
    log = work / "main_log.txt"
    log.write_text("".join(megatron_line(s, total=TOTAL_STEPS) for s in range(FIRST_STEP, FIRST_STEP + HISTORY_LINES)))
    return log


def _write_and_rotate(rotator: _Rotator, rate: float, seconds: float, every: float, lag: float) -> set[int]:
    """Run the writer for `seconds`, rotating the log every `every` seconds; returns every step written."""
    log, kind, work = rotator.log, rotator.kind, rotator.log.parent
    count = int(rate * seconds)
    reopen = {"rename": lag, "create": 0.0, "compress": 0.0, "delete": lag}.get(kind)
    written = work / "written.txt"
    cmd = [sys.executable, __file__, str(log), "--first", str(FIRST_STEP + HISTORY_LINES), "--count", str(count)]
    cmd += ["--rate", str(rate), "--written", str(written)]
    cmd += [] if reopen is None else ["--reopen-after", str(reopen)]
    writer = subprocess.Popen(cmd)
    try:
        while writer.poll() is None:
            time.sleep(every)
            if writer.poll() is None:
                rotator.rotate()
        if writer.returncode != 0:
            raise RuntimeError(f"the writer failed with exit code {writer.returncode}")
    finally:
        writer.kill()
    return set(range(FIRST_STEP, FIRST_STEP + HISTORY_LINES)) | {int(s) for s in written.read_text().split()}


def _counted(kind: str, mode: str, rotator: _Rotator, expected: Counter[int], wrote: set[int], ledger: Path) -> Result:
    seen = Counter(int(s) for s in ledger.read_text().split()) if ledger.exists() else Counter[int]()
    return Result(
        kind=kind,
        mode=mode,
        rotations=rotator.count,
        written=len(wrote),
        expected=len(expected),
        read=sum(seen.values()),
        lost=len(set(expected) - set(seen)),
        doubled=sum(n - 1 for n in seen.values()),
        extra=len(set(seen) - wrote),
    )


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
    """One run of `gradwatch tail` in the empty folder `work`; see the module's docstring."""
    log = _history(work)
    tail = _start_tail(log, work, poll, rotate_wait)
    reader = _wait_started(tail, work / "tail.jsonl")
    try:
        rotator = _Rotator(log, kind)
        wrote = _write_and_rotate(rotator, rate, seconds, every, lag)
        expected = Counter(rotator.on_disk())
        _wait_caught_up(work / "steps.txt", set(expected), timeout=rotate_wait + 10.0)
    finally:
        tail.send_signal(signal.SIGINT)
        try:
            tail.wait(timeout=30)
        except subprocess.TimeoutExpired:
            tail.kill()
        reader.join(timeout=5)
    stderr = tail.stderr.read() if tail.stderr else ""
    if "Traceback" in stderr or tail.returncode not in (0, 1):
        raise RuntimeError(f"gradwatch tail failed (exit {tail.returncode}):\n{stderr}")
    return _counted(kind, "polling" if poll else "inotify", rotator, expected, wrote, work / "steps.txt")


def scan_stress(
    work: Path,
    kind: str,
    *,
    rate: float = 2000.0,
    seconds: float = 3.0,
    every: float = 0.3,
    lag: float = 1.0,
    pause: float = 0.2,
    pattern: str = "",
) -> Result:
    """One run of `gradwatch scan` in the empty folder `work`: scans one after the other, every
    `pause` seconds, while the writer writes and the log rotates, then two once it is done;
    `pattern` is appended to the log's path (`*`: a glob that matches the rotated files too).
    See the module's docstring."""
    log = _history(work)
    config, env = ledger_config(work)
    rotator = _Rotator(log, kind)
    failures: list[str] = []

    def scan() -> None:
        args = ["scan", f"{log}{pattern}", "--state", str(work / "state.json"), "--config", str(config)]
        with rotator.scanning():
            p = subprocess.run([sys.executable, "-m", "gradwatch", *args], capture_output=True, text=True, env=env)
        # (2: the log was deleted and not created again yet, or created and still empty)
        expected = ("no such file", "is empty", "no log files found")
        errors = [line for line in p.stderr.splitlines() if line.startswith("error:")]
        empty = p.returncode == 2 and all(any(s in line for s in expected) for line in errors)
        if "Traceback" in p.stderr or "gradwatch failed" in p.stderr or not (p.returncode in (0, 1) or empty):
            failures.append(f"gradwatch scan failed (exit {p.returncode}):\n{p.stdout}\n{p.stderr}")

    done = threading.Event()

    def cron() -> None:
        while not done.wait(pause):
            scan()

    scan()  # the history, before the writer starts (as tail reads it first)
    scans = threading.Thread(target=cron, daemon=True)
    scans.start()
    try:
        wrote = _write_and_rotate(rotator, rate, seconds, every, lag)
    finally:
        done.set()
        scans.join()
    scan()  # the rest
    scan()  # and nothing more
    if failures:
        raise RuntimeError(failures[0])
    return _counted(kind, "scan" + pattern, rotator, Counter(rotator.on_disk(scanned=True)), wrote, work / "steps.txt")


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

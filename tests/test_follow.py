"""Following files: identity, rotation, truncation, globs, wake-ups and the mount table, in-process.

The follower is driven by hand here (`poll()` when the test says so), which makes every race a
chosen order of operations; test_tail.py runs the same code against real writers and observers.
A Hypothesis state machine writes, rotates, truncates and deletes at random and checks that the
bytes handed on are exactly what was written, in order (Vector tests its tailer the same way).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from gradwatch.sources import wake
from gradwatch.sources.fingerprint import HEAD_BYTES, Fingerprint
from gradwatch.sources.follow import FileFollower, Follower
from gradwatch.sources.mounts import Mount, is_network_fs, mount_of, parse_mountinfo, parse_mounts
from gradwatch.sources.wake import EventWaker, PollWaker, choose_waker


class Recorder:
    """Collects what a follower hands on and reports, as the tail command would."""

    def __init__(self) -> None:
        self.data: dict[str, bytearray] = {}
        self.events: list[tuple[str, str]] = []

    def on_data(self, path: str, data: bytes) -> None:
        self.data.setdefault(path, bytearray()).extend(data)

    def text(self, path: Path) -> str:
        return self.data.get(str(path), bytearray()).decode()

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.events]

    def file_added(self, path: str) -> None:
        self.events.append(("added", path))

    def file_rotated(self, path: str) -> None:
        self.events.append(("rotated", path))

    def file_truncated(self, path: str, resumed_at: int, read_before: int) -> None:
        self.events.append(("truncated", f"{path} at {resumed_at}"))

    def file_missing(self, path: str) -> None:
        self.events.append(("missing", path))

    def file_unreadable(self, path: str, reason: str) -> None:
        self.events.append(("unreadable", f"{path}: {reason}"))


def follower(path: Path, rec: Recorder, from_end: bool = False, rotate_wait: float = 0.0) -> FileFollower:
    """Driven by hand: a rotated file is done at the first look that finds it quiet, unless told otherwise."""
    return FileFollower(str(path), rec.on_data, rec, from_end=from_end, rotate_wait=rotate_wait)


def append(path: Path, text: str) -> None:
    with open(path, "a") as fh:
        fh.write(text)


def test_fingerprint_grows_with_a_young_file_and_sees_a_rewrite(tmp_path: Path) -> None:
    log = tmp_path / "log"
    append(log, "first line\n")
    fd = os.open(log, os.O_RDONLY)
    try:
        fp = Fingerprint.of(fd)
        assert fp.head_len == 11
        append(log, "x" * 1000)
        grown = fp.recheck(fd)
        assert grown is not None and grown.head_len == HEAD_BYTES
        assert grown.names(os.stat(log))
        with open(log, "r+") as fh:
            fh.write("FIRST")  # same inode, same size, other first bytes
        assert grown.recheck(fd) is None
    finally:
        os.close(fd)


def test_appends_and_partial_lines_are_handed_on_raw(tmp_path: Path) -> None:
    log, rec = tmp_path / "log", Recorder()
    append(log, "a\nb")
    f = follower(log, rec)
    f.poll()
    append(log, "c\n")
    f.poll()
    assert rec.text(log) == "a\nbc\n"
    assert rec.kinds() == ["added"]


def test_from_end_skips_the_history_and_a_line_being_written(tmp_path: Path) -> None:
    log, rec = tmp_path / "log", Recorder()
    append(log, "old\nhalf of a li")
    f = follower(log, rec, from_end=True)
    f.poll()
    append(log, "ne\nnew\n")
    f.poll()
    assert rec.text(log) == "new\n"


def test_rotation_by_rename_reads_the_old_file_to_its_end_first(tmp_path: Path) -> None:
    log, rec = tmp_path / "log", Recorder()
    append(log, "1\n")
    f = follower(log, rec)
    f.poll()
    append(log, "2\n3")  # written before the rename, not yet read; no newline at the end
    os.rename(log, tmp_path / "log.1")
    append(log, "4\n")
    f.poll()
    assert rec.text(log) == "1\n2\n3\n4\n"  # a newline ends the old file's last line
    assert rec.kinds() == ["added", "rotated"]


def test_renamed_away_then_a_new_file(tmp_path: Path) -> None:
    log, rec = tmp_path / "log", Recorder()
    append(log, "1\n")
    f = follower(log, rec)
    f.poll()
    os.rename(log, tmp_path / "log.1")
    f.poll()
    f.poll()
    append(log, "2\n")
    f.poll()
    assert rec.text(log) == "1\n2\n"
    assert rec.kinds() == ["added", "rotated", "added"]


def test_copytruncate_shrunk_or_rewritten_past_the_offset(tmp_path: Path) -> None:
    log, rec = tmp_path / "log", Recorder()
    append(log, "line 1\nline 2\n")
    f = follower(log, rec)
    f.poll()
    os.truncate(log, 0)
    append(log, "line 3\n")
    f.poll()  # smaller than the offset
    os.truncate(log, 0)
    append(log, "line 4 is longer than what was read\n")
    f.poll()  # larger than the offset: only the first bytes tell
    assert rec.text(log) == "line 1\nline 2\nline 3\nline 4 is longer than what was read\n"
    assert rec.kinds() == ["added", "truncated", "truncated"]


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_writer_still_appending_to_the_renamed_file_is_read_until_it_is_quiet(tmp_path: Path) -> None:
    """logrotate's `create` beside a writer that reopens late: the old file is read by its descriptor
    while the new one is read from 0, each in whole lines, until the old one has been quiet a while."""
    log, rec, clock = tmp_path / "log", Recorder(), Clock()
    f = FileFollower(str(log), rec.on_data, rec, rotate_wait=5.0, clock=clock)
    with open(log, "a") as late:  # (a `tee -a` keeps its descriptor)
        late.write("old 1\n")
        late.flush()
        f.poll()
        os.rename(log, tmp_path / "log.1")
        append(log, "new 1\n")
        late.write("old 2\nold 3 half")
        late.flush()
        f.poll()
        assert rec.text(log) == "old 1\nold 2\nnew 1\n"  # the half line waits: "new 1" is not glued to it
        clock.now += 4.0
        late.write(" and its end\n")
        late.flush()
        append(log, "new 2\n")
        f.poll()
        clock.now += 4.9
        f.poll()
        assert f.fingerprints[0].names(os.stat(tmp_path / "log.1"))  # quiet for 4.9 s only: still read
        clock.now += 0.2
        f.poll()
    assert rec.text(log) == "old 1\nold 2\nnew 1\nold 3 half and its end\nnew 2\n"
    assert len(f.fingerprints) == 1 and f.retired and rec.kinds() == ["added", "rotated"]


def test_a_renamed_file_is_read_on_while_the_new_one_stays_empty(tmp_path: Path) -> None:
    """A writer that never reopens (`tee -a` for the whole job): a pause longer than the rotate wait
    (a checkpoint being saved) does not end the old file while nothing writes the new one."""
    log, rec, clock = tmp_path / "log", Recorder(), Clock()
    f = FileFollower(str(log), rec.on_data, rec, rotate_wait=5.0, clock=clock)
    with open(log, "a") as tee:
        tee.write("1\n")
        tee.flush()
        f.poll()
        os.rename(log, tmp_path / "log.1")
        log.touch()
        f.poll()
        clock.now += 600.0
        f.poll()
        tee.write("2\n")
        tee.flush()
        f.poll()
    assert rec.text(log) == "1\n2\n" and not f.retired


def test_copytruncate_takes_what_was_not_read_yet_from_the_copy(tmp_path: Path) -> None:
    log, rec = tmp_path / "log", Recorder()
    append(tmp_path / "log.10", "1\nsomething else\n")  # a copy from before: it begins as the log does
    append(log, "1\n")
    f = follower(log, rec)
    f.poll()
    append(log, "2\n3")  # written before logrotate's copy, not read yet
    shutil.copy(log, tmp_path / "log.1")
    os.truncate(log, 0)
    append(log, "4\n")  # truncated and copied again before the next look: that copy is read whole
    shutil.copy(log, tmp_path / "log.2")
    os.truncate(log, 0)
    append(log, "5\n")
    f.poll()
    assert rec.text(log) == "1\n2\n3\n4\n5\n"
    assert rec.events[1] == ("truncated", f"{log} at 0")


@pytest.mark.parametrize("grows_back", [False, True], ids=["shorter", "grown-back-past-the-offset"])
def test_a_file_cut_short_is_read_on_from_where_it_still_matches(tmp_path: Path, grows_back: bool) -> None:
    """A job rolled back to a checkpoint cuts its log and writes on: no line is read twice, none
    is missed, even when the file grew back past our offset before we looked (same first bytes)."""
    log, rec = tmp_path / "log", Recorder()
    lines = [f"iteration {step} | lm loss: 4.5\n" for step in range(1, 41)]
    append(log, "".join(lines[:30]))
    f = follower(log, rec)
    f.poll()
    append(log, "".join(lines[30:]))
    f.poll()
    os.truncate(log, len("".join(lines[:25])))
    new = [f"iteration {step} | lm loss: 4.4\n" for step in range(26, 26 + (20 if grows_back else 5))]
    append(log, "".join(new))
    assert (log.stat().st_size > f.offset) is grows_back
    f.poll()
    assert rec.text(log) == "".join(lines + new)
    assert rec.events[1] == ("truncated", f"{log} at {len(''.join(lines[:25]))}")


def test_deleted_then_created_again(tmp_path: Path) -> None:
    log, rec = tmp_path / "log", Recorder()
    append(log, "1\n")
    f = follower(log, rec)
    f.poll()
    os.remove(log)
    f.poll()
    f.poll()
    append(log, "2\n")
    f.poll()
    assert rec.text(log) == "1\n2\n"
    assert rec.kinds() == ["added", "missing", "added"]


def test_missing_and_unreadable_paths_are_reported_once(tmp_path: Path) -> None:
    rec = Recorder()
    missing, directory = follower(tmp_path / "nope", rec), follower(tmp_path, rec)
    for _ in range(3):
        missing.poll()
        directory.poll()
    assert rec.events == [("missing", str(tmp_path / "nope")), ("unreadable", f"{tmp_path}: not a regular file")]


def test_globs_pick_up_new_files_but_not_rotated_copies(tmp_path: Path) -> None:
    rec = Recorder()
    append(tmp_path / "rank0.log", "r0\n")
    fol = Follower([str(tmp_path / "rank*"), str(tmp_path / "other.log")], rec.on_data, rec)
    fol.poll(rescan=True)
    append(tmp_path / "rank1.log", "r1\n")
    os.rename(tmp_path / "rank0.log", tmp_path / "rank0.log.1")  # matches the glob too
    append(tmp_path / "rank0.log", "r0 again\n")
    for _ in range(2):
        fol.poll(rescan=True)
    assert rec.text(tmp_path / "rank0.log") == "r0\nr0 again\n"
    assert rec.text(tmp_path / "rank1.log") == "r1\n"
    assert str(tmp_path / "rank0.log.1") not in rec.data
    assert fol.reading == 2
    assert (str(tmp_path), False) in fol.watch_dirs()


def test_a_directory_is_searched_for_log_files(tmp_path: Path) -> None:
    rec = Recorder()
    fol = Follower([str(tmp_path)], rec.on_data, rec)
    fol.poll(rescan=True)
    (tmp_path / "a").mkdir()
    append(tmp_path / "a" / "train.log", "x\n")
    append(tmp_path / "notes.md", "not a log\n")
    fol.poll(rescan=True)
    assert list(rec.data) == [str(tmp_path / "a" / "train.log")]
    assert (str(tmp_path), True) in fol.watch_dirs()


def test_the_event_waker_wakes_on_appends_and_new_files(tmp_path: Path) -> None:
    log = tmp_path / "log"
    append(log, "1\n")
    waker = EventWaker()
    try:
        waker.watch({(str(tmp_path), False)})
        waker.wait(0)  # forget anything before this point
        for change, naming in ((lambda: append(log, "2\n"), False), (lambda: append(tmp_path / "new", "x\n"), True)):
            change()
            start = time.monotonic()
            assert waker.wait(5.0) is naming
            assert time.monotonic() - start < 1.0
            time.sleep(0.05)
            waker.wait(0)
        assert waker.mode == "inotify"
    finally:
        waker.close()


def test_polling_is_chosen_by_flag_or_by_filesystem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert choose_waker(0.5, {(str(tmp_path), False)}).mode == "polling every 0.5 s (--poll)"
    monkeypatch.setattr(wake, "network_mount", lambda path: Mount("/lus", "lustre") if path == "/lus/run" else None)
    waker = choose_waker(None, {("/home/me", False), ("/lus/run", True)})
    assert isinstance(waker, PollWaker)
    assert waker.mode == "polling every 0.25 s (/lus is lustre: no inotify events from other nodes)"


MOUNTINFO = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 253:1 / / rw,relatime shared:1 - ext4 /dev/vda rw
40 27 0:50 / /lus rw,relatime shared:20 - lustre 10.0.0.1@o2ib:/lus rw
41 40 0:51 / /lus/home rw - nfs4 server:/home rw,vers=4.2
42 27 0:52 / /mnt/my\\040drive rw - fuse.sshfs me@host: rw
"""


def test_mount_table_longest_prefix_and_network_types() -> None:
    table = parse_mountinfo(MOUNTINFO)
    assert mount_of("/lus/scratch/run/log", table) == Mount("/lus", "lustre")
    assert mount_of("/lus/home/me/log", table) == Mount("/lus/home", "nfs4")
    assert mount_of("/lustre-not/log", table) == Mount("/", "ext4")
    assert mount_of("/mnt/my drive/log", table) == Mount("/mnt/my drive", "fuse.sshfs")
    assert parse_mounts("server:/home /home nfs rw 0 0\n") == [Mount("/home", "nfs")]
    assert [t for t in ("lustre", "nfs4", "gpfs", "cifs", "smb3", "ceph", "fuse.sshfs") if not is_network_fs(t)] == []
    assert not any(is_network_fs(t) for t in ("ext4", "xfs", "tmpfs", "overlay", "btrfs"))


class FollowMachine(RuleBasedStateMachine):
    """Random writes, rotations, truncations and deletions against a model of the expected bytes.

    Rules keep to what a tailer can promise: a file is looked at before it is truncated or deleted
    (what was written in between is lost by design), and between two rotations.
    """

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp())
        self.log = self.dir / "log"
        self.rec = Recorder()
        self.follower = follower(self.log, self.rec)
        self.expected = bytearray()
        self.counter = 0
        self.rotations = 0
        self.rotated_since_poll = False

    def _switch(self) -> None:
        """The model of a file change: the last line of the old file is ended."""
        if self.expected and not self.expected.endswith(b"\n"):
            self.expected += b"\n"

    def _poll(self) -> None:
        self.follower.poll()
        self.rotated_since_poll = False

    @rule(lines=st.integers(0, 4), partial=st.booleans())
    def write(self, lines: int, partial: bool) -> None:
        text = ""
        for _ in range(lines):
            self.counter += 1
            text += f"line {self.counter}\n"
        if partial:
            self.counter += 1
            text += f"part {self.counter} "
        append(self.log, text)
        self.expected += text.encode()

    @rule()
    def poll(self) -> None:
        self._poll()

    @precondition(lambda self: self.log.exists() and not self.rotated_since_poll)
    @rule()
    def rotate(self) -> None:
        fp = self.follower.fingerprint
        if fp is None or not fp.names(self.log.stat()):
            self._poll()  # a file never looked at cannot be followed through a rename
        self.rotations += 1
        os.rename(self.log, self.dir / f"log.{self.rotations}")
        self._switch()
        self.rotated_since_poll = True

    @precondition(lambda self: self.log.exists())
    @rule()
    def copytruncate(self) -> None:
        self._poll()
        shutil.copy(self.log, self.dir / "log.copy")
        os.truncate(self.log, 0)
        if self.log.stat().st_size < self.follower.offset:
            self._switch()

    @precondition(lambda self: self.log.exists())
    @rule(data=st.data())
    def cut_short(self, data: st.DataObject) -> None:
        """Cut what was read back to a line's end (a job rolled back to a checkpoint): nothing is doubled.

        (A cut inside a line and an append make a new line in the file: it is read whole.)
        """
        self._poll()
        text = self.log.read_bytes()
        if self.follower.offset != len(text):
            return  # (a line not yet ended while a rotated file is read: cutting it would lose it)
        keep = data.draw(st.sampled_from([0, len(text), *(i + 1 for i, b in enumerate(text) if b == 10)]))
        os.truncate(self.log, keep)
        if keep < len(text):
            self._switch()

    @precondition(lambda self: self.log.exists())
    @rule()
    def delete(self) -> None:
        self._poll()
        os.remove(self.log)
        self._switch()

    @invariant()
    def nothing_lost_or_doubled(self) -> None:
        got = bytes(self.rec.data.get(str(self.log), b""))
        assert self.expected.startswith(got)

    def teardown(self) -> None:
        self._poll()
        got = bytes(self.rec.data.get(str(self.log), b""))
        self.follower.close()
        shutil.rmtree(self.dir)
        # (a file renamed away is still read while no new file holds bytes: its last line is not
        # ended yet, and while a new file is open beside it, that unfinished line is held back)
        assert self.expected.startswith(got)
        assert re.fullmatch(rb"(part \d+ )?\n?", bytes(self.expected)[len(got) :]), "more than an unfinished line"


TestFollowMachine = FollowMachine.TestCase
TestFollowMachine.settings = settings(max_examples=40, stateful_step_count=20, deadline=None)

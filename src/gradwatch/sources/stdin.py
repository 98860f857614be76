"""Standard input and named pipes as a log: `gradwatch check -`, `python train.py 2>&1 | gradwatch
tail -`, and `mkfifo p; gradwatch check p & python train.py > p`.

`check` reads the pipe to its end, blocking, like a file, in chunks of a file's size (memory stays
bounded however much comes). A named pipe is read the same way, its alerts named by its path: like
`cat p`, opening it waits for a writer (after a second, one line says so) and its end is when the
last writer closes it. `tail` must not block: a daemon thread
reads the pipe as fast as it is written (so the training, and a `tee` in front of us, never wait on
us) and hands chunks to the main loop, which it also wakes up; the end of input ends the tail.
The main loop takes them a file's chunk at a time (a backlog of 80 MB parsed at once took 2 GB),
and the thread reads ahead at most `READ_AHEAD_BYTES`: past that the writer waits for us.
"""

from __future__ import annotations

import os
import stat
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path

from gradwatch.errors import InputError, UsageError
from gradwatch.sinks.safe import safe_text
from gradwatch.sources.archive import CHUNK_BYTES, read_chunks
from gradwatch.sources.follow import OnData

__all__ = ["STDIN", "StdinFollower", "is_pipe", "read_log", "say_on_stderr"]

#: The path shown for standard input in reports and alerts.
STDIN = "<stdin>"
#: One read from the pipe (a pipe holds 64 KiB by default on Linux).
_READ_BYTES = 1 << 16
#: What the reading thread holds at most before the main loop takes it.
READ_AHEAD_BYTES = 64 << 20
#: How long a named pipe may wait for a writer before the user is told.
WAIT_NOTE_S = 1.0


def say_on_stderr(message: str) -> None:
    """A note on standard error, as the CLI writes its notes."""
    print(f"note: {safe_text(message)}", file=sys.stderr, flush=True)


def is_pipe(path: Path) -> bool:
    """Whether `path` is a named pipe (symlinks followed)."""
    try:
        return stat.S_ISFIFO(os.stat(path).st_mode)
    except OSError:
        return False


def read_log(
    path: Path | None, size: int = CHUNK_BYTES, on_wait: Callable[[str], None] | None = say_on_stderr
) -> Iterator[bytes]:
    """A log's bytes in chunks of about `size`: standard input (None) or a named pipe as a
    stream, to its end, else the file (`archive.read_chunks`). `on_wait` is told once when a named
    pipe has had no writer for `WAIT_NOTE_S` (None: nobody is told)."""
    if path is None:
        yield from _read_stream(_stdin_fd(), STDIN, size)
    elif is_pipe(path):
        fd = _open_pipe(path, on_wait)
        try:
            yield from _read_stream(fd, str(path), size)
        finally:
            os.close(fd)
    else:
        yield from read_chunks(path, size)


def _stdin_fd() -> int:
    try:
        fd = sys.stdin.fileno()
        os.fstat(fd)
    except (AttributeError, ValueError, OSError):
        raise UsageError("standard input is closed: pipe the log into gradwatch, or give its path") from None
    return fd


def _open_pipe(path: Path, on_wait: Callable[[str], None] | None) -> int:
    """Open a named pipe for reading: as `cat` does, this waits for a writer (Ctrl-C ends the wait)."""
    said = None
    if on_wait is not None:
        said = threading.Timer(WAIT_NOTE_S, on_wait, [f"waiting for a writer on {path} (a named pipe)…"])
        said.daemon = True
        said.start()
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror or e}") from None
    finally:
        if said is not None:
            said.cancel()


def _read_stream(fd: int, name: str, size: int) -> Iterator[bytes]:
    """All of a pipe's bytes, to its end, in chunks of about `size`."""
    buf = bytearray()
    while True:
        try:
            data = os.read(fd, size - len(buf))
        except OSError as e:
            raise InputError(f"{name}: read failed: {e.strerror or e}") from None
        if not data:
            break
        buf += data
        if len(buf) >= size:
            yield bytes(buf)
            buf.clear()
    if buf:
        yield bytes(buf)


class StdinFollower:
    """`tail -` and `tail PIPE`: both the source (`poll`) and the waker (`wait`) of the follow loop.

    A named pipe (`path`) is opened by the reading thread, which waits there for a writer while
    the tail runs (and its status says so)."""

    def __init__(self, on_data: OnData, path: Path | None = None) -> None:
        #: the path alerts name: the pipe's, or `STDIN`
        self.name = STDIN if path is None else str(path)
        self._path = path
        self._fd = _stdin_fd() if path is None else None
        #: what the status says the tail does
        self.mode = "reading standard input" if path is None else f"waiting for a writer on the named pipe {path}"
        self._on_data = on_data
        self._lock = threading.Condition()  # notified when the main loop took chunks
        self._chunks: deque[bytes] = deque()
        self._held = 0  # bytes in `_chunks`
        self._eof = False
        self._error: str | None = None
        self._ready = threading.Event()
        #: every byte of the input has been handed on
        self.ended = False
        threading.Thread(target=self._read, name="pipe", daemon=True).start()

    def _read(self) -> None:
        try:
            fd = self._fd
            if fd is None:  # a named pipe: waits for a writer
                fd = self._fd = os.open(str(self._path), os.O_RDONLY | os.O_CLOEXEC)
                self.mode = f"reading the named pipe {self._path}"
            while True:
                with self._lock:
                    self._lock.wait_for(lambda: self._held < READ_AHEAD_BYTES)
                chunk = os.read(fd, _READ_BYTES)
                if not chunk:
                    break
                with self._lock:
                    self._chunks.append(chunk)
                    self._held += len(chunk)
                self._ready.set()
        except OSError as e:
            self._error = e.strerror or str(e)
        finally:
            self._eof = True
            self._ready.set()

    @property
    def error(self) -> str | None:
        """Why reading stopped before the end of input (None: it did not)."""
        return self._error

    @property
    def reading(self) -> int:
        return 0 if self.ended else 1

    def poll(self, rescan: bool = False) -> None:
        """Hand on what was read since the last call, as one chunk of at most about `CHUNK_BYTES`
        (the rest at the next call, which `wait` then does not delay)."""
        eof = self._eof  # before taking the chunks: then no chunk can come after them
        taken: list[bytes] = []
        size = 0
        with self._lock:
            while self._chunks and size < CHUNK_BYTES:
                taken.append(self._chunks.popleft())
                size += len(taken[-1])
            self._held -= size
            left = bool(self._chunks)
            self._lock.notify()
        if taken:
            self._on_data(self.name, b"".join(taken))
        if left:
            self._ready.set()
        self.ended = eof and not left

    def wait(self, timeout: float) -> bool:
        """Return when data or the end of input arrived, or after `timeout` seconds."""
        self._ready.wait(max(0.0, timeout))
        self._ready.clear()
        return False

    def watch_dirs(self) -> set[tuple[str, bool]]:
        return set()

    def watch(self, dirs: set[tuple[str, bool]]) -> None:
        pass

    def close(self) -> None:
        pass

"""Standard input as a log: `gradwatch check -` and `python train.py 2>&1 | gradwatch tail -`.

`check` reads the pipe to its end, blocking, like a file. `tail` must not block: a daemon thread
reads the pipe as fast as it is written (so the training, and a `tee` in front of us, never wait on
us) and hands chunks to the main loop, which it also wakes up; the end of input ends the tail.
The main loop takes them a file's chunk at a time (a backlog of 80 MB parsed at once took 2 GB),
and the thread reads ahead at most `READ_AHEAD_BYTES`: past that the writer waits for us.
"""

from __future__ import annotations

import os
import sys
import threading
from collections import deque
from collections.abc import Iterator

from gradwatch.errors import InputError, UsageError
from gradwatch.sources.archive import CHUNK_BYTES
from gradwatch.sources.follow import OnData

__all__ = ["STDIN", "StdinFollower", "read_stdin"]

#: The path shown for standard input in reports and alerts.
STDIN = "<stdin>"
#: One read from the pipe (a pipe holds 64 KiB by default on Linux).
_READ_BYTES = 1 << 16
#: What the reading thread holds at most before the main loop takes it.
READ_AHEAD_BYTES = 64 << 20


def _stdin_fd() -> int:
    try:
        fd = sys.stdin.fileno()
        os.fstat(fd)
    except (AttributeError, ValueError, OSError):
        raise UsageError("standard input is closed: pipe the log into gradwatch, or give its path") from None
    return fd


def read_stdin(size: int = CHUNK_BYTES) -> Iterator[bytes]:
    """All of standard input, in chunks of about `size` bytes."""
    fd = _stdin_fd()
    buf = bytearray()
    while True:
        try:
            data = os.read(fd, size - len(buf))
        except OSError as e:
            raise InputError(f"{STDIN}: read failed: {e.strerror or e}") from None
        if not data:
            break
        buf += data
        if len(buf) >= size:
            yield bytes(buf)
            buf.clear()
    if buf:
        yield bytes(buf)


class StdinFollower:
    """`tail -`: both the source (`poll`) and the waker (`wait`) of the follow loop."""

    mode = "reading standard input"

    def __init__(self, on_data: OnData) -> None:
        self._fd = _stdin_fd()
        self._on_data = on_data
        self._lock = threading.Condition()  # notified when the main loop took chunks
        self._chunks: deque[bytes] = deque()
        self._held = 0  # bytes in `_chunks`
        self._eof = False
        self._error: str | None = None
        self._ready = threading.Event()
        #: every byte of standard input has been handed on
        self.ended = False
        threading.Thread(target=self._read, name="stdin", daemon=True).start()

    def _read(self) -> None:
        try:
            while True:
                with self._lock:
                    self._lock.wait_for(lambda: self._held < READ_AHEAD_BYTES)
                chunk = os.read(self._fd, _READ_BYTES)
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
            self._on_data(STDIN, b"".join(taken))
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

"""One scan at a time per state file: an exclusive `flock` on `STATE.lock` beside it.

flock rather than a PID file because the kernel drops the lock when its holder dies, however it
dies (SIGKILL, the OOM killer, a node reboot): a lock left behind never blocks a later scan. The
lock file itself stays in place; deleting it would race with a scan that has just opened it.
On NFS, Linux maps flock onto NFS byte-range locks, so two login nodes sharing a state file are
serialized too.
"""

from __future__ import annotations

import fcntl
import math
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gradwatch.errors import StateLockedError, UsageError

__all__ = ["state_lock"]

_POLL_S = 0.05


def _lock_path(state: Path) -> Path:
    return state.with_name(state.name + ".lock")


@contextmanager
def state_lock(state: Path, wait_s: float) -> Iterator[None]:
    """Hold the lock of `state` for the body; wait up to `wait_s` seconds for another holder.

    Raises:
        StateLockedError: another process still held it after `wait_s` seconds.
        UsageError: `wait_s` is no number of seconds; the lock file cannot be created
            (directory missing or not writable).
    """
    if not 0 <= wait_s < math.inf:  # (NaN too: a deadline of NaN is never reached)
        raise UsageError(f"--lock-wait must be a number of seconds, got {wait_s!r}")
    path = _lock_path(state)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as e:
        raise UsageError(f"cannot create the lock file {path}: {e.strerror or e}") from None
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise StateLockedError(
                        f"another gradwatch scan is using {state} (lock {path} still held after {wait_s:g} s); "
                        "this run did nothing: the next one will catch up, or pass a longer --lock-wait"
                    ) from None
                time.sleep(_POLL_S)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock

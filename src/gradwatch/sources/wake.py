"""When to look at the files again: at filesystem events (watchdog), or on a timer.

Events are only a wake-up signal: what changed is always found by reading offsets and comparing
fingerprints, so a lost or merged event costs latency, never lines. The event waker is watchdog's
native observer (inotify on Linux) on the directories that hold the files. Polling is used when
asked (`--poll`), when a file lives on a network filesystem (writes from other nodes raise no
inotify events there), or when the observer cannot start (inotify limits); `mode` says which,
and why, in words for the status line.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Protocol

from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver, ObservedWatch

from gradwatch.sources.mounts import network_mount

__all__ = ["DEFAULT_POLL_S", "EventWaker", "PollWaker", "Waker", "choose_waker"]

#: Poll interval on network filesystems and when inotify is unavailable.
DEFAULT_POLL_S = 0.25
#: Only these wake us: opens and closes (our own reads among them) do not.
_WAKING = [
    FileModifiedEvent,
    FileCreatedEvent,
    FileMovedEvent,
    FileDeletedEvent,
    DirCreatedEvent,
    DirMovedEvent,
    DirDeletedEvent,
]
#: Event types that may change which files exist (globs are searched again after them).
_NAMING = {"created", "moved", "deleted"}


class Waker(Protocol):
    #: how following works, for the status line ("inotify", "polling every 0.25 s (--poll)")
    mode: str

    def watch(self, dirs: set[tuple[str, bool]]) -> None:
        """Watch exactly these (directory, recursive) pairs from now on."""

    def wait(self, timeout: float) -> bool:
        """Return after a change or `timeout` seconds; True when files may have appeared or gone."""

    def close(self) -> None: ...


class PollWaker:
    """Wake every `interval` seconds: the only way on filesystems that send no events."""

    def __init__(self, interval: float, why: str) -> None:
        self.interval = interval
        self.mode = f"polling every {interval:g} s ({why})"

    def watch(self, dirs: set[tuple[str, bool]]) -> None:
        pass

    def wait(self, timeout: float) -> bool:
        time.sleep(max(0.0, min(timeout, self.interval)))
        return False

    def close(self) -> None:
        pass


class _Handler(FileSystemEventHandler):
    def __init__(self, waker: EventWaker) -> None:
        self._waker = waker

    def on_any_event(self, event: FileSystemEvent) -> None:
        self._waker.notify(event.event_type in _NAMING)


class EventWaker:
    """Wake on filesystem events in the watched directories (watchdog's native observer)."""

    def __init__(self) -> None:
        self._observer: BaseObserver = Observer()
        self._observer.start()
        self._event = threading.Event()
        self._naming = False
        self._watches: dict[tuple[str, bool], ObservedWatch] = {}
        self._handler = _Handler(self)
        self._fallback: float | None = None
        self.mode = type(self._observer).__name__.removesuffix("Observer").lower() or "filesystem events"

    def notify(self, naming: bool) -> None:
        """Called from the observer's thread."""
        if naming:
            self._naming = True
        self._event.set()

    def watch(self, dirs: set[tuple[str, bool]]) -> None:
        for key in self._watches.keys() - dirs:
            with contextlib.suppress(KeyError, OSError):
                self._observer.unschedule(self._watches.pop(key))
        for key in dirs - self._watches.keys():
            path, recursive = key
            try:
                self._watches[key] = self._observer.schedule(
                    self._handler, path, recursive=recursive, event_filter=_WAKING
                )
            except OSError as e:  # inotify watch or instance limit: poll instead, and say so
                self._fallback = DEFAULT_POLL_S
                self.mode = f"polling every {DEFAULT_POLL_S:g} s (inotify failed on {path}: {e.strerror or e})"

    def wait(self, timeout: float) -> bool:
        if self._fallback is not None:
            timeout = min(timeout, self._fallback)
        self._event.wait(max(0.0, timeout))
        self._event.clear()
        naming, self._naming = self._naming, False
        return naming

    def close(self) -> None:
        self._observer.stop()
        self._observer.join(timeout=2)


def choose_waker(poll: float | None, dirs: set[tuple[str, bool]]) -> Waker:
    """`--poll` if given; else polling when any directory is on a network filesystem; else events."""
    if poll is not None:
        return PollWaker(poll, "--poll")
    for path, _ in sorted(dirs):
        mount = network_mount(path)
        if mount is not None:
            return PollWaker(DEFAULT_POLL_S, f"{mount.point} is {mount.fstype}: no inotify events from other nodes")
    return EventWaker()  # falls back to polling by itself when a watch cannot be added

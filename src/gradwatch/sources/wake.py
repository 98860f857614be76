"""When to look at the files again: at filesystem events (watchdog), or on a timer.

Events are only a wake-up signal: what changed is always found by reading offsets and comparing
fingerprints, so a lost or merged event costs latency, never lines. The event waker is watchdog's
native observer (inotify on Linux) on the directories that hold the files. Polling is used when
asked (`--poll`), when a file lives on a network filesystem (writes from other nodes raise no
inotify events there), or when the observer cannot start (inotify limits); `mode` says which,
and why, in words for the status line.

Between wake-ups, files seen truncated get quick looks of their own (`QuickLooks`): copytruncate
loses what the writer appends between logrotate's copy and its truncate, unless it was read before.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
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

__all__ = ["DEFAULT_POLL_S", "EventWaker", "PollWaker", "QuickLooks", "Waker", "choose_waker"]

#: Poll interval on network filesystems and when inotify is unavailable.
DEFAULT_POLL_S = 0.25
#: A file seen truncated is looked at this often right after...
QUICK_LOOK_S = 0.05
#: ...then less and less often (tenfold over this time), and like the others after it.
QUICK_FOR_S = 120.0
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


class QuickLooks:
    """Files seen truncated, looked at on their own between two wake-ups, and more often.

    With copytruncate, the lines a writer appends between logrotate's copy and its truncate are in
    neither file: only a look between the two reads them. A file truncated once is likely to be
    again (logrotate by size, a job that rotates its own log), so it is looked at every
    `QUICK_LOOK_S` right after a truncation, then less and less often over `QUICK_FOR_S` (0.05 s,
    0.16 s a minute later, 0.5 s after two), after which it is looked at like the others. A quick
    look reads these files alone, never all the others (`look` is given their paths).
    """

    def __init__(self, look: Callable[[set[str]], None], clock: Callable[[], float] = time.monotonic) -> None:
        self._look, self._clock = look, clock
        self._since: dict[str, float] = {}  # path: when it was last seen truncated

    def truncated(self, path: str) -> None:
        self._since[path] = self._clock()

    def every(self, now: float) -> float | None:
        """How often the files seen truncated are looked at now (together, at the pace of the latest
        truncation); None when there is none left."""
        for path, since in list(self._since.items()):
            if now - since >= QUICK_FOR_S:
                del self._since[path]
        if not self._since:
            return None
        return QUICK_LOOK_S * 10 ** ((now - max(self._since.values())) / QUICK_FOR_S)

    def wait(self, seconds: float, sleep: Callable[[float], bool]) -> bool:
        """Sleep `seconds` by `sleep` (which returns True when an event ended it: so does this),
        with quick looks at the files seen truncated meanwhile."""
        now = self._clock()
        end = now + seconds
        while (every := self.every(now)) is not None and now + every < end:
            if sleep(every):
                return True
            self._look(set(self._since))
            now = self._clock()
        return sleep(max(0.0, end - now))


def _sleep(seconds: float) -> bool:
    time.sleep(seconds)
    return False


class PollWaker:
    """Wake every `interval` seconds: the only way on filesystems that send no events."""

    def __init__(self, interval: float, why: str, quick: QuickLooks | None = None) -> None:
        self.interval = interval
        self.mode = f"polling every {interval:g} s ({why})"
        self._quick = quick

    def watch(self, dirs: set[tuple[str, bool]]) -> None:
        pass

    def wait(self, timeout: float) -> bool:
        seconds = max(0.0, min(timeout, self.interval))
        if self._quick is None:
            return _sleep(seconds)
        return self._quick.wait(seconds, _sleep)

    def close(self) -> None:
        pass


class _Handler(FileSystemEventHandler):
    def __init__(self, waker: EventWaker) -> None:
        self._waker = waker

    def on_any_event(self, event: FileSystemEvent) -> None:
        self._waker.notify(event.event_type in _NAMING)


class EventWaker:
    """Wake on filesystem events in the watched directories (watchdog's native observer)."""

    def __init__(self, quick: QuickLooks | None = None) -> None:
        self._quick = quick
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
        timeout = max(0.0, timeout)
        if self._quick is None:
            self._event.wait(timeout)
        else:  # (the quick looks are a safety net here: the file's writes wake us anyway)
            self._quick.wait(timeout, self._event.wait)
        self._event.clear()
        naming, self._naming = self._naming, False
        return naming

    def close(self) -> None:
        self._observer.stop()
        self._observer.join(timeout=2)


def choose_waker(poll: float | None, dirs: set[tuple[str, bool]], quick: QuickLooks | None = None) -> Waker:
    """`--poll` if given; else polling when any directory is on a network filesystem; else events.
    `quick`: the files seen truncated, looked at between wake-ups."""
    if poll is not None:
        return PollWaker(poll, "--poll", quick)
    for path, _ in sorted(dirs):
        mount = network_mount(path)
        if mount is not None:
            why = f"{mount.point} is {mount.fstype}: no inotify events from other nodes"
            return PollWaker(DEFAULT_POLL_S, why, quick)
    return EventWaker(quick)  # falls back to polling by itself when a watch cannot be added

"""Progress of a long `check` on standard error: which file, how far, how fast, time left.

Shown only when standard error is a terminal (a CI log or a pipe gets nothing) and gone when the
check ends, so that the report is what stays on the screen. File names are shown as text, never
as markup.
"""

from __future__ import annotations

import stat
from contextlib import AbstractContextManager
from pathlib import Path
from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.text import Text

#: Smaller files are done before a bar would be worth drawing.
MIN_BYTES = 32 << 20


class CheckProgress(AbstractContextManager["CheckProgress"]):
    """One bar per file being checked; `advance` is given the bytes read since the last call."""

    def __init__(self, console: Console | None = None) -> None:
        self._console = console or Console(stderr=True)
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    @property
    def enabled(self) -> bool:
        return self._console.is_terminal

    def __enter__(self) -> CheckProgress:
        if self.enabled:
            self._progress = Progress(
                TextColumn("{task.fields[name]}"),
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                TimeRemainingColumn(),
                console=self._console,
                transient=True,
            )
            self._progress.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._progress is not None:
            self._progress.stop()

    def start_file(self, path: Path | None) -> None:
        """A new file (None: standard input, whose size is unknown); small files get no bar."""
        progress = self._progress
        if progress is None:
            return
        if self._task is not None:
            progress.remove_task(self._task)
            self._task = None
        size = _plain_size(path)
        if size is not None and size >= MIN_BYTES:
            self._task = progress.add_task("check", total=size, name=Text(path.name if path else "-"))

    def advance(self, nbytes: int) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.advance(self._task, nbytes)


def _plain_size(path: Path | None) -> int | None:
    """The size of a plain file, None for standard input or gzip (its read bytes are decompressed)."""
    if path is None:
        return None
    try:
        if not stat.S_ISREG(path.stat().st_mode):  # (a named pipe's open would wait for a writer)
            return None
        with open(path, "rb") as fh:
            if fh.read(2) == b"\x1f\x8b":
                return None
        return path.stat().st_size
    except OSError:
        return None

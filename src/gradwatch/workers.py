"""Worker processes for large files: how many, which files are worth them, and their start.

Kept apart from `gradwatch.segments` (which imports the parsers and numpy) so that a command can
start the workers' fork server before it imports anything heavy: the server then imports what a
worker runs (0.3 s: the parsers, pyarrow) while this process imports the detectors.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.forkserver
import os
from collections.abc import Iterable
from multiprocessing.context import BaseContext
from pathlib import Path

#: Files smaller than this are read in one process: starting workers would cost more.
MIN_PARALLEL_BYTES = 64 << 20
_MAX_JOBS = 8
#: what the fork server imports once, for every worker it forks: what a worker runs, and the
#: Arrow kernels its bulk readers use (not pandas: a worker builds no frames, runs no detectors)
_PRELOAD = ["gradwatch.segments", "pyarrow.compute"]


def default_jobs() -> int:
    """One worker per core this process may use, at most 8 (login nodes are shared)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, _MAX_JOBS))


def splittable(path: Path | None, jobs: int) -> bool:
    """Whether `path` is worth reading in parallel: a large plain (not gzip) file, and jobs > 1."""
    if path is None or jobs < 2:
        return False
    try:
        if path.stat().st_size < MIN_PARALLEL_BYTES:
            return False
        with open(path, "rb") as fh:
            return fh.read(2) != b"\x1f\x8b"
    except OSError:
        return False  # the sequential read reports it


def context() -> BaseContext:
    """The workers' multiprocessing context: forked from a server that imported gradwatch once."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    return ctx


def start_early(paths: Iterable[str], jobs: int | None) -> None:
    """Start the fork server now if one of `paths` (as given on the command line) will be read by
    workers; what it cannot tell cheaply (directories, globs) waits for the read."""
    jobs = jobs or default_jobs()
    if not any(splittable(Path(p), jobs) for p in paths):
        return
    context()
    with contextlib.suppress(OSError):  # no process to be had: the read says so, and goes on here
        multiprocessing.forkserver.ensure_running()

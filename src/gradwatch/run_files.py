"""The files of one run (`--run NAME`) in the order its jobs wrote them.

A run given as several files mixes two kinds: files written side by side (a file per rank or node,
their first steps about equal) and files written one after another (the `slurm-%j.out` of each
requeued job, each starting where a checkpoint of the one before left off). `check` reads them
job by job, so that each later job's first start is audited as a restart of the run against where
the job before left it (`--previous` for a pair of files, done here for all of them), and its
incidents follow the restart. A job's place comes from its first logged steps, read from the head
of each file; a shell glob's order (`slurm-9.out` after `slurm-10.out`) is no guide.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gradwatch.config import Settings
from gradwatch.detectors.resume_config import ResumeConfig, RunEnd
from gradwatch.errors import InputError
from gradwatch.parsers.stream import LogStream
from gradwatch.pipeline import FileCheck, new_stream
from gradwatch.records import columns_of
from gradwatch.sources import archive
from gradwatch.sources.stdin import is_pipe

__all__ = ["RunFile", "in_job_order", "run_left"]

#: how much of a file's head is read for its first steps
HEAD_BYTES = 16 << 20


@dataclass(frozen=True)
class RunFile:
    """A file of the run (None: standard input) and the job of the run that wrote it (0: first)."""

    path: Path | None
    job: int


def in_job_order(paths: Sequence[Path | None], settings: Settings, fmt: str | None) -> list[RunFile]:
    """`paths` by the job that wrote them: files whose first steps are within one logging interval
    of each other are one job (kept in the order given), a file that starts further on is a later
    job. Files without a step in their head (ranks that print no progress, standard input) stay
    with the first job."""
    heads = {path: _first_steps(path, settings, fmt) for path in paths}
    logged = sorted((p for p in paths if heads[p]), key=lambda p: heads[p][0])
    jobs: dict[Path | None, int] = {}
    job, start, interval = -1, 0, 0  # the job being gathered, its first step, its interval
    for path in logged:
        first = heads[path][0]
        if job < 0 or first - start > interval:
            job, start, interval = job + 1, first, _interval(heads[path])
        jobs[path] = job
    return sorted((RunFile(p, jobs.get(p, 0)) for p in paths), key=lambda f: f.job)


def run_left(checks: Iterable[FileCheck]) -> RunEnd | None:
    """Where the run was left by the files read so far (`tail` and `scan` with `--run`, when a
    file of the run appears: the next job's `slurm-%j.out`): the end of the file that logged the
    furthest step, against which the new file's first start is audited (a rank that starts late
    continues the run alike). None: no file has logged a step, or no restart audit runs."""
    audits = [
        (c.summary.last_step, audit)
        for c in checks
        if c.summary.last_step is not None
        for audit in c.detectors
        if isinstance(audit, ResumeConfig)
    ]
    return max(audits, key=lambda found: found[0])[1].end() if audits else None


def _interval(steps: tuple[int, ...]) -> int:
    return max(steps[1] - steps[0], 1) if len(steps) > 1 else 1


def _first_steps(path: Path | None, settings: Settings, fmt: str | None) -> tuple[int, ...]:
    """The first two steps logged in the head of `path` (fewer when it logs fewer). A named pipe
    is not peeked at: what a look took from it would be gone for the read that follows."""
    if path is None or is_pipe(path):
        return ()
    stream = new_stream(settings, fmt, str(path))
    steps: list[int] = []
    read = 0
    try:
        for chunk in archive.read_chunks(path, archive.CHUNK_BYTES):
            stream.feed(chunk)
            read += len(chunk)
            steps += _taken_steps(stream)
            if len(steps) >= 2 or read >= HEAD_BYTES:
                return tuple(steps[:2])
    except InputError:  # the check of the file will say what is wrong with it
        return tuple(steps[:2])
    stream.close()
    return tuple((steps + _taken_steps(stream))[:2])


def _taken_steps(stream: LogStream) -> list[int]:
    _, data = stream.take_columns()
    if data is None:
        return []
    steps = columns_of(data)["step"]
    return [int(s) for s in steps[steps >= 0][:2]]

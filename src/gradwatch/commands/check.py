"""`gradwatch check`: every file (or standard input, `-`) through the pipeline, one report."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from gradwatch.alerts import Alert, Severity
from gradwatch.commands.unknown_files import is_skipped, nothing_found, skipped_note, special_note
from gradwatch.config import Settings
from gradwatch.detectors.resume_config import RunEnd
from gradwatch.errors import InputError, UsageError
from gradwatch.incidents import Correlator, in_run_order
from gradwatch.parsers.stream import Batch
from gradwatch.pipeline import check_path, run_end
from gradwatch.run_files import RunFile, in_job_order
from gradwatch.sinks.progress import CheckProgress
from gradwatch.sinks.report import Report
from gradwatch.sources.exclude import Excludes
from gradwatch.sources.paths import Expanded
from gradwatch.sources.stdin import STDIN, is_pipe
from gradwatch.stragglers import stragglers

if TYPE_CHECKING:
    from gradwatch.sinks.snapshot import SnapshotWriter


def run_check(
    paths: list[str],
    settings: Settings,
    fmt: str | None,
    fail_on: Severity,
    snapshots: SnapshotWriter | None = None,
    jobs: int | None = None,
    previous: str | None = None,
    run: str | None = None,
    exclude: Excludes | None = None,
    note: Callable[[str], None] | None = None,
) -> Report:
    """Check `paths` in order, each file once; `-` is standard input (a file named `-` is `./-`),
    a named pipe is read as it is, as a stream.

    `jobs`: worker processes for a large file (None: `workers.default_jobs()`). `previous`: the
    log of the job before (`--previous`): each file's first start is a restart of the run it left.
    `run`: the files are one run of that name (`--run`): their alerts and incidents are the run's,
    a later job's file starts as a restart of the run (`run_files`), and a file that fell far
    behind the others is a straggler. `exclude`: files left out
    (`--exclude`). A file that a folder or glob brought in, in no known format, is left out of the
    report and named in one line to `note` (`commands.unknown_files`), and so are the named pipes,
    sockets and devices they met (never opened); `note` is also told when a named pipe waits for
    a writer.
    """
    from gradwatch.parsers import new_parsers
    from gradwatch.workers import default_jobs

    if fmt is not None and fmt not in {c.name for c in settings.custom_formats}:
        new_parsers(fmt)  # raises UsageError for an unknown format before any file is read
    if paths.count("-") > 1:
        raise UsageError("`-` (standard input) can be given once")
    report = Report(fail_on=fail_on)
    files: list[Path | None] = []  # None: standard input
    given = Expanded(exclude or Excludes())
    for arg in paths:
        files += [None] if arg == "-" else given.add(arg)
    if not files:
        raise nothing_found(paths, given.special)
    if given.special and note is not None:
        note(special_note(given.special))
    named = {Path(arg) for arg in paths}
    skipped: list[str] = []  # files a walk found, in no known format
    before = None if previous is None else run_end(Path(previous), settings, fmt)
    ordered = in_job_order(files, settings, fmt) if run is not None and len(files) > 1 else _one_job(files)
    correlator = Correlator(settings.incidents, run)
    found: dict[tuple[str, int], list[list[Alert]]] = {}  # (run, job) -> each file's alerts
    ends: dict[int, tuple[int, RunEnd]] = {}  # job -> where its furthest file left the run
    with CheckProgress() as progress:
        for f in ordered:
            path = f.path
            progress.start_file(None if path is None or is_pipe(path) else path)  # (a pipe has no size)
            name = STDIN if path is None else str(path)
            left = ends.get(f.job - 1)
            summary, alerts = check_path(
                path,
                settings,
                fmt,
                on_batch=_observer(correlator, name),
                snapshots=snapshots,
                jobs=jobs or default_jobs(),
                on_bytes=progress.advance,
                previous=before if left is None else left[1],
                on_end=_keep_end(ends, f.job),
                on_wait=note,
            )
            if is_skipped(path, named, summary, alerts, fmt):
                skipped.append(name)
                continue
            report.files.append(summary)
            found.setdefault((run or name, f.job), []).append(alerts)
    if skipped and not report.files:
        raise InputError(f"no log files in a known format in {', '.join(paths)}: {skipped_note(skipped)}")
    if skipped and note is not None:
        note(skipped_note(skipped))
    for per_file in found.values():
        correlator.add_all(in_run_order(per_file))
    if run is not None:
        correlator.add_all(stragglers(report.files, settings.stragglers))
    correlator.settle()
    report.alerts = sorted(correlator.alerts, key=Alert.sort_key)
    report.incidents = correlator.incidents
    return report


def _one_job(files: list[Path | None]) -> list[RunFile]:
    return [RunFile(path, 0) for path in files]


def _keep_end(ends: dict[int, tuple[int, RunEnd]], job: int) -> Callable[[RunEnd], None]:
    """What `check_path` tells where a file of `job` left the run: the file that logged the
    furthest step is where the next job resumes from."""

    def keep(end: RunEnd) -> None:
        step = -1 if end.last_step is None else end.last_step
        if job not in ends or step > ends[job][0]:
            ends[job] = (step, end)

    return keep


def _observer(correlator: Correlator, path: str) -> Callable[[Batch], None]:
    """What `check_path` calls with each batch of `path`: its restarts, overflows and steps go to
    the incidents (check tells no note: it reports the incidents at the end)."""

    def observe(batch: Batch) -> None:
        correlator.observe(path, batch)

    return observe

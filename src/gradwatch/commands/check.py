"""`gradwatch check`: every file (or standard input, `-`) through the pipeline, one report."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from gradwatch.alerts import Severity
from gradwatch.config import Settings
from gradwatch.errors import InputError, UsageError
from gradwatch.pipeline import check_path
from gradwatch.sinks.progress import CheckProgress
from gradwatch.sinks.report import Report
from gradwatch.sources.archive import expand_paths

if TYPE_CHECKING:
    from gradwatch.sinks.snapshot import SnapshotWriter


def run_check(
    paths: list[str],
    settings: Settings,
    fmt: str | None,
    fail_on: Severity,
    snapshots: SnapshotWriter | None = None,
    jobs: int | None = None,
) -> Report:
    """Check `paths` in order; `-` is standard input (a file named `-` is `./-`).

    `jobs`: worker processes for a large file (None: `workers.default_jobs()`).
    """
    from gradwatch.parsers import new_parsers
    from gradwatch.workers import default_jobs

    if fmt is not None and fmt not in {c.name for c in settings.custom_formats}:
        new_parsers(fmt)  # raises UsageError for an unknown format before any file is read
    if paths.count("-") > 1:
        raise UsageError("`-` (standard input) can be given once")
    report = Report(fail_on=fail_on)
    files: list[Path | None] = []  # None: standard input
    for arg in paths:
        files += [None] if arg == "-" else expand_paths([arg])
    if not files:
        raise InputError(f"no log files found in {', '.join(paths)}")
    with CheckProgress() as progress:
        for path in files:
            progress.start_file(path)
            summary, alerts = check_path(
                path, settings, fmt, snapshots=snapshots, jobs=jobs or default_jobs(), on_bytes=progress.advance
            )
            report.files.append(summary)
            report.alerts.extend(alerts)
    return report

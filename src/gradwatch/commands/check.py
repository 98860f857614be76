"""`gradwatch check`: every file through the pipeline, one report, progress on stderr."""

from __future__ import annotations

from gradwatch.alerts import Severity
from gradwatch.config import Settings
from gradwatch.pipeline import check_path
from gradwatch.sinks.report import Report
from gradwatch.sources.archive import expand_paths


def run_check(
    paths: list[str], settings: Settings, fmt: str | None, fail_on: Severity, progress: bool = False
) -> Report:
    from gradwatch.parsers import new_parsers

    if fmt is not None and fmt not in {c.name for c in settings.custom_formats}:
        new_parsers(fmt)  # raises UsageError for an unknown format before any file is read
    report = Report(fail_on=fail_on)
    files = expand_paths(paths)
    if not files:
        from gradwatch.errors import InputError

        raise InputError(f"no log files found in {', '.join(paths)}")
    for path in files:
        summary, alerts = check_path(path, settings, fmt)
        report.files.append(summary)
        report.alerts.extend(alerts)
    return report

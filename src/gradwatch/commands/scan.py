"""`gradwatch scan`: one unattended pass over logs that resumes where the previous pass stopped.

Made for cron. Under the state file's lock, each log is read from its saved offset only (from its
start when it was rotated or truncated) into its resumed parsers and detectors; a run silent for
longer than the stall limit by the wall clock is reported once; the alerts are grouped into
incidents (`gradwatch.incidents`, kept in the state between scans; `--run` makes the files one
run), and each incident at or above `fail_on` is queued for the notification sinks once when it
opens, again when it escalates and once when it ends; what is owed is saved, then delivered; the
Prometheus textfile is written; the state is saved again. A scan killed at any point leaves the
previous state or the new one, never a mix, and the next scan carries on from it. With
`--snapshot-dir`, each warning or critical alert gets a snapshot of its evidence; the recent lines
and records it shows are kept in the state, so an alert at the start of new bytes has its context.
"""

from __future__ import annotations

import os
import shlex
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gradwatch.alerts import Alert, Severity
from gradwatch.config import Settings
from gradwatch.detectors.stall import Stall
from gradwatch.errors import InputError, UsageError
from gradwatch.incidents import Correlator, Note, in_run_order
from gradwatch.pipeline import FileCheck, FileSummary
from gradwatch.sinks import prometheus
from gradwatch.sinks.outbox import CommandSink, Owed, Sink, WebhookSink, deliver, note_key
from gradwatch.sinks.scan_report import FileRead, ScanReport
from gradwatch.sinks.snapshot import SnapshotWriter
from gradwatch.sinks.webhook import check_url
from gradwatch.sources import checkpoint
from gradwatch.sources.archive import CHUNK_BYTES, expand_paths, read_chunks
from gradwatch.sources.checkpoint import FileState, ScanState
from gradwatch.sources.fingerprint import Fingerprint
from gradwatch.sources.lock import state_lock

__all__ = ["ScanOptions", "run_scan", "scan_options"]

#: Seconds a --notify-cmd may run per alert before it is killed.
NOTIFY_TIMEOUT_S = 30.0
_GZIP_MAGIC = b"\x1f\x8b"


@dataclass
class ScanOptions:
    state: Path
    fail_on: Severity = Severity.WARNING
    sinks: list[Sink] = field(default_factory=list)
    textfile: Path | None = None
    #: seconds to wait for another scan that holds the state file's lock
    lock_wait_s: float = 10.0
    snapshots: SnapshotWriter | None = None
    #: the files are one run of this name (`--run`); None: each file is a run
    run: str | None = None


def run_scan(
    paths: list[str],
    settings: Settings,
    options: ScanOptions,
    warn: Callable[[str], None],
) -> ScanReport:
    """Scan `paths` once; `warn` receives recoverable problems (one line each)."""
    if "-" in paths:
        raise UsageError("scan resumes files where the last scan stopped, which standard input cannot do: use check -")
    files = expand_paths(paths)
    if not files:
        raise InputError(f"no log files found in {', '.join(paths)}")
    report = ScanReport(fail_on=options.fail_on)
    with state_lock(options.state, options.lock_wait_s):
        state = checkpoint.load(options.state, checkpoint.config_digest(settings), warn)
        now = time.time()
        correlator = state.incidents = state.incidents or Correlator(settings.incidents, options.run)
        found: dict[str, list[list[Alert]]] = {}
        notes: list[Note] = []
        for path in files:
            summary, alerts = _scan_file(path, state, settings, now, report, options.snapshots, notes)
            report.files.append(summary)
            found.setdefault(options.run or str(path), []).append(sorted(alerts, key=Alert.sort_key))
        for per_file in found.values():
            for alert in in_run_order(per_file):
                kept, told = correlator.add(alert)
                if kept is not None:
                    report.alerts.append(kept)
                notes += told
        notes += correlator.settle()
        changed = {a.incident for a in report.alerts} | {n.incident for n in notes}
        report.incidents = [inc for inc in correlator.incidents if inc.id in changed]
        _queue(report.alerts, notes, state, options)
        _forget_vanished(state)
        if state.outbox and options.sinks:
            checkpoint.save(options.state, state)  # what is owed survives a crash during delivery
            report.delivery = deliver(state.outbox, options.sinks)
        report.owed = len(state.outbox)
        checkpoint.save(options.state, state)
    for error in report.delivery.errors:
        warn(f"notification failed: {error}")
    if options.textfile is not None:
        _export(options.textfile, report, state, now, warn)
    return report


def _scan_file(
    path: Path,
    state: ScanState,
    settings: Settings,
    now: float,
    report: ScanReport,
    snapshots: SnapshotWriter | None,
    notes: list[Note],
) -> tuple[FileSummary, list[Alert]]:
    """Read what is new in one file; returns its summary and the alerts of this scan. Its batches
    go to the incidents too; the notes of incidents they ended are added to `notes`."""
    key = str(path)
    fs = state.files.get(key) or FileState()
    read = report.reads[key] = FileRead(offset=fs.offset)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        reason = "no such file" if isinstance(e, FileNotFoundError) else f"cannot read: {e.strerror or e}"
        return FileSummary(key, error=f"{path}: {reason}"), []
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return FileSummary(key, error=f"{path}: not a regular file"), []
        state.files[key] = fs
        read.restarted = _why_restart(fs, fd, st)
        is_gzip = os.pread(fd, 2, 0) == _GZIP_MAGIC
        if is_gzip and read.restarted is None and st.st_size != fs.offset:
            read.restarted = "rewritten"  # a compressed log cannot be continued: read it again
        if read.restarted is not None:
            fs.restart()
            fs.check = FileCheck(key, settings)
        check = fs.check
        assert check is not None  # _why_restart says "new" when there is none
        if snapshots is not None:
            snapshots.watch(check)
        else:
            check.evidence = None  # kept by an earlier scan with --snapshot-dir: no use now

        def feed(chunk: bytes) -> list[Alert]:
            found = check.feed(chunk)
            return found if snapshots is None else snapshots.attach(check, found)

        assert state.incidents is not None  # (made by run_scan)
        observe = state.incidents.observe
        check.on_batch = lambda batch: notes.extend(observe(key, batch))

        check.summary.error = None
        records_before = check.summary.records
        alerts: list[Alert] = []
        try:
            if not is_gzip:
                alerts += _feed_range(fd, fs, feed, st.st_size, read)
            elif read.restarted is not None:
                for chunk in read_chunks(path):
                    alerts += feed(chunk)
                fs.offset = read.new_bytes = st.st_size
        except (OSError, InputError) as e:
            check.summary.error = str(e) if isinstance(e, InputError) else f"{path}: read failed: {e.strerror or e}"
        fs.fingerprint = Fingerprint.of(fd)
        check.on_batch = None  # (pickled with the state: no closures)
    finally:
        os.close(fd)
    read.offset = fs.offset
    summary = check.summary
    summary.format, summary.layout, summary.lines = check.stream.format, check.stream.layout, check.stream.lines
    if summary.records > records_before:
        fs.last_step, fs.last_step_at = summary.last_step, st.st_mtime
    stalled = _wall_clock_stall(check, fs, now)
    if snapshots is not None:
        alerts += snapshots.attach(check, stalled)
        snapshots.close(check)  # the end of this scan's input
    else:
        alerts += stalled
    return summary, alerts


def _why_restart(fs: FileState, fd: int, st: os.stat_result) -> str | None:
    """Why the open file cannot be continued from the saved offset; None when it can.

    Another device or inode at the path is a new file (rotation by rename, delete and re-create);
    the same inode, shorter than what was read or with other first bytes, was truncated and
    written again (copytruncate).
    """
    if fs.check is None or fs.fingerprint is None:
        return "new"
    if not fs.fingerprint.names(st):
        return "rotated"
    if st.st_size < fs.offset or fs.fingerprint.recheck(fd) is None:
        return "truncated"
    return None


def _feed_range(fd: int, fs: FileState, feed: Callable[[bytes], list[Alert]], end: int, read: FileRead) -> list[Alert]:
    """Feed the bytes from the saved offset to `end` (the size when the scan looked)."""
    alerts: list[Alert] = []
    while fs.offset < end:
        chunk = os.pread(fd, min(CHUNK_BYTES, end - fs.offset), fs.offset)
        if not chunk:
            break
        alerts += feed(chunk)
        fs.offset += len(chunk)
        read.new_bytes += len(chunk)
    return alerts


def _wall_clock_stall(check: FileCheck, fs: FileState, now: float) -> list[Alert]:
    if fs.last_step_at is None:
        return []
    for det in check.detectors:
        if isinstance(det, Stall):
            return det.wall_clock_stall(now, fs.last_step_at)
    return []


def _queue(alerts: list[Alert], notes: list[Note], state: ScanState, options: ScanOptions) -> None:
    """Count every alert; owe each note of an incident at or above fail_on to every sink, once
    (an end only where the incident was told)."""
    for alert in alerts:
        fs = state.files[alert.path or ""]
        counter = (alert.detector, str(alert.severity))
        fs.alerts[counter] = fs.alerts.get(counter, 0) + 1
    told = {key.rsplit(" ", 2)[0] for key in state.notified}
    for note in notes:
        key = note_key(note)
        due = note.incident in told if note.event == "ended" else note.severity >= options.fail_on
        if not due or key in state.notified:
            continue
        state.notified.add(key)
        told.add(note.incident)
        if options.sinks:
            state.outbox.append(Owed(note, {s.name for s in options.sinks}))


def _forget_vanished(state: ScanState) -> None:
    """A log that no longer exists needs no offset; what is still owed for it stays in the outbox."""
    for path in [p for p in state.files if not os.path.lexists(p)]:
        del state.files[path]


def _export(directory: Path, report: ScanReport, state: ScanState, now: float, warn: Callable[[str], None]) -> None:
    runs = []
    for summary in report.files:
        fs = state.files.get(summary.path)
        if fs is None:
            continue
        runs.append(
            prometheus.RunMetrics(
                path=summary.path,
                last_step=summary.last_step,
                values=dict(summary.last_values),
                seconds_since_step=None if fs.last_step_at is None else max(0.0, now - fs.last_step_at),
                alerts=dict(fs.alerts),
            )
        )
    try:
        prometheus.write_textfile(directory, prometheus.render(runs, now))
    except OSError as e:
        warn(f"cannot write the Prometheus textfile in {directory}: {e.strerror or e}")


def scan_options(
    state: str,
    fail_on: str,
    notify_cmd: str | None,
    webhook: str | None,
    webhook_format: str,
    textfile: str | None,
    lock_wait_s: float,
    snapshots: SnapshotWriter | None = None,
    run: str | None = None,
) -> ScanOptions:
    """Turn the command line into options; a bad value fails here, before any log is read."""
    sinks: list[Sink] = []
    if notify_cmd is not None:
        try:
            argv = shlex.split(notify_cmd)
        except ValueError as e:
            raise UsageError(f"--notify-cmd {notify_cmd!r}: {e}") from None
        if not argv:
            raise UsageError("--notify-cmd is empty; give the command to run for each new alert")
        sinks.append(CommandSink(argv, NOTIFY_TIMEOUT_S))
    if webhook is not None:
        check_url(webhook)
        sinks.append(WebhookSink(webhook, webhook_format))
    return ScanOptions(
        state=Path(state),
        fail_on=Severity.parse(fail_on),
        sinks=sinks,
        textfile=None if textfile is None else Path(textfile),
        lock_wait_s=lock_wait_s,
        snapshots=snapshots,
        run=run,
    )

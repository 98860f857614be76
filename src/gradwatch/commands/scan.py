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
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gradwatch.alerts import Alert, Severity
from gradwatch.commands.unknown_files import is_skipped, nothing_found, skipped_note, special_note
from gradwatch.config import Settings
from gradwatch.detectors.resume_config import RunEnd
from gradwatch.detectors.stall import Stall
from gradwatch.errors import InputError, UsageError
from gradwatch.incidents import Correlator, Note, in_run_order
from gradwatch.pipeline import FileCheck, FileSummary, internal_error, no_format_message
from gradwatch.run_files import run_left
from gradwatch.sinks import prometheus
from gradwatch.sinks.journal import Journal
from gradwatch.sinks.outbox import CommandSink, Owed, Sink, WebhookSink, deliver, note_key
from gradwatch.sinks.scan_report import FileRead, ScanReport
from gradwatch.sinks.snapshot import SnapshotWriter
from gradwatch.sinks.webhook import DEADLINE_S, check_url
from gradwatch.sources import checkpoint, resume, rotation
from gradwatch.sources.archive import CHUNK_BYTES, read_chunks
from gradwatch.sources.checkpoint import FileState, ScanState
from gradwatch.sources.exclude import Excludes
from gradwatch.sources.fingerprint import HEAD_BYTES, Fingerprint
from gradwatch.sources.lock import state_lock
from gradwatch.sources.marks import Marks
from gradwatch.sources.paths import expand
from gradwatch.sources.stdin import is_pipe
from gradwatch.stragglers import stragglers

__all__ = ["ScanOptions", "run_scan", "scan_options"]

#: Why a named pipe given to scan is not read.
PIPE_REFUSED = (
    "is a named pipe: scan reads files again where the last scan stopped, which a pipe cannot do "
    "(nothing was read from it); read it with `gradwatch check` or `gradwatch tail`"
)


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
    #: seconds one round of notifications may take in all (`--notify-timeout`)
    notify_timeout_s: float = DEADLINE_S


def run_scan(
    paths: list[str],
    settings: Settings,
    options: ScanOptions,
    warn: Callable[[str], None],
    exclude: Excludes | None = None,
    note: Callable[[str], None] | None = None,
) -> ScanReport:
    """Scan `paths` once, but the files `exclude` leaves out; `warn` receives recoverable problems
    (one line each). A file that a folder or glob brought in, in no known format (yet), is left
    out of the report and named in one line to `note` (`commands.unknown_files`), and so are the
    named pipes, sockets and devices they met. A named pipe named is refused (`PIPE_REFUSED`):
    it is never opened, scan reads files again where it left off."""
    if "-" in paths:
        raise UsageError("scan resumes files where the last scan stopped, which standard input cannot do: use check -")
    given = expand(paths, exclude)
    if not given.files:
        raise nothing_found(paths, given.special)
    pipes = [str(f) for f in given.files if is_pipe(f)]
    files = [f for f in given.files if str(f) not in pipes]
    named = {Path(arg) for arg in paths}
    skipped: list[str] = []  # files a walk found, in no known format
    report = ScanReport(fail_on=options.fail_on)
    with state_lock(options.state, options.lock_wait_s):
        state = checkpoint.load(options.state, settings, warn)
        journal = Journal.beside(options.state, warn)  # what was delivered, whatever the state lost
        now = time.time()
        correlator = state.incidents = state.incidents or Correlator(settings.incidents, options.run)
        found: dict[str, list[list[Alert]]] = {}
        notes: list[Note] = []
        matching = rotation.match(state.files, files, since=state.scanned_at)  # each saved file found again by identity
        state.scanned_at = now
        # (--run: where the files read before left the run, for a file of it that appears now)
        left = None if options.run is None else run_left(fs.check for fs in state.files if fs.check is not None)
        read = [(p, FileSummary(p, error=e), list[Alert]()) for p, e in matching.errors]
        read += [(p, FileSummary(p, error=f"{p}: {PIPE_REFUSED}"), []) for p in pipes]
        try:
            for fs, opened, why in matching.reads:
                try:
                    summary, alerts = _scan_file(
                        fs, opened, why, state, settings, now, report, options.snapshots, notes, left
                    )
                except Exception as e:  # a fault of ours on this file's content: the others are still scanned
                    state.files.remove(fs)  # (a new file to the next scan: the others' states stay usable)
                    read.append((opened.path, FileSummary(opened.path, error=internal_error(opened.path, e)), []))
                    continue
                if opened.scanned or alerts or report.reads[fs.key].new_bytes:  # (a rotated file: when it grew)
                    read.append((opened.path, summary, alerts))
        finally:
            matching.close()
        for path, summary, alerts in read:
            if is_skipped(Path(path), named, summary, alerts):
                skipped.append(path)
                continue
            report.files.append(summary)
            found.setdefault(options.run or summary.path, []).append(sorted(alerts, key=Alert.sort_key))
        if skipped and note is not None:
            note(skipped_note(skipped))
        if given.special and note is not None:
            note(special_note(given.special))
        if options.run is not None:
            of_run = [fs.check.summary for fs, _, _ in matching.reads if fs.check is not None]
            found.setdefault(options.run, []).append(_untold(stragglers(of_run, settings.stragglers), correlator))
        for per_file in found.values():
            for alert in in_run_order(per_file):
                kept, told = correlator.add(alert)
                if kept is not None:
                    report.alerts.append(kept)
                notes += told
        notes += correlator.settle()
        changed = {a.incident for a in report.alerts} | {n.incident for n in notes}
        report.incidents = [inc for inc in correlator.incidents if inc.id in changed]
        _queue(report.alerts, notes, state, options, journal)
        if state.outbox and options.sinks:
            checkpoint.save(options.state, state)  # what is owed survives a crash during delivery
            report.delivery = deliver(state.outbox, options.sinks, journal, options.notify_timeout_s)
        report.owed = len(state.outbox)
        checkpoint.save(options.state, state, warn)
    for error in report.delivery.errors:
        warn(f"notification failed: {error}")
    if options.textfile is not None:
        _export(options.textfile, report, state, now, warn)
    return report


def _scan_file(
    fs: FileState,
    opened: rotation.Opened,
    restarted: str | None,
    state: ScanState,
    settings: Settings,
    now: float,
    report: ScanReport,
    snapshots: SnapshotWriter | None,
    notes: list[Note],
    left: RunEnd | None = None,
) -> tuple[FileSummary, list[Alert]]:
    """Read what is new in one file (from its start when `restarted` says why); returns its
    summary and the alerts of this scan. Its batches go to the incidents too; the notes of
    incidents they ended are added to `notes`. `left`: where the run was left, for a file read
    from its start (the next job's log of a `--run`)."""
    key, fd, st = fs.key, opened.fd, opened.st
    read = report.reads.setdefault(key, FileRead(offset=fs.offset))
    read.restarted = restarted or read.restarted
    is_gzip = opened.gzip
    if is_gzip and restarted is None and st.st_size != fs.offset and not opened.compressed:
        read.restarted = restarted = "rewritten"  # a compressed log cannot be continued: read it again
    if restarted is not None or fs.check is None:
        fs.restart()
        fs.check = FileCheck(key, settings, previous=left)
    check = fs.check
    if snapshots is not None:
        snapshots.watch(check)
    else:
        check.evidence = None  # kept by an earlier scan with --snapshot-dir: no use now

    cut = opened.cut  # (cut short in place: what its first lines held before is not fed again)
    if cut is not None:
        read.restarted = "cut short"

    def feed(chunk: bytes) -> list[Alert]:
        nonlocal cut
        found = check.feed(chunk) if cut is None else resume.feed_after_cut(check, chunk, cut, fs.last_step)
        cut = None
        return found if snapshots is None else snapshots.attach(check, found)

    assert state.incidents is not None  # (made by run_scan)
    observe = state.incidents.observe
    check.on_batch = lambda batch: notes.extend(observe(key, batch))

    check.summary.error = None
    records_before = check.summary.records
    alerts: list[Alert] = []
    head = os.pread(fd, HEAD_BYTES, 0)  # (what the file held as it is read: it may be truncated meanwhile)
    last = bytearray(os.pread(fd, min(fs.offset, HEAD_BYTES), max(0, fs.offset - HEAD_BYTES)))
    seen = fs.fingerprint  # (cut short or rewritten since it was found: left as it is, the next scan sees how)
    changed = not is_gzip and cut is None and seen is not None and not seen.holds(fd, fs.offset)
    try:
        if cut is not None:
            alerts += resume.end_torn_line(check)
        if not is_gzip and not changed:
            alerts += _feed_range(fd, fs, feed, st.st_size, read, last)
        elif restarted is not None or opened.compressed:  # (compressed: read on from where it was read plain)
            for chunk in read_chunks(Path(opened.path), start=fs.offset):
                alerts += feed(chunk)
                read.new_bytes += len(chunk)
            fs.offset, fs.marks = st.st_size, Marks(st.st_size)  # (a gzip file's offset: its size)
    except (OSError, InputError) as e:
        check.summary.error = str(e) if isinstance(e, InputError) else f"{opened.path}: read failed: {e.strerror or e}"
    fs.fingerprint = Fingerprint.of(fd) if is_gzip else seen if changed else Fingerprint.of_read(st, head, last)
    fs.path = opened.path
    check.on_batch = None  # (saved with the state: no closures)
    read.offset = fs.offset
    summary = check.summary
    summary.format, summary.layout, summary.lines = check.stream.format, check.stream.layout, check.stream.lines
    if summary.records > records_before:
        fs.last_step, fs.last_step_at = summary.last_step, st.st_mtime
    elif not summary.records and summary.error is None and not any(a.severity >= Severity.WARNING for a in alerts):
        summary.error = no_format_message(summary.path, summary.lines)  # as `check` says (exit 2)
    stalled = _wall_clock_stall(check, fs, now)
    if snapshots is not None:
        alerts += snapshots.attach(check, stalled)
        snapshots.close(check)  # the end of this scan's input
    else:
        alerts += stalled
    return summary, alerts


def _untold(alerts: list[Alert], correlator: Correlator) -> list[Alert]:
    """The alerts that no scan before raised: a rank still behind at the same step is told once."""
    told = {(a.detector, a.path, a.step) for a in correlator.alerts}
    return [a for a in alerts if (a.detector, a.path, a.step) not in told]


def _feed_range(
    fd: int, fs: FileState, feed: Callable[[bytes], list[Alert]], end: int, read: FileRead, last: bytearray
) -> list[Alert]:
    """Feed the bytes from the saved offset to `end` (the size when the scan looked), marking
    where they were (`sources.marks`); `last` is left holding the last bytes read."""
    alerts: list[Alert] = []
    while fs.offset < end:
        chunk = os.pread(fd, min(CHUNK_BYTES, end - fs.offset), fs.offset)
        if not chunk:
            break
        alerts += feed(chunk)
        fs.marks.add(chunk, fs.marks.kept, at_end=False)
        fs.offset += len(chunk)
        read.new_bytes += len(chunk)
        last += chunk[-HEAD_BYTES:]
        del last[:-HEAD_BYTES]
    return alerts


def _wall_clock_stall(check: FileCheck, fs: FileState, now: float) -> list[Alert]:
    if fs.last_step_at is None:
        return []
    for det in check.detectors:
        if isinstance(det, Stall):
            return det.wall_clock_stall(now, fs.last_step_at)
    return []


def _queue(alerts: list[Alert], notes: list[Note], state: ScanState, options: ScanOptions, journal: Journal) -> None:
    """Count every alert; owe each note of an incident at or above fail_on to every sink, once
    (an end only where the incident was told), and never to a sink the journal says took it."""
    by_key = {fs.key: fs for fs in state.files}
    for alert in alerts:
        fs = by_key[alert.path or ""]
        counter = (alert.detector, str(alert.severity))
        fs.alerts[counter] = fs.alerts.get(counter, 0) + 1
    told = {key.rsplit(" ", 2)[0] for key in state.notified} | journal.incidents()
    for note in notes:
        key = note_key(note)
        due = note.incident in told if note.event == "ended" else note.severity >= options.fail_on
        if not due or key in state.notified:
            continue
        state.notified.add(key)
        told.add(note.incident)
        sinks = journal.owed_to(note, {s.name for s in options.sinks})
        if sinks:
            state.outbox.append(Owed(note, sinks))


def _export(directory: Path, report: ScanReport, state: ScanState, now: float, warn: Callable[[str], None]) -> None:
    runs = []
    by_key = {fs.key: fs for fs in state.files}
    for summary in report.files:
        fs = by_key.get(summary.path)
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
    notify_timeout_s: float = DEADLINE_S,
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
        sinks.append(CommandSink(argv))
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
        notify_timeout_s=notify_timeout_s,
    )

"""`gradwatch tail`: follow live logs, alert as things happen, run a command for the bad incidents.

One loop on the main thread: wait for a wake-up (a filesystem event, or the poll timer; files
seen truncated get quicker looks of their own meanwhile, `wake.QuickLooks`), read what is new in
every file, feed each file's own `FileCheck`, group its alerts into incidents (one `Correlator`
for all files; `--run` makes them one run), and hand alerts, incidents, file notices and statuses
to the output. History is read first in whole chunks, so baselines are warm when
following starts (`--from-end` skips it; detectors then start cold). `--on-alert` commands run on
a worker thread, one at a time, so a slow pager never delays reading; they run once when an
incident reaches `--on-alert-severity`, again when it escalates and once when it ends, only while
following, not for the history (an old alert must not `scancel` a job that has since
recovered). The stall detector is also asked, at every wake-up, about silence by the wall clock,
and with `--run`, whether a file of the run fell behind the others (`gradwatch.stragglers`).

`-` reads standard input instead (`python train.py 2>&1 | tee -p train.log | gradwatch tail -`):
all of it is live, and its end ends the tail like Ctrl-C does. With `--snapshot-dir`, each warning
or critical alert also gets a snapshot file of its evidence (`sinks/snapshot.py`). With
`--metrics-port`, the gauges of `scan --textfile` are served over HTTP, refreshed at each wake-up.

Exit codes are check's: 1 when an alert at or above `--exit-on` (else warning) was seen, 0 if not.
Ctrl-C, SIGTERM and the end of standard input read what is left, close the files (their partial
last line is parsed) and print the summary. Line numbers in alerts count from where following
began, across rotations.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
import shutil
import signal
import sys
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from gradwatch.alerts import Alert, Severity
from gradwatch.commands.unknown_files import special_kind
from gradwatch.config import Settings
from gradwatch.detectors.resume_config import RunEnd
from gradwatch.detectors.stall import Stall
from gradwatch.errors import ExitCode, UsageError
from gradwatch.incidents import Correlator, Note, in_run_order
from gradwatch.parsers.stream import Batch
from gradwatch.pipeline import FileCheck, internal_error, run_end
from gradwatch.plugins import failures as plugin_failures
from gradwatch.run_files import run_left
from gradwatch.sinks import prometheus
from gradwatch.sinks.metrics_http import MetricsServer
from gradwatch.sinks.notify import run_command
from gradwatch.sinks.snapshot import SnapshotWriter
from gradwatch.sinks.tailing import Notice, TailSink, TailStatus, TailSummary, severity_counts
from gradwatch.sources.exclude import Excludes
from gradwatch.sources.follow import DEFAULT_ROTATE_WAIT_S, Follower, OnData
from gradwatch.sources.paths import expand
from gradwatch.sources.resume import Cut, feed_after_cut
from gradwatch.sources.stdin import StdinFollower, is_pipe
from gradwatch.sources.wake import QuickLooks, Waker, choose_waker
from gradwatch.stragglers import StragglerWatch

__all__ = ["TailOptions", "run_tail"]

#: Every file is looked at this often even without an event (a safety net for missed events);
#: it is also the pace of the live view's age counters.
LOOK_EVERY_S = 0.5
#: Globs and directories are searched for new files at least this often (and after each
#: create/move/delete event).
RESCAN_EVERY_S = 1.0
#: lines/s is measured over this window.
RATE_WINDOW_S = 10.0


@dataclass(frozen=True, kw_only=True)
class TailOptions:
    """The command line of `gradwatch tail`, as given."""

    paths: tuple[str, ...]
    fmt: str | None = None
    poll: float | None = None
    from_end: bool = False
    #: live, text or jsonl; None: live on a terminal, text otherwise
    output: str | None = None
    on_alert: str | None = None
    on_alert_severity: str = "critical"
    on_alert_timeout: float = 30.0
    exit_on: str | None = None
    status_every: float = 300.0
    snapshot_dir: str | None = None
    #: serve Prometheus metrics on this port (0: any free one); None: do not
    metrics_port: int | None = None
    metrics_addr: str = "127.0.0.1"
    #: the files are one run of this name (`--run`); None: each file is a run
    run: str | None = None
    #: the log of the job before (`--previous`): each file's first start is a restart of its run
    previous: str | None = None
    #: seconds a rotated file is read on after it last grew (`--rotate-wait`)
    rotate_wait: float = DEFAULT_ROTATE_WAIT_S
    #: text output of the alerts and errors alone (`--quiet`)
    quiet: bool = False
    #: globs of files never followed (`--exclude`)
    exclude: tuple[str, ...] = ()


def run_tail(opts: TailOptions, settings: Settings, clock: Callable[[], float] = time.time) -> ExitCode:
    """Follow until Ctrl-C, SIGTERM, an `--exit-on` alert or the end of standard input; returns the exit code.

    Raises:
        UsageError: an unknown format, an `--on-alert` command that cannot run, `-` or a named
            pipe beside other paths or with `--from-end`, an unusable `--snapshot-dir`, `--output
            live` without a terminal, a `--metrics-port` that cannot be served, or `--quiet` with
            another output than text.
    """
    if "-" in opts.paths and len(opts.paths) > 1:
        raise UsageError("`-` (standard input) cannot be followed together with files: run one tail for each")
    if "-" in opts.paths and opts.from_end:
        raise UsageError("--from-end does not apply to standard input: a pipe has only what comes next")
    pipes = [p for p in opts.paths if p != "-" and is_pipe(Path(p))]
    if pipes and len(opts.paths) > 1:
        raise UsageError(f"{pipes[0]} is a named pipe, followed alone: run one tail for each pipe")
    if pipes and opts.from_end:
        raise UsageError(f"--from-end does not apply to {pipes[0]}, a named pipe: it has only what comes next")
    if opts.fmt is not None and opts.fmt not in {c.name for c in settings.custom_formats}:
        from gradwatch.parsers import new_parsers

        new_parsers(opts.fmt)  # raises UsageError naming the known formats
    argv = _command(opts.on_alert)
    return _Tail(opts, settings, _sink(opts.output, opts.quiet), argv, clock).run()


def _command(text: str | None) -> list[str] | None:
    if text is None:
        return None
    try:
        argv = shlex.split(text)
    except ValueError as e:
        raise UsageError(f"--on-alert {text!r}: {e}") from None
    if not argv:
        raise UsageError("--on-alert: the command is empty")
    if shutil.which(argv[0]) is None:
        raise UsageError(f"--on-alert: {argv[0]!r} is neither an executable file nor a command on PATH")
    return argv


def _sink(output: str | None, quiet: bool) -> TailSink:
    tty = sys.stdout.isatty()
    output = output or ("live" if tty and not quiet else "text")
    if quiet and output != "text":
        raise UsageError(f"--quiet is for --output text (a line per alert), not --output {output}")
    if output == "jsonl":
        from gradwatch.sinks.lines import JsonlSink

        return JsonlSink(sys.stdout)
    from gradwatch.commands.console import stdout_console

    if output == "live":
        if not tty:
            raise UsageError("--output live needs a terminal on stdout; use --output text or --output jsonl")
        from gradwatch.sinks.live import LiveSink

        return LiveSink(stdout_console())
    from gradwatch.sinks.lines import TextSink

    return TextSink(stdout_console(), quiet)


class _Tail:
    """The state of one run. It is also the `FollowEvents` that the follower reports to."""

    def __init__(
        self, opts: TailOptions, settings: Settings, sink: TailSink, argv: list[str] | None, clock: Callable[[], float]
    ) -> None:
        self.opts, self.settings, self.sink, self.argv, self.clock = opts, settings, sink, argv, clock
        # (read before anything is started that would need stopping: it may raise InputError)
        self.previous = None if opts.previous is None else run_end(Path(opts.previous), settings, opts.fmt)
        self.snapshots = (
            None
            if opts.snapshot_dir is None
            else SnapshotWriter.open(opts.snapshot_dir, settings.snapshots, self._snapshot_failed)
        )
        self.metrics = None if opts.metrics_port is None else MetricsServer.start(opts.metrics_addr, opts.metrics_port)
        self.on_alert_level = Severity.parse(opts.on_alert_severity)
        self.exit_level = Severity.parse(opts.exit_on) if opts.exit_on else None
        self.checks: dict[str, FileCheck] = {}
        self.stalls: dict[str, Stall | None] = {}
        self.last_step_at: dict[str, float] = {}
        self.alerts: list[Alert] = []
        self.counts = severity_counts([])  # of `alerts`, kept as they come: the status is made at every wake-up
        self.correlator = Correlator(settings.incidents, opts.run)
        self.stragglers = None if opts.run is None else StragglerWatch(settings.stragglers)
        self.paged: set[str] = set()  # incidents told to --on-alert: only they are told when they end
        self.stdin = _stream_follower(opts.paths, self._on_data)
        self.following = self.stdin is not None  # history is read (a pipe has none): alerts may run --on-alert
        self.history: dict[str, list[Alert]] = {}  # the history's alerts per file, told once it is read
        self.failed: set[str] = set()  # files gradwatch itself failed on: no longer judged
        self.cuts: dict[str, Cut] = {}  # files cut short far back, until their next bytes are read
        self.reason: str | None = None  # why the run stops; None while it goes on
        self.last_data: float | None = None
        self.rate: deque[tuple[float, int]] = deque()
        self.commands = ThreadPoolExecutor(max_workers=1, thread_name_prefix="on-alert") if argv else None
        self.pending: list[tuple[Note, Future[str | None]]] = []
        self.follower: Follower | StdinFollower
        self.waker: Waker
        self.quick: QuickLooks | None = None  # files seen truncated, looked at more often for a while
        if self.stdin is not None:
            self.follower = self.waker = self.stdin
        else:
            files = self.follower = Follower(
                list(opts.paths),
                self._on_data,
                self,
                from_end=opts.from_end,
                rotate_wait=opts.rotate_wait,
                exclude=Excludes(opts.exclude),
            )
            self.quick = QuickLooks(lambda paths: files.poll(rescan=False, only=paths))
            self.waker = choose_waker(opts.poll, files.watch_dirs(), self.quick)
            for path in expand(list(opts.paths), Excludes(opts.exclude)).special:  # (what the follower skips)
                self.sink.notice(Notice("skipped", str(path), f"{special_kind(path)}: never opened"))

    # ---- FollowEvents ---------------------------------------------------------------------------
    def file_added(self, path: str) -> None:
        self.sink.notice(Notice("added", path))

    def file_rotated(self, path: str) -> None:
        detail = "the old file is read on until quiet for --rotate-wait; the new one from its start"
        self.sink.notice(Notice("rotated", path, detail))

    def file_truncated(self, path: str, resumed_at: int, read_before: int) -> None:
        if read_before:
            self.cuts[path] = Cut(resumed_at, read_before)
        detail = "read again from its start" if resumed_at == 0 else f"cut short: read on from byte {resumed_at:,}"
        self.sink.notice(Notice("truncated", path, detail))
        if self.quick is not None:
            self.quick.truncated(path)

    def file_missing(self, path: str) -> None:
        self.sink.notice(Notice("missing", path, "waiting for it"))

    def file_unreadable(self, path: str, reason: str) -> None:
        self.sink.notice(Notice("unreadable", path, f"{reason}; trying again"))

    def _snapshot_failed(self, message: str) -> None:
        self.sink.notice(Notice("snapshot failed", self.opts.snapshot_dir or "", message))

    # ---- the run --------------------------------------------------------------------------------
    def run(self) -> ExitCode:
        handlers = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        forced = False
        try:
            try:
                self._follow()
            except KeyboardInterrupt:
                forced = self.reason == "interrupted"  # a second signal: nothing more is read
                self.reason = "interrupted"
            if self.reason == "interrupted" and not forced:
                with contextlib.suppress(KeyboardInterrupt):  # a second signal: what was read stands
                    self._read_rest()
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
            self._shut_down()
        return self._exit_code()

    def _on_signal(self, signum: int, frame: object) -> None:
        """Ctrl-C or SIGTERM: stop at the next wake-up, never in the middle of a read.

        An interrupt between reading bytes and parsing them would lose those lines; while the
        history is read (which can take a while) it interrupts at once, since nothing is live yet.
        A second one interrupts at once too: a read that does not end (a plugin's detector that
        hangs) must not leave `kill -9` as the only way out.
        """
        if not self.following or self.reason == "interrupted":
            raise KeyboardInterrupt
        self.reason = "interrupted"

    def _follow(self) -> None:
        self.follower.poll(rescan=True)  # the history, in whole chunks
        self._tell_history()
        self.following = True
        now = self.clock()
        self.waker.watch(self.follower.watch_dirs())
        self.sink.start(self._status(now))
        if self.metrics is not None:
            self._export_metrics(now)
            self.sink.notice(Notice("metrics", self.metrics.url, "served for Prometheus"))
        next_status, last_scan = now + self.opts.status_every, now
        while self.reason is None:
            changed = self.waker.wait(max(0.0, min(LOOK_EVERY_S, next_status - now)))
            now = self.clock()
            rescan = changed or now - last_scan >= RESCAN_EVERY_S
            self.follower.poll(rescan)
            if self.stdin is not None and self.stdin.ended and self.reason is None:
                self._end_of_input(self.stdin)
                break
            if rescan:
                self.waker.watch(self.follower.watch_dirs())
                last_scan = now
            self._wall_clock_stalls(now)
            self._stragglers(now)
            self._export_metrics(now)
            self._report_commands()
            periodic = now >= next_status
            if periodic:
                next_status = now + self.opts.status_every
            self.sink.status(self._status(now), periodic)

    def _read_rest(self) -> None:
        """After Ctrl-C: what was written up to now, then the end of every file."""
        self.follower.poll(rescan=False)
        self._close_checks()

    def _end_of_input(self, stdin: StdinFollower) -> None:
        if stdin.error is not None:
            self.sink.notice(Notice("unreadable", stdin.name, f"{stdin.error}; its end is taken as the end of input"))
        self.reason = "end of input"
        self._close_checks()

    def _close_checks(self) -> None:
        self._tell_history()  # (Ctrl-C while the history was read)
        for path, check in self.checks.items():
            found = None if path in self.failed else self._judged(path, check, check.close)
            if found is not None:
                self._dispatch(found)
            if self.snapshots is not None:
                self.snapshots.close(check)
        self._tell(self.correlator.settle())

    def _shut_down(self) -> None:
        self.waker.close()
        self.follower.close()
        if self.commands is not None:
            self.commands.shutdown(wait=True)  # an --exit-on run must still page someone
            self._report_commands()
        if self.snapshots is not None:
            self.snapshots.close_all()  # an --exit-on run: snapshots still waiting for lines get what came
        if self.metrics is not None:
            self.metrics.close()
        files = [
            dataclasses.replace(c.summary, format=c.stream.format, layout=c.stream.layout, lines=c.stream.lines)
            for c in self.checks.values()
        ]
        code = self._exit_code()
        self.sink.close(TailSummary(files, dict(self.counts), int(code), self.reason or "error"))

    def _run_left(self) -> RunEnd | None:
        """With --run, where the run was left when a file of it appears while following."""
        if not self.following or self.opts.run is None:
            return None
        return run_left(self.checks.values())

    def _exit_code(self) -> ExitCode:
        """As the process exits: 2 where a plugin or gradwatch itself failed on a file, else by the alerts."""
        if plugin_failures.any_failed() or self.failed:
            return ExitCode.USAGE
        level = self.exit_level if self.exit_level is not None else Severity.WARNING
        return ExitCode.ALERTS if any(a.severity >= level for a in self.alerts) else ExitCode.OK

    # ---- data in, alerts out --------------------------------------------------------------------
    def _on_data(self, path: str, data: bytes) -> None:
        if self.reason is not None and self.reason != "interrupted":
            return  # --exit-on fired earlier in this read: nothing more is judged (after Ctrl-C, what was written is)
        if path in self.failed:
            return
        check = self.checks.get(path)
        if check is None:
            check = self.checks[path] = FileCheck(
                path,
                self.settings,
                self.opts.fmt,
                on_batch=lambda batch: self._on_batch(path, batch),
                previous=self._run_left() or self.previous,
            )
            self.stalls[path] = next((d for d in check.detectors if isinstance(d, Stall)), None)
            if self.snapshots is not None:
                self.snapshots.watch(check)
            if data.startswith(b"\x1f\x8b"):  # (else silence: its bytes hold no record)
                detail = "gzip-compressed: tail follows plain text logs; `gradwatch check` reads it"
                self.sink.notice(Notice("unreadable", path, detail))
        self.last_data = self.clock()
        cut = self.cuts.pop(path, None)
        if cut is None:
            found = self._judged(path, check, lambda: check.feed(data))
        else:  # (the first bytes after a cut far back: lines read before are not read again)
            found = self._judged(path, check, lambda: feed_after_cut(check, data, cut, check.summary.last_step))
        if found is None:
            return
        if not self.following:
            self.history.setdefault(path, []).extend(found)
            return
        self._dispatch(found)
        self._tell(self.correlator.settle())

    def _judged(self, path: str, check: FileCheck, judge: Callable[[], list[Alert]]) -> list[Alert] | None:
        """The alerts of `judge` (the feed or the close of `check`), with their evidence; None when
        gradwatch itself failed on this file's content: it is no longer judged (its stall and
        straggler checks with it), the other files are still followed."""
        try:
            return self._evidenced(check, judge())
        except Exception as e:
            self.failed.add(path)
            self.sink.notice(Notice("unreadable", path, internal_error(path, e)))
            return None

    def _tell_history(self) -> None:
        """The alerts of what the files held when the tail started, in step order across the
        files (each file's in line order), as `check` tells them: not file after file, chunk
        after chunk."""
        per_file = [sorted(found, key=Alert.sort_key) for found in self.history.values()]
        self.history.clear()
        self._dispatch(in_run_order(per_file), in_order=True)
        self._tell(self.correlator.settle())

    def _evidenced(self, check: FileCheck, alerts: list[Alert]) -> list[Alert]:
        return alerts if self.snapshots is None else self.snapshots.attach(check, alerts)

    def _on_batch(self, path: str, batch: Batch) -> None:
        if len(batch.records):
            now = self.clock()
            # history: the file's last write is the best guess of when its last step was logged
            self.last_step_at[path] = now if self.following else min(now, _mtime(path, now))
        self.sink.batch(self.checks[path], batch)
        self._tell(self.correlator.observe(path, batch))

    def _dispatch(self, alerts: list[Alert], in_order: bool = False) -> None:
        for found in alerts if in_order else sorted(alerts, key=Alert.sort_key):  # (line order, as check groups them)
            alert, notes = self.correlator.add(found)
            if alert is None:
                continue  # another rank's copy of an alert already shown: that one names this file now
            self.alerts.append(alert)
            self.counts[str(alert.severity)] += 1
            self._tell(notes, alert)
            if self.exit_level is not None and alert.severity >= self.exit_level and self.reason is None:
                self.reason = f"--exit-on {self.exit_level}"

    def _tell(self, notes: list[Note], alert: Alert | None = None) -> None:
        """The alert that caused them, and incidents that opened, escalated or ended: to --on-alert
        while following (once an incident reached --on-alert-severity: then its escalations and its
        end too), then to the output."""
        for note in notes:
            page = note.incident in self.paged if note.event == "ended" else note.severity >= self.on_alert_level
            if self.commands is not None and self.following and page:
                assert self.argv is not None  # paged first: a screen that fails (a full disk) must not stop it
                self.paged.add(note.incident)
                future = self.commands.submit(run_command, self.argv, note, self.opts.on_alert_timeout)
                self.pending.append((note, future))
        if alert is not None:
            self.sink.alert(alert)
        for note in notes:
            self.sink.incident(note)

    def _wall_clock_stalls(self, now: float) -> None:
        for path, stall in self.stalls.items():
            at = self.last_step_at.get(path)
            if stall is not None and at is not None and path not in self.failed:
                self._dispatch(self._evidenced(self.checks[path], stall.wall_clock_stall(now, at)))

    def _stragglers(self, now: float) -> None:
        """With --run: a file that fell behind the others, by steps or by the stall detector's clock."""
        if self.stragglers is not None:
            judged = [p for p in self.checks if p not in self.failed]
            limits = {p: float("inf") if (stall := self.stalls[p]) is None else stall.limit() for p in judged}
            files = [self.checks[p].summary for p in judged]
            self._dispatch(self.stragglers.look(files, self.last_step_at, limits, now))

    def _export_metrics(self, now: float) -> None:
        if self.metrics is not None:
            runs = [
                prometheus.run_metrics(c.summary, self.last_step_at.get(p), now, self.alerts)
                for p, c in self.checks.items()
            ]
            self.metrics.update(runs)

    def _report_commands(self) -> None:
        still = []
        for note, future in self.pending:
            if not future.done():
                still.append((note, future))
                continue
            failure = future.result()
            if failure is not None:
                detail = f"{failure} (for incident {note.incident}, {note.event})"
                self.sink.notice(Notice("on-alert failed", note.alert.path or "", detail))
        self.pending = still

    def _status(self, now: float) -> TailStatus:
        lines = sum(c.stream.lines for c in self.checks.values())
        self.rate.append((now, lines))
        while self.rate[0][0] < now - RATE_WINDOW_S:
            self.rate.popleft()
        t0, lines0 = self.rate[0]
        return TailStatus(
            mode=self.waker.mode,
            files=self.follower.reading,
            lines=lines,
            records=sum(c.summary.records for c in self.checks.values()),
            lines_per_s=(lines - lines0) / (now - t0) if now > t0 else 0.0,
            idle_s=None if self.last_data is None else now - self.last_data,
            alerts=dict(self.counts),
        )


def _stream_follower(paths: tuple[str, ...], on_data: OnData) -> StdinFollower | None:
    """The follower of standard input (`-`) or of a named pipe, when that is what is tailed."""
    if paths == ("-",):
        return StdinFollower(on_data)
    if len(paths) == 1 and is_pipe(Path(paths[0])):
        return StdinFollower(on_data, Path(paths[0]))
    return None


def _mtime(path: str, default: float) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return default

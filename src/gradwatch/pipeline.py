"""source -> parse -> detect: the one pipeline every command runs.

`FileCheck` owns the parsers and detectors of one file. It is fed bytes (a whole archive in
chunks, or appends as a live file grows) and returns alerts as they are found; its summary
(format, records, steps, last values) feeds the reports.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gradwatch import segments, workers
from gradwatch.alerts import Alert, Severity
from gradwatch.config import Settings
from gradwatch.detectors import DETECTORS, Detector
from gradwatch.detectors.base import ColumnBatch
from gradwatch.detectors.resume_config import ResumeConfig, RunEnd, continue_run
from gradwatch.downsample import MinMaxBuckets
from gradwatch.errors import InputError, WorkerError
from gradwatch.events import Event, EventKind
from gradwatch.parsers import PARSERS, Parser, new_parsers
from gradwatch.parsers.generic import GenericParser
from gradwatch.parsers.stream import Batch, LogStream, format_text
from gradwatch.plugins import guard, loader
from gradwatch.records import METRICS, columns_of
from gradwatch.sources import archive
from gradwatch.sources.archive import read_chunks
from gradwatch.sources.stdin import STDIN, read_log, say_on_stderr
from gradwatch.spike_score import SpikeScore

if TYPE_CHECKING:
    from gradwatch.evidence import Evidence
    from gradwatch.sinks.snapshot import SnapshotWriter


@dataclass
class FileSummary:
    """What one file held, for reports."""

    path: str
    format: str | None = None
    #: how the format's parser read the file, where it says (the generic reader's layout)
    layout: str | None = None
    records: int = 0
    first_step: int | None = None
    last_step: int | None = None
    lines: int = 0
    last_values: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    spike_score: SpikeScore = field(default_factory=SpikeScore)
    #: per metric, min/max over the run in at most SHAPE_BUCKETS buckets (check's sparklines)
    shapes: dict[str, MinMaxBuckets] = field(default_factory=dict)
    #: ids of the detectors that judged the file (JUnit's test cases)
    detectors: tuple[str, ...] = ()
    #: what the run was told at each start: per `config` event, its line, step, source and
    #: canonical keys (the raw keys stay with the event: `gradwatch export --configs`); a tuple
    #: class default, as `detectors`
    configs: tuple[dict[str, Any], ...] = ()

    @property
    def format_text(self) -> str:
        """The format as people read it: with the layout where the parser says one."""
        return format_text(self.format, self.layout)


def config_summary(event: Event) -> dict[str, Any]:
    """A `config` event as reports give it: where, which block, and its canonical keys."""
    return {"line": event.line, "step": event.step, "source": event.data["source"], "config": event.data["config"]}


#: Buckets per metric kept for sparklines: small and fixed, whatever the log's length.
SHAPE_BUCKETS = 128


def _extra_parsers(settings: Settings) -> list[Parser]:
    extra: list[Parser] = []
    jsonl = PARSERS.get("jsonl")
    if jsonl is not None and settings.jsonl_aliases:
        extra.append(jsonl(aliases=settings.jsonl_aliases))  # type: ignore[call-arg]
    if settings.synonyms:
        extra.append(GenericParser(synonyms=settings.synonyms))
    if settings.custom_formats:
        from gradwatch.parsers.regex_format import RegexParser

        extra += [RegexParser(c.name, c.pattern, c.description) for c in settings.custom_formats]
    return extra


def build_parsers(settings: Settings, fmt: str | None, path: str = "") -> list[Parser]:
    custom = {c.name for c in settings.custom_formats}
    if fmt is not None and fmt in custom:
        auxiliary = [p for p in new_parsers(path=path) if p.auxiliary]
        return [p for p in _extra_parsers(settings) if p.name == fmt] + auxiliary
    parsers = new_parsers(fmt, path=path)
    extra = _extra_parsers(settings)
    if not extra:
        return parsers
    names = {p.name for p in extra}
    if fmt is None:
        main = [p for p in parsers if not p.auxiliary and p.name not in names]
        auxiliary = [p for p in parsers if p.auxiliary and not p.fallback]
        fallback = [p for p in extra if p.fallback] or [p for p in parsers if p.fallback]
        return [p for p in extra if not p.fallback] + main + auxiliary + fallback
    # a format named: the configured generic reader stands in for the registry's
    return [next((e for e in extra if e.fallback), p) if p.fallback else p for p in parsers]


def new_stream(settings: Settings, fmt: str | None, path: str = "") -> LogStream:
    """A stream of the file's parsers (`build_parsers`). Where `--format` names a parser, only
    its records are the file's: a log of another trainer is one without records, not a healthy
    DeepSpeed log (the auxiliary parsers' records stand in only where no format is named)."""
    parsers = build_parsers(settings, fmt, path)
    return LogStream(parsers, path, stand_ins=None if fmt is None else frozenset({fmt}))


def build_detectors(settings: Settings, path: str) -> list[Detector]:
    """The enabled detectors for one file; plugins' run behind a guard (`gradwatch.plugins.guard`)."""
    loader.load_installed()
    built: list[Detector] = []
    for det_id, cls in DETECTORS.items():
        config = settings.detectors[det_id] if det_id in settings.detectors else cls.Config()
        if config.enabled and (det := guard.new_detector(cls, config, path)) is not None:
            built.append(det)
    return built


def _ieee_arithmetic() -> np.errstate:
    """Detectors compare with values or settings near the largest float (a garbled `1.7E+308`,
    a ratio of 1e308): inf and NaN then compare as IEEE says, and numpy's warnings about them
    would only clutter the user's terminal."""
    return np.errstate(over="ignore", invalid="ignore", divide="ignore")


class FileCheck:
    """Parsers and detectors for one file, fed incrementally.

    `on_batch`, when given, sees every batch before the detectors do (live views keep their own
    recent-values window from it).
    """

    #: recent raw lines, records and events for snapshots (set by `SnapshotWriter.watch`; None: not kept)
    evidence: Evidence | None = None

    def __init__(
        self,
        path: str,
        settings: Settings,
        fmt: str | None = None,
        on_batch: Callable[[Batch], None] | None = None,
        previous: RunEnd | None = None,
    ) -> None:
        """`previous`: where the job before this file left the run (`--previous`, `run_end`)."""
        self.summary = FileSummary(path)
        self.stream = new_stream(settings, fmt, path)
        self.detectors = build_detectors(settings, path)
        if previous is not None:
            continue_run(self.detectors, previous)
        self.summary.detectors = tuple(d.id for d in self.detectors)
        self.on_batch = on_batch

    def feed(self, data: bytes) -> list[Alert]:
        self.parse(data)
        return self.run_parsed()

    def parse(self, data: bytes) -> None:
        """The first half of `feed`: parse `data`, keep what it holds for `run_parsed`."""
        if self.evidence is not None:
            self.evidence.data(data)
        self.stream.feed(data)

    def run_parsed(self) -> list[Alert]:
        """The second half of `feed`: the detectors on what was parsed since the last call."""
        return self._run(self._taken())

    def feed_batch(self, batch: Batch) -> list[Alert]:
        """Records parsed elsewhere, in file order (worker processes: `gradwatch.segments`)."""
        return self._run(batch)

    def close(self) -> list[Alert]:
        self.stream.close()
        alerts = self._run(self._taken())
        with _ieee_arithmetic():
            for det in self.detectors:
                alerts += det.finish()
        self.summary.format, self.summary.layout = self.stream.format, self.stream.layout
        self.summary.lines = self.stream.lines
        return alerts

    def _taken(self) -> ColumnBatch:
        """What the stream parsed since the last call: a batch of numpy columns, no frame built."""
        facts, data = self.stream.take_columns()
        return ColumnBatch.of_columns(facts, columns_of(data or {}))

    def _run(self, batch: Batch) -> list[Alert]:
        batch = ColumnBatch.of(batch)  # every reader shares one set of numpy columns
        self._summarise(batch)
        if self.evidence is not None:
            self.evidence.batch(batch)
        if self.on_batch is not None:
            self.on_batch(batch)
        alerts: list[Alert] = []
        with _ieee_arithmetic():
            for det in self.detectors:
                alerts += det.update(batch)
        return alerts

    def _summarise(self, batch: ColumnBatch) -> None:
        s = self.summary
        configs = [e for e in batch.events if e.kind is EventKind.CONFIG]
        if configs:
            s.configs = (*s.configs, *map(config_summary, configs))
        cols = batch.columns
        if len(cols) == 0:
            return
        s.records += len(cols)
        s.spike_score.update(cols)
        all_steps = cols["step"]
        steps = all_steps[all_steps >= 0]
        if len(steps):
            if s.first_step is None:
                s.first_step = int(steps[0])
            s.last_step = int(steps[-1])
        for name in METRICS:
            col = cols[name]
            mask = ~np.isnan(col)
            logged = col[mask]
            if len(logged):
                s.last_values[name] = float(logged[-1])
                shape = s.shapes.get(name)
                if shape is None:
                    shape = s.shapes[name] = MinMaxBuckets(SHAPE_BUCKETS)
                shape.add(all_steps[mask], logged)


def check_path(
    path: Path | None,
    settings: Settings,
    fmt: str | None = None,
    on_batch: Callable[[Batch], None] | None = None,
    snapshots: SnapshotWriter | None = None,
    jobs: int = 1,
    on_bytes: Callable[[int], None] | None = None,
    previous: RunEnd | None = None,
    on_end: Callable[[RunEnd], None] | None = None,
    on_wait: Callable[[str], None] | None = say_on_stderr,
) -> tuple[FileSummary, list[Alert]]:
    """Check one archived file, or all of standard input when `path` is None (or of a named pipe),
    from start to end.

    `on_batch` as in `FileCheck`; `snapshots` writes the evidence of each alert (and keeps the
    read in this process); `jobs` > 1 lets a large file be parsed by that many worker processes;
    `on_bytes` is told how many more bytes were read, as they are (progress bars); `previous` as
    in `FileCheck`; `on_end` is told where the file left its run (`run_end`), when the restart
    audit ran; `on_wait` is told when a named pipe waits for a writer (`sources.stdin.read_log`).
    """
    advance = on_bytes or (lambda n: None)
    check = FileCheck(STDIN if path is None else str(path), settings, fmt, on_batch, previous)
    if snapshots is not None:
        snapshots.watch(check)

    def evidenced(found: list[Alert]) -> list[Alert]:
        return found if snapshots is None else snapshots.attach(check, found)

    alerts: list[Alert] = []
    try:
        if snapshots is None and path is not None and workers.splittable(path, jobs):
            alerts += _read_split(check, path, jobs, advance)
        else:
            chunks = read_log(path, archive.CHUNK_BYTES, on_wait)
            for chunk in chunks:
                alerts += evidenced(check.feed(chunk))
                advance(len(chunk))
    except (InputError, WorkerError) as e:  # a missing file, a damaged gzip, a worker that failed:
        check.summary.error = str(e)  # what came before it is still checked (and the check fails)
    except Exception as e:  # a fault of ours on this file's content: the other files are still checked
        check.summary.error = internal_error(check.summary.path, e)
        return check.summary, sorted(alerts, key=Alert.sort_key)
    alerts += evidenced(check.close())
    audit = next((d for d in check.detectors if isinstance(d, ResumeConfig)), None)
    if on_end is not None and audit is not None:
        on_end(audit.end())
    if snapshots is not None:
        snapshots.close(check)
    if check.summary.records == 0 and check.summary.error is None and not _says_something(alerts):
        check.summary.error = no_format_message(check.summary.path, check.stream.lines, fmt)
    alerts.sort(key=Alert.sort_key)
    return check.summary, alerts


def run_end(path: Path, settings: Settings, fmt: str | None = None) -> RunEnd:
    """Where the log at `path` left its run (`--previous`): read as `check` reads it, with only
    the restart audit judging.

    Raises:
        InputError: the file cannot be read.
    """
    check = FileCheck(str(path), settings, fmt)
    audit = next((d for d in check.detectors if isinstance(d, ResumeConfig)), None) or ResumeConfig(path=str(path))
    check.detectors = [audit]
    for chunk in read_chunks(path, archive.CHUNK_BYTES):
        check.feed(chunk)
    check.close()
    return audit.end()


def _read_split(check: FileCheck, path: Path, jobs: int, advance: Callable[[int], None]) -> list[Alert]:
    """A large file: its head by a worker, then the rest by all of them when the format allows
    it (`gradwatch.segments`), else the rest here in order, exactly as `check_path` reads.

    The workers get their segments as soon as the head is read, before the detectors run on it.
    """
    try:
        reader = segments.SegmentReader(path, jobs)
    except OSError:  # no processes to be had (a shared login node's limits): all of it here
        reader = None
    alerts: list[Alert] = []
    read = 0  # bytes read by a worker: the head
    if reader is not None:
        with reader:
            check.stream, head_batches, read, ready = reader.head(check.stream)
            batches = reader.batches(check.stream, read) if ready else None  # (handed out now)
            for batch in head_batches:
                alerts += check.feed_batch(batch)
            advance(read)
            if batches is not None:
                for batch, final, size in batches:
                    alerts += check.feed_batch(batch)
                    advance(size)
                    if final is not None:
                        check.stream = final
                return alerts
    for chunk in read_chunks(path, archive.CHUNK_BYTES, start=read):  # no workers, or no format known in the head
        alerts += check.feed(chunk)
        advance(len(chunk))
    return alerts


def _says_something(alerts: list[Alert]) -> bool:
    """Whether a file without records still told of trouble (a crash before the first step):
    then it was read, and its alerts, not "no records", are what `check` reports and exits by."""
    return any(a.severity >= Severity.WARNING for a in alerts)


def internal_error(path: Path | str, error: Exception) -> str:
    """The message for a file on which gradwatch itself failed (a bug, not the log's fault): the
    file's check fails (exit 2) with it, the other files are still read, saved and notified."""
    return (
        f"{path}: gradwatch failed on this file ({type(error).__name__}: {error}); what came before is "
        "still reported, the other files are checked. Please report it with the file's lines near the end"
    )


def no_format_message(path: Path | str, lines: int, fmt: str | None = None) -> str:
    plural = "s" if lines != 1 else ""
    what = "is empty: no training records" if lines == 0 else f"has {lines} line{plural} but no training records"
    if fmt is not None and lines:
        return f"{path}: {what} in format {fmt} (given with --format; without it every known format is tried)"
    stand_ins = ("deepspeed", "fp16_scaler")  # the auxiliary parsers whose records may be a file's
    names = ", ".join(n for n, c in PARSERS.items() if not c.auxiliary or c.fallback or n in stand_ins)
    return (
        f"{path}: {what} in any known format (tried: {names}); if this is a trainer we do not "
        "know, name its metrics under formats.synonyms or add a regex format under formats.custom "
        "in a --config file (see `gradwatch config init`)"
    )

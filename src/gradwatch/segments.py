"""Reading one large archived file on several cores: segments cut at line starts, parsed by
worker processes, merged back in file order for the detectors.

A worker reads the file's head first (its first chunks, until the format is known:
`HEAD_BYTES`, `HEAD_LIMIT`; `read_head`), so that its templates are compiled; each worker then
starts from a copy of that stream, and this process takes the head's records and the stream.
(The head is read by a worker, not here, because the fork server has imported the bulk readers'
Arrow kernels while this process imported the detectors: a check in workers imports no Arrow
here.) Before its segment a worker reads a stretch of the lines just before it (the warm-up),
so that the facts carried
from line to line (the last step, the copy of a record another rank printed, the last overflow)
are what a sequential read would have had there; what it finds in the warm-up is dropped. A
record belongs to the segment that holds its first line: a worker finishes a multi-line record
still open at its segment's end and drops what begins after it. Detectors and summaries run in
the main process on the batches in file order, so alerts are those of a sequential read
(tests/test_segments.py).

What a warm-up cannot tell is checked (`LogStream.carried`): a step counted from the start of
the file (Hugging Face Trainer dicts numbered by position, JSON lines without a step, which the
worker guesses from a tqdm bar or a record's step), a multi-line record open since before the
warm-up (a long traceback), the log's clock (its last time, the latest record's). A segment is
kept where that is what the segment before ended with. Where it is not, the segment is read
again in order, going on from the stream the one before ended with (`snapshot`), and so are the
next 1, 2, 4... segments before guessing is tried again (`SegmentReader._read`); this process
runs the detectors on each segment while the next is read. A plugin's parser that is neither
`segment_safe` nor says what it carries is read in order from the start.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import pickle
import signal
import sys
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, NamedTuple, ParamSpec, Protocol, TypeVar

import numpy as np

from gradwatch import workers
from gradwatch.errors import InputError, WorkerError
from gradwatch.events import Event, EventKind
from gradwatch.parsers.stream import Batch, BatchFacts, LogStream
from gradwatch.plugins import failures, loader
from gradwatch.records import EXTRA_METRICS, columns_of, declare_extra_metrics, logged_columns
from gradwatch.sources import archive
from gradwatch.sources.archive import read_chunks

if TYPE_CHECKING:
    from gradwatch.detectors.base import ColumnBatch


class _Reports(Protocol):
    failures: list[str]


_Done = TypeVar("_Done", bound=_Reports)  # what a worker's task returns
_Args = ParamSpec("_Args")


class _TaskFailed(Exception):
    """What a worker's task raised, as text, with the plugin failures the worker withheld: often
    the cause (a plugin file that imports in the main process but not in a worker)."""

    def __init__(self, cause: str, withheld: list[str]) -> None:
        super().__init__(cause, withheld)  # (the arguments pickle it)
        self.cause, self.withheld = cause, withheld


def _in_worker(task: Callable[_Args, _Done]) -> Callable[_Args, _Done]:
    """A worker's task: what it raises comes back as `_TaskFailed`, but for the file's own
    InputError (it went away while read), which a read in order reports as it is."""

    @functools.wraps(task)
    def run(*args: _Args.args, **kwargs: _Args.kwargs) -> _Done:
        try:
            return task(*args, **kwargs)
        except InputError:
            raise
        except Exception as e:
            raise _TaskFailed(f"{type(e).__name__}: {e}", failures.since(0)) from None

    return run


#: The first chunk of a file that a worker reads to learn its format before the workers take
#: the rest: small, as they wait for it (1 MiB holds hundreds of records in every format)
HEAD_BYTES = 1 << 20
#: How far the head may grow, chunk by chunk, while the format is not known: past it, the rest
#: of the file is read in order by this process (its format may never be known)
HEAD_LIMIT = 16 << 20
#: One worker task: large enough that the warm-up and the sending of the stream cost little.
SEGMENT_BYTES = 16 << 20
#: Records a segment holds at most, as the head's density foretells: this process holds the
#: segments read ahead until the detectors take them (JSON lines hold 100,000 per 16 MiB)
SEGMENT_RECORDS = 65536
#: One task of a file read in order: no warm-up to pay for, so a batch the size of a sequential
#: read's (the detectors' memory grows with the batch)
IN_ORDER_BYTES = 4 << 20
#: Records per batch handed to the detectors: a segment's batch is cut into pieces of this many,
#: so that their memory stays bounded whatever the format's density. Each piece costs the
#: detectors some fixed work (pandas' rolling set-up, a few dozen numpy calls): 16,384 took a
#: fifth more of this process's CPU on a Megatron log (two pieces a segment), 65,536 some 30 MB more
BATCH_RECORDS = 32768
#: Lines before a segment that a worker reads to set up its parsers' state.
WARMUP_BYTES = 256 << 10
#: How far a worker reads past its segment's end to finish a record open there.
OVERRUN_LIMIT = 1 << 20
_READ_BYTES = 4 << 20


def stream_ready(stream: LogStream) -> bool:
    """Whether a stream that has read a file's head may be copied into workers.

    A record may still be open (OLMo's records end only when the next one begins): the first
    segment goes on from the head exactly, without a warm-up, and finishes it. A stream whose
    format may not be split is read in order by the workers (`SegmentReader.batches`).
    """
    return stream.format_locked and not stream.has_partial_line


@dataclass(frozen=True)
class _Task:
    path: str
    #: the pickled LogStream to start from: as it stood after the head, or (`chained`) at the
    #: end of the segment before
    template: bytes
    start: int  # the segment: bytes [start, end), both at line starts
    end: int
    last: bool  # the file's last segment: close the stream at its end
    warmup: int
    #: read in order: the stream at `start` is the template (the end of the task before)
    chained: bool = False
    #: read on past the end to finish a record open there (the next task begins with a warm-up
    #: and drops it); else the next task goes on from this one's end and finishes it
    overrun: bool = True
    #: (chained) records that begin up to this line (the stream's count) were taken by a task
    #: before, which read on past its end to finish the one open there: drop them here, however
    #: many segments that record spans
    taken_through: int = 0
    #: (not chained) what the parsers tell a guess, from the newest stream known (`LogStream.hints`)
    hints: dict[str, object] | None = None


@dataclass
class _Segment:
    facts: BatchFacts  # numbered as the worker counted: line `skip + 1` is the segment's first; no events
    records: dict[str, np.ndarray]  # the batch's records, as the columns that have values (`logged_columns`)
    events: _PackedEvents  # the batch's events, sent as columns
    skip: int
    lines: int  # lines in the segment proper
    size: int  # its bytes
    stream: LogStream | None  # the worker's stream after the last segment (the state after the file)
    carried_in: tuple[Any, ...]  # what the stream carried at the segment's start (`LogStream.carried`)
    carried_out: tuple[Any, ...]  # and at its end
    hints_out: dict[str, object]  # what the parsers tell a guess at its end (`LogStream.hints`)
    #: the stream at the segment's end, pickled (`LogStream.snapshot`), for a task to go on from
    end_state: bytes | None
    failures: list[str]  # plugin failures met in it, for the main process to report


class SegmentReader:
    """A pool of workers for one file; `batches` yields the rest of the file after its head."""

    def __init__(self, path: Path, jobs: int) -> None:
        self.path = path
        self.jobs = jobs
        #: how often a worker's guess of what its stream carried in was wrong (the segment was read
        #: again, in order), how many segments were read in order, of how many
        self.rereads = 0
        self.in_order = 0
        self.segments = 0
        self._pool = ProcessPoolExecutor(
            jobs,
            mp_context=workers.context(),
            initializer=_start_worker,
            initargs=(tuple(EXTRA_METRICS), loader.files_loaded()),
        )

    def __enter__(self) -> SegmentReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def head(self, stream: LogStream) -> HeadRead:
        """The file's head read by a worker, from `stream` (as yet unfed)."""
        sizes = (HEAD_BYTES, archive.CHUNK_BYTES, HEAD_LIMIT)  # (as this process has them)
        head = self._result(self._pool.submit(read_head, str(self.path), stream.snapshot(), *sizes))
        batches = (
            batch
            for facts, records, events in head.batches
            for batch, _, _ in _pieces(dataclasses.replace(facts, events=events.unpacked(0)), records, None, 0)
        )
        return HeadRead(pickle.loads(head.stream), batches, head.size, head.ready)

    def batches(self, stream: LogStream, head_end: int) -> Iterator[tuple[Batch, LogStream | None, int]]:
        """Batches of the file from `head_end` on, in order, with line numbers continuing `stream`'s,
        each with the bytes it covers.

        With the last batch comes the stream as it stands at the end of the file (else None). The
        first segments are handed out before this returns: the caller may run the detectors on
        the head while the workers read.
        """
        split = stream.segment_safe
        template = stream.snapshot()
        bounds = segment_bounds(self.path, head_end, segment_size(stream) if split else IN_ORDER_BYTES)
        tasks = [
            _Task(
                str(self.path),
                template,
                a,
                b,
                last=k == len(bounds) - 1,
                warmup=WARMUP_BYTES if k and split else 0,
                chained=not split,
                overrun=split,
            )
            for k, (a, b) in enumerate(bounds)
        ]
        self.segments += len(tasks)
        carried = stream.carried() if split else None
        pending = deque(tasks)
        in_flight: deque[tuple[_Task, Future[_Segment]]] = deque()
        while pending and len(in_flight) < (self.jobs + 1 if split else 1):
            task = pending.popleft()
            in_flight.append((task, self._pool.submit(read_segment, task)))
        return self._read(in_flight, pending, stream.lines, carried)

    def _read(
        self,
        in_flight: deque[tuple[_Task, Future[_Segment]]],
        pending: deque[_Task],
        lines_before: int,
        carried: tuple[Any, ...] | None,
    ) -> Iterator[tuple[Batch, LogStream | None, int]]:
        """The batches of the tasks handed out (`in_flight`), then of those `pending`, in order.

        `carried`: what the stream carries at the first task's start. The tasks are then read
        `jobs + 1` ahead, each guessing what its stream carries in, and kept while that is what
        the segment before carried out. From the first that is not (None: from the start), each
        task goes on from the stream the one before ended with, handed out once that is known,
        while this process runs the detectors on the one before. Guessing is tried again with the
        segment after the next one; if that guess is wrong too, after 2 more, 4, 8... (a stretch
        without records ends; a file without steps wastes a guess now and then, on a worker that
        would wait otherwise). A task that guesses starts from the head's stream, with what the
        parsers of the newest stream known (the end of the last segment read) tell a guess
        (`LogStream.hints`: where an HF Trainer log resumed, which its dict count goes on from).
        """
        may_guess = guessing = carried is not None
        retry_after, read_in_order = 1, 0  # segments read in order before guessing again, and since the last guess
        held = True  # the last guess held (or none was wrong yet)
        before: tuple[_Task, _Segment] | None = None  # the last task read, and what it read

        def hand_out(task: _Task) -> None:
            if before is not None and not task.chained:
                task = dataclasses.replace(task, hints=before[1].hints_out)
            in_flight.append((task, self._pool.submit(read_segment, task)))

        while in_flight:
            task, future = in_flight.popleft()
            segment = self._result(future)
            if guessing and segment.carried_in != carried:
                self.rereads += 1
                guessing, read_in_order = False, 0
                retry_after, held = 1 if held else 2 * retry_after, False
                for later, guessed in reversed(in_flight):
                    guessed.cancel()
                    pending.appendleft(later)
                in_flight.clear()
                assert before is not None  # the first task starts from the head itself
                task = _going_on(task, *before)
                segment = self._result(self._pool.submit(read_segment, task))
            elif guessing and not task.chained:
                held = True
            self.in_order += task.chained
            carried, before = segment.carried_out, (task, segment)
            if pending and guessing:
                while pending and len(in_flight) < self.jobs + 1:
                    hand_out(pending.popleft())
            elif pending:
                read_in_order += 1
                retry = may_guess and read_in_order >= retry_after and len(pending) > 1
                hand_out(_going_on(pending.popleft(), *before, overrun=retry))
                if retry:
                    hand_out(pending.popleft())  # a guess again, kept where it holds
                    guessing = True
            facts, records = _shifted(segment, lines_before - segment.skip)
            lines_before += segment.lines
            if segment.stream is not None:
                segment.stream.lines, segment.stream.bytes = lines_before, self.path.stat().st_size
            yield from _pieces(facts, records, segment.stream, segment.size)

    def _result(self, future: Future[_Done]) -> _Done:
        """A task's result, its plugin failures reported here (a worker prints none). A worker
        that failed ends the read of the file with one message (`WorkerError`, exit 2): what
        was read before it is still checked."""
        unchecked = "the rest of the file went unchecked; try --jobs 1"
        try:
            done = future.result()
        except InputError:
            raise
        except _TaskFailed as e:
            for message in e.withheld:
                failures.report(message)
            raise WorkerError(f"{self.path}: a worker process failed: {e.cause}; {unchecked}") from None
        except BrokenProcessPool:
            raise WorkerError(f"{self.path}: a worker process died (out of memory?); {unchecked}") from None
        except Exception as e:  # (its result could not be taken, say)
            raise WorkerError(f"{self.path}: a worker process failed: {type(e).__name__}: {e}; {unchecked}") from None
        for message in done.failures:
            failures.report(message)
        return done


def _going_on(task: _Task, before: _Task, read: _Segment, overrun: bool = False) -> _Task:
    """`task` read from where the task `before` it ended (`read`: what that read), without a
    warm-up; `overrun`: a task with a warm-up comes next."""
    assert read.end_state is not None  # only the last task has none, and nothing comes after it
    # the stream's line count at this task's start; a record open there that the task before
    # finished past its end began at or before it
    taken = read.skip + read.lines if before.overrun else before.taken_through
    return dataclasses.replace(
        task, template=read.end_state, warmup=0, chained=True, overrun=overrun, taken_through=taken
    )


def segment_size(stream: LogStream) -> int:
    """Bytes per segment for the rest of a file whose head `stream` read: `SEGMENT_BYTES`, or
    less where that would hold more than `SEGMENT_RECORDS` records (down to a quarter of it)."""
    records = sum(stream.out.counts.values())
    if not records:
        return SEGMENT_BYTES
    return max(SEGMENT_BYTES // 4, min(SEGMENT_BYTES, stream.bytes * SEGMENT_RECORDS // records))


def segment_bounds(path: Path, start: int, size: int) -> list[tuple[int, int]]:
    """[start, end) byte ranges of about `size` covering the file from `start`, cut at line starts."""
    total = path.stat().st_size
    cuts = [start]
    with open(path, "rb") as fh:
        while cuts[-1] + size < total:
            fh.seek(cuts[-1] + size)
            cut = _next_line_start(fh)
            if cut is None or cut >= total:
                break
            cuts.append(cut)
    return list(zip(cuts, [*cuts[1:], total], strict=True))


def _next_line_start(fh: BinaryIO) -> int | None:
    """The offset just after the next newline at or after the file position (None: none left)."""
    pos = fh.tell()
    while True:
        block = fh.read(1 << 16)
        if not block:
            return None
        nl = block.find(b"\n")
        if nl >= 0:
            return pos + nl + 1
        pos += len(block)


class HeadRead(NamedTuple):
    """A file's head, as a worker read it (`SegmentReader.head`)."""

    stream: LogStream  # the stream after it
    #: its records (a trainer's records held back while its format is not known are in `stream`)
    batches: Iterator[Batch]
    size: int  # its bytes
    #: whether its format is known (the workers may read the rest); else this process reads on
    #: from it, in order: past `HEAD_LIMIT` without a format, no workers are kept waiting
    ready: bool


@dataclass
class _Head:
    stream: bytes  # the stream after the head, pickled
    #: a batch taken after each chunk, as a read in order takes them (which records a batch
    #: holds depends on it: a trainer's records that begin late drop DeepSpeed's before them only
    #: from the batch in which they begin): facts without events, records, events
    batches: list[tuple[BatchFacts, dict[str, np.ndarray], _PackedEvents]]
    size: int  # the head's bytes
    ready: bool  # its format known
    failures: list[str]  # plugin failures met in it, for the main process to report


@_in_worker
def read_head(path: str, template: bytes, first: int, size: int, limit: int) -> _Head:
    """Parse a file's head in a worker: its first chunks (of `first` bytes, then `size`), until
    the format is known (and no line is cut), for at most `limit` bytes."""
    reported = failures.count()
    stream = pickle.loads(template)
    read = 0
    batches = []

    def take() -> None:
        facts, data = stream.take_columns()
        batches.append((dataclasses.replace(facts, events=[]), logged_columns(data), _PackedEvents.of(facts.events)))

    for chunk in read_chunks(Path(path), size, first=first):
        cut = chunk.rfind(b"\n") + 1
        stream.feed(chunk[:cut])
        read += cut
        if cut and stream_ready(stream):
            take()
            return _Head(stream.snapshot(), batches, read, True, failures.since(reported))
        stream.feed(chunk[cut:])
        read += len(chunk) - cut
        take()
        if read >= limit:
            break
    return _Head(pickle.dumps(stream), batches, read, False, failures.since(reported))  # (with what it holds back)


@_in_worker
def read_segment(task: _Task) -> _Segment:
    """Parse one segment in a worker: warm-up, the segment, then the end of an open record."""
    # Line numbers go on from the head's, as if the lines between were empty: parsers that key
    # state by line (Megatron's rank dedupe) see the head's lines as earlier, which they are.
    reported = failures.count()
    stream = pickle.loads(task.template)
    try:
        with open(task.path, "rb") as fh:
            warmup = _warmup(fh, task.start, task.warmup)
            if warmup:
                stream.guess(warmup.decode("utf-8", "replace"), task.hints)
            stream.feed(warmup)
            carried_in = stream.carried()
            warm_lines = stream.lines
            fh.seek(task.start)
            left = task.end - task.start
            while left > 0:
                data = fh.read(min(_READ_BYTES, left))
                if not data:
                    break  # the file shrank while being read: what was there is checked
                left -= len(data)
                stream.feed(data)
            carried_out, hints_out = stream.carried(), stream.hints()
            end_state = None if task.last else stream.snapshot()
            if task.last:
                stream.close()  # a last line without its newline is read here: one of the segment's
            lines = stream.lines - warm_lines
            if task.overrun and not task.last:
                _finish_open_record(stream, fh)
    except OSError as e:
        raise InputError(f"{task.path}: read failed: {e.strerror or e}") from None
    # A segment read from the head or the end of the one before goes on from there: a record it
    # finishes began there, and is its own unless a task before finished it (`taken_through`).
    first = warm_lines if task.warmup else task.taken_through
    taken, data = stream.take_columns()
    facts, records = _within(taken, data, first, warm_lines + lines)
    events = _PackedEvents.of(facts.events)
    facts = dataclasses.replace(facts, events=[])
    return _Segment(
        facts,
        records,
        events,
        warm_lines,
        lines,
        task.end - task.start,
        stream if task.last else None,
        carried_in,
        carried_out,
        hints_out,
        end_state,
        failures.since(reported),
    )


def _warmup(fh: BinaryIO, start: int, size: int) -> bytes:
    """Whole lines from up to `size` bytes before `start`."""
    if start == 0 or size == 0:
        return b""
    begin = max(0, start - size - 1)
    fh.seek(begin)
    data: bytes = fh.read(start - begin)
    if begin == 0:
        return data
    nl = data.find(b"\n")
    return data[nl + 1 :] if nl >= 0 else b""


def _finish_open_record(stream: LogStream, fh: BinaryIO) -> None:
    """Read on past the segment while a multi-line record begun in it is still open."""
    read = 0
    while stream.collecting and read < OVERRUN_LIMIT:
        data = fh.read(1 << 16)
        if not data:
            stream.close()  # the file's end ends the record, as it ends a sequential read
            break
        read += len(data)
        stream.feed(data)


def _within(
    facts: BatchFacts, data: dict[str, np.ndarray] | None, after: int, last: int
) -> tuple[BatchFacts, dict[str, np.ndarray]]:
    """The part of a batch (`facts`) and its records (`data`, columns) whose lines are in (after, last]:
    what the segment itself holds; the records as `logged_columns`."""
    if data is not None:
        keep = (data["line"] > after) & (data["line"] <= last)
        if not keep.all():
            data = {name: col[keep] for name, col in data.items()}
    events = [e for e in facts.events if after < e.line <= last]
    skips = facts.skip_counts
    skips = skips.where((skips.line > after) & (skips.line <= last))
    return dataclasses.replace(facts, events=events, skip_counts=skips), logged_columns(data)


@dataclass
class _PackedEvents:
    """Events as columns: a segment has thousands (DeepSpeed's progress lines), and a list of
    columns pickles and loads several times faster than a list of events."""

    kinds: list[str]
    lines: list[int]
    steps: list[int | None]
    times: list[float | None]
    data: list[dict[str, Any]]

    @staticmethod
    def of(events: list[Event]) -> _PackedEvents:
        return _PackedEvents(
            [e.kind.value for e in events],
            [e.line for e in events],
            [e.step for e in events],
            [e.ts for e in events],
            [e.data for e in events],
        )

    def unpacked(self, offset: int) -> list[Event]:
        """The events, their lines moved on by `offset`."""
        kind = _KINDS.__getitem__
        columns = zip(self.kinds, self.lines, self.steps, self.times, self.data, strict=True)
        return [Event(kind(k), line + offset, step, ts, data) for k, line, step, ts, data in columns]


_KINDS = {kind.value: kind for kind in EventKind}


def _pieces(
    facts: BatchFacts, records: dict[str, np.ndarray], stream: LogStream | None, size: int
) -> Iterator[tuple[Batch, LogStream | None, int]]:
    """A batch (`facts`) with its `records` (columns) as batches of at most `BATCH_RECORDS` records, each
    with the events of its lines (as a read cut after its last record would have had them); the
    clock facts, the stream and the bytes go with the last piece, which is where they stand."""
    lines = records["line"]
    events = facts.events
    event_lines = np.array([e.line for e in events], dtype=np.int64)
    # a plugin's events out of line order could repeat in pieces: such a batch is not cut
    if len(lines) <= BATCH_RECORDS or (np.diff(event_lines) < 0).any():
        yield _carrying(facts, records), stream, size
        return
    skips = facts.skip_counts
    start, first_event, first_skip = 0, 0, 0
    while start + BATCH_RECORDS < len(lines):
        end = start + BATCH_RECORDS
        last_event = int(np.searchsorted(event_lines, lines[end - 1], side="right"))
        last_skip = int(np.searchsorted(skips.line, lines[end - 1], side="right"))
        piece = BatchFacts(
            events=events[first_event:last_event],
            path=facts.path,
            skip_counts=skips.where(slice(first_skip, last_skip)),
        )
        yield _carrying(piece, {name: col[start:end] for name, col in records.items()}), None, 0
        start, first_event, first_skip = end, last_event, last_skip
    rest = dataclasses.replace(facts, events=events[first_event:], skip_counts=skips.where(slice(first_skip, None)))
    yield _carrying(rest, {name: col[start:] for name, col in records.items()}), stream, size


def _carrying(facts: BatchFacts, records: dict[str, np.ndarray]) -> ColumnBatch:
    """The batch of `facts` and these records, as numpy columns (a frame is built if asked for)."""
    from gradwatch.detectors.base import ColumnBatch  # here: the workers import no detectors

    return ColumnBatch.of_columns(facts, columns_of(records))


def _shifted(segment: _Segment, offset: int) -> tuple[BatchFacts, dict[str, np.ndarray]]:
    """The segment's batch with its events, and its records (columns), their line numbers moved on by `offset`."""
    records = segment.records
    records["line"] = records["line"] + offset
    facts = segment.facts
    moved = dataclasses.replace(
        facts, events=segment.events.unpacked(offset), skip_counts=facts.skip_counts.moved(offset)
    )
    return moved, records


def _start_worker(extra_metrics: tuple[str, ...], plugin_files: tuple[Path, ...]) -> None:
    """A worker's set-up. Ctrl-C is the main process's to handle: a worker must not print its own
    traceback. A plugin's failure is the main process's to print, once (`SegmentReader._result`),
    and so is the report: a worker writes nothing on stdout (a plugin that prints as it loads
    printed into `--output json` once per worker). The plugin files the config named are
    imported, as in the main process: their parsers come to the worker in the pickled stream,
    and unpickling looks their classes up in those modules (installed plugins are packages,
    which it imports by itself). The metrics that plugin parsers declared are columns of the
    worker's batches too."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (the worker's, for its life)
    failures.withhold()
    loader.load_files(plugin_files)
    declare_extra_metrics(extra_metrics)

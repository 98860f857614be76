"""The `scan --state` file: which files were read how far, their parsers' and detectors' state,
and which notes were notified or are still owed. Data only: JSON, never a pickle.

One JSON document, versioned like Vector's checkpoints (an incompatible change bumps
`FORMAT_VERSION`) and replaced atomically (temp file, fsync, rename)::

    {"version": 3, "gradwatch": "0.1.0", "config": "<sha256 of the effective config>",
     "scanned_at": <when the last scan began, seconds since the epoch>,
     "files": [{"key": "<path the run is known by>", "path": "<where it was read last>",
                "dev", "ino", "head_len", "head_crc", "tail_len", "tail_crc", "offset",
                "marks": {"base", "crc", "lines", "points": [offset step, crc, lines step, ...]},
                "last_step", "last_step_at", "alerts": [[det, sev, n], ...],
                "check": <the FileCheck as data (gradwatch.state.codec), or null>}],
     "incidents": <the Correlator as data, or null>,
     "notified": ["<incident id> <event> <severity>", ...],
     "outbox": [{"note": {"event", "incident", "headline", "alert": {...}}, "sinks": ["command", "webhook"]}]}

Files are kept by identity (`Fingerprint`), not by path: `scan` finds a file again after a rename or
a copytruncate. Its `marks` (`sources.marks`: about a thousand offsets with the crc up to each,
every line end of the last ~500 lines read, further apart before; some 20 KB, whatever the log's
size) find where a file cut short in place still matches what was read. The parsers, detectors and
incidents go through `state_dict()` and their class versions (`gradwatch.state`), and only classes
of gradwatch's own are made from the file.

Recovery, never a traceback and never silent (one warning each): a missing file is a first run; a
damaged one, or one of another format (version 2 held pickles: they are not loaded), is read for
what was notified and owed where that part is intact, and every log is read again from its start.
When the gradwatch version or the config changed, or one file's check does not load (another
class version, a key this build does not know), the logs are read again from their start and
their incidents grouped anew (with the same ids), but what was notified and what is owed are
kept: nothing is sent twice.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gradwatch import __version__
from gradwatch._atomic import write_atomic
from gradwatch.alerts import Alert
from gradwatch.config import Settings
from gradwatch.errors import UsageError
from gradwatch.incidents import Correlator, Note
from gradwatch.pipeline import FileCheck
from gradwatch.sinks.outbox import Owed
from gradwatch.sources.fingerprint import HEAD_BYTES, Fingerprint
from gradwatch.sources.marks import Mark, Marks
from gradwatch.state import StateError, dump, restore, restore_check

__all__ = ["FORMAT_VERSION", "FileState", "ScanState", "config_digest", "load", "save"]

#: 3: parsers, detectors and incidents as data (2 pickled them); files by identity (2: by path)
FORMAT_VERSION = 3
_PICKLED_VERSION = 2
_LARGEST = 2**62


@dataclass
class FileState:
    """One log file: where the run it belongs to is known, how far it was read, and what its
    detectors have already said."""

    #: the path the file was first found at: its run's name, kept after a rotation renamed it
    key: str
    #: where it was found last (after a rename, its rotated name)
    path: str = ""
    fingerprint: Fingerprint | None = None
    offset: int = 0
    #: where the file still matches what was read, should it be cut short (up to `offset`)
    marks: Marks = field(default_factory=Marks)
    #: parsers and detectors as they were at `offset`; None: read the file from its start
    check: FileCheck | None = None
    last_step: int | None = None
    #: wall clock (the file's mtime) when `last_step` was first read, for stall detection
    last_step_at: float | None = None
    #: (detector, severity) -> alerts raised in this file, for the Prometheus counters
    alerts: dict[tuple[str, str], int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.path = self.path or self.key

    def restart(self) -> None:
        """Forget where reading stood (a rewritten file, an unusable saved check)."""
        self.fingerprint, self.offset, self.check, self.marks = None, 0, None, Marks()
        self.last_step = self.last_step_at = None


@dataclass
class ScanState:
    config: str
    files: list[FileState] = field(default_factory=list)
    #: when the last scan began (None: none did), for the files rotated in and out since
    scanned_at: float | None = None
    #: the incidents of every run scanned; None: group anew (a first scan, or logs read again)
    incidents: Correlator | None = None
    #: notes (`outbox.note_key`) already queued for notification
    notified: set[str] = field(default_factory=set)
    outbox: list[Owed] = field(default_factory=list)


def config_digest(settings: Settings) -> str:
    """Detectors resumed under other thresholds would mix two configs: a change means a re-read."""
    return hashlib.sha256(json.dumps(settings.raw, sort_keys=True, default=str).encode()).hexdigest()


def _check_owner(path: Path, st: os.stat_result) -> None:
    """Refuse a state file that someone other than its owner could have written: it decides
    which alerts are notified and which logs are read."""
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UsageError(
            f"{path} is writable by group or others; a state file decides what is read and notified, "
            f"so only its owner may write it: chmod go-w {path}"
        )
    if st.st_uid not in (os.getuid(), 0):
        raise UsageError(
            f"{path} belongs to another user (uid {st.st_uid}); a state file decides what is read and "
            "notified: use a state file of your own"
        )


def load(path: Path, settings: Settings, warn: Callable[[str], None]) -> ScanState:
    """The state saved at `path`, or what of it can be used (see the module docstring)."""
    config = config_digest(settings)
    try:
        with open(path, "rb") as fh:
            _check_owner(path, os.fstat(fh.fileno()))
            raw = fh.read()
    except FileNotFoundError:
        return ScanState(config)
    except OSError as e:
        raise UsageError(f"cannot read the state file {path}: {e.strerror or e}") from None
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):  # (RecursionError: JSON nested deeper than Python's stack)
        doc = None
    version = doc.get("version") if isinstance(doc, dict) else None
    if type(version) is not int:
        warn(f"state file {path} is damaged (not a gradwatch state): every log is read again from its start")
        return ScanState(config)
    state = _notified(doc, config, path, warn)
    if version == _PICKLED_VERSION:
        warn(
            f"state file {path} is from an older gradwatch (format 2, which held pickles: not loaded): "
            "every log is read again from its start; incidents it notified are not notified again"
        )
        return state
    if version != FORMAT_VERSION:
        warn(
            f"state file {path} has format version {version}, this gradwatch reads {FORMAT_VERSION}: "
            "every log is read again from its start"
        )
        return state
    scanned_at = doc.get("scanned_at")
    if type(scanned_at) in (int, float) and math.isfinite(scanned_at):
        state.scanned_at = float(scanned_at)
    _files(state, doc, path, warn)
    _resume(state, doc, settings, path, warn)
    return state


def save(path: Path, state: ScanState, warn: Callable[[str], None] | None = None) -> None:
    doc = {
        "version": FORMAT_VERSION,
        "gradwatch": __version__,
        "config": state.config,
        "scanned_at": state.scanned_at,
        "files": [_encode_file(f, warn) for f in state.files],
        "incidents": _dumped(state.incidents, "the incidents", warn),
        "notified": sorted(state.notified),
        "outbox": [{"note": _encode_note(o.note), "sinks": sorted(o.sinks)} for o in state.outbox],
    }
    try:
        write_atomic(path, json.dumps(doc, allow_nan=False, separators=(",", ":")).encode())
    except OSError as e:
        raise UsageError(f"cannot write the state file {path}: {e.strerror or e}") from None


# ---- encoding -----------------------------------------------------------------------------------
def _dumped(obj: object, what: str, warn: Callable[[str], None] | None) -> Any:
    """`obj` as data; None (read again next time) where it holds something that cannot be saved."""
    if obj is None:
        return None
    try:
        return dump(obj)
    except StateError as e:
        if warn is not None:
            warn(f"cannot save the state of {what} ({e}): the next scan reads it again from its start")
        return None


def _encode_file(f: FileState, warn: Callable[[str], None] | None) -> dict[str, Any]:
    fp = f.fingerprint
    return {
        "key": f.key,
        "path": f.path,
        "dev": fp.dev if fp else None,
        "ino": fp.ino if fp else None,
        "head_len": fp.head_len if fp else None,
        "head_crc": fp.head_crc if fp else None,
        "tail_len": fp.tail_len if fp else None,
        "tail_crc": fp.tail_crc if fp else None,
        "offset": f.offset,
        "marks": _encode_marks(f.marks),
        "last_step": f.last_step,
        "last_step_at": f.last_step_at,
        "alerts": [[det, sev, n] for (det, sev), n in sorted(f.alerts.items())],
        "check": _dumped(f.check, f.path, warn),
    }


def _encode_marks(marks: Marks) -> dict[str, Any]:
    """Offsets and lines as steps from the one before (small numbers), crcs as they are."""
    points: list[int] = []
    offset, lines = marks.base, 0
    for m in marks.points:
        points += [m.offset - offset, m.crc, m.lines - lines]
        offset, lines = m.offset, m.lines
    return {"base": marks.base, "crc": marks.crc, "lines": marks.lines, "points": points}


def _encode_note(note: Note) -> dict[str, Any]:
    return {"event": note.event, "incident": note.incident, "headline": note.headline, "alert": note.alert.to_json()}


# ---- decoding -----------------------------------------------------------------------------------
def _int(value: Any, low: int = 0, high: int = _LARGEST) -> int:
    if type(value) is not int or not low <= value <= high:
        raise StateError(f"{value!r} is not an integer from {low} to {high}")
    return value


def _str(value: Any) -> str:
    if type(value) is not str:
        raise StateError(f"{value!r} is not a string")
    return value


def _list(value: Any) -> list[Any]:
    if type(value) is not list:
        raise StateError(f"{str(value)[:40]!r} is not a list")
    return value


def _notified(doc: dict[str, Any], config: str, path: Path, warn: Callable[[str], None]) -> ScanState:
    """What was notified and what is owed: plain JSON in this format and the one before, kept
    whatever else in the file is lost, so that no incident is notified twice."""
    state = ScanState(config)
    try:
        state.notified = {_str(k) for k in _list(doc.get("notified", []))}
        state.outbox = [_decode_owed(o) for o in _list(doc.get("outbox", []))]
    except (StateError, KeyError, TypeError, ValueError, AttributeError) as e:
        warn(f"state file {path}: what was notified is damaged ({e}); incidents may be notified again once")
        state.notified, state.outbox = set(), []
    return state


def _decode_owed(data: Any) -> Owed:
    note = data["note"]
    alert = Alert.from_json(note["alert"])
    owed = Note(_str(note["event"]), _str(note["incident"]), _str(note["headline"]), alert)
    return Owed(owed, {_str(s) for s in _list(data["sinks"])})


def _files(state: ScanState, doc: dict[str, Any], path: Path, warn: Callable[[str], None]) -> None:
    try:
        entries = _list(doc.get("files"))
    except StateError:
        warn(f"state file {path} is damaged (its files are not a list): every log is read again from its start")
        return
    for entry in entries:
        try:
            state.files.append(_decode_file(entry))
        except (StateError, KeyError, TypeError) as e:
            warn(f"state file {path}: a file's entry is damaged ({e}): it is read again from its start")


def _decode_file(f: Any) -> FileState:
    fp = None
    if f["dev"] is not None:
        head_len, tail_len = _int(f["head_len"], 0, HEAD_BYTES), _int(f["tail_len"], 0, HEAD_BYTES)
        crcs = _int(f["head_crc"], 0, 2**32 - 1), _int(f["tail_crc"], 0, 2**32 - 1)
        fp = Fingerprint(_int(f["dev"]), _int(f["ino"]), head_len, crcs[0], tail_len, crcs[1])
    last_step_at = f["last_step_at"]
    if last_step_at is not None and not (type(last_step_at) in (int, float) and math.isfinite(last_step_at)):
        raise StateError(f"last_step_at {last_step_at!r} is not a time")
    alerts: dict[tuple[str, str], int] = {}
    for entry in _list(f["alerts"]):
        det, sev, n = _list(entry)
        alerts[(_str(det), _str(sev))] = _int(n)
    offset = _int(f["offset"])
    if fp is not None and fp.tail_len > offset:
        raise StateError(f"offset {offset} is before the {fp.tail_len} bytes checksummed before it")
    return FileState(
        key=_str(f["key"]),
        path=_str(f["path"]),
        fingerprint=fp,
        offset=offset,
        marks=_decode_marks(f.get("marks"), offset),
        last_step=None if f["last_step"] is None else _int(f["last_step"], -_LARGEST),
        last_step_at=None if last_step_at is None else float(last_step_at),
        alerts=alerts,
    )


def _decode_marks(data: Any, offset: int) -> Marks:
    """The marks up to `offset`; none (from `offset` on) in a state of an earlier build."""
    marks = Marks(offset)
    if data is None:
        return marks
    marks.base = marks.offset = _int(data["base"], 0, offset)
    points = _list(data["points"])
    if len(points) % 3 or len(points) > 3 * marks.kept:
        raise StateError(f"{len(points)} numbers are not the marks' triples")
    lines = 0
    for i in range(0, len(points), 3):
        marks.offset += _int(points[i], 1)
        lines += _int(points[i + 2])
        marks.points.append(Mark(marks.offset, _int(points[i + 1], 0, 2**32 - 1), lines))
    marks.crc, marks.lines = _int(data["crc"], 0, 2**32 - 1), _int(data["lines"], lines)
    if marks.offset > offset:
        raise StateError(f"a mark at {marks.offset} is past the offset {offset}")
    marks.offset = offset
    return marks


def _resume(state: ScanState, doc: dict[str, Any], settings: Settings, path: Path, warn: Callable[[str], None]) -> None:
    """Restore each file's check and the incidents, unless the code or config that made them has
    changed; one file read again from its start means every file is, with incidents grouped anew
    (the incidents already hold the alerts of what was read)."""
    if doc.get("gradwatch") != __version__:
        stale = f"was written by gradwatch {doc.get('gradwatch')!r}, this is {__version__}"
    elif doc.get("config") != state.config:
        stale = "was written with another configuration"
    else:
        stale = ""
    if stale and state.files:
        warn(
            f"state file {path} {stale}: logs are read again from their start "
            "(alerts already notified are not sent again)"
        )
    entries: list[Any] = doc["files"] if type(doc.get("files")) is list else []
    packed = {id(f): e.get("check") for f, e in zip(state.files, entries, strict=False) if isinstance(e, dict)}
    broken = bool(stale) or len(state.files) != len(entries)
    for f in state.files:
        if broken or packed.get(id(f)) is None:
            broken = True
            continue
        try:
            f.check = restore_check(packed[id(f)], f.key, settings)
        except StateError as e:
            warn(f"state of {f.path} in {path} does not load ({e}): every log is read again from its start")
            broken = True
            break
    if not broken:
        try:
            incidents = restore(doc.get("incidents"))
            if not isinstance(incidents, Correlator):
                raise StateError("not the incidents")
            state.incidents = incidents
        except StateError as e:
            warn(f"the incidents in {path} do not load ({e}): every log is read again from its start")
            broken = True
    if broken:
        state.incidents = None
        for f in state.files:
            f.restart()  # (their alerts must be grouped again, from the start)

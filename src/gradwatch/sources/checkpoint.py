"""The `scan --state` file: where each log was left off, and which alerts are owed to whom.

One JSON document, versioned like Vector's checkpoints (an incompatible change bumps
`FORMAT_VERSION`) and replaced atomically (temp file, fsync, rename)::

    {"version": 2, "gradwatch": "0.1.0", "config": "<sha256 of the effective config>",
     "files": {"<path>": {"dev", "ino", "head_len", "head_crc", "offset", "last_step",
                          "last_step_at", "alerts": [[det, sev, n], ...],
                          "check": "<base64 of the zlib'ed pickle of the FileCheck>"}},
     "incidents": "<base64 of the zlib'ed pickle of the Correlator>",
     "notified": ["<incident id> <event> <severity>", ...],
     "outbox": [{"note": {"event", "incident", "headline", "alert": {...}}, "sinks": ["command", "webhook"]}]}

What the parsers and detectors need to resume (a partial line, an open multi-line record,
windows, baselines, cooldowns) is the file's `FileCheck` itself, pickled (and the incidents
open across files, the `Correlator`, likewise): they keep their state in
plain attributes, so one mechanism covers every parser and detector, third-party ones included.
Loading a pickle runs code, hence the rule that only its owner may write a state file: `load`
refuses one that is group- or world-writable or owned by someone else, and `save` writes 0600.

Recovery, never a crash and never silent: a missing file is a first run; a file that cannot be
read as a state of this format gives a warning and an empty state (every log read from its start).
When only the gradwatch version or the config changed, or one file's pickle does not load, those
logs are read from their start again (and their incidents grouped anew, with the same ids), but
what was already notified and notifications still owed are kept: nothing is sent twice.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import pickle
import stat
import zlib
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
from gradwatch.sources.fingerprint import Fingerprint

__all__ = ["FORMAT_VERSION", "FileState", "ScanState", "config_digest", "load", "save"]

#: 2: incidents (the correlator, notified notes) replaced per-file notified alerts
FORMAT_VERSION = 2


@dataclass
class FileState:
    """One log file: how far it was read, and what its detectors have already said."""

    fingerprint: Fingerprint | None = None
    offset: int = 0
    #: parsers and detectors as they were at `offset`; None: read the file from its start
    check: FileCheck | None = None
    last_step: int | None = None
    #: wall clock (the file's mtime) when `last_step` was first read, for stall detection
    last_step_at: float | None = None
    #: (detector, severity) -> alerts raised in this file, for the Prometheus counters
    alerts: dict[tuple[str, str], int] = field(default_factory=dict)

    def restart(self) -> None:
        """Forget where reading stood (rotation, truncation, an unusable pickle)."""
        self.fingerprint, self.offset, self.check = None, 0, None
        self.last_step = self.last_step_at = None


@dataclass
class ScanState:
    config: str
    files: dict[str, FileState] = field(default_factory=dict)
    #: the incidents of every run scanned; None: group anew (a first scan, or logs read again)
    incidents: Correlator | None = None
    #: notes (`outbox.note_key`) already queued for notification
    notified: set[str] = field(default_factory=set)
    outbox: list[Owed] = field(default_factory=list)


def config_digest(settings: Settings) -> str:
    """Detectors resumed under other thresholds would mix two configs: a change means a re-read."""
    return hashlib.sha256(json.dumps(settings.raw, sort_keys=True, default=str).encode()).hexdigest()


def _check_owner(path: Path, st: os.stat_result) -> None:
    """Refuse a state file that someone other than its owner could have written."""
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UsageError(
            f"{path} is writable by group or others; a state file holds pickled data that gradwatch loads, "
            f"so only its owner may write it: chmod go-w {path}"
        )
    if st.st_uid not in (os.getuid(), 0):
        raise UsageError(
            f"{path} belongs to another user (uid {st.st_uid}); a state file holds pickled data that "
            "gradwatch loads: use a state file of your own"
        )


def load(path: Path, config: str, warn: Callable[[str], None]) -> ScanState:
    """The state saved at `path`, or an empty one (see the module docstring for recovery)."""
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
        version = doc["version"]
    except (ValueError, TypeError, KeyError):
        warn(f"state file {path} is damaged (not a gradwatch state): every log is read again from its start")
        return ScanState(config)
    if version != FORMAT_VERSION:
        warn(
            f"state file {path} has format version {version!r}, this gradwatch reads {FORMAT_VERSION}: "
            "every log is read again from its start"
        )
        return ScanState(config)
    try:
        state = _decode(doc, config)
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        warn(f"state file {path} is damaged ({e!r}): every log is read again from its start")
        return ScanState(config)
    _resume_checks(state, doc, path, warn)
    return state


def save(path: Path, state: ScanState) -> None:
    doc = {
        "version": FORMAT_VERSION,
        "gradwatch": __version__,
        "config": state.config,
        "files": {p: _encode_file(f) for p, f in state.files.items()},
        "incidents": None if state.incidents is None else _pack(state.incidents),
        "notified": sorted(state.notified),
        "outbox": [{"note": _encode_note(o.note), "sinks": sorted(o.sinks)} for o in state.outbox],
    }
    try:
        write_atomic(path, json.dumps(doc, indent=1).encode())
    except OSError as e:
        raise UsageError(f"cannot write the state file {path}: {e.strerror or e}") from None


# ---- encoding -----------------------------------------------------------------------------------
def _encode_file(f: FileState) -> dict[str, Any]:
    fp = f.fingerprint
    return {
        "dev": fp.dev if fp else None,
        "ino": fp.ino if fp else None,
        "head_len": fp.head_len if fp else None,
        "head_crc": fp.head_crc if fp else None,
        "offset": f.offset,
        "last_step": f.last_step,
        "last_step_at": f.last_step_at,
        "alerts": [[det, sev, n] for (det, sev), n in sorted(f.alerts.items())],
        "check": None if f.check is None else _pack(f.check),
    }


def _pack(obj: FileCheck | Correlator) -> str:
    return base64.b64encode(zlib.compress(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), 1)).decode()


def _unpack(packed: str) -> Any:
    return pickle.loads(zlib.decompress(base64.b64decode(packed)))


def _encode_note(note: Note) -> dict[str, Any]:
    return {"event": note.event, "incident": note.incident, "headline": note.headline, "alert": note.alert.to_json()}


def _decode_note(data: dict[str, Any]) -> Note:
    return Note(str(data["event"]), str(data["incident"]), str(data["headline"]), Alert.from_json(data["alert"]))


def _decode(doc: dict[str, Any], config: str) -> ScanState:
    """The JSON part of the state; pickled checks are restored by `_resume_checks`."""
    state = ScanState(config)
    for path, f in doc["files"].items():
        fp = None
        if f["dev"] is not None:
            fp = Fingerprint(int(f["dev"]), int(f["ino"]), int(f["head_len"]), int(f["head_crc"]))
        state.files[str(path)] = FileState(
            fingerprint=fp,
            offset=int(f["offset"]),
            last_step=None if f["last_step"] is None else int(f["last_step"]),
            last_step_at=None if f["last_step_at"] is None else float(f["last_step_at"]),
            alerts={(str(det), str(sev)): int(n) for det, sev, n in f["alerts"]},
        )
    state.notified = {str(k) for k in doc["notified"]}
    state.outbox = [Owed(_decode_note(o["note"]), {str(s) for s in o["sinks"]}) for o in doc["outbox"]]
    return state


def _resume_checks(state: ScanState, doc: dict[str, Any], path: Path, warn: Callable[[str], None]) -> None:
    """Unpickle each file's check and the incidents, unless the code or config that made them has
    changed; a file read again from its start means incidents grouped anew."""
    if doc.get("gradwatch") != __version__:
        stale = f"was written by gradwatch {doc.get('gradwatch')}, this is {__version__}"
    elif doc.get("config") != state.config:
        stale = "was written with another configuration"
    else:
        stale = ""
    if stale and state.files:
        warn(
            f"state file {path} {stale}: logs are read again from their start "
            "(alerts already notified are not sent again)"
        )
    for name, f in state.files.items():
        packed = doc["files"][name]["check"]
        if stale or packed is None:
            f.restart()
            continue
        try:
            check = _unpack(packed)
        except Exception as e:  # a damaged or outdated pickle fails in many ways: all mean "read again"
            warn(f"state of {name} in {path} does not load ({e!r}): it is read again from its start")
            f.restart()
            continue
        if not isinstance(check, FileCheck):
            warn(f"state of {name} in {path} is not a gradwatch check: it is read again from its start")
            f.restart()
            continue
        f.check = check
    packed_incidents = doc.get("incidents")
    if stale or packed_incidents is None or any(f.check is None for f in state.files.values()):
        for f in state.files.values():
            f.restart()  # (their alerts must be grouped again, from the start)
        return
    try:
        incidents = _unpack(packed_incidents)
    except Exception as e:  # as for a check: every way it fails means "read again"
        incidents = e
    if not isinstance(incidents, Correlator):
        warn(f"the incidents in {path} do not load: every log is read again from its start")
        for f in state.files.values():
            f.restart()
        return
    state.incidents = incidents

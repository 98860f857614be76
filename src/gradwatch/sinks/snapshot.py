"""`--snapshot-dir`: one JSON file of evidence per warning or critical alert.

Why: an alert read the next morning must be understandable without re-running anything. The file
holds the alert, the last records of every metric up to its line, the raw log lines around it,
what the detector compared (value, baseline, threshold, and its config: windows, factors), the
run's recent events (overflows, checkpoint loads, errors) and host facts that cost nothing.

The name is made of the run, the detector and the step, so the same incident always gets the same
file (a scan that reads a log again overwrites it instead of adding one). The file is written
atomically as soon as the alert is raised, so an `--on-alert` command can read it; when lines after
the alert have not arrived yet it says `"complete": false` and is written again, complete, when
they arrive or at the end of input. Snapshots are bounded: records, lines, events and line length
by the `snapshots` config, the directory by `max_files` (the oldest snapshots are deleted; no other
file there is touched).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import socket
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gradwatch import __version__
from gradwatch._atomic import write_atomic
from gradwatch.alerts import Alert, Severity
from gradwatch.config import SnapshotConfig
from gradwatch.errors import UsageError
from gradwatch.events import Event
from gradwatch.evidence import Evidence
from gradwatch.pipeline import FileCheck
from gradwatch.records import METRICS
from gradwatch.sources.stdin import STDIN

__all__ = ["SUFFIX", "SnapshotWriter", "snapshot_name"]

#: Every snapshot file name ends with this; pruning touches no other file.
SUFFIX = ".snapshot.json"
FORMAT_VERSION = 1
_UNSAFE = re.compile(r"[^A-Za-z0-9_.+-]+")


def snapshot_name(path: str, alert: Alert) -> str:
    """`<dir>-<file>-<hash>.<detector>.step<N>.snapshot.json`.

    The run is named by its directory and file name (`run42-main_log.txt`), plus a hash of its full
    path so that two runs' `main_log.txt` never share a name; standard input is `stdin`.
    """
    if path == STDIN:
        run = "stdin"
    else:
        p = Path(path)
        name = f"{p.parent.name}-{p.name}" if p.parent.name else p.name
        digest = hashlib.sha1(os.path.abspath(path).encode(), usedforsecurity=False).hexdigest()[:6]
        run = f"{_safe(name)[:80]}-{digest}"
    where = f"line{alert.line}" if alert.line is not None else "end"
    if alert.step is not None:
        where = f"step{alert.step}"
    return f"{run}.{_safe(alert.detector)}.{where}{SUFFIX}"


def _safe(text: str) -> str:
    return _UNSAFE.sub("_", text).strip("._") or "log"


@dataclasses.dataclass
class _Pending:
    """A snapshot written before the lines after its alert arrived."""

    check: FileCheck
    doc: dict[str, Any]
    #: the raw lines up to the alert's own
    before: list[dict[str, Any]]
    line: int


class SnapshotWriter:
    """Writes the snapshots of every file of one command; `warn` hears of a failed write (once)."""

    def __init__(self, directory: Path, config: SnapshotConfig, warn: Callable[[str], None]) -> None:
        self.directory, self.config, self._warn = directory, config, warn
        self._pending: dict[Path, _Pending] = {}
        self._failed = False

    @classmethod
    def open(cls, directory: str, config: SnapshotConfig, warn: Callable[[str], None]) -> SnapshotWriter:
        """A writer into `directory`, created if missing; a directory that cannot be used is a usage error."""
        d = Path(directory)
        try:
            d.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UsageError(f"--snapshot-dir {directory}: cannot create it: {e.strerror or e}") from None
        if not os.access(d, os.W_OK | os.X_OK):
            raise UsageError(f"--snapshot-dir {directory}: not writable")
        return cls(d, config, warn)

    def watch(self, check: FileCheck) -> None:
        """Start keeping the evidence of `check` (a resumed check may already keep it)."""
        if check.evidence is None:
            check.evidence = Evidence(self.config, check.stream.lines + 1)

    def attach(self, check: FileCheck, alerts: list[Alert]) -> list[Alert]:
        """After each feed of `check`: finish the snapshots whose later lines came, write the new ones.

        Returns `alerts`, those that got a snapshot naming it.
        """
        self._finish(check, end=False)
        return [self._write_new(check, a) if a.severity >= Severity.WARNING else a for a in alerts]

    def close(self, check: FileCheck) -> None:
        """End of the input of `check`: its snapshots still waiting get the lines there are."""
        self._finish(check, end=True)

    def close_all(self) -> None:
        """End of every input (a tail that stops): all waiting snapshots are written as they are."""
        for p in list(self._pending.values()):
            self.close(p.check)

    # ---- writing --------------------------------------------------------------------------------
    def _write_new(self, check: FileCheck, alert: Alert) -> Alert:
        ev = check.evidence
        assert ev is not None, "watch(check) first"
        target = self.directory / snapshot_name(check.summary.path, alert)
        alert = dataclasses.replace(alert, snapshot=str(target))
        cfg, line = self.config, alert.line
        if line is None:  # no line of its own (a stall): the last lines read
            lines = _lines_json(ev.raw_lines(ev.line_count - cfg.lines_before + 1, ev.line_count + 1))
            waiting = False
        else:
            lines = _lines_json(ev.raw_lines(line - cfg.lines_before, line + cfg.lines_after))
            waiting = ev.line_count < line + cfg.lines_after
        doc = {
            "version": FORMAT_VERSION,
            "complete": not waiting,
            "alert": alert.to_json(),
            "detector": _detector_json(check, alert),
            "run": {
                "path": check.summary.path,
                "format": check.stream.format,
                "lines_read": ev.line_count,
                "records_read": check.summary.records,
                "first_step": check.summary.first_step,
                "last_step": check.summary.last_step,
            },
            "records": _records_json(ev.records(line)),
            "lines": lines,
            "events": [_event_json(e, cfg.max_line_chars) for e in ev.events(line)],
            "host": _host_json(),
        }
        if not self._write(target, doc):
            return dataclasses.replace(alert, snapshot=None)
        if waiting and line is not None:
            self._pending[target] = _Pending(check, doc, [x for x in lines if x["line"] <= line], line)
        self._prune(keep=target)
        return alert

    def _finish(self, check: FileCheck, end: bool) -> None:
        ev = check.evidence
        if ev is None:
            return
        after = self.config.lines_after
        for target, p in list(self._pending.items()):
            if p.check is not check or not (end or ev.line_count >= p.line + after):
                continue
            del self._pending[target]
            p.doc["lines"] = p.before + _lines_json(ev.raw_lines(p.line + 1, p.line + after))
            p.doc["complete"] = True
            self._write(target, p.doc)

    def _write(self, target: Path, doc: dict[str, Any]) -> bool:
        try:
            write_atomic(target, json.dumps(doc, allow_nan=False, indent=1, default=str).encode(), mode=0o644)
        except OSError as e:
            if not self._failed:
                self._failed = True
                self._warn(f"cannot write snapshot {target}: {e.strerror or e} (alerts go on without snapshots)")
            return False
        return True

    def _prune(self, keep: Path) -> None:
        """Delete the oldest snapshots past `max_files` (never `keep`, the one just written)."""
        try:
            found = [
                (e.stat().st_mtime, e.name)
                for e in os.scandir(self.directory)
                if e.name.endswith(SUFFIX) and e.name != keep.name and e.is_file(follow_symlinks=False)
            ]
        except OSError:
            return  # another gradwatch pruned at the same time: the next write tries again
        for _, name in sorted(found)[: max(0, len(found) + 1 - self.config.max_files)]:
            try:
                os.unlink(self.directory / name)
            except OSError:
                continue
            self._pending.pop(self.directory / name, None)


# ---- JSON pieces --------------------------------------------------------------------------------
def _num(v: Any) -> Any:
    """JSON-safe scalar: non-finite floats become null, numpy scalars plain Python."""
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _lines_json(lines: list[tuple[int, str]]) -> list[dict[str, Any]]:
    return [{"line": n, "text": text} for n, text in lines]


def _detector_json(check: FileCheck, alert: Alert) -> dict[str, Any]:
    """What the detector compared (from the alert) and how it is configured (windows, factors)."""
    det = next((d for d in check.detectors if d.id == alert.detector), None)
    config = det.config if det is not None else None
    settings = dataclasses.asdict(config) if dataclasses.is_dataclass(config) and not isinstance(config, type) else {}
    return {
        "id": alert.detector,
        "metric": alert.metric,
        "value": _num(alert.value),
        "baseline": _num(alert.baseline),
        "threshold": _num(alert.threshold),
        "config": {k: _num(v) for k, v in settings.items()},
    }


def _records_json(frame: pd.DataFrame | None) -> dict[str, list[Any]]:
    """Columns of the records: step, line, time, and each metric they logged (non-finite: null,
    and named in `nonfinite`)."""
    if frame is None:
        return {}
    nonfinite = [str(x) if isinstance(x, str) else "" for x in frame["nonfinite"].tolist()]
    named = {n for x in nonfinite for n in x.split(",") if n}
    out: dict[str, list[Any]] = {
        "step": [None if s < 0 else s for s in frame["step"].astype("int64").tolist()],
        "line": frame["line"].astype("int64").tolist(),
    }
    for name in ("ts", *METRICS):
        col = frame[name].to_numpy(dtype=np.float64)
        if name in named or not np.isnan(col).all():
            out[name] = [_num(v) for v in col.tolist()]
    if named:
        out["nonfinite"] = nonfinite
    return out


def _event_json(event: Event, max_chars: int) -> dict[str, Any]:
    data = {k: v[:max_chars] if isinstance(v, str) else _num(v) for k, v in event.data.items()}
    return {"kind": event.kind.value, "line": event.line, "step": event.step, "ts": _num(event.ts), "data": data}


def _host_json() -> dict[str, Any]:
    now = time.time()
    return {
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "time": datetime.fromtimestamp(now, timezone.utc).isoformat(timespec="seconds"),
        "unix_time": now,
        "gradwatch": __version__,
    }

"""Rotation under load (issue 27): no line lost or read twice by `gradwatch scan`, counted by step.

Each case runs real `gradwatch scan --state` subprocesses one after the other, as cron would,
while a real writer process appends 1,500 Megatron iteration lines/s to the log for 5 s and the
test rotates it the way logrotate does, every ~1.2 s; then two more scans once the writer is done
(`tests/rotation_harness.py` says how each kind is done and how lines are counted). A line still
on disk somewhere at the end (the log, `log.N`, `log.N.gz`, or a deleted file while a scan could
see it) must have been read exactly once; a line the rotation itself destroyed (written between
copytruncate's copy and its truncate, or cut away before a scan read it) is not counted as lost.
The scans are given the log's path (rotated files are found under their rotated names) or a glob
that matches the rotated files too. `benchmarks/rotation_stress.py --scan` runs the same for longer.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.rotation_harness import SCAN_KINDS, scan_stress

CASES = [(kind, "") for kind in SCAN_KINDS] + [(kind, "*") for kind in ("rename", "copytruncate", "compress")]


@pytest.mark.parametrize(("kind", "pattern"), CASES, ids=[f"{k}{'-glob' if p else ''}" for k, p in CASES])
def test_no_line_is_lost_or_doubled_between_scans(tmp_path: Path, kind: str, pattern: str) -> None:
    result = scan_stress(tmp_path, kind, rate=1500.0, seconds=5.0, every=0.3, lag=1.0, pattern=pattern)
    assert result.rotations >= 2, result
    assert (result.lost, result.doubled, result.extra) == (0, 0, 0), result
    if kind not in ("shrink", "delete"):  # (those destroy lines before any scan can read them)
        assert result.expected >= result.written * 0.95, result

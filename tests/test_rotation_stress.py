"""Rotation under load (issue 27): no line lost or read twice by `gradwatch tail`, counted by step.

Each case runs a real `gradwatch tail` subprocess (inotify, or `--poll 0.25`) on a log that a real
writer process appends 1,500 Megatron iteration lines/s to for 4 s, while the test rotates it the
way logrotate does, every ~1.2 s (`tests/rotation_harness.py` says how each kind is done and how
lines are counted). A line that is still on disk somewhere at the end (the log, `log.N`, a deleted
file) must have been read exactly once; a line the rotation itself destroyed (written between
copytruncate's copy and its truncate, or cut away before tail read it) is not counted as lost.
`benchmarks/rotation_stress.py` runs the same for longer and prints the counts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.rotation_harness import KINDS, stress


@pytest.mark.parametrize("poll", [False, True], ids=["inotify", "polling"])
@pytest.mark.parametrize("kind", KINDS)
def test_no_line_is_lost_or_doubled_through_rotation(tmp_path: Path, kind: str, poll: bool) -> None:
    # rename: the writer appends to the renamed file for 1 s, within the 2 s rotate wait
    result = stress(tmp_path, kind, poll, rate=1500.0, seconds=4.0, every=0.3, lag=1.0, rotate_wait=2.0)
    assert result.rotations >= 2, result
    assert (result.lost, result.doubled, result.extra) == (0, 0, 0), result
    assert result.expected >= result.written * (0.6 if kind == "shrink" else 0.95), result

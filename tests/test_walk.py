"""`sources.walk`: the globs and folder walks of check, scan, report, export and tail, which entered
symlink loops for ever (`glob.glob` follows a link to a parent again and again)."""

from __future__ import annotations

import glob
import os
from pathlib import Path

import pytest

from gradwatch.sources.walk import glob_paths, walk_files


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """Logs at three depths, a hidden folder, a named pipe; no symlink."""
    for name in ("a.log", "x/b.log", "x/y/c.log", "x/y/c.txt", ".hidden/d.log", "x/.e.log"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x\n")
    os.mkfifo(tmp_path / "x" / "pipe.log")
    return tmp_path


@pytest.mark.parametrize("pattern", ["**/*.log", "*.log", "x/**/*.log", "**/y/*", "x/*/c.*", "**/*.txt"])
def test_globs_match_as_glob_does_without_links(tree: Path, pattern: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where no symlink leads anywhere, the matches are glob's, less what is not a regular file."""
    monkeypatch.chdir(tree)
    expected = sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p) and "pipe" not in p)
    assert glob_paths(pattern) == expected
    absolute = str(tree / pattern)
    assert glob_paths(absolute) == [str(tree / p) for p in expected]


def test_each_real_directory_is_entered_once_by_its_own_path(tree: Path) -> None:
    """Two links to a parent and one to itself: each log once, under its real path; a folder
    only a link leads to is entered through it."""
    for name, target in (("up1", ".."), ("up2", ".."), ("self", ".")):
        (tree / "x" / "y" / name).symlink_to(target)
    (tree / "outside").mkdir()
    (tree / "outside" / "o.log").write_text("o\n")
    (tree / "x" / "link").symlink_to(tree / "outside")
    found = glob_paths(str(tree / "x" / "**" / "*.log"))
    assert found == [str(tree / p) for p in ("x/b.log", "x/link/o.log", "x/y/c.log")]
    walked = walk_files(tree / "x")
    assert walked == [tree / p for p in ("x/.e.log", "x/b.log", "x/link/o.log", "x/y/c.log", "x/y/c.txt")]

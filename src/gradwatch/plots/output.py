"""Where a picture goes: the suffix of `--out` picks HTML or PNG, checked before any log is read."""

from __future__ import annotations

from pathlib import Path

from gradwatch.errors import UsageError
from gradwatch.plots.png import require_matplotlib

SUFFIXES = (".html", ".png")


def output_kind(out_path: str) -> str:
    """ "html" or "png"; an unknown suffix, or PNG without matplotlib, is a `UsageError`."""
    suffix = Path(out_path).suffix.lower()
    if suffix not in SUFFIXES:
        raise UsageError(f"--out {out_path}: unknown type {suffix or '(none)'}; use {' or '.join(SUFFIXES)}")
    if suffix == ".png":
        require_matplotlib()
    return suffix[1:]


def write_html(out_path: str, page: str) -> None:
    try:
        Path(out_path).write_text(page, encoding="utf-8")
    except OSError as e:
        raise UsageError(f"cannot write {out_path}: {e.strerror or e}") from None

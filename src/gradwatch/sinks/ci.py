"""The CI outputs of `check` and `scan`: `--output junit`, `github` or `markdown`.

Each format is its own module rendering a `Report`; this one picks it by name. Markdown is also
appended to the file `$GITHUB_STEP_SUMMARY` names, when that is set (inside a GitHub Actions step),
and printed all the same: stdout carries the report whatever the environment, so a redirect or a
later step gets it too. A summary that cannot be written is a warning, not an error: the exit code
stays the verdict on the logs.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from gradwatch.sinks import github, junit, markdown
from gradwatch.sinks.report import Report

__all__ = ["RENDERERS", "emit"]

#: The formats, by `--output` name (the CLI lists the same names without importing this module).
RENDERERS: dict[str, Callable[[Report], str]] = {
    "junit": junit.render,
    "github": github.render,
    "markdown": markdown.render,
}


def emit(report: Report, output: str, warn: Callable[[str], None]) -> str:
    """The document for stdout; for markdown, also appended to `$GITHUB_STEP_SUMMARY` when set."""
    text = RENDERERS[output](report)
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if output == "markdown" and summary:
        try:
            with open(summary, "a", encoding="utf-8") as fh:
                fh.write(text + "\n")
        except OSError as e:
            warn(f"cannot append the report to $GITHUB_STEP_SUMMARY ({summary}): {e.strerror or e}")
    return text

"""`gradwatch report`: logs as pictures, one self-contained HTML page or one PNG figure."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gradwatch.commands.unknown_files import nothing_found, special_note
from gradwatch.config import Settings
from gradwatch.errors import InputError, UsageError
from gradwatch.plots import figure, panels
from gradwatch.plots.output import output_kind, write_html
from gradwatch.plots.series import RunSeries, collect
from gradwatch.sources.exclude import Excludes
from gradwatch.sources.paths import expand


@dataclass
class Drawn:
    """What a report drew: each log with its panels, and the messages of the logs it could not read."""

    runs: list[tuple[RunSeries, list[figure.PanelData]]] = field(default_factory=list)
    unread: list[str] = field(default_factory=list)


def run_report(
    paths: list[str],
    out_path: str,
    settings: Settings,
    metrics: list[str] | None = None,
    exclude: Excludes | None = None,
    note: Callable[[str], None] | None = None,
) -> Drawn:
    """Check each log (each file once; a named pipe as a stream), draw its panels with its alerts
    marked, and write `out_path`.

    Every log that can be read is drawn; the others are listed (on the page, and returned). Only
    when none can be drawn is it an error. The named pipes, sockets and devices a folder or glob
    met are never opened: `note` is told of them in one line.
    """
    kind = output_kind(out_path)
    chosen = panels.select(metrics)
    if "-" in paths:
        raise UsageError("report reads log files, not standard input: save the log first")
    found = expand(paths, exclude)
    if not found.files:
        raise nothing_found(paths, found.special)
    if found.special and note is not None:
        note(special_note(found.special))
    wanted = {m for p in chosen for m in p.metrics}
    drawn = Drawn()
    first = 1
    for path in found.files:
        try:
            run = collect(path, settings, wanted)
        except InputError as e:
            drawn.unread.append(str(e))
            continue
        drawn.runs.append((run, figure.report_panels(run, chosen, first)))
        first += len(run.alerts)
    if not drawn.runs:
        raise InputError("; ".join(drawn.unread))
    if not any(p for _, p in drawn.runs):
        asked = ", ".join(metrics) if metrics else "any plotted metric"
        raise UsageError(f"nothing to draw: {', '.join(run.summary.path for run, _ in drawn.runs)} log no {asked}")
    if kind == "html":
        from gradwatch.plots.html import report_page

        write_html(out_path, report_page(drawn.runs, drawn.unread))
    else:
        from gradwatch.plots.png import render_png

        render_png([figure.Section(_heading(run), p) for run, p in drawn.runs], Path(out_path))
    return drawn


def _heading(run: RunSeries) -> str:
    s = run.summary
    return (
        f"{s.path}\n{s.format_text}  |  steps {run.steps_text()}  |  spike score {run.spike_text()}  |  "
        f"{len(run.alerts)} alerts"
    )

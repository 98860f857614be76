"""`gradwatch report`: logs as pictures, one self-contained HTML page or one PNG figure."""

from __future__ import annotations

from pathlib import Path

from gradwatch.config import Settings
from gradwatch.errors import InputError, UsageError
from gradwatch.plots import figure, panels
from gradwatch.plots.output import output_kind, write_html
from gradwatch.plots.series import RunSeries, collect
from gradwatch.sources.archive import expand_paths


def run_report(
    paths: list[str], out_path: str, settings: Settings, metrics: list[str] | None = None
) -> list[tuple[RunSeries, list[figure.PanelData]]]:
    """Check each log, draw its panels with its alerts marked, and write `out_path`."""
    kind = output_kind(out_path)
    chosen = panels.select(metrics)
    if "-" in paths:
        raise UsageError("report reads log files, not standard input: save the log first")
    files = expand_paths(paths)
    if not files:
        raise InputError(f"no log files found in {', '.join(paths)}")
    wanted = {m for p in chosen for m in p.metrics}
    drawn: list[tuple[RunSeries, list[figure.PanelData]]] = []
    first = 1
    for path in files:
        run = collect(path, settings, wanted)
        drawn.append((run, figure.report_panels(run, chosen, first)))
        first += len(run.alerts)
    if not any(p for _, p in drawn):
        asked = ", ".join(metrics) if metrics else "any plotted metric"
        raise UsageError(f"nothing to draw: {', '.join(map(str, files))} log no {asked}")
    if kind == "html":
        from gradwatch.plots.html import report_page

        write_html(out_path, report_page(drawn))
    else:
        from gradwatch.plots.png import render_png

        render_png([figure.Section(_heading(run), p) for run, p in drawn], Path(out_path))
    return drawn


def _heading(run: RunSeries) -> str:
    s = run.summary
    return (
        f"{s.path}  |  {s.format_text}  |  steps {run.steps_text()}  |  spike score {run.spike_text()}  |  "
        f"{len(run.alerts)} alerts"
    )

"""`gradwatch compare`: runs overlaid on shared axes, and which run's metric grows alone."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table
from rich.text import Text

from gradwatch.config import Settings
from gradwatch.errors import UsageError
from gradwatch.plots import figure
from gradwatch.plots.output import output_kind, write_html
from gradwatch.plots.series import RunSeries, collect
from gradwatch.plots.trend import TrendRow, trend_rows
from gradwatch.records import METRICS
from gradwatch.sinks.safe import safe_text

#: Metrics compared when --metrics is not given (those that no run logs are left out).
DEFAULT_METRICS = ("loss", "grad_norm", "logit_norm", "z_loss")


def run_compare(
    paths: list[str],
    out_path: str,
    settings: Settings,
    metrics: list[str] | None = None,
    labels: list[str] | None = None,
    x: str = "step",
    window: int = 1000,
) -> tuple[list[TrendRow], list[RunSeries]]:
    """Read every run, write the overlay to `out_path`, return the trend table's rows and the runs."""
    kind = output_kind(out_path)
    if len(paths) < 2:
        raise UsageError("compare needs at least two logs")
    if "-" in paths:
        raise UsageError("compare reads log files, not standard input: save the log first")
    labels = labels or _default_labels(paths)
    if len(labels) != len(paths):
        raise UsageError(f"--labels has {len(labels)} names for {len(paths)} logs")
    unknown = [m for m in metrics or () if m not in METRICS]
    if unknown:
        raise UsageError(f"--metrics: unknown {', '.join(unknown)}; choose from {', '.join(METRICS)}")
    wanted = list(metrics or DEFAULT_METRICS)
    runs = [collect(Path(p), settings, wanted, x, window) for p in paths]
    if x == "tokens":
        for label, run in zip(labels, runs, strict=True):
            if "tokens" not in run.summary.last_values:
                raise UsageError(f"--x tokens: {run.summary.path} ({label}) logs no token counts; use --x step")
    missing = [m for m in wanted if not any(run.logged(m) for run in runs)]
    if metrics and missing:
        raise UsageError(f"no run logs {', '.join(missing)}")
    wanted = [m for m in wanted if m not in missing]
    if not wanted:
        raise UsageError(f"no run logs any of {', '.join(DEFAULT_METRICS)}; pick metrics with --metrics")
    rows = trend_rows(labels, [run.recent for run in runs], wanted)
    panels = figure.compare_panels(runs, labels, wanted, x)
    if kind == "html":
        from gradwatch.plots.html import compare_page

        write_html(out_path, compare_page(runs, labels, panels, rows, window))
    else:
        from gradwatch.plots.png import render_png

        render_png([figure.Section(_heading(runs, labels), panels)], Path(out_path))
    return rows, runs


def _default_labels(paths: list[str]) -> list[str]:
    """File names, or the paths as given where two runs share a file name (run1/log.txt, run2/log.txt)."""
    names = [Path(p).name for p in paths]
    return names if len(set(names)) == len(names) else list(paths)


def _heading(runs: list[RunSeries], labels: list[str]) -> str:
    return "  |  ".join(
        f"{label}: {run.summary.format}, steps {run.steps_text()}" for label, run in zip(labels, runs, strict=True)
    )


def trend_table(rows: list[TrendRow], window: int) -> Table:
    """The console table: one row per run and metric, the run that grows alone marked."""
    table = Table(
        box=None,
        header_style="dim",
        pad_edge=False,
        caption=f"growth and ln slope over each run's last {window:,} steps",
        caption_style="dim",
        caption_justify="left",
    )
    for name in ("run", "metric", "last", "growth", "slope/1k"):
        table.add_column(name, justify="left" if name in ("run", "metric") else "right")
    table.add_column("")
    for row in rows:
        mark = Text("◀ grows, others flat", style="bold red") if row.grows_alone else Text("")
        table.add_row(Text(safe_text(row.run)), row.metric, *row.cells(), mark)
    return table

"""`gradwatch compare`: runs overlaid on shared axes, which run's metric grows alone, and what
the runs were told differently (their configurations)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from gradwatch.config import Settings
from gradwatch.errors import UsageError
from gradwatch.plots import figure
from gradwatch.plots.output import output_kind, write_html
from gradwatch.plots.series import RunSeries, collect
from gradwatch.plots.trend import TrendRow, trend_rows
from gradwatch.records import METRICS
from gradwatch.run_config import KEYS
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
    labels = run_labels(paths, labels)
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


def run_labels(paths: list[str], labels: list[str] | None = None) -> list[str]:
    """The runs' names: `--labels` as given, else the file names, or the paths as given where two
    runs share a file name (run1/log.txt, run2/log.txt)."""
    if labels:
        if len(labels) != len(paths):
            raise UsageError(f"--labels has {len(labels)} names for {len(paths)} logs")
        return labels
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


def latest_config(run: RunSeries) -> dict[str, Any]:
    """Each canonical key's latest value in the run: what its last start was told (a start that
    prints two blocks, Megatron's arguments and DeepSpeed's JSON, gives the keys of both)."""
    latest: dict[str, Any] = {}
    for start in run.summary.configs:
        latest.update(start["config"])
    return latest


def config_differences(configs: list[dict[str, Any]]) -> list[tuple[str, list[Any]]]:
    """(key, each run's value) for the canonical keys, in `KEYS` order, whose values are not all
    the same; a run that did not print a key has None there."""
    rows = []
    for key in KEYS:
        values = [config.get(key) for config in configs]
        if any(value is not None for value in values) and any(value != values[0] for value in values[1:]):
            rows.append((key, values))
    return rows


def config_table(runs: list[RunSeries], labels: list[str]) -> RenderableType:
    """The console view of the runs' configurations: a row per canonical key whose latest values
    differ, a column per run that printed its configuration; one line when there is nothing to set
    side by side (they agree, or fewer than two runs printed one)."""
    told = [(label, latest_config(run)) for label, run in zip(labels, runs, strict=True)]
    silent = [label for label, config in told if not config]
    told = [(label, config) for label, config in told if config]
    unsaid = f"; {', '.join(map(safe_text, silent))} printed none" if silent else ""
    if len(told) < 2:
        who = f"only {safe_text(told[0][0])}" if told else "no run"
        return Text(f"configuration: {who} printed its configuration", style="dim")
    rows = config_differences([config for _, config in told])
    if not rows:
        return Text(f"configuration: the same in every run{unsaid}", style="dim")
    heading = Text(f"configuration: the keys whose latest values differ (-: not printed){unsaid}:", style="dim")
    table = Table(box=None, header_style="dim", pad_edge=False)
    table.add_column("config")
    for label, _ in told:
        table.add_column(Text(safe_text(label)), overflow="fold")
    for key, values in rows:
        table.add_row(key, *(_config_cell(v) for v in values))
    return Group(heading, table)


def _config_cell(value: Any) -> Text:
    if value is None:
        return Text("-", style="dim")
    if isinstance(value, float):
        return Text(f"{value:g}")
    return Text(safe_text(str(value)))

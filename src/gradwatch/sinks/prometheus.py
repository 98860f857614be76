"""Prometheus export in node_exporter's textfile-collector format (`--textfile DIR`).

node_exporter reads every `*.prom` file of its `--collector.textfile.directory` at each scrape, so
the file is replaced atomically (its temporary name does not end in `.prom`) and made readable by
the exporter's user. Each log file is one series per metric, labelled `path` (the file) and `run`
(its name without log suffixes); alert counts are counters that only grow while a file is scanned.
Federation and Alertmanager rules then work on `gradwatch_*` like on any other exporter.
`families` defines every metric once; `sinks/metrics_http.py` serves the same over HTTP.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from gradwatch._atomic import write_atomic
from gradwatch.alerts import Alert
from gradwatch.pipeline import FileSummary
from gradwatch.sources.archive import LOG_SUFFIXES

__all__ = ["TEXTFILE_NAME", "Family", "RunMetrics", "families", "render", "run_metrics", "write_textfile"]

TEXTFILE_NAME = "gradwatch.prom"

#: (canonical metric, exported name, help) of the per-run gauges taken from the last logged values.
_VALUE_GAUGES = (
    ("loss", "gradwatch_loss", "Last logged training loss."),
    ("grad_norm", "gradwatch_grad_norm", "Last logged gradient norm."),
    ("loss_scale", "gradwatch_loss_scale", "Last logged fp16 loss scale."),
    ("lr", "gradwatch_lr", "Last logged learning rate."),
)


@dataclass
class RunMetrics:
    """What one log file exports."""

    path: str
    last_step: int | None = None
    #: last logged value per canonical metric name
    values: dict[str, float] = field(default_factory=dict)
    #: wall-clock seconds since the last step was written, when known
    seconds_since_step: float | None = None
    #: (detector, severity) -> alerts raised in this file since it was first scanned
    alerts: dict[tuple[str, str], int] = field(default_factory=dict)


def _run_label(path: str) -> str:
    """`runs/gpt-7b/train.log.gz` -> `train`: the file's name without its log suffixes."""
    name = Path(path).name.removesuffix(".gz")
    for suffix in LOG_SUFFIXES:
        name = name.removesuffix(suffix)
    return name or Path(path).name


@dataclass(frozen=True)
class Family:
    """One metric family: the textfile and `tail --metrics-port` both expose exactly these."""

    name: str
    kind: str  #: "gauge" or "counter"
    help: str
    samples: list[tuple[dict[str, str], float]]


def families(runs: list[RunMetrics]) -> list[Family]:
    """The per-run families, defined once for every exporter."""

    def base(run: RunMetrics) -> dict[str, str]:
        return {"path": run.path, "run": _run_label(run.path)}

    out = [
        Family(
            "gradwatch_last_step",
            "gauge",
            "Last training step logged.",
            [(base(r), r.last_step) for r in runs if r.last_step is not None],
        )
    ]
    for metric, name, help_text in _VALUE_GAUGES:
        out.append(Family(name, "gauge", help_text, [(base(r), r.values[metric]) for r in runs if metric in r.values]))
    out.append(
        Family(
            "gradwatch_seconds_since_last_step",
            "gauge",
            "Wall-clock seconds since the last step was written to the log.",
            [(base(r), r.seconds_since_step) for r in runs if r.seconds_since_step is not None],
        )
    )
    out.append(
        Family(
            "gradwatch_alerts_total",
            "counter",
            "Alerts raised, by detector and severity.",
            [
                ({**base(r), "detector": det, "severity": sev}, n)
                for r in runs
                for (det, sev), n in sorted(r.alerts.items())
            ],
        )
    )
    return out


def run_metrics(summary: FileSummary, last_step_at: float | None, now: float, alerts: Iterable[Alert]) -> RunMetrics:
    """What a followed file exports now: its summary, its silence, and its alerts counted."""
    counts: Counter[tuple[str, str]] = Counter((a.detector, str(a.severity)) for a in alerts if a.path == summary.path)
    return RunMetrics(
        path=summary.path,
        last_step=summary.last_step,
        values=dict(summary.last_values),
        seconds_since_step=None if last_step_at is None else max(0.0, now - last_step_at),
        alerts=dict(counts),
    )


def render(runs: list[RunMetrics], now: float) -> str:
    """The textfile: HELP and TYPE once per metric family, then its samples; the scan's time last."""
    scanned = Family(
        "gradwatch_last_scan_timestamp_seconds", "gauge", "When gradwatch scan last finished.", [({}, now)]
    )
    out: list[str] = []
    for fam in [*families(runs), scanned]:
        out.append(f"# HELP {fam.name} {fam.help}")
        out.append(f"# TYPE {fam.name} {fam.kind}")
        out.extend(f"{fam.name}{_labels(labels)} {_value(v)}" for labels, v in fam.samples)
    return "\n".join(out) + "\n"


def write_textfile(directory: Path, text: str) -> Path:
    """Replace DIR/gradwatch.prom atomically; readable by all (node_exporter runs as its own user)."""
    path = directory / TEXTFILE_NAME
    write_atomic(path, text.encode("utf-8", errors="replace"), mode=0o644)
    return path


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"


def _escape(value: str) -> str:
    """Label values escape backslash, double quote and newline, as the exposition format says."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _value(v: float) -> str:
    if isinstance(v, int):
        return str(v)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))

"""The self-contained HTML page of `report` and `compare`: facts at the top, plotly panels, tables.

Self-contained means it needs no network: plotly.js (from the `plotly` package) is inlined, with
the figures as JSON, inline CSS and system fonts. Its Content-Security-Policy forbids loading
anything and runs only the page's own scripts (by hash; no `eval`), so log text, escaped
everywhere, could not run or fetch anything even if an escape were missed. Styles are allowed
inline because plotly.js adds its own style rules as it draws. The page's script opens an
alert's table row when its marker is clicked, and marks `<html data-ready="1">` when every figure
is drawn, which is how the browser test knows it loaded.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
from collections.abc import Sequence
from html import escape
from typing import Any

from gradwatch.alerts import Alert
from gradwatch.plots.figure import PanelData
from gradwatch.plots.interactive import CONFIG, figure
from gradwatch.plots.series import RunSeries
from gradwatch.plots.trend import TrendRow

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;max-width:1140px;
  padding:0 16px;color:#222;background:#fff}
h1{font-size:20px;margin:0 0 12px} h2{font-size:16px;margin:28px 0 6px;word-break:break-all}
.facts{color:#444;margin:0 0 8px} .facts b{color:#222;font-weight:600} .error{color:#b00}
.figure{width:100%;margin:4px 0 10px} .help{color:#666;font-size:12px;margin:0}
table{border-collapse:collapse;width:100%;font-size:13px;margin:8px 0 16px}
th,td{text-align:left;padding:4px 8px;border-bottom:1px solid #eee;vertical-align:top}
th{color:#666;font-weight:500} td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr:target{background:#fff4cc} tr.grows{background:#fdecea}
.critical{color:#d62728;font-weight:600} .warning{color:#b37400} .info{color:#3b82c4}
.where,.hint{color:#666} .hint{font-style:italic} .none{color:#2a7a2a}
"""

_SCRIPT = """
const drawn = [];
for (const div of document.querySelectorAll("div.figure")) {
  const fig = JSON.parse(document.getElementById(div.id + "-data").textContent);
  drawn.push(Plotly.newPlot(div, fig.data, fig.layout, fig.config).then(() => {
    div.on("plotly_clickannotation", (e) => { if (e.annotation.name) location.hash = e.annotation.name; });
  }));
}
Promise.all(drawn).then(() => { document.documentElement.dataset.ready = "1"; });
"""

_HELP = (
    '<p class="help">Hover for every panel\'s values at a step; drag across a panel to zoom to those steps '
    "(double-click: all steps). Numbered markers are the alerts below; red bands: NaN or infinite values; "
    "&times;: fp16 overflows.</p>"
)


def _sha256(text: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()


@functools.cache
def _plotly_js() -> tuple[str, str]:
    """plotly.js and the Content-Security-Policy that lets it and the page's script run."""
    from plotly.offline import get_plotlyjs

    js = get_plotlyjs()
    csp = (
        f"default-src 'none'; script-src '{_sha256(js)}' '{_sha256(_SCRIPT)}'; style-src 'unsafe-inline'; img-src data:"
    )
    return js, csp


def _page(title: str, body: list[str]) -> str:
    js, csp = _plotly_js()
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en">',
            "<head>",
            '<meta charset="utf-8">',
            f'<meta http-equiv="Content-Security-Policy" content="{csp}">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{escape(title)}</title>",
            f"<style>{_CSS}</style>",
            f"<script>{js}</script>",
            "</head>",
            "<body>",
            *body,
            f"<script>{_SCRIPT}</script>",
            "</body>",
            "</html>",
            "",
        ]
    )


def _figure(div_id: str, panels: list[PanelData]) -> list[str]:
    """A plotly figure: its div and its JSON (with `<` escaped, so no text can close the script)."""
    fig: dict[str, Any] = {**figure(panels), "config": CONFIG}
    data = json.dumps(fig, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")
    return [
        f'<div class="figure" id="{div_id}"></div>',
        f'<script type="application/json" id="{div_id}-data">{data}</script>',
    ]


def _facts(run: RunSeries) -> list[str]:
    s = run.summary
    counts = {sev: sum(str(a.severity) == sev for a in run.alerts) for sev in ("critical", "warning", "info")}
    alerts = ", ".join(f"{n} {sev}" for sev, n in counts.items())
    out = [
        f'<p class="facts"><b>format</b> {escape(s.format_text)} &middot; <b>records</b> {s.records:,} &middot; '
        f"<b>steps</b> {run.steps_text()} &middot; <b>spike score</b> {escape(run.spike_text())} &middot; "
        f"<b>alerts</b> {alerts}</p>"
    ]
    if s.error:
        out.append(f'<p class="error">{escape(s.error)}</p>')
    return out


def _alert_table(alerts: list[Alert], first: int) -> list[str]:
    if not alerts:
        return ['<p class="none">no alerts</p>']
    out = [
        '<table class="alerts"><thead><tr><th>#</th><th>severity</th><th class="num">step</th><th>detector</th>'
        "<th>what</th></tr></thead><tbody>"
    ]
    for number_, a in enumerate(alerts, first):
        where = f"{a.path}:{a.line}" if a.line is not None else (a.path or "")
        step = "" if a.step is None else f"{a.step:,}"
        out.append(
            f'<tr id="alert-{number_}"><td class="num">{number_}</td><td class="{a.severity}">{a.severity}</td>'
            f'<td class="num">{step}</td><td>{escape(a.detector)}</td><td>{escape(a.message)}'
            f'<div class="where">{escape(where)}</div><div class="hint">hint: {escape(a.hint)}</div></td></tr>'
        )
    out.append("</tbody></table>")
    return out


def report_page(runs: list[tuple[RunSeries, list[PanelData]]], unread: Sequence[str] = ()) -> str:
    """One section per log; alert numbers run across the page, as `figure.report_panels` numbered them.

    `unread` are the messages of the logs that could not be drawn, listed at the top.
    """
    body = ["<h1>gradwatch report</h1>"]
    if unread:
        body.append('<p class="error">not drawn:</p><ul class="unread">')
        body += [f'<li class="error">{escape(message)}</li>' for message in unread]
        body.append("</ul>")
    body.append(_HELP)
    first = 1
    for index, (run, panels) in enumerate(runs, 1):
        body.append(f'<section class="run" data-path="{escape(run.summary.path)}">')
        body.append(f"<h2>{escape(run.summary.path)}</h2>")
        body += _facts(run)
        if panels:
            body += _figure(f"figure-{index}", panels)
        body += _alert_table(run.alerts, first)
        body.append("</section>")
        first += len(run.alerts)
    title = "gradwatch report: " + ", ".join(run.summary.path for run, _ in runs)
    return _page(title, body)


def compare_page(
    runs: list[RunSeries], labels: list[str], panels: list[PanelData], rows: list[TrendRow], window: int
) -> str:
    """The runs' facts, one overlay panel per metric, and the trend table with marked runs."""
    body = [
        "<h1>gradwatch compare</h1>",
        '<table class="runs"><thead><tr><th>run</th><th>file</th>'
        '<th>format</th><th class="num">steps</th><th>spike score</th><th class="num">alerts</th>'
        "</tr></thead><tbody>",
    ]
    for label, run in zip(labels, runs, strict=True):
        s = run.summary
        body.append(
            f"<tr><td>{escape(label)}</td><td>{escape(s.path)}</td><td>{escape(s.format_text)}</td>"
            f'<td class="num">{run.steps_text()}</td><td>{escape(run.spike_text())}</td>'
            f'<td class="num">{len(run.alerts)}</td></tr>'
        )
    body.append("</tbody></table>")
    body += [_HELP, *_figure("figure-1", panels)]
    body.append(
        f'<table class="trends"><thead><tr><th>run</th><th>metric</th><th class="num">last</th>'
        f'<th class="num">growth, last {window:,} steps</th><th class="num">slope of ln, per 1k steps</th>'
        "<th></th></tr></thead><tbody>"
    )
    for row in rows:
        cells = row.cells()
        mark = "grows while the others stay flat" if row.grows_alone else ""
        body.append(
            f'<tr class="{"grows" if row.grows_alone else ""}" data-run="{escape(row.run)}" '
            f'data-metric="{escape(row.metric)}" data-grows="{int(row.grows_alone)}"><td>{escape(row.run)}</td>'
            f'<td>{escape(row.metric)}</td><td class="num">{cells[0]}</td><td class="num">{cells[1]}</td>'
            f'<td class="num">{cells[2]}</td><td class="critical">{mark}</td></tr>'
        )
    body.append("</tbody></table>")
    return _page("gradwatch compare: " + ", ".join(labels), body)

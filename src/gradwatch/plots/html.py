"""The self-contained HTML page of `report` and `compare`: facts at the top, SVG panels, tables.

Self-contained means it needs no network: inline CSS, inline SVG, one inline script, system fonts.
Its Content-Security-Policy forbids loading anything and allows only that script and style (by
hash), so log text, escaped everywhere, could not run or fetch anything even if an escape were
missed. The script adds a step readout under the mouse and marks `<html data-ready="1">` when it
ran, which is how the browser test knows the page loaded without errors.
"""

from __future__ import annotations

import base64
import hashlib
from html import escape

from gradwatch.alerts import Alert
from gradwatch.plots.figure import PanelData
from gradwatch.plots.series import RunSeries
from gradwatch.plots.svg import panel_svg
from gradwatch.plots.trend import TrendRow

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;max-width:1140px;
  padding:0 16px;color:#222;background:#fff}
h1{font-size:20px;margin:0 0 12px} h2{font-size:16px;margin:28px 0 6px;word-break:break-all}
.facts{color:#444;margin:0 0 8px} .facts b{color:#222;font-weight:600} .error{color:#b00}
svg.panel{width:100%;height:auto;display:block;margin:4px 0 10px}
svg .frame{fill:none;stroke:#bbb} svg .grid{stroke:#eee} svg .tick{font-size:11px;fill:#666}
svg .title{font-size:13px;font-weight:600;fill:#222} svg .legend,svg .readout{font-size:12px;fill:#444}
svg .series{stroke-width:1.2;stroke-linejoin:round} svg .cursor{stroke:#999} svg .overflows{stroke-width:1.5}
table{border-collapse:collapse;width:100%;font-size:13px;margin:8px 0 16px}
th,td{text-align:left;padding:4px 8px;border-bottom:1px solid #eee;vertical-align:top}
th{color:#666;font-weight:500} td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr:target{background:#fff4cc} tr.grows{background:#fdecea}
.critical{color:#d62728;font-weight:600} .warning{color:#b37400} .info{color:#3b82c4}
.where,.hint{color:#666} .hint{font-style:italic} .none{color:#2a7a2a}
"""

_SCRIPT = """
for (const svg of document.querySelectorAll("svg.panel")) {
  const d = svg.dataset, x0 = +d.x0, x1 = +d.x1, left = +d.left, right = +d.right;
  const cursor = svg.querySelector(".cursor"), readout = svg.querySelector(".readout");
  svg.addEventListener("mousemove", (e) => {
    const box = svg.getBoundingClientRect();
    const vx = (e.clientX - box.left) / box.width * svg.viewBox.baseVal.width;
    const inside = vx >= left && vx <= right;
    cursor.setAttribute("visibility", inside ? "visible" : "hidden");
    readout.textContent = inside
      ? d.xlabel + " " + Math.round(x0 + (vx - left) / (right - left) * (x1 - x0)).toLocaleString("en-US")
      : "";
    cursor.setAttribute("x1", vx);
    cursor.setAttribute("x2", vx);
  });
  svg.addEventListener("mouseleave", () => {
    cursor.setAttribute("visibility", "hidden");
    readout.textContent = "";
  });
}
document.documentElement.dataset.ready = "1";
"""


def _sha256(text: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()


_CSP = f"default-src 'none'; style-src '{_sha256(_CSS)}'; script-src '{_sha256(_SCRIPT)}'"


def _page(title: str, body: list[str]) -> str:
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en">',
            "<head>",
            '<meta charset="utf-8">',
            f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{escape(title)}</title>",
            f"<style>{_CSS}</style>",
            "</head>",
            "<body>",
            *body,
            f"<script>{_SCRIPT}</script>",
            "</body>",
            "</html>",
            "",
        ]
    )


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


def report_page(runs: list[tuple[RunSeries, list[PanelData]]]) -> str:
    """One section per log; alert numbers run across the page, as `figure.report_panels` numbered them."""
    body = ["<h1>gradwatch report</h1>"]
    first = 1
    for run, panels in runs:
        body.append(f'<section class="run" data-path="{escape(run.summary.path)}">')
        body.append(f"<h2>{escape(run.summary.path)}</h2>")
        body += _facts(run)
        body += [panel_svg(p) for p in panels]
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
    body += [panel_svg(p) for p in panels]
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

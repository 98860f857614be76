"""`--output markdown`: the report as GitHub-flavoured Markdown, for a job summary or a PR comment.

A heading with the totals, a table with a row per file (format, records, steps, alerts by
severity), then per file with alerts a table of them (severity, step, detector, message and hint,
where). At most `MAX_ROWS` alerts are listed per file: GitHub takes 1 MiB of summary per step.

Log text (paths, messages) is untrusted: in a table cell it could close the cell (`|`), inject
HTML or links, mention someone, or start emphasis, code or math. `safe_text(..., "markdown")` backslash-escapes every
character Markdown gives a meaning to in inline text, breaks URLs that would autolink, turns line
breaks into spaces and removes control characters and bidi marks, so what shows is the text itself.
"""

from __future__ import annotations

from gradwatch.alerts import Alert, Severity
from gradwatch.pipeline import FileSummary
from gradwatch.sinks.report import Report
from gradwatch.sinks.safe import safe_text

__all__ = ["MAX_ROWS", "cell", "render"]

#: Alerts listed per file; the rest are counted in a line below the table.
MAX_ROWS = 50


def render(report: Report) -> str:
    c = report.counts()
    n = len(report.files)
    out = [
        f"## gradwatch: {n} file{'s' if n != 1 else ''} checked: {c['critical']} critical, "
        f"{c['warning']} warning, {c['info']} info (exit {int(report.exit_code)})",
        "",
        "| file | format | records | steps | critical | warning | info | note |",
        "|---|---|--:|---|--:|--:|--:|---|",
    ]
    by_file = {f.path: [a for a in report.alerts if a.path == f.path] for f in report.files}
    out += [_file_row(f, by_file[f.path]) for f in report.files]
    for f in report.files:
        if by_file[f.path]:
            out += ["", f"### {cell(f.path)}", "", *_alert_table(by_file[f.path])]
    return "\n".join(out) + "\n"


def _file_row(f: FileSummary, alerts: list[Alert]) -> str:
    steps = f"{f.first_step:,}-{f.last_step:,}" if f.first_step is not None and f.last_step is not None else ""
    counts = [str(sum(a.severity == s for a in alerts)) for s in (Severity.CRITICAL, Severity.WARNING, Severity.INFO)]
    row = [cell(f.path), cell(f.format or ""), f"{f.records:,}", steps, *counts, cell(f.error or "")]
    return "| " + " | ".join(row) + " |"


def _alert_table(alerts: list[Alert]) -> list[str]:
    rows = ["| severity | step | detector | what | where |", "|---|--:|---|---|---|"]
    for a in alerts[:MAX_ROWS]:
        severity = f"**{a.severity}**" if a.severity == Severity.CRITICAL else str(a.severity)
        step = "" if a.step is None else f"{a.step:,}"
        what = f"{cell(a.message)}<br>*hint:* {cell(a.hint)}"
        where = cell(f"{a.path}:{a.line}" if a.line is not None else (a.path or ""))
        rows.append(f"| {severity} | {step} | {cell(a.detector)} | {what} | {where} |")
    if len(alerts) > MAX_ROWS:
        rows += ["", f"{len(alerts) - MAX_ROWS} more alerts: `--output text` or `--output json` lists them all."]
    return rows


def cell(text: str) -> str:
    """Text shown as itself inside a table cell or a heading."""
    return safe_text(text, "markdown")

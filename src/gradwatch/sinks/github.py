"""`--output github`: alerts as GitHub Actions workflow commands, which the runner turns into
annotations on the run and on the log files in the pull request.

    ::warning file=PATH,line=N,title=DETECTOR::step S: MESSAGE%0Ahint: HINT     a warning
    ::error file=PATH,line=N,title=DETECTOR::...                                a critical alert
    ::error file=PATH,title=unreadable::WHY                                     a file without usable records
    ::warning file=PATH,title=unreadable::WHY                                   a read problem after some records

Info alerts are left out (they say a problem is over). The last line is a plain summary.

Escaping is the Actions toolkit's (`actions/toolkit`, packages/core/src/command.ts): in the
message `%`, CR and LF become %25, %0D and %0A; property values also escape `:` and `,` as %3A
and %2C. Other control characters are removed. So a log line can neither end a command early,
nor add a property, nor start a command of its own on a new line. Both are `safe_text` targets:
escape sequences and bidi marks go as everywhere else.
"""

from __future__ import annotations

from gradwatch.alerts import Alert, Severity
from gradwatch.sinks.report import Report
from gradwatch.sinks.safe import safe_text

__all__ = ["escape_data", "escape_property", "render"]

_COMMAND = {Severity.WARNING: "warning", Severity.CRITICAL: "error"}


def render(report: Report) -> str:
    """One workflow command per warning or critical alert and per unreadable file, then a summary line."""
    lines = [_command("error", {"file": f.path, "title": "unreadable"}, f.error) for f in report.files if f.error]
    lines += [_alert(a) for a in report.alerts if a.severity in _COMMAND]
    c = report.counts()
    n = len(report.files)
    lines.append(
        f"gradwatch: {n} file{'s' if n != 1 else ''} checked: {c['critical']} critical, {c['warning']} warning, "
        f"{c['info']} info (exit {int(report.exit_code)})"
    )
    return "\n".join(lines) + "\n"


def _alert(a: Alert) -> str:
    props = {"file": a.path, "line": None if a.line is None else str(a.line), "title": a.detector}
    step = "" if a.step is None else f"step {a.step}: "
    return _command(_COMMAND[a.severity], props, f"{step}{a.message}\nhint: {a.hint}")


def _command(name: str, props: dict[str, str | None], message: str) -> str:
    joined = ",".join(f"{k}={escape_property(v)}" for k, v in props.items() if v is not None)
    return f"::{name} {joined}::{escape_data(message)}"


def escape_data(text: str) -> str:
    """A command's message: %, CR and LF percent-encoded, other control characters removed."""
    return safe_text(text, "github-data")


def escape_property(text: str) -> str:
    """A property value: the message's escapes, and `:` and `,` that would end the value."""
    return safe_text(text, "github-property")

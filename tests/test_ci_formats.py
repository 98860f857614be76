"""The CI outputs (`--output junit|github|markdown`) and the examples/ that use them.

End-to-end runs go through the real CLI on Megatron-DeepSpeed logs written into tmp_path, one of
them named with the characters workflow commands must escape; `check --output json` over the same
files is the oracle. Hostile log text (markup, escapes, separators) goes through each renderer
directly, and each output is read back with a real parser: ElementTree, a workflow-command regex,
markdown-it (rich's Markdown parser).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from markdown_it import MarkdownIt

from gradwatch import synth
from gradwatch.alerts import Alert, Severity
from gradwatch.cli import CI_OUTPUTS, cli
from gradwatch.detectors import DETECTORS
from gradwatch.pipeline import FileSummary
from gradwatch.sinks import github, junit, markdown
from gradwatch.sinks.ci import RENDERERS
from gradwatch.sinks.report import Report
from tests.conftest import REPO, run_cli
from tests.test_bad_input import check_report, megatron_log, no_traceback
from tests.test_cli import nan_log_text

EXAMPLES = REPO / "examples"
#: `::warning file=P,line=N,title=T::M`: property values without raw `,` `:` `%`-escapes aside,
#: a message without raw CR/LF, every `%` part of %25, %0D, %0A (or, in properties, %3A, %2C).
_PROP = r"(?:[^,:%\r\n]|%25|%0D|%0A|%3A|%2C)*"
COMMAND = re.compile(
    rf"^::(?P<cmd>warning|error) file=(?P<file>{_PROP})(?:,line=(?P<line>\d+))?,title=(?P<title>{_PROP})"
    r"::(?P<msg>(?:[^%\r\n]|%25|%0D|%0A)*)$"
)
HOSTILE = 'rate 50% done, loss: 2.1\r\nnext <b>&amp;</b> "q" ]]> [x](http://e.x) *em* `c` $m$ | @team \x1b[31m\x00end'


def unescape(text: str) -> str:
    for code, char in (("%0D", "\r"), ("%0A", "\n"), ("%3A", ":"), ("%2C", ","), ("%25", "%")):
        text = text.replace(code, char)
    return text


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory: a log with one grad-norm spike (an awkward name) and one with NaN/Inf values."""
    d = tmp_path_factory.mktemp("ci") / "logs"
    d.mkdir()
    (d / "spike, run: 50%.log").write_text(megatron_log(300, spike_at=2500))
    (d / "nan.log").write_text(nan_log_text())
    return d


@pytest.fixture(scope="module")
def oracle(logs: Path) -> tuple[int, dict[str, Any]]:
    return check_report(str(logs))


def ci(output: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return no_traceback(run_cli("check", "--output", output, *args, env={"GITHUB_STEP_SUMMARY": "", **(env or {})}))


def hostile_report() -> Report:
    """A file whose path and alert carry what every format must escape, and a file nobody could read."""
    path = "logs/run, 50%: <x>.log"
    alert = Alert("nonfinite", Severity.CRITICAL, 7, "loss", float("nan"), 2.0, None, HOSTILE, "hint: a|b", 3, path)
    info = Alert("nonfinite", Severity.INFO, 9, None, None, None, None, "finite again", "none", 5, path)
    files = [
        FileSummary(path, format="megatron", records=10, first_step=1, last_step=10, detectors=("nonfinite", "stall")),
        FileSummary("cut.log", error="cut.log: no known format\x1b[2J (tried megatron)"),
    ]
    return Report(files=files, alerts=[alert, info])


def test_the_cli_offers_exactly_the_ci_renderers() -> None:
    assert set(CI_OUTPUTS) == set(RENDERERS)


# ---- JUnit ------------------------------------------------------------------------------------------
def test_junit_is_one_suite_per_file_one_case_per_detector_and_one_failure_per_alert(
    logs: Path, oracle: tuple[int, dict[str, Any]]
) -> None:
    code, report = oracle
    p = ci("junit", str(logs))
    assert p.returncode == code == 1
    root = ET.fromstring(p.stdout)
    assert root.tag == "testsuites" and [s.tag for s in root] == ["testsuite"] * len(report["files"])
    for suite, f in zip(root, report["files"], strict=True):
        assert suite.get("name") == f["path"]
        props = {e.get("name"): e.get("value") for e in suite.findall("properties/property")}
        assert props == {
            "format": f["format"],
            "records": str(f["records"]),
            "first_step": str(f["first_step"]),
            "last_step": str(f["last_step"]),
            "fail_on": "warning",
        }
        cases = suite.findall("testcase")
        assert all(c.get("classname") == f["path"] and c.get("name") for c in cases)
        assert all(len(c) <= 1 and {e.tag for e in c} <= {"failure", "error"} for c in cases)
        failures = [c.find("failure") for c in cases if c.find("failure") is not None]
        assert suite.get("tests") == str(len(cases)) and suite.get("failures") == str(len(failures))
        assert suite.get("errors") == "0" and suite.get("skipped") == "0"
        alerts = [a for a in report["alerts"] if a["path"] == f["path"]]
        failing = [a for a in alerts if a["severity"] != "info"]
        assert failing, "each log must have an alert at or above warning"
        assert [(e.get("type"), e.get("message")) for e in failures if e is not None] == [
            (a["severity"], a["message"]) for a in failing
        ]
        assert [c.get("name") for c in cases if c.find("failure") is not None] == [
            f"{a['detector']} at step {a['step']}" for a in failing
        ]
        passing = {c.get("name") for c in cases if len(c) == 0}
        assert passing == set(DETECTORS) - {a["detector"] for a in failing}
        out = suite.findtext("system-out") or ""
        assert all(a["message"] in out for a in alerts if a["severity"] == "info")
    for attr in ("tests", "failures", "errors"):
        assert root.get(attr) == str(sum(int(s.get(attr, "")) for s in root))


def test_junit_fail_on_critical_fails_only_critical_alerts(logs: Path, oracle: tuple[int, dict[str, Any]]) -> None:
    _, report = oracle
    root = ET.fromstring(ci("junit", str(logs), "--fail-on", "critical").stdout)
    assert int(root.get("failures", "")) == sum(a["severity"] == "critical" for a in report["alerts"]) > 0
    assert {e.get("type") for e in root.iter("failure")} == {"critical"}


def test_junit_escapes_log_text_and_reports_unreadable_files_as_errors() -> None:
    root = ET.fromstring(junit.render(hostile_report()))
    good, cut = root.findall("testsuite")
    assert good.get("name") == "logs/run, 50%: <x>.log"
    (failure,) = good.iter("failure")
    assert failure.get("message") == HOSTILE.replace("\r", "").replace("\x1b[31m", "").replace("\x00", "")
    assert [c.get("name") for c in good.findall("testcase")] == ["stall", "nonfinite at step 7"]
    assert "finite again" in (good.findtext("system-out") or "")
    (error,) = cut.iter("error")
    assert error.get("message") == "cut.log: no known format (tried megatron)"
    assert (cut.get("tests"), cut.get("errors"), root.get("errors"), root.get("failures")) == ("1", "1", "1", "1")


# ---- GitHub workflow commands ------------------------------------------------------------------------
def test_github_annotations_are_workflow_commands_for_every_warning_and_critical_alert(
    logs: Path, oracle: tuple[int, dict[str, Any]]
) -> None:
    code, report = oracle
    p = ci("github", str(logs))
    assert p.returncode == code
    *commands, summary = p.stdout.splitlines()
    assert all(COMMAND.match(line) for line in commands), [line for line in commands if not COMMAND.match(line)]
    matches = [m for line in commands if (m := COMMAND.match(line))]
    got = [(m["cmd"], unescape(m["file"]), int(m["line"]), unescape(m["title"]), unescape(m["msg"])) for m in matches]
    annotated = [a for a in report["alerts"] if a["severity"] != "info"]
    expected = [
        (
            "error" if a["severity"] == "critical" else "warning",
            a["path"],
            a["line"],
            a["detector"],
            f"step {a['step']}: {a['message']}\nhint: {a['hint']}",
        )
        for a in annotated
    ]
    assert got == expected
    assert any("spike%2C run%3A 50%25.log" in line for line in commands)
    s = report["summary"]
    assert summary.startswith("gradwatch: 2 files checked: ") and f"{s['critical']} critical" in summary
    assert summary.endswith(f"(exit {code})")


def test_github_escapes_percent_cr_lf_in_messages_and_also_colon_comma_in_properties() -> None:
    unreadable, first, summary = github.render(hostile_report()).splitlines()
    assert first == (
        "::error file=logs/run%2C 50%25%3A <x>.log,line=3,title=nonfinite::"
        'step 7: rate 50%25 done, loss: 2.1%0D%0Anext <b>&amp;</b> "q" ]]> [x](http://e.x) *em* `c` $m$ | @team '
        "end%0Ahint: hint: a|b"
    )
    assert unreadable == "::error file=cut.log,title=unreadable::cut.log: no known format (tried megatron)"
    assert all(COMMAND.match(line) for line in (first, unreadable))
    assert summary == "gradwatch: 2 files checked: 1 critical, 0 warning, 1 info (exit 2)"
    assert github.escape_property("a:b,c%d\ne") == "a%3Ab%2Cc%25d%0Ae"


@pytest.mark.parametrize(
    "error",
    [
        "run.log.gz: damaged gzip data (Compressed file ended before the end-of-stream marker was reached)",
        "big.log: a worker process failed: MemoryError: ; the rest of the file went unchecked; try --jobs 1",
    ],
)
def test_a_file_read_only_in_part_fails_the_check_in_every_format(error: str) -> None:
    """Records were read, but not all of the file: an error (not a warning), exit 2 (a damaged
    gzip passed CI with exit 0; found by QA)."""
    path = error.split(":")[0]
    report = Report(files=[FileSummary(path, records=5, error=error)])
    assert report.exit_code == 2
    assert github.render(report).splitlines()[0] == f"::error file={path},title=unreadable::{error}"
    case = ET.fromstring(junit.render(report)).find("testsuite/testcase/error")
    assert case is not None and case.get("type") == "unreadable" and case.get("message") == error


# ---- Markdown ------------------------------------------------------------------------------------------
def table_rows(html_text: str) -> list[list[str]]:
    """The cells of every body row of every table in rendered HTML."""
    rows = re.findall(r"<tr>(.*?)</tr>", html_text, re.S)
    return [re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", r, re.S) for r in rows]


def test_markdown_is_a_table_per_report_and_alerts_and_is_appended_to_the_step_summary(
    logs: Path, oracle: tuple[int, dict[str, Any]], tmp_path: Path
) -> None:
    code, report = oracle
    summary = tmp_path / "step_summary.md"
    summary.write_text("## an earlier step\n")
    p = ci("markdown", str(logs), env={"GITHUB_STEP_SUMMARY": str(summary)})
    assert p.returncode == code
    assert summary.read_text() == "## an earlier step\n" + p.stdout + "\n"
    html = MarkdownIt("commonmark").enable("table").render(p.stdout)
    rows = table_rows(html)
    assert rows[0] == ["file", "format", "records", "steps", "critical", "warning", "info", "note"]
    assert [r[0] for r in rows[1:3]] == [f["path"] for f in report["files"]]
    alert_rows = [r for r in rows if len(r) == 5 and r[0] != "severity"]
    assert len(alert_rows) == len(report["alerts"])
    assert [r[2] for r in alert_rows] == [a["detector"] for a in report["alerts"]]
    nowhere = ci("markdown", str(logs))  # no $GITHUB_STEP_SUMMARY: stdout only
    assert nowhere.stdout == p.stdout and nowhere.stderr == ""


def test_an_unwritable_step_summary_is_a_warning_and_stdout_is_still_the_report(logs: Path, tmp_path: Path) -> None:
    p = ci("markdown", str(logs), env={"GITHUB_STEP_SUMMARY": str(tmp_path)})  # a directory
    assert p.returncode == 1 and p.stdout.startswith("## gradwatch: 2 files checked")
    assert (
        p.stderr.startswith("warning: cannot append the report to $GITHUB_STEP_SUMMARY") and p.stderr.count("\n") == 1
    )


def test_markdown_shows_hostile_log_text_as_text() -> None:
    html = MarkdownIt("commonmark").enable(["table", "strikethrough"]).render(markdown.render(hostile_report()))
    assert not re.search(r"<(?!/?(?:h[23]|table|thead|tbody|tr|th|td|br|em|strong|p)\b)", html), html
    rows = table_rows(html)
    assert all(len(r) == 8 for r in rows[:3]) and all(len(r) == 5 for r in rows[3:])
    what = rows[4][3]
    assert what.startswith(
        "rate 50% done, loss: 2.1 next &lt;b&gt;&amp;amp;&lt;/b&gt; &quot;q&quot; ]]&gt; [x](http://e.x)"
    )
    assert what.endswith("*em* `c` $m$ | @team end<br><em>hint:</em> hint: a|b")


def test_markdown_lists_at_most_max_rows_alerts_per_file() -> None:
    path = "run.log"
    alerts = [Alert("loss_spike", Severity.WARNING, s, None, None, None, None, "m", "h", s, path) for s in range(60)]
    text = markdown.render(Report(files=[FileSummary(path, records=60)], alerts=alerts))
    assert text.count("| loss\\_spike |") == markdown.MAX_ROWS and "10 more alerts" in text


def test_scan_has_the_ci_outputs_too(logs: Path, tmp_path: Path) -> None:
    p = no_traceback(run_cli("scan", str(logs), "--state", str(tmp_path / "s.json"), "--output", "junit"))
    assert p.returncode == 1 and int(ET.fromstring(p.stdout).get("failures", "")) > 0
    again = no_traceback(run_cli("scan", str(logs), "--state", str(tmp_path / "s.json"), "--output", "github"))
    assert again.returncode == 0 and again.stdout.startswith("gradwatch: 2 files checked: 0 critical, 0 warning")


# ---- examples/ -------------------------------------------------------------------------------------------
def assert_known_options(command: click.Command, tokens: list[str]) -> None:
    """Every `--option` an example passes exists on that command."""
    known = {opt for param in command.params for opt in param.opts}
    unknown = [t.split("=")[0] for t in tokens if t.startswith("--") and t.split("=")[0] not in known]
    assert not unknown, f"{command.name} has no {unknown}"


def gradwatch_args(line: str, command: str) -> list[str]:
    """The arguments after `gradwatch COMMAND` in a shell line, up to a redirection or `||`."""
    tokens = shlex.split(line[line.index(f"gradwatch {command}") :])[2:]
    stop = next((i for i, t in enumerate(tokens) if t in ("||", "&", "|") or t[:1] == ">" or t[:2] == "2>"), None)
    return tokens[:stop]


def test_the_github_workflow_checks_logs_with_annotations_and_a_markdown_summary() -> None:
    workflow = yaml.safe_load((EXAMPLES / "github" / "gradwatch.yml").read_text())
    runs = [step["run"] for job in workflow["jobs"].values() for step in job["steps"] if "run" in step]
    check = [r for r in runs if "gradwatch check" in r]
    assert any(r.startswith("gradwatch check logs/ --output github") for r in check)
    assert any("--output markdown" in r for r in check)
    for r in check:
        assert_known_options(cli.commands["check"], gradwatch_args(r, "check"))


def test_the_crontab_line_is_a_five_field_schedule_running_scan() -> None:
    lines = (EXAMPLES / "cron" / "crontab").read_text().splitlines()
    (line,) = [x for x in lines if x and not x.startswith("#") and "=" not in x.split()[0]]  # not a comment or VAR=
    fields = line.split(maxsplit=5)
    assert fields[0] == "*/5" and fields[1:5] == ["*"] * 4 and "%" not in line
    args = gradwatch_args(fields[5], "scan")
    assert "--state" in args and "--textfile" in args
    assert_known_options(cli.commands["scan"], args)


def test_the_slurm_script_is_valid_bash_and_cancels_the_job_on_a_critical_alert() -> None:
    script = EXAMPLES / "slurm" / "train_with_gradwatch.sbatch"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text().replace("\\\n", " ")
    (line,) = [x for x in text.splitlines() if x.lstrip().startswith("gradwatch tail")]
    args = gradwatch_args(line, "tail")
    assert args[args.index("--on-alert") + 1] == "scancel $SLURM_JOB_ID"  # expanded by bash, not by gradwatch
    assert_known_options(cli.commands["tail"], args)
    assert "kill -TERM" in text and "trap" in text


def test_the_prometheus_rules_use_only_metrics_gradwatch_exports(tmp_path: Path) -> None:
    log, textfile = tmp_path / "run.log", tmp_path / "textfile"
    synth.write_log(log, synth.RunSpec(fmt="megatron-deepspeed", steps=300, seed=1))
    textfile.mkdir()
    no_traceback(run_cli("scan", str(log), "--state", str(tmp_path / "s.json"), "--textfile", str(textfile)))
    exported = set(re.findall(r"^# TYPE (\S+) ", (textfile / "gradwatch.prom").read_text(), re.M))

    rules = yaml.safe_load((EXAMPLES / "prometheus" / "gradwatch-rules.yml").read_text())
    exprs = {r["alert"]: str(r["expr"]) for g in rules["groups"] for r in g["rules"]}
    used = {name for e in exprs.values() for name in re.findall(r"\bgradwatch_[a-z_]+", e)}
    assert used <= exported, used - exported
    assert "gradwatch_seconds_since_last_step" in exprs["TrainingRunStalled"]
    assert 'gradwatch_alerts_total{severity="critical"}' in exprs["TrainingRunCritical"]
    assert all(r.get("labels", {}).get("severity") for g in rules["groups"] for r in g["rules"])

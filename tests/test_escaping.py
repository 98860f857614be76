"""Escapes never get through: a corpus of hostile text × every output and sink gradwatch has.

Each payload is both in a log file's name and in the message of the crash the log ends with (a
`RuntimeError: PAYLOAD` that trainer_error reports), so it reaches every place an alert's text
and path go: the terminal report of check and scan, `tail -`'s lines, GitHub annotations,
Markdown, JUnit, `--notify-cmd`'s GRADWATCH_* variables and its printed stderr, and Slack. What
must not reach a terminal: controls (but tab and newline), escape sequences with their
parameters (OSC 52's clipboard data, a title), bidi marks, line separators. What must not come
alive in Markdown or Slack: links (bare URLs too), formatting, mentions, HTML, table cells.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from markdown_it import MarkdownIt

from tests.conftest import run_cli
from tests.test_ci_formats import COMMAND, table_rows, unescape
from tests.test_trainer_error import megatron_records
from tests.webhook_server import Receiver

#: name -> text. Markers in capitals are sequence parameters: seen anywhere, a sequence got through.
PAYLOADS = {
    "osc52": "\x1b]52;c;CLIPBOARDDATA\x07",
    "osc52-st": "\x1b]52;c;CLIPBOARDST\x1b\\",
    "title": "\x1b]0;TITLESET\x07",
    "title-c1": "\x9d2;TITLECONE\x9c",
    "csi": "\x1b[0m\x1b[2J\x1b[3J\x1bc\x9b31m",
    "bidi": "\u202eevil\u202c \u2066x\u2069 \u200e\u200f\u061c\u202a\u202b\u202d",
    "separators": "a\u2028b\u2029c",
    "controls": "\x07\x08\r\x0b\x0c\x7f\x85",
    "slack": "*bold* _it_ ~strike~ `code` <!channel> <@U123> <http://evil.example|click> &amp;",
    "markdown": "| a | b | `tick` [x](http://e.x) <b>html</b> ![i](http://e.x/i.png) **strong**",
    "urls": "https://evil.example/p?q=1 www.evil.example ftp://evil.example",
    "github": "%0A::error::injected ::warning file=x,line=1::injected",
}
MARKERS = ("CLIPBOARDDATA", "CLIPBOARDST", "TITLESET", "TITLECONE")
#: What no terminal, environment variable or notification text may hold.
FORBIDDEN = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u061c\u202a-\u202e\u2066-\u2069\u2028\u2029]")
#: A --notify-cmd that appends its GRADWATCH_* variables as a JSON line to a file.
ENV_RECORDER = (
    "import json, os, sys; env = {k: v for k, v in os.environ.items() if k.startswith('GRADWATCH_')}; "
    "open(sys.argv[1], 'a').write(json.dumps(env) + '\\n')"
)
#: A --notify-cmd that fails with every payload on its stderr.
FAILING = "import sys; sys.stderr.write(sys.argv[1] + '\\n'); sys.exit(4)"


def crash_log(payload: str) -> str:
    lines = ["Traceback (most recent call last):", '  File "train.py", line 1, in <module>', f"RuntimeError: {payload}"]
    return "\n".join(megatron_records(10, 50) + lines) + "\n"


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with a log per payload, named after it."""
    d = tmp_path_factory.mktemp("esc") / "logs"
    d.mkdir()
    for name, payload in PAYLOADS.items():
        (d / f"{name} {payload.replace('/', '')}.log").write_text(crash_log(payload), encoding="utf-8")
    return d


def assert_inert(text: str, where: str) -> None:
    """Nothing that drives a terminal or reorders text, and no sequence's parameters."""
    found = FORBIDDEN.search(text)
    assert found is None, f"{where}: {found.group()!r} in ...{text[max(0, found.start() - 60) : found.end() + 20]!r}"
    for marker in MARKERS:
        assert marker not in text, f"{where}: {marker} (an escape sequence's parameters) got through"


def test_the_payloads_reach_the_alerts(logs: Path) -> None:
    """(Else the other tests would prove nothing.) check's JSON keeps the text as it is."""
    p = run_cli("check", str(logs), "--output", "json")
    report = json.loads(p.stdout)
    crashes = [a for a in report["alerts"] if a["detector"] == "trainer_error"]
    assert len(crashes) == len(PAYLOADS)
    messages = " ".join(a["message"] + a["path"] for a in crashes)
    for payload in ("*bold*", "https://evil.example", "| a | b |", "\u202eevil", "a\u2028b", "%0A::error::"):
        assert payload in messages
    assert FORBIDDEN.search(messages) and any(m in messages for m in MARKERS)


@pytest.mark.parametrize("command", ["check", "scan"])
def test_the_terminal_report_is_inert(logs: Path, tmp_path: Path, command: str) -> None:
    state = ["--state", str(tmp_path / "s.json")] if command == "scan" else []
    p = run_cli(command, str(logs), *state)
    assert p.returncode == 1 and "RuntimeError" in p.stdout, p.stderr
    assert_inert(p.stdout, f"{command} stdout")
    assert_inert(p.stderr, f"{command} stderr")
    assert "https://evil.example" in p.stdout  # text, shown as it is, but for what was stripped


def test_tail_lines_are_inert(logs: Path) -> None:
    text = "".join(crash_log(payload) for payload in PAYLOADS.values())
    p = run_cli("tail", "-", stdin=text.encode())
    assert "RuntimeError" in p.stdout, p.stderr
    assert_inert(p.stdout, "tail stdout")
    assert_inert(p.stderr, "tail stderr")


def test_github_annotations_cannot_end_add_or_start_a_command(logs: Path) -> None:
    p = run_cli("check", str(logs), "--output", "github")
    *commands, summary = p.stdout.splitlines()
    assert summary.startswith("gradwatch: ") and len(commands) >= len(PAYLOADS)
    for line in commands:
        m = COMMAND.match(line)
        assert m is not None, line
        assert_inert(line, "annotation")
        for part in ("file", "title", "msg"):
            # (CR and LF are %0D and %0A, as the runner wants them: not line breaks in the log)
            assert_inert(re.sub(r"[\r\n]", " ", unescape(m[part])), f"annotation {part}")
    assert sum("::error::injected" in unescape(m["msg"]) for line in commands if (m := COMMAND.match(line))) >= 1


def test_markdown_shows_the_payloads_as_text(logs: Path) -> None:
    p = run_cli("check", str(logs), "--output", "markdown", env={"GITHUB_STEP_SUMMARY": ""})
    assert_inert(p.stdout, "markdown")
    assert not re.search(r"(?<!\\):(?=//)", p.stdout) and "www." not in p.stdout  # GitHub would autolink
    html = MarkdownIt("commonmark").enable(["table", "strikethrough"]).render(p.stdout)
    assert not re.search(r"<(?!/?(?:h[23]|table|thead|tbody|tr|th|td|br|em|strong|p)\b)", html), html
    assert set(re.findall(r"<em>(.*?)</em>", html)) == {"hint:"}
    assert set(re.findall(r"<strong>(.*?)</strong>", html)) == {"critical"}
    rows = table_rows(html)
    assert all(len(r) in (8, 5) for r in rows)
    assert len([r for r in rows if len(r) == 5 and r[0] != "severity"]) >= len(PAYLOADS)


def test_junit_text_is_inert(logs: Path) -> None:
    p = run_cli("check", str(logs), "--output", "junit")
    root = ET.fromstring(p.stdout)
    for element in root.iter():
        for value in [element.text or "", *element.attrib.values()]:
            assert_inert(value, f"junit <{element.tag}>")


def test_notify_cmd_environment_and_its_printed_stderr_are_inert(logs: Path, tmp_path: Path) -> None:
    env_file = tmp_path / "env.jsonl"
    recorder = f"{sys.executable} -c {json.dumps(ENV_RECORDER)} {env_file}"
    p = run_cli("scan", str(logs), "--state", str(tmp_path / "a.json"), "--notify-cmd", recorder)
    seen = [json.loads(line) for line in env_file.read_text().splitlines()]
    assert len(seen) >= len(PAYLOADS), p.stderr
    for env in seen:
        for name, value in env.items():
            assert_inert(value, name)
            assert "\n" not in value and "\t" not in value
    assert any("https://evil.example" in env["GRADWATCH_MESSAGE"] for env in seen)

    everything = "".join(PAYLOADS.values())
    failing = f"{sys.executable} -c {json.dumps(FAILING)} {shlex.quote(everything)}"
    p = run_cli("scan", str(logs), "--state", str(tmp_path / "b.json"), "--notify-cmd", failing)
    assert "exited with status 4" in p.stderr and "evil.example" in p.stderr, p.stderr
    assert_inert(p.stderr, "notify-cmd stderr")


def slack_parts(text: str) -> tuple[str, list[str]]:
    """(the text outside inline code spans, the spans)."""
    pieces = text.split("`")
    assert len(pieces) % 2 == 1, text  # every span closed
    return " ".join(pieces[0::2]), pieces[1::2]


def test_slack_messages_show_the_payloads_as_text(logs: Path, tmp_path: Path) -> None:
    receiver = Receiver()
    try:
        run_cli(
            "scan",
            str(logs),
            "--state",
            str(tmp_path / "s.json"),
            "--webhook",
            receiver.url,
            "--webhook-format",
            "slack",
        )
        bodies: list[Any] = [p.body for p in receiver.posts]
    finally:
        receiver.close()
    assert len(bodies) >= len(PAYLOADS)
    for body in bodies:
        text = body["text"]
        assert_inert(text, "slack")
        outside, spans = slack_parts(text)
        # outside code spans only gradwatch's own words: its severity in bold, no log text at all
        assert re.fullmatch(
            r"gradwatch: \*(warning|critical)\* incident (opened|escalated|ended)\s+(step \d+)?:\s*", outside
        ), outside
        for span in spans:
            assert "<" not in span and ">" not in span and re.sub(r"&(amp|lt|gt);", "", span).count("&") == 0, span
    for shown in ("https://evil.example", "&lt;!channel&gt;", "*bold*", "\u02cbcode\u02cb"):  # as text, in a span
        assert any(shown in b["text"] for b in bodies), shown

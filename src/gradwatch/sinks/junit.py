"""`--output junit`: the report as JUnit XML, the test-report format every CI system reads.

The usual shape, with at most one failure per test case, since GitLab, Jenkins and most report
viewers read only one::

    <testsuites name="gradwatch" tests failures errors>
      <testsuite name=PATH tests failures errors skipped="0">       one per file
        <properties>format, records, first_step, last_step, fail_on</properties>
        <testcase classname=PATH name=DETECTOR/>                    a detector with nothing at or above --fail-on
        <testcase classname=PATH name="DETECTOR at step N">         one per alert at or above --fail-on
          <failure type=SEVERITY message=MESSAGE>where, values, hint</failure>
        </testcase>
        <testcase classname=PATH name="read"><error message=WHY/></testcase>   a file with no usable records
        <system-out>alerts below --fail-on</system-out>
        <system-err>a read problem after some records</system-err>
      </testsuite>
    </testsuites>

ElementTree escapes markup in text and attributes; what XML 1.0 cannot hold at all (control
characters, lone surrogates), which log text may contain, is removed before.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from gradwatch.alerts import Alert
from gradwatch.pipeline import FileSummary
from gradwatch.sinks.report import Report
from gradwatch.sinks.safe import safe_text

__all__ = ["render"]

_NOT_XML = re.compile("[\ud800-\udfff\ufffe\uffff]")


def render(report: Report) -> str:
    """The XML document, declaration included, ending with a newline."""
    root = ET.Element("testsuites", name="gradwatch")
    for f in report.files:
        root.append(_suite(f, [a for a in report.alerts if a.path == f.path], report))
    _count(root, root.findall("testsuite/testcase"))
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _suite(f: FileSummary, alerts: list[Alert], report: Report) -> ET.Element:
    suite = ET.Element("testsuite", name=_xml(f.path))
    props = ET.SubElement(suite, "properties")
    facts = {
        "format": f.format,
        "layout": f.layout,
        "records": f.records,
        "first_step": f.first_step,
        "last_step": f.last_step,
        "fail_on": str(report.fail_on),
    }
    for name, value in facts.items():
        if value is not None:
            ET.SubElement(props, "property", name=name, value=_xml(str(value)))
    failing = [a for a in alerts if a.severity >= report.fail_on]
    if f.error:
        case = _case(suite, f.path, "read")
        ET.SubElement(case, "error", type="unreadable", message=_xml(f.error))
    for detector in f.detectors:
        if not any(a.detector == detector for a in failing):
            _case(suite, f.path, detector)
    for a in failing:
        case = _case(suite, f.path, a.detector if a.step is None else f"{a.detector} at step {a.step}")
        failure = ET.SubElement(case, "failure", type=str(a.severity), message=_xml(a.message))
        failure.text = _xml(_details(a))
    below = [a for a in alerts if a.severity < report.fail_on]
    if below:
        ET.SubElement(suite, "system-out").text = _xml("\n".join(_line(a) for a in below))
    _count(suite, suite.findall("testcase"))
    return suite


def _case(suite: ET.Element, path: str, name: str) -> ET.Element:
    return ET.SubElement(suite, "testcase", classname=_xml(path), name=_xml(name))


def _count(element: ET.Element, cases: list[ET.Element]) -> None:
    """tests, failures and errors count test cases, as JUnit's own reports do."""
    element.set("tests", str(len(cases)))
    element.set("failures", str(sum(c.find("failure") is not None for c in cases)))
    element.set("errors", str(sum(c.find("error") is not None for c in cases)))
    if element.tag == "testsuite":
        element.set("skipped", "0")


def _details(a: Alert) -> str:
    where = f"{a.path}:{a.line}" if a.line is not None else (a.path or "")
    values = ", ".join(
        f"{k} {v:.6g}"
        for k, v in (("value", a.value), ("baseline", a.baseline), ("threshold", a.threshold))
        if v is not None
    )
    lines = [f"{a.severity} at step {a.step}" if a.step is not None else str(a.severity), where]
    if a.metric is not None:
        lines.append(f"{a.metric}: {values}" if values else a.metric)
    if a.snapshot is not None:
        lines.append(f"snapshot: {a.snapshot}")
    lines.append(f"hint: {a.hint}")
    return "\n".join(lines)


def _line(a: Alert) -> str:
    step = "" if a.step is None else f" step {a.step}"
    return f"{a.severity} {a.detector}{step}: {a.message}"


def _xml(text: str) -> str:
    """Text XML 1.0 can carry: no control characters but tab and newline, no lone surrogates."""
    return _NOT_XML.sub("", safe_text(text))

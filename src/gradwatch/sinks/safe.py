"""Log content is untrusted: one function makes it inert wherever it is shown or passed on.

`safe_text(text, target)` first removes what could drive a terminal or reorder what is read:
whole escape sequences (CSI such as a colour reset, OSC such as a window title or OSC 52's
clipboard write, DCS/APC/PM/SOS strings, two-character escapes such as RIS), the C0 and C1
controls left (tab and newline stay in terminal text), and the bidirectional marks, embeddings,
overrides and isolates (U+200E/F, U+061C, U+202A-E, U+2066-9); U+2028 and U+2029, which some
viewers take as line breaks, become spaces. Then it escapes for the target:

    terminal         the above only (rich `Text`, warnings, notify-command output)
    line             one line: tab, newline and carriage return become spaces (environment
                     variables such as GRADWATCH_MESSAGE, one-line messages)
    slack            a line in an inline code span of Slack mrkdwn: `&<>` as entities, backticks
                     replaced, so no formatting (`*_~`), mention, link or bare URL comes alive
    markdown         a line with every character GitHub-flavoured Markdown gives a meaning to
                     backslash-escaped (`|` of tables, backticks, emphasis, HTML, mentions) and
                     URL schemes and `www.` broken, so nothing autolinks
    github-data      a GitHub workflow command's message: `%`, CR, LF as %25, %0D, %0A
                     (actions/toolkit, packages/core/src/command.ts)
    github-property  a workflow command's property: also `:` and `,` as %3A and %2C
"""

from __future__ import annotations

import re
from typing import Literal

__all__ = ["Target", "safe_text"]

Target = Literal["terminal", "line", "slack", "markdown", "github-data", "github-property"]

#: Escape sequences as a terminal parses them, so their parameters go with them: strings
#: (OSC, DCS, SOS, PM, APC) up to BEL or ST, or to the end of the text when unterminated; CSI
#: up to its final byte; any other ESC with its intermediate and final bytes. 7-bit and C1 forms.
_SEQUENCE = re.compile(
    r"(?:\x1b[]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    r"|(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"
    r"|\x1b[ -/]*[0-~]?"
)
#: Controls but tab and newline; bidi marks, embeddings, overrides and isolates.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u061c\u202a-\u202e\u2066-\u2069]")
_LINE_SEPARATOR = re.compile(r"[\u2028\u2029]")
_LINE_BREAK = re.compile(r"\r\n|[\t\n\r]")
#: Characters with a meaning in GitHub-flavoured Markdown's inline text.
_MARKDOWN = re.compile(r"([\\`*_\[\]<>!&|~$#@])")
#: What GitHub turns into a link without markup: a scheme's `:` before `//`, `www.`.
_AUTOLINK = re.compile(r"(?i)(?<=[a-z0-9+.-])(:)(?=//)|(?<![a-z0-9])(www)(\.)")


def safe_text(text: str, target: Target = "terminal") -> str:
    """`text` made inert for `target` (see the module docstring)."""
    if target.startswith("github-"):
        text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    if target != "terminal":
        text = _LINE_BREAK.sub(" ", text)
    clean = _LINE_SEPARATOR.sub(" ", _CONTROL.sub("", _SEQUENCE.sub("", text)))
    if target == "github-property":
        return clean.replace(":", "%3A").replace(",", "%2C")
    if target == "slack":
        inert = clean.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("`", "\u02cb")
        return f"`{inert}`" if inert.strip() else ""
    if target == "markdown":
        escaped = _MARKDOWN.sub(r"\\\1", clean.strip())
        return _AUTOLINK.sub(lambda m: "\\:" if m.group(1) else f"{m.group(2)}\\.", escaped)
    return clean

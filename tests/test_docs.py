"""README.md and docs/ as a newcomer uses them: short enough to read, every flag they show
exists on its command, every link they follow leads to a file and a heading that are there."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gradwatch.cli import cli
from tests.conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
#: `gradwatch COMMAND ...` up to the end of its code span or line (a synopsis goes on over the
#: indented lines that follow it)
_COMMAND = re.compile(r"gradwatch (\w+)\b([^`\n]*(?:\n {10,}[^\n]*)*)")
_LINK = re.compile(r"\]\(([^)#\s]*)(?:#([^)\s]+))?\)")


def anchors(page: Path) -> set[str]:
    """The anchors GitHub makes of a page's headings (lower case, punctuation dropped, spaces to -)."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(encoding="utf-8"), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_the_readme_stays_under_20_kb() -> None:
    assert (REPO / "README.md").stat().st_size < 20_000


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_flag_shown_exists_on_its_command(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    unknown = []
    for m in _COMMAND.finditer(text):
        command = cli.commands.get(m.group(1))
        if command is None:
            continue  # prose: "gradwatch is ...", "gradwatch reads ..."
        known = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}
        unknown += [
            (m.group(1), flag) for flag in re.findall(r"(?<![\w-])--[a-z][a-z-]*", m.group(2)) if flag not in known
        ]
    assert not unknown


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_leads_to_a_file_and_heading(page: Path) -> None:
    broken = []
    for target, anchor in _LINK.findall(page.read_text(encoding="utf-8")):
        if target.startswith(("http://", "https://")):
            continue
        linked = (page.parent / target).resolve() if target else page
        if not linked.exists() or (anchor and linked.suffix == ".md" and anchor not in anchors(linked)):
            broken.append(f"{target}#{anchor}")
    assert not broken

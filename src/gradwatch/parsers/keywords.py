"""Where the parsers' keywords occur in a block: the stream's search for lines worth parsing.

The parsers' `scan` patterns are top-level alternations (`iteration|checkpoint|step=\\d`). One
regex of all their branches makes `re` try every branch at every position; searching each
branch on its own is several times faster: a plain string with `str.find` (C's fast search), a
branch with regex syntax with a regex of its own, which `re` scans for its literal prefix.
A line holding a match of the alternation holds a match of one of its branches and the other
way round, so the lines found are the same.
"""

from __future__ import annotations

import re

_SPECIAL = frozenset(".^$*+?{}[]|()")


class Keywords:
    """The branches of some `scan` patterns, searched one by one."""

    def __init__(self, patterns: list[str]) -> None:
        branches = dict.fromkeys(b for p in patterns for b in split_branches(p))
        self.strings: list[str] = []
        self.regexes: list[re.Pattern[str]] = []
        for branch in branches:
            literal = _literal(branch)
            if literal:
                self.strings.append(literal)
            else:  # regex syntax, or an empty branch (which matches everywhere)
                self.regexes.append(re.compile(branch))

    def positions(self, text: str) -> list[int]:
        """The start of every match in `text`, ascending (one per position)."""
        found: list[int] = []
        for word in self.strings:
            find, at = text.find, text.find(word)
            while at >= 0:
                found.append(at)
                at = find(word, at + 1)
        for regex in self.regexes:
            found += [m.start() for m in regex.finditer(text)]
        return sorted(set(found)) if len(self.strings) + len(self.regexes) > 1 else found


def split_branches(pattern: str) -> list[str]:
    """The top-level branches of a regex: split at `|` outside groups, classes and escapes."""
    branches, start, depth, i = [], 0, 0, 0
    in_class = False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            if pattern[i + 1 : i + 2] == "]":  # `[]...]`: the first `]` is a member
                i += 1
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "|" and depth == 0:
            branches.append(pattern[start:i])
            start = i + 1
        i += 1
    branches.append(pattern[start:])
    return branches


def _literal(branch: str) -> str | None:
    """The string a branch matches when it is a plain one (punctuation may be escaped), else None."""
    out: list[str] = []
    i = 0
    while i < len(branch):
        c = branch[i]
        if c == "\\":
            escaped = branch[i + 1 : i + 2]
            if not escaped or escaped.isalnum():  # `\d`, `\b`, `\1`: regex syntax
                return None
            out.append(escaped)
            i += 2
            continue
        if c in _SPECIAL:
            return None
        out.append(c)
        i += 1
    return "".join(out)

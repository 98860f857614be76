"""Where the parsers' keywords occur in a block: the stream's search for lines worth parsing.

The parsers' `scan` patterns are top-level alternations (`iteration|checkpoint|step=\\d`). In an
ASCII block the lines that hold a match are found by RE2 (Arrow's `match_substring_regex` over
the block's lines, a DFA: one pass whatever the number of keywords), where RE2 reads the
alternation as `re` does (it compiles; on ASCII text `\\d`, `\\b` and `\\s` mean the same to both).
Otherwise `re` searches: one regex of all the branches makes it try every branch at every
position, so each branch is searched on its own, a plain string with `str.find` (C's fast
search), a branch with regex syntax with a regex of its own. A line holding a match of the
alternation holds a match of one of its branches and the other way round, so the lines found
are the same.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from gradwatch.parsers._arrow import arrow, indices, numpy_of, strings

_SPECIAL = frozenset(".^$*+?{}[]|()")


class Keywords:
    """The branches of some `scan` patterns, searched one by one."""

    def __init__(self, patterns: list[str]) -> None:
        self.pattern = "|".join(dict.fromkeys(patterns))
        self._re2: bool | None = None  # whether RE2 reads the alternation (asked when first needed)
        self._shadow: str | None = None  # the alternation for blocks that are not ASCII (see `lines`)
        branches = dict.fromkeys(b for p in patterns for b in split_branches(p))
        self.strings: list[str] = []
        self.regexes: list[re.Pattern[str]] = []
        for branch in branches:
            literal = _literal(branch)
            if literal:
                self.strings.append(literal)
            else:  # regex syntax, or an empty branch (which matches everywhere)
                self.regexes.append(re.compile(branch))

    def lines(
        self, codes: np.ndarray, newlines: np.ndarray, among: np.ndarray | None = None, ascii_only: bool = True
    ) -> np.ndarray | None:
        """Indices of the lines of a block (`codes`, a byte per character, ending with a newline
        at each of `newlines`) that hold a keyword, of all lines or of those `among` (indices,
        ascending); None where RE2 cannot read the alternation as `re` does.

        Where the block is not ASCII (`ascii_only` False, `?` standing for each other character,
        see `Block`), `\\d` and `\\w` also take a `?`: lines are found that `re` might not
        find, which costs a look, but none is missed."""
        _, pc = arrow()

        if self._re2 is None:
            self._re2 = _re2_reads(self.pattern)
            self._shadow = _shadow_pattern(self.pattern) if self._re2 else None
        pattern = self.pattern if ascii_only else self._shadow
        if not self._re2 or pattern is None:
            return None
        found = pc.match_substring_regex(line_array(codes, newlines, among), pattern)
        hit = numpy_of(found)
        return np.flatnonzero(hit) if among is None else among[hit]

    def holds(self, text: str) -> bool:
        """Whether `text` holds a keyword (as `re` reads them)."""
        return any(word in text for word in self.strings) or any(r.search(text) for r in self.regexes)

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


def line_array(codes: np.ndarray, newlines: np.ndarray, among: np.ndarray | None = None) -> Any:
    """The lines of an ASCII block (`codes`, its bytes; `newlines`, where its lines end), or
    those `among` (indices), as an Arrow string array over the block's bytes (no copy of all).
    A line's value holds its newline."""
    pa, _ = arrow()

    bounds = np.empty(len(newlines) + 1, dtype=np.int64)
    bounds[0], bounds[1:] = 0, newlines + 1
    lines = pa.LargeStringArray.from_buffers(len(newlines), pa.py_buffer(bounds), pa.py_buffer(codes))
    return lines if among is None else lines.take(indices(among))


def _re2_reads(pattern: str) -> bool:
    """Whether RE2 reads `pattern` as `re` does on ASCII text: it compiles (no lookarounds, no
    backreferences) and has no `\\s` (to `re` also \\v and \\x1c-\\x1f), no POSIX class (`[[:`, a
    set of `[` and `:` to `re`) and no `$` (which `re` matches before a line's newline)."""
    pa, pc = arrow()

    if re.search(r"\\[sS]|\[\[:|(?<!\\)\$", pattern):  # `$` before a line's newline; POSIX classes
        return False
    try:
        pc.match_substring_regex(strings(["x"]), pattern)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return False
    return True


def _shadow_pattern(pattern: str) -> str | None:
    """`pattern` for a block whose non-ASCII characters are each a `?`: `\\d` and `\\w` (the
    classes that hold such characters to `re`) widened to `[\\d?]` and `[\\w?]`, which finds a
    superset of `re`'s lines (`\\b`, `\\D`, `\\W` do already). None where that cannot be said so
    simply: a class in brackets, `\\B`, escapes for other characters, inline flags (Unicode
    case folding), or characters that are not ASCII in the pattern."""
    if not pattern.isascii() or re.search(r"\(\?[a-zA-Z]", pattern):
        return None
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == "[":
            return None
        if c == "\\":
            escape = pattern[i : i + 2]
            if escape[1:] in ("B", "u", "U", "N", "x") or escape[1:].isdigit():
                return None
            out.append(f"[{escape}?]" if escape in ("\\d", "\\w") else escape)
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def split_branches(pattern: str) -> list[str]:
    """The top-level branches of a regex: split at `|` outside groups, classes and escapes. A
    pattern that begins with inline flags (`(?i)`) is one branch: the flags are for all of it."""
    if re.match(r"\(\?[aiLmsux]+\)", pattern):
        return [pattern]
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
            if pattern[i + 1 : i + 2] == "^":
                i += 1
            if pattern[i + 1 : i + 2] == "]":  # `[]...]`, `[^]...]`: the first `]` is a member
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

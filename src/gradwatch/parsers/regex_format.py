"""User-defined formats: one regular expression whose named groups are metric names.

    RegexParser("mytrainer", r"it (?P<step>\\d+) loss=(?P<loss>\\S+) gn=(?P<grad_norm>\\S+)")

The pattern is applied with `re.search`, so a launcher or logger prefix does not matter. Named
groups must be `step` or canonical metric names (`gradwatch.records.METRICS`); anything else, or a
pattern that does not compile, is a `ConfigError` naming the format. Values are read with
`number()` (`1.2E+00`, `195,153`, `nan`); a group that did not take part in the match is not logged.
Without a `step` group a record gets one more than the previous record's step.

These parsers are not in the registry: the config builds them and passes them to
`new_parsers(extra=...)`. A literal that every match must contain is taken from the pattern, so
that lines without it are rejected by a substring test before the regex runs.
"""

from __future__ import annotations

import importlib
import math
import re
import warnings
from typing import Any

from gradwatch.errors import ConfigError
from gradwatch.parsers._text import is_nonfinite, number
from gradwatch.parsers.base import ParseOutput, Parser
from gradwatch.records import METRICS, is_metric

_MAX_STEP = 10**18  # a larger (or negative) step is garbage and would not fit int64


def _sre_modules() -> tuple[Any, Any]:
    """The regex parser modules: `re._parser` since Python 3.11, `sre_parse` before."""
    try:
        return importlib.import_module("re._parser"), importlib.import_module("re._constants")
    except ImportError:  # Python 3.10
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return importlib.import_module("sre_parse"), importlib.import_module("sre_constants")


def required_literal(pattern: str) -> str | None:
    """The longest run of literal characters that every match of `pattern` contains, if any.

    Only top-level concatenation and plain groups are followed; anything optional, repeated or
    alternative ends a run. Case-insensitive patterns give None. Any surprise gives None too:
    this is an optimisation, never a reason to reject a pattern.
    """
    try:
        sre_parse, sre_constants = _sre_modules()
        parsed = sre_parse.parse(pattern)
        ignorecase = int(sre_constants.SRE_FLAG_IGNORECASE)
        if parsed.state.flags & ignorecase:
            return None
        literal, subpattern = sre_constants.LITERAL, sre_constants.SUBPATTERN
        best, run = "", []

        def walk(items: Any) -> bool:
            nonlocal best
            for op, av in items:
                if op is literal:
                    run.append(chr(av))
                    continue
                if op is subpattern:
                    if av[1] & ignorecase:
                        return False
                    if not walk(av[3]):
                        return False
                    continue
                if len(run) > len(best):
                    best = "".join(run)
                run.clear()
            return True

        if not walk(parsed):
            return None
        if len(run) > len(best):
            best = "".join(run)
        return best or None
    except Exception:  # a private API: any surprise means no pre-filter, never an error
        return None


class RegexParser(Parser):
    """A format described by one regex in the user's config."""

    name = "regex"
    description = "user-defined regular expression with metric-named groups"

    def __init__(self, name: str, pattern: str, description: str = "") -> None:
        self.name = name  # type: ignore[misc]  # instances carry the config's format name
        self.description = description or f"user-defined format {name!r}"  # type: ignore[misc]
        try:
            self.regex = re.compile(pattern)
        except re.error as e:
            raise ConfigError(f"format {name!r}: the pattern does not compile: {e}") from e
        groups = list(self.regex.groupindex)
        for group in groups:
            if group != "step" and not is_metric(group):
                raise ConfigError(
                    f"format {name!r}: group {group!r} is not `step` or a metric name; "
                    f"use one of: step, {', '.join(METRICS)}"
                )
        self._metric_groups = [g for g in groups if g != "step"]
        if not self._metric_groups:
            raise ConfigError(
                f"format {name!r}: the pattern has no named group for a metric, "
                f"e.g. (?P<loss>\\S+); use one of: {', '.join(METRICS)}"
            )
        self._has_step = "step" in groups
        self._literal = required_literal(pattern)
        self.scan = re.escape(self._literal) if self._literal else None  # type: ignore[misc]
        self._step: int | None = None

    def parse(self, text: str, line: int, ts: float | None, out: ParseOutput) -> bool:
        if self._literal is not None and self._literal not in text:
            return False
        m = self.regex.search(text)
        if m is None:
            return False
        metrics: dict[str, float] = {}
        for group in self._metric_groups:
            raw = m.group(group)
            if raw is None:
                continue
            try:
                metrics[group] = number(raw)
            except ValueError:
                continue
        if not metrics:
            return False
        step: int | None = None
        if self._has_step and m.group("step") is not None:
            try:
                v = number(m.group("step"))
            except ValueError:
                v = math.nan
            if 0 <= v < _MAX_STEP:  # NaN fails too
                step = int(v)
        if step is None:
            step = (self._step or 0) + 1
        self._step = step
        nonfinite = [k for k, v in metrics.items() if is_nonfinite(v)]
        out.record(self.name, step, line, ts, metrics, nonfinite)
        return True

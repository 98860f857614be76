"""Plugins run behind a guard: the first exception of a plugin's detector or parser is reported as
one line, that instance is switched off for the rest of its file, and everything else runs on.

gradwatch's own classes run bare: a bug in them should show as one, not be talked away. The guards
are plain objects holding the plugin's instance, so `scan` pickles them with the state inside; a
guard restored from a state file reports its plugin's failure again.
"""

from __future__ import annotations

from typing import Any

from gradwatch.alerts import Alert
from gradwatch.detectors.base import Detector, DetectorConfig
from gradwatch.parsers.base import ParseOutput, Parser
from gradwatch.parsers.stream import Batch
from gradwatch.plugins import failures
from gradwatch.plugins.registry import BUILTIN, origin_of


def new_detector(cls: type[Detector], config: DetectorConfig, path: str) -> Detector | None:
    """`cls(config, path)`; a plugin's behind a guard, or None when its constructor raised."""
    origin = origin_of("detector", cls.id)
    if origin == BUILTIN:
        return cls(config, path)
    try:
        return GuardedDetector(cls(config, path), origin)
    except (Exception, SystemExit) as e:  # (a plugin's sys.exit must not end the run)
        failures.report(f"plugin detector {cls.id!r} ({origin}) raised in __init__ for {path}: {_describe(e)}")
        return None


def new_parser(cls: type[Parser], path: str) -> Parser | None:
    """`cls()`; a plugin's behind a guard, or None when its constructor raised."""
    origin = origin_of("parser", cls.name)
    if origin == BUILTIN:
        return cls()
    try:
        return GuardedParser(cls(), origin, path)
    except (Exception, SystemExit) as e:
        failures.report(f"plugin parser {cls.name!r} ({origin}) raised in __init__ for {path}: {_describe(e)}")
        return None


class GuardedDetector(Detector):
    """A plugin's detector; after its first exception it returns no more alerts for this file."""

    def __init__(self, inner: Detector, origin: str) -> None:
        super().__init__(inner.config, inner.path)
        self.inner, self.origin = inner, origin
        self.error: str | None = None
        vars(self).update(id=inner.id, description=inner.description)  # the plugin's, per instance

    def update(self, batch: Batch) -> list[Alert]:
        return self._call("update", batch)

    def finish(self) -> list[Alert]:
        return self._call("finish")

    def _call(self, method: str, *args: Any) -> list[Alert]:
        if self.error is not None:
            return []
        try:
            alerts = getattr(self.inner, method)(*args)
            if not isinstance(alerts, list) or not all(isinstance(a, Alert) for a in alerts):
                raise TypeError(f"{method} must return a list of Alert, got {alerts!r:.80}")
            return alerts
        except (Exception, SystemExit) as e:
            self.error = (
                f"plugin detector {self.inner.id!r} ({self.origin}) raised in {method} on {self.path}: "
                f"{_describe(e)}; it is off for the rest of this file"
            )
            failures.report(self.error)
            return []

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self.error is not None:
            failures.report(self.error)


class GuardedParser(Parser):
    """A plugin's parser; after its first exception it reads no more lines of this file."""

    def __init__(self, inner: Parser, origin: str, path: str) -> None:
        self.inner, self.origin, self.path = inner, origin, path
        self.error: str | None = None
        self._collects = type(inner).collecting is not Parser.collecting
        # the plugin's class attributes, per instance: the stream reads them from each parser
        vars(self).update(name=inner.name, description=inner.description, scan=inner.scan, auxiliary=inner.auxiliary)

    @property
    def collecting(self) -> bool:
        if not self._collects or self.error is not None:
            return False
        try:
            return bool(self.inner.collecting)
        except (Exception, SystemExit) as e:
            self._fail("collecting", None, e)
            return False

    def parse(self, text: str, line: int, ts: float | None, out: ParseOutput) -> bool:
        if self.error is not None:
            return False
        try:
            return bool(self.inner.parse(text, line, ts, out))
        except (Exception, SystemExit) as e:
            self._fail("parse", line, e)
            return False

    def flush(self, out: ParseOutput) -> None:
        if self.error is not None:
            return
        try:
            self.inner.flush(out)
        except (Exception, SystemExit) as e:
            self._fail("flush", None, e)

    def _fail(self, method: str, line: int | None, error: BaseException) -> None:
        where = self.path or "<input>"
        if line is not None:
            where += f":{line}"
        self.error = (
            f"plugin parser {self.inner.name!r} ({self.origin}) raised in {method} at {where}: "
            f"{_describe(error)}; it reads no more of this file"
        )
        failures.report(self.error)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self.error is not None:
            failures.report(self.error)


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"

"""Errors that reach the user, and the exit codes they map to.

    GradwatchError            one clear message, no traceback
     ├── UsageError           bad flags or arguments                      -> exit 2
     ├── ConfigError          YAML unreadable, unknown key, wrong type    -> exit 2
     ├── InputError           missing/unreadable file, no known format    -> exit 2
     ├── PluginError          a plugin's class breaks the contract        -> exit 2
     ├── WorkerError          a worker failed part-way through a file     -> exit 2
     └── StateLockedError     another scan holds the --state file         -> exit 3

Each message names the file, line or key path and says how to fix it. `cli.main` catches
`GradwatchError` once and prints `error: <message>` on stderr.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0  #: no alert at or above --fail-on
    ALERTS = 1  #: alerts at or above --fail-on
    USAGE = 2  #: usage error, missing/unreadable file, invalid config, unknown format
    LOCKED = 3  #: `scan`: another scan kept the --state file locked for all of --lock-wait


class GradwatchError(Exception):
    """An error caused by input we were given, reported as one line and an exit code."""

    exit_code = ExitCode.USAGE


class UsageError(GradwatchError):
    """A flag or argument that does not make sense."""


class ConfigError(GradwatchError):
    """A YAML config that cannot be read or does not match the schema."""


class InputError(GradwatchError):
    """A log file that is missing, unreadable, or in no format we know."""


class PluginError(GradwatchError):
    """A detector or parser class that cannot be registered: no `id`, a duplicate, no `update`...

    The registries raise it when a class is added. While plugins load, it (like anything else a
    plugin raises) is reported as one line on stderr and the run goes on without that plugin.
    """


class WorkerError(GradwatchError):
    """A worker process failed while reading part of a large file (`check --jobs`): the rest of
    that file went unchecked, so the run fails (exit 2) whatever the part before it held."""


class StateLockedError(GradwatchError):
    """Another `gradwatch scan` holds the lock of the same state file: try again later."""

    exit_code = ExitCode.LOCKED

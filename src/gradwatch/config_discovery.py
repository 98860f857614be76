"""Which configuration a command uses when `--config` is not given, found as ruff and pytest find theirs.

The first of these that exists is used, whole (they are not merged):

1. `--config PATH`;
2. `$GRADWATCH_CONFIG`, a YAML file (one that does not exist is an error, not a silent default);
3. walking up from the working directory to the root of its repository (the first folder that
   holds `.git`) or of the filesystem: in each folder, `gradwatch.yaml`, then a `pyproject.toml`
   with a `[tool.gradwatch]` table. The nearest folder wins, so a project's own settings beat
   those of the repository around it;
4. `$XDG_CONFIG_HOME/gradwatch/config.yaml` (`~/.config/gradwatch/config.yaml` when unset);
5. the built-in defaults.

`[tool.gradwatch]` is read with the standard library's `tomllib` (Python 3.11+). On Python 3.10
a `pyproject.toml` that has the table is an error that says so: ignoring it would check with
other thresholds than the user's without a word.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gradwatch import config
from gradwatch.errors import ConfigError

__all__ = ["ConfigSource", "find", "load", "load_settings"]

ENV_VAR = "GRADWATCH_CONFIG"
PROJECT_FILE = "gradwatch.yaml"
PYPROJECT = "pyproject.toml"
#: a `pyproject.toml` that does not name us is not parsed (a broken one of another tool's is not our error)
_NAMES_US = re.compile(rb"tool\s*\.\s*[\"']?gradwatch\b")


@dataclass(frozen=True)
class ConfigSource:
    """The file a command's configuration comes from, and how it was found."""

    #: None: the built-in defaults
    path: Path | None = None
    #: how it was found, in words: "--config", "$GRADWATCH_CONFIG", ...
    found_by: str = "no configuration file"
    #: the `[tool.gradwatch]` table, when `path` is a pyproject.toml
    table: dict[str, Any] | None = None

    def describe(self) -> str:
        """`/repo/gradwatch.yaml (found in the working directory or a parent)`, or `built-in defaults`."""
        if self.path is None:
            return "built-in defaults"
        where = f"{self.path} [tool.gradwatch]" if self.table is not None else str(self.path)
        return f"{where} ({self.found_by})"


def find(explicit: str | None, cwd: Path | None = None, environ: Mapping[str, str] | None = None) -> ConfigSource:
    """The configuration to use (module docstring); `cwd` and `environ` default to the process's.

    Raises:
        ConfigError: `$GRADWATCH_CONFIG` names no file; a `pyproject.toml` that has
            `[tool.gradwatch]` cannot be read or parsed (or needs Python 3.11 to be).
    """
    env = os.environ if environ is None else environ
    if explicit is not None:
        return ConfigSource(Path(explicit), "--config")
    if env.get(ENV_VAR):
        path = Path(env[ENV_VAR]).expanduser()
        if not path.is_file():
            raise ConfigError(f"${ENV_VAR} names {path}, which is not a file: point it at a YAML config or unset it")
        return ConfigSource(path, f"${ENV_VAR}")
    for folder in _folders_up(Path.cwd() if cwd is None else cwd):
        if (folder / PROJECT_FILE).is_file():
            return ConfigSource(folder / PROJECT_FILE, "found in the working directory or a parent")
        table = _tool_table(folder / PYPROJECT)
        if table is not None:
            return ConfigSource(folder / PYPROJECT, "found in the working directory or a parent", table)
    user = _user_config(env)
    if user.is_file():
        return ConfigSource(user, "the user's configuration")
    return ConfigSource()


def load(source: ConfigSource) -> config.Settings:
    """The settings of `source`: the defaults with its keys on top. Errors name its file and key."""
    if source.table is not None and source.path is not None:
        return config.load_table(source.table, f"{source.path} [tool.gradwatch]", source.path.parent)
    return config.load(source.path)


def load_settings(explicit: str | None) -> config.Settings:
    """The settings a command runs with: `--config` when given, else those found (module docstring)."""
    return load(find(explicit))


def _folders_up(start: Path) -> list[Path]:
    """`start` and its parents, up to the first that holds `.git` (a repository's root) or `/`."""
    folders = []
    for folder in (start.absolute(), *start.absolute().parents):
        folders.append(folder)
        if (folder / ".git").exists():
            break
    return folders


def _tool_table(path: Path) -> dict[str, Any] | None:
    """The `[tool.gradwatch]` table of the pyproject.toml at `path`; None when it has none or is absent."""
    if not path.is_file():
        return None
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror or e}") from None
    if not _NAMES_US.search(data):
        return None
    if sys.version_info < (3, 11):
        raise ConfigError(
            f"{path} has a [tool.gradwatch] table, but reading TOML needs Python 3.11 or later; "
            f"on this Python put the settings in {PROJECT_FILE} beside it, or pass --config"
        )
    import tomllib

    try:
        parsed = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a UTF-8 text file (expected TOML)") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from None
    tool = parsed.get("tool")
    table = tool.get("gradwatch") if isinstance(tool, dict) else None
    if table is None:
        return None
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: tool.gradwatch must be a table of sections, got {type(table).__name__}")
    return table


def _user_config(env: Mapping[str, str]) -> Path:
    """`$XDG_CONFIG_HOME/gradwatch/config.yaml`; the spec says a relative XDG_CONFIG_HOME is ignored."""
    base = env.get("XDG_CONFIG_HOME", "")
    root = Path(base) if os.path.isabs(base) else Path(env.get("HOME") or Path.home()) / ".config"
    return root / "gradwatch" / "config.yaml"

"""Configuration: the packaged defaults, a user's YAML on top key by key, validated strictly.

Every detector's section is checked against its `Config` dataclass: an unknown key or a value of
the wrong type is a `ConfigError` naming the file and the dotted key path. Plugin detectors are no
exception: installed plugins and the files under `plugins:` are loaded before the merge, so their
sections are checked the same way. YAML is only ever read with `yaml.safe_load`'s loader, bounded
(file size, values once aliases are expanded, nesting depth).
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat
import typing
from collections.abc import Collection
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import yaml

from gradwatch.detectors import DETECTORS, DetectorConfig
from gradwatch.errors import ConfigError, UsageError
from gradwatch.parsers.generic_names import Names
from gradwatch.plugins import loader

DEFAULT_NAME = "default.yaml"
_T = TypeVar("_T")


@dataclass(frozen=True)
class CustomFormat:
    """A user-defined line format: a regex whose named groups are canonical metric names."""

    name: str
    pattern: str
    description: str = ""


@dataclass(frozen=True)
class SnapshotConfig:
    """Limits of the evidence written per alert with --snapshot-dir (see default.yaml)."""

    records: int = 200
    lines_before: int = 40
    lines_after: int = 10
    events: int = 50
    max_line_chars: int = 2000
    max_files: int = 1000

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            low = 1 if f.name in ("max_line_chars", "max_files") else 0
            if getattr(self, f.name) < low:
                raise ValueError(f"{f.name} must be at least {low}, got {getattr(self, f.name)}")


@dataclass(frozen=True)
class IncidentConfig:
    """How alerts are grouped into incidents (`gradwatch.incidents`; see default.yaml)."""

    gap_logs: int = 25
    restart_steps: int = 1000

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if getattr(self, f.name) < 1:
                raise ValueError(f"{f.name} must be at least 1, got {getattr(self, f.name)}")


@dataclass(frozen=True)
class StragglerConfig:
    """When a file of a `--run` is a straggler or dead rank (`gradwatch.stragglers`; see default.yaml)."""

    enabled: bool = True
    lag_logs: int = 100

    def __post_init__(self) -> None:
        if self.lag_logs < 1:
            raise ValueError(f"lag_logs must be at least 1, got {self.lag_logs}")


@dataclass(frozen=True)
class Settings:
    """The effective configuration of one run of gradwatch."""

    detectors: dict[str, DetectorConfig]
    jsonl_aliases: dict[str, str] = field(default_factory=dict)
    #: extra metric names for the generic reader (`formats.synonyms`), name -> canonical metric
    synonyms: dict[str, str] = field(default_factory=dict)
    custom_formats: tuple[CustomFormat, ...] = ()
    raw: dict[str, Any] = field(default_factory=dict)
    snapshots: SnapshotConfig = field(default_factory=SnapshotConfig)
    #: plugin files named under `plugins:`, as absolute paths
    plugins: tuple[str, ...] = ()
    incidents: IncidentConfig = field(default_factory=IncidentConfig)
    stragglers: StragglerConfig = field(default_factory=StragglerConfig)


def default_text() -> str:
    return resources.files("gradwatch").joinpath(DEFAULT_NAME).read_text(encoding="utf-8")


def load(path: str | Path | None = None) -> Settings:
    """Defaults, overridden by the YAML file at `path` when given (plugins load first)."""
    raw = _parse(default_text(), DEFAULT_NAME)
    loader.load_installed()
    if path is not None:
        p = Path(path)
        try:
            text = _bounded_text(p)
        except OSError as e:
            raise ConfigError(f"cannot read config {p}: {e.strerror or e}") from None
        except UnicodeDecodeError:
            raise ConfigError(f"{p}: not a text file (expected YAML)") from None
        user = _parse(text, str(p))
        raw = _overlay(raw, user, str(p), p.parent)
    return _build(raw, str(path) if path else DEFAULT_NAME)


def load_table(table: Any, where: str, folder: Path) -> Settings:
    """Defaults, overridden by a mapping read from another file (`[tool.gradwatch]` of a
    pyproject.toml): `where` names it in errors, `plugins:` paths are relative to `folder`."""
    raw = _parse(default_text(), DEFAULT_NAME)
    loader.load_installed()
    return _build(_overlay(raw, table, where, folder), where)


def _overlay(raw: dict[str, Any], user: Any, where: str, folder: Path) -> dict[str, Any]:
    """`raw` with a user's sections merged over it, key by key, after loading their plugins."""
    if user is None:
        user = {}
    if not isinstance(user, dict):
        raise ConfigError(f"{where}: the top level must be a mapping of sections, got {_kind(user)}")
    plugins = _plugin_files(user.get("plugins"), where, folder)
    loader.load_files(plugins)
    raw = _merge(_with_plugin_sections(raw), user, where, "")
    raw["plugins"] = [str(f) for f in plugins]
    return raw


def _plugin_files(value: Any, where: str, folder: Path) -> list[Path]:
    """`plugins:`: Python files, relative to the config file's folder, as absolute paths."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: plugins must be a list of Python file paths, got {_kind(value)}")
    return [(folder / Path(v).expanduser()).resolve() for v in value]


def _with_plugin_sections(raw: dict[str, Any]) -> dict[str, Any]:
    """The defaults plus a section per plugin detector, so that `_merge` checks a user's keys there too."""
    sections = dict(raw.get("detectors") or {})
    for det_id, cls in DETECTORS.items():
        sections.setdefault(det_id, dataclasses.asdict(cls.Config()))
    return {**raw, "detectors": sections}


#: The largest config file read (real ones are a few KB): a bigger one, or `--config /dev/zero`,
#: is refused before it fills the memory.
MAX_CONFIG_BYTES = 1 << 20
#: Values a config may expand to, aliases expanded (an alias bomb of 400 bytes makes billions),
#: and how deep its mappings and lists may nest.
MAX_CONFIG_VALUES = 100_000
MAX_CONFIG_DEPTH = 64
_TOO_DEEP = f"mappings and lists nested more than {MAX_CONFIG_DEPTH} deep"


def _bounded_text(path: Path) -> str:
    """The text of the config file at `path`: a regular file of at most `MAX_CONFIG_BYTES`.

    Raises:
        ConfigError: a device, a pipe or a directory; a bigger file.
        OSError, UnicodeDecodeError: as reading it raises them.
    """
    # (without blocking: a pipe's open would wait for a writer)
    with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise ConfigError(f"{path}: not a regular file (expected a YAML file)")
        data = fh.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES >> 20} MB; a config is a few KB of YAML")
    return data.decode("utf-8")


class _BoundedLoader(yaml.SafeLoader):
    """`yaml.safe_load`'s loader, refusing a document that expands into more than
    `MAX_CONFIG_VALUES` values or nests deeper than `MAX_CONFIG_DEPTH`, before it is built:
    anchors and aliases stay usable, an alias bomb or a value that holds itself does not."""

    def get_single_node(self) -> yaml.Node | None:
        node = super().get_single_node()
        if node is not None:
            _check_expansion(node)
        return node


def _check_expansion(root: yaml.Node) -> None:
    """Raise a YAML error where the document under `root` is too large or too deep once its
    aliases are expanded: sizes and heights per node, memoised, in one walk without recursion."""
    sizes: dict[int, tuple[int, int]] = {}  # per node: values under it, levels under it
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        children = _children(node)
        if done:
            on_path.discard(key)
            size = 1 + sum(sizes[id(c)][0] for c in children)
            height = 1 + max((sizes[id(c)][1] for c in children), default=0)
            if size > MAX_CONFIG_VALUES:
                raise yaml.YAMLError(f"more than {MAX_CONFIG_VALUES:,} values once its aliases are expanded")
            if height > MAX_CONFIG_DEPTH:
                raise yaml.YAMLError(_TOO_DEEP)
            sizes[key] = size, height
        elif key in on_path:
            raise yaml.YAMLError("a value that contains itself (an alias of a mapping or list inside it)")
        elif key not in sizes:
            on_path.add(key)
            stack.append((node, True))
            stack.extend((c, False) for c in children)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _parse(text: str, where: str) -> Any:
    try:
        return yaml.load(text, Loader=_BoundedLoader)  # noqa: S506 - yaml.safe_load's loader, bounded
    except RecursionError:
        raise ConfigError(f"{where}: invalid YAML: {_TOO_DEEP}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{where}{at}: invalid YAML: {problem}") from None


def _kind(value: Any) -> str:
    return {
        dict: "a mapping",
        list: "a list",
        str: "a string",
        bool: "true/false",
        int: "an integer",
        float: "a number",
        type(None): "nothing",
    }.get(type(value), type(value).__name__)


def _merge(base: dict[str, Any], user: dict[str, Any], where: str, prefix: str) -> dict[str, Any]:
    out = dict(base)
    for key, value in user.items():
        dotted = f"{prefix}{key}"
        if key not in base:
            known = ", ".join(sorted(map(str, base))) or "none"
            raise ConfigError(f"{where}: unknown key {dotted!r} (known here: {known})")
        if isinstance(base[key], dict) and not _is_free_mapping(dotted):
            if not isinstance(value, dict):
                raise ConfigError(f"{where}: {dotted} must be a mapping, got {_kind(value)}")
            out[key] = _merge(base[key], value, where, dotted + ".")
        else:
            out[key] = value
    return out


def _is_free_mapping(dotted: str) -> bool:
    """Sections whose keys are the user's own (not a fixed schema)."""
    return dotted in ("formats.jsonl_aliases", "formats.synonyms")


def _build(raw: dict[str, Any], where: str) -> Settings:
    detectors: dict[str, DetectorConfig] = {}
    for det_id, section in (raw.get("detectors") or {}).items():
        cls = DETECTORS.get(det_id)
        if cls is None:
            raise ConfigError(f"{where}: unknown detector 'detectors.{det_id}' (known: {', '.join(DETECTORS)})")
        detectors[det_id] = _dataclass_from(cls.Config, section or {}, f"detectors.{det_id}", where)
    for det_id, cls in DETECTORS.items():
        detectors.setdefault(det_id, cls.Config())
    formats = raw.get("formats") or {}
    aliases = _name_table(formats, "jsonl_aliases", where)
    synonyms = _name_table(formats, "synonyms", where)
    try:
        Names(synonyms)  # checked now: a wrong metric name is the config's error, not a file's
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    custom = []
    for i, item in enumerate(formats.get("custom") or []):
        key = f"formats.custom[{i}]"
        if (
            not isinstance(item, dict)
            or set(item) - {"name", "pattern", "description"}
            or not {"name", "pattern"} <= set(item)
        ):
            raise ConfigError(
                f"{where}: {key} must be a mapping with 'name' and 'pattern' (and optional 'description')"
            )
        if not all(isinstance(v, str) for v in item.values()):
            raise ConfigError(f"{where}: {key}: name, pattern and description must be strings")
        try:
            re.compile(item["pattern"])
        except re.error as e:
            raise ConfigError(f"{where}: {key}.pattern is not a valid regex: {e}") from None
        custom.append(CustomFormat(item["name"], item["pattern"], item.get("description", "")))
    snapshots = _dataclass_from(SnapshotConfig, raw.get("snapshots") or {}, "snapshots", where)
    incidents = _dataclass_from(IncidentConfig, raw.get("incidents") or {}, "incidents", where)
    plugins = tuple(raw.get("plugins") or ())
    stragglers = _dataclass_from(StragglerConfig, raw.get("stragglers") or {}, "stragglers", where)
    return Settings(detectors, aliases, synonyms, tuple(custom), raw, snapshots, plugins, incidents, stragglers)


def _name_table(formats: dict[str, Any], key: str, where: str) -> dict[str, str]:
    """A `formats` table of the user's names for metrics (`jsonl_aliases`, `synonyms`)."""
    table = formats.get(key) or {}
    if not isinstance(table, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in table.items()):
        raise ConfigError(f"{where}: formats.{key} must map strings to metric names")
    return dict(table)


def _dataclass_from(cls: type[_T], section: Any, dotted: str, where: str) -> _T:
    if not isinstance(section, dict):
        raise ConfigError(f"{where}: {dotted} must be a mapping, got {_kind(section)}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {}
    for key, value in section.items():
        if key not in names:
            raise ConfigError(f"{where}: unknown key '{dotted}.{key}' (known: {', '.join(sorted(names))})")
        kwargs[key] = _coerce(value, hints[key], f"{dotted}.{key}", where)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: {dotted}: {e}") from None


def _coerce(value: Any, hint: Any, dotted: str, where: str) -> Any:
    if hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif hint is str:
        if isinstance(value, str):
            return value
    elif hint == (int | None):
        if value is None or (isinstance(value, int) and not isinstance(value, bool)):
            return value
        raise ConfigError(f"{where}: {dotted} must be an integer or null, got {_kind(value)} {value!r}")
    else:
        return value
    raise ConfigError(f"{where}: {dotted} must be {_kind(hint())}, got {_kind(value)} {value!r}")


def choose_detectors(settings: Settings, select: Collection[str] = (), ignore: Collection[str] = ()) -> Settings:
    """`settings` with only the `select`ed detectors enabled (or every one, when none is named),
    less the `ignore`d ones (`--select`, `--ignore`). Each choice sets `detectors.<id>.enabled`
    as a config file would, so a scan state made under other choices is read again.

    Raises:
        UsageError: a name that is no detector's id (the message lists them), or none left to run.
    """
    if not select and not ignore:
        return settings
    for flag, names in (("--select", select), ("--ignore", ignore)):
        unknown = [n for n in names if n not in DETECTORS]
        if unknown:
            raise UsageError(
                f"{flag}: unknown detector {', '.join(map(repr, unknown))}; known detectors: "
                f"{', '.join(DETECTORS)} (see `gradwatch detectors`)"
            )
    detectors = dict(settings.detectors)
    sections = dict(settings.raw.get("detectors") or {})
    for det_id, det_config in settings.detectors.items():
        enabled = (det_config.enabled if not select else det_id in select) and det_id not in ignore
        if enabled != det_config.enabled:
            detectors[det_id] = dataclasses.replace(det_config, enabled=enabled)
            sections[det_id] = {**(sections.get(det_id) or {}), "enabled": enabled}
    if not any(c.enabled for c in detectors.values()):
        raise UsageError("--select and --ignore leave no detector to run")
    return dataclasses.replace(settings, detectors=detectors, raw={**settings.raw, "detectors": sections})


def effective_yaml(settings: Settings) -> str:
    """The effective config as YAML (what `gradwatch config show` prints)."""
    data: dict[str, Any] = {
        "plugins": list(settings.plugins),
        "formats": {
            "jsonl_aliases": dict(settings.jsonl_aliases),
            "synonyms": dict(settings.synonyms),
            "custom": [dataclasses.asdict(c) for c in settings.custom_formats],
        },
        "snapshots": dataclasses.asdict(settings.snapshots),
        "incidents": dataclasses.asdict(settings.incidents),
        "stragglers": dataclasses.asdict(settings.stragglers),
        "detectors": {k: dataclasses.asdict(v) for k, v in settings.detectors.items()},
    }
    return yaml.safe_dump(data, sort_keys=False)

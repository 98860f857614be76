"""Finding plugins: installed packages' entry points, and Python files named in the config.

Entry points of the groups `gradwatch.detectors` and `gradwatch.parsers` name a class each
(`attn_logit_growth = "gradwatch_attnlogit.detector:AttnLogitGrowth"`), which is registered here.
A plugin file registers its own classes with `gradwatch.api.register_detector`/`register_parser`
when it is imported. Each entry point and each file is imported at most once per process, before a
registry is first used; one that fails is reported (see `failures`) and the others still load.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import sys
from collections.abc import Callable, Iterable
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any

from gradwatch.errors import PluginError
from gradwatch.plugins import failures, registry

_installed_loaded = False
_files_loaded: dict[Path, None] = {}  # (in the order they were imported)


def load_installed() -> None:
    """Register the classes of installed plugins (entry points); later calls do nothing."""
    global _installed_loaded
    if _installed_loaded:
        return
    _installed_loaded = True
    # imported here: the registries import this package
    from gradwatch.detectors import register as register_detector
    from gradwatch.parsers import register as register_parser

    groups: dict[str, Callable[[Any], Any]] = {
        "gradwatch.detectors": register_detector,
        "gradwatch.parsers": register_parser,
    }
    for group, register in groups.items():
        for ep in sorted(entry_points(group=group), key=lambda e: (_dist_label(e), e.name)):
            origin = f"{_dist_label(ep)} (entry point {ep.name})"
            with registry.loading(origin):
                try:
                    register(ep.load())
                except (Exception, SystemExit) as e:  # (a plugin's `sys.exit` must not end the run)
                    failures.report(_failed(origin, e))


def load_files(paths: Iterable[Path]) -> None:
    """Import plugin files (absolute paths) that were not imported yet; they register themselves."""
    for path in paths:
        if path in _files_loaded:
            continue
        _files_loaded[path] = None
        with registry.loading(str(path)):
            try:
                _import_file(path)
            except (Exception, SystemExit) as e:
                failures.report(_failed(str(path), e))


def files_loaded() -> tuple[Path, ...]:
    """The plugin files this process imported (or tried to), in order: a worker process imports
    them too, so that their parsers, pickled in a stream, are found there."""
    return tuple(_files_loaded)


def _import_file(path: Path) -> None:
    # A stable module name per path: `scan` pickles detector state, and unpickling in the next
    # process finds the plugin's classes under this name once the config has loaded the file again.
    stem, digest = re.sub(r"\W", "_", path.stem), hashlib.sha256(str(path).encode()).hexdigest()[:8]
    name = f"gradwatch_plugin_{stem}_{digest}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError("not a Python file (expected a .py file)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickle look classes up through sys.modules
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise


def _dist_label(ep: EntryPoint) -> str:
    dist = ep.dist
    return f"{dist.name} {dist.version}" if dist is not None else ep.value


def _failed(origin: str, error: Exception | SystemExit) -> str:
    if isinstance(error, PluginError):  # its message names the plugin already
        return str(error)
    return f"plugin {origin} failed to load: {type(error).__name__}: {error}; running without it"

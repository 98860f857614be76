"""Configuration found without `--config`: $GRADWATCH_CONFIG, gradwatch.yaml or [tool.gradwatch]
up to the repository's root, the user's config folder, in that order; `config show` names it.

Every test runs the real CLI in a subprocess, in a working directory under a fake repository
(a `.git` folder bounds the search) and with HOME and XDG_CONFIG_HOME pointed into tmp_path.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from gradwatch import config, config_discovery
from gradwatch.errors import ConfigError
from tests.conftest import gradwatch_cmd
from tests.test_bad_input import megatron_log, no_traceback

DEFAULT_Z = config.load().detectors["grad_norm_spike"].z_alert  # type: ignore[attr-defined]


def run_in(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`gradwatch ARGS` run in `cwd`, with no config of the machine's user in sight: HOME is
    `cwd`'s tmp root's `home` unless `env` says otherwise, GRADWATCH_CONFIG and XDG_CONFIG_HOME unset."""
    base = {k: v for k, v in os.environ.items() if k not in (config_discovery.ENV_VAR, "XDG_CONFIG_HOME")}
    full = {**base, "HOME": str(home_of(cwd)), "NO_COLOR": "1", "COLUMNS": "120", **(env or {})}
    p = subprocess.run([*gradwatch_cmd(), *args], cwd=cwd, capture_output=True, text=True, timeout=120, env=full)
    return no_traceback(p)


def home_of(cwd: Path) -> Path:
    """The fake home of a test: `home` beside the fake repository that holds `cwd`."""
    for folder in (cwd, *cwd.parents):
        if (folder / "home").is_dir():
            return folder / "home"
    raise AssertionError(f"{cwd} is not under a test's tmp_path")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository root (it holds `.git`) with a folder `sub/deeper`; `home` beside it."""
    (tmp_path / "home").mkdir()
    root = tmp_path / "outside" / "repo"
    (root / ".git").mkdir(parents=True)
    (root / "sub" / "deeper").mkdir(parents=True)
    return root


def z_config(z: float) -> str:
    """A YAML config whose grad-norm spike threshold tells which file was used."""
    return f"detectors:\n  grad_norm_spike:\n    z_alert: {z}\n"


def z_table(z: float) -> str:
    return f'[project]\nname = "mine"\n\n[tool.gradwatch.detectors.grad_norm_spike]\nz_alert = {z}\n'


def shown(cwd: Path, *args: str, env: dict[str, str] | None = None) -> tuple[str, float]:
    """`config show` in `cwd`: its first line (which file) and the grad-norm spike threshold it prints."""
    p = run_in(cwd, "config", "show", *args, env=env)
    assert p.returncode == 0, p.stderr
    first, _, rest = p.stdout.partition("\n")
    data: dict[str, Any] = yaml.safe_load(rest)
    return first, data["detectors"]["grad_norm_spike"]["z_alert"]


def test_nothing_found_is_the_defaults(repo: Path) -> None:
    """No file anywhere: the built-in defaults, and config show says so."""
    first, z = shown(repo / "sub")
    assert first == "# configuration: built-in defaults"
    assert z == DEFAULT_Z


def test_gradwatch_yaml_in_the_working_directory(repo: Path) -> None:
    (repo / "sub" / "gradwatch.yaml").write_text(z_config(7.5))
    first, z = shown(repo / "sub")
    assert z == 7.5
    assert str(repo / "sub" / "gradwatch.yaml") in first


def test_gradwatch_yaml_in_a_parent(repo: Path) -> None:
    (repo / "gradwatch.yaml").write_text(z_config(7.5))
    first, z = shown(repo / "sub" / "deeper")
    assert z == 7.5
    assert str(repo / "gradwatch.yaml") in first


def test_search_stops_at_the_repository_root(repo: Path) -> None:
    """A gradwatch.yaml above the folder that holds `.git` belongs to something else."""
    (repo.parent / "gradwatch.yaml").write_text(z_config(7.5))
    first, z = shown(repo / "sub")
    assert (first, z) == ("# configuration: built-in defaults", DEFAULT_Z)


def test_pyproject_tool_table(repo: Path) -> None:
    (repo / "pyproject.toml").write_text(z_table(8.5))
    first, z = shown(repo / "sub" / "deeper")
    assert z == 8.5
    assert f"{repo / 'pyproject.toml'} [tool.gradwatch]" in first


def test_pyproject_without_our_table_is_passed_over(repo: Path) -> None:
    """A pyproject.toml of the project's own (no [tool.gradwatch]) does not stop the search."""
    (repo / "sub" / "pyproject.toml").write_text('[project]\nname = "mine"\n[tool.ruff]\nline-length = 99\n')
    (repo / "gradwatch.yaml").write_text(z_config(7.5))
    assert shown(repo / "sub")[1] == 7.5


def test_gradwatch_yaml_beats_pyproject_in_the_same_folder(repo: Path) -> None:
    (repo / "pyproject.toml").write_text(z_table(8.5))
    (repo / "gradwatch.yaml").write_text(z_config(7.5))
    assert shown(repo / "sub")[1] == 7.5


def test_the_nearest_folder_wins(repo: Path) -> None:
    """A sub-project's [tool.gradwatch] beats the gradwatch.yaml of the repository around it."""
    (repo / "gradwatch.yaml").write_text(z_config(7.5))
    (repo / "sub" / "pyproject.toml").write_text(z_table(8.5))
    assert shown(repo / "sub" / "deeper")[1] == 8.5
    assert shown(repo)[1] == 7.5


def test_environment_variable_beats_the_project_and_config_beats_both(repo: Path, tmp_path: Path) -> None:
    (repo / "gradwatch.yaml").write_text(z_config(7.5))
    env_file, flag_file = tmp_path / "env.yaml", tmp_path / "flag.yaml"
    env_file.write_text(z_config(9.5))
    flag_file.write_text(z_config(11.0))
    env = {"GRADWATCH_CONFIG": str(env_file)}
    first, z = shown(repo, env=env)
    assert z == 9.5
    assert first == f"# configuration: {env_file} ($GRADWATCH_CONFIG)"
    first, z = shown(repo, "--config", str(flag_file), env=env)
    assert z == 11.0
    assert first == f"# configuration: {flag_file} (--config)"


def test_environment_variable_naming_no_file_is_an_error(repo: Path, tmp_path: Path) -> None:
    """A typo in GRADWATCH_CONFIG must not quietly fall back to other thresholds."""
    (repo / "gradwatch.yaml").write_text(z_config(7.5))
    p = run_in(repo, "check", "x.log", env={"GRADWATCH_CONFIG": str(tmp_path / "missing.yaml")})
    assert p.returncode == 2
    assert "$GRADWATCH_CONFIG" in p.stderr and "missing.yaml" in p.stderr


def test_user_config_under_xdg_config_home_then_home(repo: Path, tmp_path: Path) -> None:
    home_config = home_of(repo) / ".config" / "gradwatch" / "config.yaml"
    home_config.parent.mkdir(parents=True)
    home_config.write_text(z_config(6.5))
    first, z = shown(repo)
    assert z == 6.5
    assert str(home_config) in first
    xdg = tmp_path / "xdg"
    (xdg / "gradwatch").mkdir(parents=True)
    (xdg / "gradwatch" / "config.yaml").write_text(z_config(5.5))
    assert shown(repo, env={"XDG_CONFIG_HOME": str(xdg)})[1] == 5.5
    (repo / "gradwatch.yaml").write_text(z_config(7.5))  # a project's config beats the user's
    assert shown(repo, env={"XDG_CONFIG_HOME": str(xdg)})[1] == 7.5


def test_found_config_changes_what_check_reports(repo: Path, tmp_path: Path) -> None:
    """Not only `config show`: check judges with the thresholds it found."""
    log = tmp_path / "spike.log"
    log.write_text(megatron_log(300, spike_at=2500))
    detectors = [
        a["detector"] for a in json.loads(run_in(repo, "check", str(log), "--output", "json").stdout)["alerts"]
    ]
    assert "grad_norm_spike" in detectors
    (repo / "gradwatch.yaml").write_text("detectors:\n  grad_norm_spike:\n    enabled: false\n")
    p = run_in(repo / "sub", "check", str(log), "--output", "json")
    assert p.returncode == 0, p.stdout
    assert "grad_norm_spike" not in {a["detector"] for a in json.loads(p.stdout)["alerts"]}


@pytest.mark.parametrize(
    ("name", "text", "named"),
    [
        ("gradwatch.yaml", "detectors:\n  grad_norm_spike:\n    z_alrt: 3\n", "detectors.grad_norm_spike.z_alrt"),
        ("pyproject.toml", "[tool.gradwatch.detectors.grad_norm_spike]\nz_alrt = 3\n", "z_alrt"),
        ("pyproject.toml", "[tool.gradwatch.detectors.grad_norm_spike]\nz_alert = 'high'\n", "z_alert"),
        ("pyproject.toml", "[project]\nname = 'x'\n[tool.gradwatch]\nincidents = { gap_logs = }\n", "line 4"),
    ],
)
def test_errors_in_a_found_file_name_the_file_and_key(repo: Path, name: str, text: str, named: str) -> None:
    (repo / name).write_text(text)
    p = run_in(repo / "sub", "check", "x.log")
    assert p.returncode == 2
    assert str(repo / name) in p.stderr and named in p.stderr, p.stderr


def test_plugins_of_a_pyproject_table_are_relative_to_its_folder(repo: Path) -> None:
    """`plugins:` in [tool.gradwatch] load from beside the pyproject.toml, as from beside a YAML."""
    (repo / "my_det.py").write_text(
        "from dataclasses import dataclass\n"
        "from gradwatch.api import Detector, DetectorConfig, register_detector\n\n"
        "@register_detector\n"
        "class Mine(Detector):\n"
        "    id = 'mine_from_pyproject'\n"
        "    description = 'a test detector'\n\n"
        "    @dataclass(frozen=True, kw_only=True)\n"
        "    class Config(DetectorConfig):\n"
        "        pass\n\n"
        "    def update(self, batch):\n"
        "        return []\n"
    )
    (repo / "pyproject.toml").write_text('[tool.gradwatch]\nplugins = ["my_det.py"]\n')
    p = run_in(repo / "sub", "detectors")
    assert p.returncode == 0, p.stderr
    assert "mine_from_pyproject" in p.stdout


def test_pyproject_table_on_python_3_10_is_a_clear_error(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No tomllib before 3.11 (and tomli is no dependency): say so rather than ignore the user's settings."""
    (repo / "pyproject.toml").write_text(z_table(8.5))
    monkeypatch.setattr(config_discovery, "sys", SimpleNamespace(version_info=(3, 10, 14)))
    with pytest.raises(ConfigError, match=r"pyproject\.toml has a \[tool\.gradwatch\] table.*Python 3\.11"):
        config_discovery.find(None, cwd=repo / "sub", environ={"HOME": str(home_of(repo))})
    (repo / "pyproject.toml").write_text('[project]\nname = "mine"\ndependencies = ["gradwatch"]\n')
    assert config_discovery.find(None, cwd=repo / "sub", environ={"HOME": str(home_of(repo))}).path is None


def test_config_init_says_the_file_is_found(repo: Path) -> None:
    p = run_in(repo, "config", "init")
    assert p.returncode == 0
    assert "--config" not in p.stdout and "config show" in p.stdout
    assert str(repo / "gradwatch.yaml") in shown(repo / "sub")[0]

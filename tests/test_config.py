"""YAML thresholds: defaults documented and in sync with the code, strict validation."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gradwatch import config
from gradwatch.detectors import DETECTORS
from gradwatch.errors import ConfigError
from tests.conftest import EXAMPLES, REPO, run_cli


def test_default_yaml_matches_every_detector_config_default() -> None:
    """configs/default.yaml documents exactly the dataclass defaults, key for key."""
    raw = yaml.safe_load((REPO / "configs" / "default.yaml").read_text())
    assert set(raw["detectors"]) == set(DETECTORS)
    for det_id, cls in DETECTORS.items():
        assert raw["detectors"][det_id] == dataclasses.asdict(cls.Config()), det_id


def test_every_default_key_has_a_comment() -> None:
    """Each detector key is preceded by a comment saying where its default comes from."""
    lines = (REPO / "configs" / "default.yaml").read_text().splitlines()
    in_detectors = False
    for i, line in enumerate(lines):
        if line.startswith("detectors:"):
            in_detectors = True
            continue
        if in_detectors and line.startswith("    ") and not line.strip().startswith("#"):
            key = line.strip().split(":")[0]
            if key == "enabled":
                continue
            back = i - 1
            while lines[back].strip().startswith("#") is False and lines[back].startswith("    "):
                back -= 1  # keys grouped under one comment
            assert lines[back].strip().startswith("#"), f"no comment above {key!r} (line {i + 1})"


def test_user_config_overrides_key_by_key(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("detectors:\n  grad_norm_spike:\n    short_ratio: 8\n")
    s = config.load(f)
    assert s.detectors["grad_norm_spike"].short_ratio == 8.0
    assert s.detectors["grad_norm_spike"].window == 128
    assert s.detectors["loss_spike"] == DETECTORS["loss_spike"].Config()


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (
            "detectors:\n  grad_norm_spike:\n    windw: 3\n",
            r"c\.yaml: unknown key 'detectors\.grad_norm_spike\.windw'",
        ),
        ("detectors:\n  nope: {}\n", r"unknown key 'detectors.nope'"),
        (
            "detectors:\n  grad_norm_spike:\n    window: many\n",
            r"detectors\.grad_norm_spike\.window must be an integer",
        ),
        ("detectors:\n  grad_norm_spike:\n    enabled: 1\n", r"enabled must be true/false"),
        ("detectors: [1, 2]\n", r"detectors must be a mapping"),
        ("detectors:\n  grad_norm_spike: {window: 3\n", r"c\.yaml:\d+:\d+: invalid YAML"),
        ("- just\n- a list\n", r"top level must be a mapping"),
        (
            "detectors:\n  resume_regression:\n    vocab_size: big\n",
            r"vocab_size must be an integer or null",
        ),
        (
            "formats:\n  custom:\n    - {name: x, pattern: '(?P<loss'}\n",
            r"formats\.custom\[0\]\.pattern is not a valid regex",
        ),
        # numbers out of range: each was a traceback in the middle of a run (found by QA)
        (
            "detectors:\n  grad_norm_spike:\n    short_ratio: -3\n",
            r"c\.yaml: detectors\.grad_norm_spike: short_ratio must be a finite number above 0, got -3\.0",
        ),
        (
            "detectors:\n  grad_norm_spike:\n    min_ratio: 0\n",
            r"detectors\.grad_norm_spike: min_ratio must be a finite number above 0, got 0\.0$",
        ),
        (
            "detectors:\n  loss_divergence:\n    window: 0\n",
            r"loss_divergence: window must be an integer above 0 and at most 2\*\*62",
        ),
        (
            "detectors:\n  loss_spike:\n    z_alert: .nan\n",
            r"loss_spike: z_alert must be a finite number of 0 or more",
        ),
        (
            "detectors:\n  loss_spike:\n    quiet: 1" + "0" * 400 + "\n",
            r"loss_spike: quiet must be an integer of 0 or more and at most 2\*\*62",
        ),
        (
            "detectors:\n  loss_spike:\n    window: 1" + "0" * 20 + "\n",
            r"loss_spike: window must be an integer above 0",
        ),
        (
            "detectors:\n  resume_regression:\n    vocab_size: -1\n",
            r"resume_regression: vocab_size must be an integer of 0 or more and at most 2\*\*62, got -1$",
        ),
    ],
)
def test_bad_config_names_file_and_key(tmp_path: Path, text: str, match: str) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=match):
        config.load(f)


def test_yaml_is_loaded_safely(tmp_path: Path) -> None:
    """A YAML tag that would construct a Python object is refused, not executed."""
    f = tmp_path / "c.yaml"
    f.write_text("detectors: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        config.load(f)


def test_cli_config_show_and_init(tmp_path: Path) -> None:
    shown = run_cli("config", "show")
    assert shown.returncode == 0
    assert yaml.safe_load(shown.stdout)["detectors"]["loss_spike"]["z_alert"] == 6.0
    target = tmp_path / "mine.yaml"
    p = run_cli("config", "init", str(target))
    assert p.returncode == 0 and target.read_text() == config.default_text()
    again = run_cli("config", "init", str(target))
    assert again.returncode == 2 and "--force" in again.stderr
    assert run_cli("config", "show", "--config", str(target)).returncode == 0


def test_cli_bad_config_is_one_line_and_exit_2(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("detectors:\n  loss_spike:\n    z_alert: [1]\n")
    p = run_cli("config", "show", "--config", str(f))
    assert p.returncode == 2
    assert "Traceback" not in p.stderr
    assert p.stderr.strip().startswith("error: ") and "detectors.loss_spike.z_alert" in p.stderr


_EVERY_INT_AT_ITS_LARGEST = """
import dataclasses, sys
from pathlib import Path
import yaml
from gradwatch import config
from gradwatch.detectors import DETECTORS
from gradwatch.pipeline import check_path

tmp = Path(sys.argv[1])
for det_id, cls in DETECTORS.items():
    for f in dataclasses.fields(cls.Config):
        if f.type in ("int", "int | None"):
            tmp.write_text(yaml.safe_dump({"detectors": {det_id: {f.name: 2**62}}}))
            settings = config.load(tmp)
            print(det_id, f.name, flush=True)
            for log in sys.argv[2:]:
                check_path(Path(log), settings)
"""


def test_every_integer_setting_at_its_largest_finishes(tmp_path: Path) -> None:
    """Each built-in integer key at 2**62, the largest accepted, one at a time: the checks end.
    A `rising_blocks` of 1e18 made logit_norm_drift loop that many times per batch (review)."""
    logs = [str(EXAMPLES / name) for name in ("olmo-zloss-drift.log", "megatron-ds-fp16-resume-collapse.log")]
    p = subprocess.run(
        [sys.executable, "-c", _EVERY_INT_AT_ITS_LARGEST, str(tmp_path / "c.yaml"), *logs],
        capture_output=True,
        text=True,
        timeout=300,
    )
    tried = p.stdout.splitlines()
    assert p.returncode == 0, f"{tried[-1:]}: {p.stderr}"
    assert "logit_norm_drift rising_blocks" in tried and len(tried) >= 20, tried

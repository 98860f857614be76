"""Shared test helpers: where the real samples are, and running the CLI as a user would."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gradwatch.records import Columns, RecordBuilder, columns_of


def pytest_configure(config: pytest.Config) -> None:
    """A suite started where SIGINT is ignored (a background job of a script, `.ci/run &`) would
    pass that on to every gradwatch it starts: the tests send Ctrl-C to gradwatch as a terminal
    does, so its processes get the default back (a Python handler is reset to it across exec)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


REPO = Path(__file__).resolve().parents[1]
REAL = REPO.parent / "shared" / "samples" / "real"
#: more trainer families (Lightning, Keras, mlx-lm, MMEngine, fairseq, nanoGPT, ...), labelled alike
REAL_MORE = REPO.parent / "shared" / "samples" / "real-more"
EXAMPLES = REPO / "examples" / "logs"


def real_samples() -> Path:
    """The labelled third-party logs; tests that need them skip where they are absent."""
    if not (REAL / "labels.json").is_file():
        pytest.skip("real samples not present: ../shared/samples/real (third-party logs, not shipped)")
    return REAL


def real_folders() -> list[Path]:
    """The labelled folders that are present (none in a user's clone)."""
    return [folder for folder in (REAL, REAL_MORE) if (folder / "labels.json").is_file()]


def gradwatch_cmd() -> list[str]:
    return [sys.executable, "-m", "gradwatch"]


#: `python -m gradwatch ARGS` that writes its own peak RSS (the kernel's VmHWM, KiB) at exit to the
#: file `$GRADWATCH_TEST_PEAK_FILE` names. `os.wait4`'s ru_maxrss would not do: the kernel carries
#: the high-water mark of the forked copy of the test process into the child across exec, so a
#: child of a pytest that has grown to 400 MB "peaks" at 400 MB whatever it does.
_PEAK_WRAPPER = """
import atexit, os, re, runpy, sys
def _report():
    with open("/proc/self/status") as fh:
        peak = re.search(r"VmHWM:\\s+(\\d+) kB", fh.read())
    with open(os.environ["GRADWATCH_TEST_PEAK_FILE"], "w") as out:
        out.write(peak.group(1) if peak else "")
atexit.register(_report)
sys.argv = ["gradwatch", *sys.argv[1:]]
runpy.run_module("gradwatch", run_name="__main__")
"""


def measured_cmd(peak_file: Path) -> tuple[list[str], dict[str, str]]:
    """The command prefix and environment that run `gradwatch ARGS` reporting its own peak RSS to
    `peak_file` (read it with `peak_rss_mb`)."""
    return [sys.executable, "-c", _PEAK_WRAPPER], {"GRADWATCH_TEST_PEAK_FILE": str(peak_file)}


def peak_rss_mb(peak_file: Path) -> float:
    """The peak RSS a `measured_cmd` run reported, in MiB."""
    text = peak_file.read_text().strip() if peak_file.is_file() else ""
    assert text, f"the measured gradwatch wrote no peak RSS to {peak_file} (it did not exit normally)"
    return int(text) / 1024


def run_cli(
    *args: str, stdin: bytes | None = None, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run `gradwatch ARGS` in a real subprocess and return its result (text mode)."""
    full_env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "120", **(env or {})}
    return subprocess.run(
        [*gradwatch_cmd(), *args],
        input=stdin.decode() if stdin is not None else None,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
    )


def check_json(*args: str) -> dict[str, Any]:
    """`gradwatch check --output json ARGS`, parsed; fails the test on a traceback."""
    p = run_cli("check", "--output", "json", *args)
    assert "Traceback" not in p.stderr, p.stderr
    return json.loads(p.stdout)


def metric_columns(metrics: dict[str, np.ndarray]) -> Columns:
    """A batch's columns holding these metrics (steps 0, 1, ...; the rest of the schema not logged)."""
    n = len(next(iter(metrics.values())))
    builder = RecordBuilder()
    builder.add_columns(
        np.arange(n), np.arange(1, n + 1), np.full(n, np.nan), metrics, np.full(n, "", dtype=object), "x"
    )
    return columns_of(builder.take_columns() or {})

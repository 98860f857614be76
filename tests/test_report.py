"""`gradwatch report`, `gradwatch compare` and check's sparklines, run through the real CLI.

Logs are generated with `gradwatch.synth` into tmp_path (Megatron-DeepSpeed with a grad-norm spike
and a loss-scale collapse; JSON lines with and without a growing output-logit norm). The HTML is
parsed and its panels and markers counted against what `check` finds; the PNG's size and pixels
are checked; the HTML is opened in headless Chromium (Debian's package, installed when missing).
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gradwatch import config
from gradwatch.pipeline import check_path
from gradwatch.plots.figure import Section
from gradwatch.plots.panels import PANELS
from gradwatch.plots.png import png_size
from gradwatch.plots.trend import RecentWindow, Trend, grows_alone
from gradwatch.synth import Anomaly, RunSpec, write_log
from tests.conftest import check_json, run_cli

HOSTILE_NAME = "<img src=x onerror=alert(1)>.log"
HOSTILE_ERROR = 'RuntimeError: <script>alert(1)</script> loss is nan & "x"\n'


# ---- logs ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("logs")
    faults = (Anomaly("grad_norm_spike", 1500), Anomaly("loss_scale_collapse", 2500))
    write_log(d / "fp16.log", RunSpec(steps=3000, anomalies=faults))
    write_log(
        d / "grow.jsonl", RunSpec(fmt="jsonl", steps=3000, anomalies=(Anomaly("logit_norm_drift", 1500, 2, 1500),))
    )
    write_log(d / "flat.jsonl", RunSpec(fmt="jsonl", steps=3000, seed=1))
    write_log(d / "bf16.log", RunSpec(steps=3000, fp16=False, seed=2))
    lines = (d / "bf16.log").read_text().splitlines(keepends=True)[:400]
    hostile = 'Traceback (most recent call last):\n  File "train.py", line 9, in step\n' + HOSTILE_ERROR
    (d / HOSTILE_NAME).write_text("".join(lines) + hostile)
    return d


class Page(HTMLParser):
    """What the tests look at in a page: panels, alert markers and rows, trend rows, tags, text."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.panels: list[str] = []
        self.markers: list[int] = []
        self.alert_rows: list[str] = []
        self.trend_rows: list[dict[str, str | None]] = []
        self.tags: Counter[str] = Counter()
        self.text: list[str] = []
        self.root: dict[str, str | None] = {}
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags[tag] += 1
        if tag == "html":
            self.root = a
        if tag == "svg" and a.get("data-panel"):
            self.panels.append(str(a["data-panel"]))
        if a.get("data-alert"):
            self.markers.append(int(str(a["data-alert"])))
        if tag == "tr" and str(a.get("id", "")).startswith("alert-"):
            self.alert_rows.append(str(a["id"]))
        if tag == "tr" and "data-grows" in a:
            self.trend_rows.append(a)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def report(*args: str) -> Any:
    p = run_cli("report", *args)
    assert "Traceback" not in p.stderr, p.stderr
    return p


def expected_panels(log: Path) -> list[str]:
    last = check_path(log, config.load(None))[0].last_values
    return [p.id for p in PANELS if any(m in last for m in p.metrics)]


def alerts_with_step(log: Path) -> int:
    return sum(a["step"] is not None for a in check_json(str(log))["alerts"])


def png_dims(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def assert_not_blank(path: Path) -> None:
    image = pytest.importorskip("matplotlib.image").imread(path)[..., :3]
    inked = (image < 0.85).any(axis=-1).mean()
    assert inked > 0.01, f"{path.name}: only {inked:.2%} of pixels are not near-white"
    assert len(np.unique(image.reshape(-1, 3), axis=0)) > 20  # lines, text and markers, not a flat fill


# ---- report: HTML ---------------------------------------------------------------------------------
def test_html_has_a_panel_per_metric_and_a_marker_per_alert(logs: Path, tmp_path: Path) -> None:
    log, out = logs / "fp16.log", tmp_path / "r.html"
    p = report(str(log), "--out", str(out))
    assert p.returncode == 0 and f"wrote {out}" in p.stdout
    page = Page(out.read_text())
    assert page.panels == expected_panels(log)
    assert {"loss", "grad_norm", "loss_scale", "lr", "throughput"} <= set(page.panels)
    n_alerts = alerts_with_step(log)
    assert n_alerts >= 3 and len(page.markers) == n_alerts
    assert len(page.alert_rows) == len(check_json(str(log))["alerts"])
    text = " ".join(page.text)
    assert "megatron" in text and "1-3,000" in text and "spike score" in text and "grad_norm" in text
    assert 'data-overflows="' in out.read_text()  # fp16 overflows ticked on the loss-scale panel


def test_html_of_a_directory_numbers_alerts_across_logs(logs: Path, tmp_path: Path) -> None:
    d = tmp_path / "runs"
    d.mkdir()
    for name in ("fp16.log", "grow.jsonl"):
        shutil.copy(logs / name, d / name)
    out = tmp_path / "r.html"
    assert report(str(d), "--out", str(out)).returncode == 0
    page = Page(out.read_text())
    assert page.tags["section"] == 2
    assert "logit_norm" in page.panels
    total = alerts_with_step(d / "fp16.log") + alerts_with_step(d / "grow.jsonl")
    assert sorted(page.markers) == sorted(set(page.markers)) and len(page.markers) == total


def test_metrics_option_limits_panels_but_keeps_every_marker(logs: Path, tmp_path: Path) -> None:
    log, out = logs / "fp16.log", tmp_path / "r.html"
    assert report(str(log), "--out", str(out), "--metrics", "grad_norm,loss").returncode == 0
    page = Page(out.read_text())
    assert page.panels == ["loss", "grad_norm"]
    assert len(page.markers) == alerts_with_step(log)  # alerts of undrawn metrics sit on the first panel


def test_log_content_and_file_names_are_escaped(logs: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    assert report(str(logs / HOSTILE_NAME), "--out", str(out)).returncode == 0
    page = Page(out.read_text())
    assert page.tags["img"] == 0 and page.tags["script"] == 1  # only the page's own script
    text = "".join(page.text)
    assert HOSTILE_NAME in text and "<script>alert(1)</script>" in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--out", "r.pdf"], "unknown type .pdf"),
        (["--out", "r.html", "--metrics", "loss,bogus"], "--metrics: unknown bogus"),
        (["--out", "r.html", "--metrics", "z_loss"], "nothing to draw"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(logs: Path, tmp_path: Path, args: list[str], message: str) -> None:
    p = report(str(logs / "fp16.log"), *[str(tmp_path / a) if a.startswith("r.") else a for a in args])
    assert p.returncode == 2 and message in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_standard_input_is_not_read(logs: Path, tmp_path: Path) -> None:
    p = report("-", "--out", str(tmp_path / "r.html"))
    assert p.returncode == 2 and p.stderr == "error: report reads log files, not standard input: save the log first\n"


def test_a_log_without_records_is_an_input_error(tmp_path: Path) -> None:
    (tmp_path / "notes.log").write_text("hello\nworld\n")
    p = report(str(tmp_path / "notes.log"), "--out", str(tmp_path / "r.html"))
    assert p.returncode == 2 and "no training records" in p.stderr
    assert not (tmp_path / "r.html").exists()


def test_html_stays_small_for_a_200k_step_run(tmp_path: Path) -> None:
    log, out = tmp_path / "long.jsonl", tmp_path / "r.html"
    write_log(log, RunSpec(fmt="jsonl", steps=200_000, noise_lines=False))
    assert report(str(log), "--out", str(out)).returncode == 0
    assert out.stat().st_size < 5_000_000
    assert "200,000" in " ".join(Page(out.read_text()).text)


# ---- report: PNG ----------------------------------------------------------------------------------
def test_png_has_the_expected_size_and_is_not_blank(logs: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    log, out = logs / "fp16.log", tmp_path / "r.png"
    assert report(str(log), "--out", str(out)).returncode == 0
    n = len(expected_panels(log))
    assert png_dims(out) == png_size([Section("", [None] * n)])  # type: ignore[list-item]
    assert_not_blank(out)


def test_png_without_matplotlib_says_how_to_install_it(logs: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "blocker"
    (blocker / "matplotlib").mkdir(parents=True)
    (blocker / "matplotlib" / "__init__.py").write_text("raise ImportError('blocked for this test')\n")
    p = run_cli("report", str(logs / "fp16.log"), "--out", str(tmp_path / "r.png"), env={"PYTHONPATH": str(blocker)})
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.strip() == "error: PNG output needs matplotlib: pip install 'gradwatch[plot]' (or write .html)"


# ---- report in a browser --------------------------------------------------------------------------
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1200,900",
    "--enable-logging=stderr",
    "--v=0",
]


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's chromium, installed with apt-get when missing and we are root."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip("headless Chromium is not installed and cannot be installed here (needs root and apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    steps = (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "chromium"])
    for cmd in steps:
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1200)
        if r.returncode != 0:
            pytest.skip(f"could not install chromium ({' '.join(cmd)}): {r.stderr.strip()[-300:]}")
    found = shutil.which("chromium")
    if not found:
        pytest.skip("apt-get installed chromium but no chromium binary is on PATH")
    return found


def run_chromium(binary: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
    )


def test_html_loads_in_chromium_without_console_errors(chromium: str, logs: Path, tmp_path: Path) -> None:
    html = tmp_path / "r.html"
    assert report(str(logs / "fp16.log"), "--out", str(html)).returncode == 0
    dom = run_chromium(chromium, tmp_path / "profile", "--dump-dom", html.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    console = [line for line in dom.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], console  # script errors and Content-Security-Policy violations land here
    assert Page(dom.stdout).root.get("data-ready") == "1"  # the page's script ran to its end
    shot = tmp_path / "shot.png"
    r = run_chromium(chromium, tmp_path / "profile", f"--screenshot={shot}", html.as_uri())
    assert r.returncode == 0 and shot.exists(), r.stderr[-2000:]
    assert png_dims(shot) == (1200, 900)
    assert_not_blank(shot)


# ---- compare --------------------------------------------------------------------------------------
def test_compare_marks_the_run_whose_logit_norm_grows(logs: Path, tmp_path: Path) -> None:
    out = tmp_path / "c.html"
    args = [str(logs / "grow.jsonl"), str(logs / "flat.jsonl"), "--metrics", "logit_norm,loss"]
    p = run_cli("compare", *args, "--labels", "bf16-reduce,fp32-reduce", "--out", str(out))
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    rows = {
        tuple(line.split()[:2]): line
        for line in p.stdout.splitlines()
        if line.split()[:1] in (["bf16-reduce"], ["fp32-reduce"])
    }
    assert set(rows) == {(r, m) for r in ("bf16-reduce", "fp32-reduce") for m in ("logit_norm", "loss")}
    marked = {key for key, line in rows.items() if "grows, others flat" in line}
    assert marked == {("bf16-reduce", "logit_norm")}
    page = Page(out.read_text())
    assert page.panels == ["logit_norm", "loss"]
    grows = {(r["data-run"], r["data-metric"]) for r in page.trend_rows if r["data-grows"] == "1"}
    assert grows == {("bf16-reduce", "logit_norm")}


def test_compare_png_and_default_labels(logs: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "c.png"
    p = run_cli("compare", str(logs / "flat.jsonl"), str(logs / "grow.jsonl"), "--out", str(out))
    assert p.returncode == 0, p.stderr
    assert "flat.jsonl" in p.stdout and "grow.jsonl" in p.stdout
    assert png_dims(out)[0] == 1200
    assert_not_blank(out)


def test_compare_on_tokens(logs: Path, tmp_path: Path) -> None:
    out = tmp_path / "c.html"
    p = run_cli("compare", str(logs / "fp16.log"), str(logs / "bf16.log"), "--x", "tokens", "--out", str(out))
    assert p.returncode == 0, p.stderr
    page = Page(out.read_text())
    assert "loss" in page.panels and 'data-xlabel="tokens"' in out.read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["grow.jsonl"], "at least two logs"),
        (["grow.jsonl", "flat.jsonl", "--labels", "a"], "--labels has 1 names for 2 logs"),
        (["grow.jsonl", "flat.jsonl", "--x", "tokens"], "logs no token counts"),
        (["grow.jsonl", "flat.jsonl", "--metrics", "bogus"], "--metrics: unknown bogus"),
        (["grow.jsonl", "flat.jsonl", "--metrics", "z_loss"], "no run logs z_loss"),
    ],
)
def test_compare_usage_errors(logs: Path, tmp_path: Path, args: list[str], message: str) -> None:
    full = [str(logs / a) if a.endswith(".jsonl") else a for a in args]
    p = run_cli("compare", *full, "--out", str(tmp_path / "c.html"))
    assert p.returncode == 2 and message in p.stderr and "Traceback" not in p.stderr, p.stderr


# ---- check's sparklines ---------------------------------------------------------------------------
def test_check_text_shows_a_sparkline_per_metric(logs: Path) -> None:
    p = run_cli("check", str(logs / "fp16.log"))
    assert p.returncode == 1, p.stderr
    lines = p.stdout.splitlines()
    assert any("shape over steps 1-3,000" in line for line in lines)
    spark = {line.split()[0]: line.split()[1] for line in lines if line.startswith("  ") and "▁" in line}
    assert {"loss", "grad_norm", "loss_scale", "lr"} <= set(spark)
    assert spark["grad_norm"].count("█") == 1  # the one spike, in one cell of the 40
    assert all(len(s) <= 40 for s in spark.values())


# ---- trends (compare's table) ---------------------------------------------------------------------
def test_trend_measures_growth_and_log_slope_over_the_last_steps() -> None:
    steps = np.arange(0, 2001)
    window = RecentWindow(1000)
    for part in np.array_split(steps, 7):
        window.add(part, np.exp(part / 1000.0))
    t = window.trend()
    assert t is not None
    assert t.slope == pytest.approx(1.0, rel=1e-6)  # ln grows by 1 per 1,000 steps
    assert t.growth == pytest.approx(np.exp(0.9), rel=0.01)  # medians of the first and last hundred steps
    assert RecentWindow(10).trend() is None


def test_a_run_is_marked_only_when_it_grows_alone() -> None:
    grow, flat, fall = Trend(2.0, 1.5, 0.4), Trend(1.0, 1.0, 0.0), Trend(1.0, 0.8, -0.2)
    assert grows_alone([grow, flat, fall]) == [True, False, False]
    assert grows_alone([grow, grow]) == [False, False]
    assert grows_alone([grow, None]) == [False, False]  # nothing to compare with

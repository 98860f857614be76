"""`gradwatch report`, `gradwatch compare` and check's sparklines, run through the real CLI.

Logs are generated with `gradwatch.synth` into tmp_path (Megatron-DeepSpeed with a grad-norm spike
and a loss-scale collapse; JSON lines with and without a growing output-logit norm), or written
here line by line in the trainers' formats (a BigScience tr8-104B-like fp16 log with a gap and a
NaN step; a DeepSpeed-Chat-like log whose loss scale is only in its overflow messages). The page's
plotly figures (JSON) are read and their panels, lines and markers checked against what `check`
finds; the PNG's size, pixels and label boxes are checked; the pages are opened in headless
Chromium (Debian's package, installed when missing), driven by playwright: a screenshot per case,
a hover read back, a zoom, no console message.
"""

from __future__ import annotations

import json
import math
import os
import re
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
from gradwatch.plots.axes import distinct_labels
from gradwatch.plots.figure import GAP_COLOR, NONFINITE_COLOR, Section, report_panels
from gradwatch.plots.panels import PANELS
from gradwatch.plots.png import build_figure, png_size
from gradwatch.plots.series import collect
from gradwatch.plots.trend import RecentWindow, Trend, grows_alone
from gradwatch.synth import Anomaly, RunSpec, write_log
from tests.conftest import EXAMPLES, check_json, real_samples, run_cli

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
    """What the tests look at in a page: its figures (panels, markers), alert and trend rows, tags, text."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.figures: list[dict[str, Any]] = []
        self.alert_rows: list[str] = []
        self.trend_rows: list[dict[str, str | None]] = []
        self.tags: Counter[str] = Counter()
        self.text: list[str] = []
        self.root: dict[str, str | None] = {}
        self._in_data = False
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags[tag] += 1
        if tag == "html":
            self.root = a
        self._in_data = tag == "script" and a.get("type") == "application/json"
        if tag == "tr" and str(a.get("id", "")).startswith("alert-"):
            self.alert_rows.append(str(a["id"]))
        if tag == "tr" and "data-grows" in a:
            self.trend_rows.append(a)

    def handle_data(self, data: str) -> None:
        if self._in_data:
            self.figures.append(json.loads(data))
        elif self.lasttag != "script":
            self.text.append(data)

    def handle_endtag(self, tag: str) -> None:
        self._in_data = False

    @property
    def panels(self) -> list[str]:
        return [panel for f in self.figures for panel in f["layout"]["meta"]["panels"]]

    @property
    def markers(self) -> list[int]:
        """The alert numbers of the markers, figure by figure."""
        return [int(a["name"].split("-")[1]) for f in self.figures for a in f["layout"]["annotations"] if "name" in a]

    def panel(self, panel_id: str, figure: int = 0) -> Panel:
        return Panel(self.figures[figure], panel_id)


class Panel:
    """One panel of a plotly figure: its traces, shapes and markers (all on its y axis)."""

    def __init__(self, fig: dict[str, Any], panel_id: str) -> None:
        k = fig["layout"]["meta"]["panels"].index(panel_id) + 1
        self.axis = "y" if k == 1 else f"y{k}"
        self.layout = fig["layout"][f"yaxis{k}"]
        self.traces = {t["name"]: t for t in fig["data"] if t["yaxis"] == self.axis}
        refs = (self.axis, f"{self.axis} domain")
        self.shapes = [sh for sh in fig["layout"]["shapes"] if sh["yref"] in refs]
        self.markers = [a for a in fig["layout"]["annotations"] if "name" in a and a["yref"] in refs]

    def bands(self, color: str) -> list[tuple[float, float]]:
        return [(sh["x0"], sh["x1"]) for sh in self.shapes if sh["type"] == "rect" and sh["fillcolor"] == color]

    def points(self, name: str) -> list[tuple[float | None, float | None]]:
        t = self.traces[name]
        return list(zip(t["x"], t["y"], strict=True))


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
    assert page.panel("loss_scale").traces["overflow"]["x"]  # fp16 overflows marked on the loss-scale panel


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
    html = out.read_text()
    page = Page(html)
    assert page.tags["img"] == 0 and page.tags["script"] == 3  # plotly.js, the figure's data, the page's script
    assert "<script>alert" not in html and "<img src=x" not in html
    text = "".join(page.text)
    assert HOSTILE_NAME in text and "<script>alert(1)</script>" in text
    (marker,) = [m for m in page.panel("loss").markers if "nan" in m["hovertext"]]
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in marker["hovertext"]  # plotly reads its texts as HTML


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
    from plotly.offline import get_plotlyjs

    assert out.stat().st_size - len(get_plotlyjs().encode()) < 2_000_000  # the page's own part: figures, tables
    assert "200,000" in " ".join(Page(out.read_text()).text)


def test_gaps_and_nan_steps_break_lines_and_the_loss_scale_is_drawn_as_steps(tmp_path: Path) -> None:
    """The tr8-104B picture: 65536 until the 300-step gap, 16384 after it, 8192 from the NaN step."""
    log, out = write_tr8(tmp_path / "tr8.log"), tmp_path / "r.html"
    assert report(str(log), "--out", str(out)).returncode == 0
    page = Page(out.read_text())
    scale = page.panel("loss_scale")
    assert scale.traces["loss_scale"]["line"]["shape"] == "hv"
    assert page.panel("loss").traces["loss"]["line"]["shape"] == "linear"
    for panel_id, name in (("loss", "loss"), ("loss_scale", "loss_scale"), ("grad_norm", "grad_norm")):
        points = page.panel(panel_id).points(name)
        breaks = [i for i, (x, _) in enumerate(points) if x is None]
        across = [(points[i - 1][0], points[i + 1][0]) for i in breaks]
        assert TR8_GAP in across, (name, across)  # nothing drawn across the gap
        joined = [(a[0], b[0]) for a, b in zip(points, points[1:], strict=False) if None not in (a[0], b[0])]
        assert all(b - a <= 1 for a, b in joined)  # and nothing else is joined
    loss = page.panel("loss").points("loss")
    assert TR8_NAN not in [x for x, _ in loss]
    assert any(a[0] == TR8_NAN - 1 and b[0] is None for a, b in zip(loss, loss[1:], strict=False))
    (band,) = page.panel("loss").bands(NONFINITE_COLOR)
    assert band[0] < TR8_NAN < band[1]
    assert page.panel("grad_norm").bands(NONFINITE_COLOR) == []  # the grad norm was finite there
    assert page.panel("lr").bands(GAP_COLOR) == [TR8_GAP]  # the gap is shaded on every panel
    at = {x: y for x, y in scale.points("loss_scale")}
    assert (at[8000], at[TR8_GAP[1]], at[TR8_NAN]) == (65536, 16384, 8192)


def test_a_deepspeed_chat_log_gets_a_loss_scale_panel_from_its_overflows(tmp_path: Path) -> None:
    """DeepSpeed-Chat prints its loss scale only in overflow messages: the scale is drawn from them,
    as steps, and the loss-scale alerts sit on that panel, numbered as in the table."""
    log, out = tmp_path / "dschat.log", tmp_path / "r.html"
    log.write_text("".join(ds_chat_lines()))
    assert report(str(log), "--out", str(out)).returncode == 0
    page = Page(out.read_text())
    assert page.panels[0] == "loss_scale" and "lr" in page.panels
    scale = page.panel("loss_scale")
    assert scale.traces["loss_scale"]["line"]["shape"] == "hv"
    assert None not in [x for x, _ in scale.points("loss_scale")]  # 10-step progress lines: no gap
    at = scale.traces["overflow"]["x"]  # DeepSpeed counts steps every 10: an overflow is placed after the last count
    assert len(at) == 5 and all(s - 10 < x <= s for x, s in zip(at, (200, 201, 202, 203, 420), strict=True)), at
    assert scale.traces["overflow"]["y"] == [1024, 512, 256, 128, 256]
    alerts = check_json(str(log))["alerts"]
    on_scale = [n for n, a in enumerate(alerts, 1) if a["metric"] == "loss_scale" and a["step"] is not None]
    assert on_scale and sorted(int(m["name"].split("-")[1]) for m in scale.markers) == on_scale
    assert [f"alert-{n}" for n in range(1, len(alerts) + 1)] == page.alert_rows


def test_a_trainer_without_a_logged_scale_gets_it_from_deepspeed_overflow_lines(tmp_path: Path) -> None:
    """HF Trainer under DeepSpeed: records without a loss scale, DeepSpeed's OVERFLOW lines beside them."""
    lines = []
    for step in range(1, 61):
        lines.append(f"{{'loss': {2.5 - step / 100:.4f}, 'learning_rate': 5e-05, 'epoch': {step / 60:.2f}}}\n")
        if step in (30, 31):
            attempted = 65536 >> (step - 30)
            lines.append(
                "[2024-01-01 10:00:00,000] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 "
                f"Skipping step. Attempted loss scale: {attempted}, reducing to {attempted // 2}\n"
            )
    log, out = tmp_path / "hf.log", tmp_path / "r.html"
    log.write_text("".join(lines))
    assert report(str(log), "--out", str(out)).returncode == 0
    page = Page(out.read_text())
    scale = page.panel("loss_scale")
    assert [y for _, y in scale.points("loss_scale")] == [32768, 16384]
    titles = [a["text"] for a in page.figures[0]["layout"]["annotations"] if "name" not in a]
    assert any("from the overflow messages" in t for t in titles)


def test_a_folder_draws_every_log_it_can_read_and_lists_the_others(logs: Path, tmp_path: Path) -> None:
    d = tmp_path / "runs"
    d.mkdir()
    (d / "a-notes.log").write_text("hello\nworld\n")
    shutil.copy(logs / "fp16.log", d / "b.log")
    shutil.copy(logs / "grow.jsonl", d / "c.jsonl")
    out = tmp_path / "r.html"
    p = report(str(d), str(tmp_path / "missing.log"), "--out", str(out))
    assert p.returncode == 0, p.stderr
    assert f"wrote {out}: 2 logs" in p.stdout
    unread = [line for line in p.stderr.splitlines() if line.startswith("not drawn: ")]
    assert len(unread) == 2 and "a-notes.log" in unread[0] and "missing.log: no such file" in unread[1]
    page = Page(out.read_text())
    assert page.tags["section"] == 2 and "logit_norm" in page.panels
    text = " ".join(page.text)
    assert "not drawn:" in text and "a-notes.log" in text and "missing.log" in text


def test_tick_labels_never_repeat_at_any_range() -> None:
    for lo, hi in ((24_300, 24_310), (0, 1_000_000), (6.0e-06, 6.1e-06), (8740, 9027), (1, 3)):
        values = [float(v) for v in np.linspace(lo, hi, 7)]
        labels = distinct_labels(values)
        assert len(set(labels)) == len(labels), labels
    assert distinct_labels([200_000.0, 400_000.0]) == ["200k", "400k"]  # short where short is enough


# ---- report: PNG ----------------------------------------------------------------------------------
def test_png_has_the_expected_size_and_is_not_blank(logs: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    log, out = logs / "fp16.log", tmp_path / "r.png"
    assert report(str(log), "--out", str(out)).returncode == 0
    n = len(expected_panels(log))
    assert png_dims(out) == png_size([Section("", [None] * n)])  # type: ignore[list-item]
    assert_not_blank(out)


@pytest.mark.parametrize("case", ["tr8", "dschat", "readme"])
def test_png_keeps_every_label_inside_the_image(tmp_path: Path, case: str) -> None:
    pytest.importorskip("matplotlib")
    log = cases(tmp_path)[case]
    run = collect(log, config.load(None), {m for p in PANELS for m in p.metrics})
    heading = f"{log}\nmegatron  |  steps 8,000-8,800  |  spike score loss 0.000%, grad_norm 0.000%  |  3 alerts"
    fig = build_figure([Section(heading, report_panels(run, PANELS))])
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [ax.get_tightbbox(renderer) for ax in fig.axes]  # ticks, titles, labels and markers drawn
    boxes += [sub._suptitle.get_window_extent(renderer) for sub in fig.subfigs]
    assert len(boxes) == len(fig.axes) + 1 >= 4
    for box in boxes:
        inside = box.x0 >= -1 and box.y0 >= -1 and box.x1 <= fig.bbox.x1 + 1 and box.y1 <= fig.bbox.y1 + 1
        assert inside, (box, fig.bbox)


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
    """The page as Chromium's command line opens it: its scripts run under its Content-Security-Policy."""
    html = tmp_path / "r.html"
    assert report(str(logs / "fp16.log"), "--out", str(html)).returncode == 0
    dom = run_chromium(chromium, tmp_path / "profile", "--virtual-time-budget=20000", "--dump-dom", html.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    console = [line for line in dom.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], console  # script errors and Content-Security-Policy violations land here
    assert Page(dom.stdout).root.get("data-ready") == "1"  # every figure was drawn
    assert dom.stdout.count('class="main-svg"') >= 2  # plotly drew into the page


# ---- the page as a person uses it: playwright driving Debian's chromium ----------------------------
def tr8_line(step: int, loss: float | None, scale: float, grad_norm: float, lr: float = 6.0e-05) -> str:
    """A Megatron-DeepSpeed iteration line as BigScience's tr8-104B printed it (no `lm loss` on a NaN step)."""
    lm_loss = "" if loss is None else f" lm loss: {loss:.6E} |"
    return (
        f" iteration {step:8d}/  159576 | consumed samples: {step * 176:12d} | elapsed time per iteration (ms): "
        f"61947.6 | learning rate: {lr:.3E} | global batch size:   176 |{lm_loss} loss scale: {scale:.1f} | "
        f"grad norm: {grad_norm:.3f} | num zeros: 0.0 | number of skipped iterations:   0 | "
        "number of nan iterations:   0 |\ntime (ms)\n"
    )


#: the tr8-104B-like log: steps 8,000-8,400, then none until 8,700 (280 steps), a NaN loss at 8,750
TR8_GAP = (8400, 8700)
TR8_NAN = 8750


def tr8_loss(step: int) -> float:
    return 2.9 + 0.05 * math.sin(step / 7)


def write_tr8(path: Path) -> Path:
    lines = []
    for step in [*range(8000, TR8_GAP[0] + 1), *range(TR8_GAP[1], 8801)]:
        scale = 65536.0 if step < TR8_GAP[1] else 16384.0 if step < TR8_NAN else 8192.0
        lines.append(tr8_line(step, None if step == TR8_NAN else tr8_loss(step), scale, 2.0e4 + step))
    path.write_text("".join(lines))
    return path


def ds_chat_lines(steps: int = 600, overflows: tuple[int, ...] = (200, 201, 202, 203, 420)) -> list[str]:
    """A DeepSpeed-Chat step-2 log (fused optimizer): `step=N, skipped=K` and timer lines every 10
    steps, the loss scale only in the overflow and scale-increase messages."""
    out = ["Beginning of Epoch 1/1, Total Micro Batches 1840\n"]
    scale, skipped = 1024.0, 0
    for step in range(1, steps + 1):
        t = f"[2023-04-18 03:{36 + step // 600:02d}:{step % 60:02d},000] [INFO]"
        if step in overflows:
            skipped += 1
            out.append(f"{t} [fused_optimizer.py:362:_update_scale] \nGrad overflow on iteration {step}\n")
            out.append(
                f"{t} [fused_optimizer.py:363:_update_scale] Reducing dynamic loss scale from {scale} to {scale / 2}\n"
            )
            out.append(
                f"{t} [logging.py:96:log_dist] [Rank 0] Overflow detected. Skipping step. Attempted loss scale: "
                f"{scale}, reducing to {scale / 2}\n"
            )
            scale /= 2
        elif step % 100 == 0:
            increasing = f"Increasing dynamic loss scale from {scale} to {scale * 2}"
            out.append(f"{t} [fused_optimizer.py:371:_update_scale] {increasing}\n")
            scale *= 2
        if step % 10 == 0:
            lr = 5e-05 * (1 + math.cos(math.pi * step / steps)) / 2
            progress = f"step={step}, skipped={skipped}, lr=[{lr}, {lr}], mom=[(0.9, 0.95), (0.9, 0.95)]"
            out.append(f"{t} [logging.py:96:log_dist] [Rank 0] {progress}\n")
            out.append(
                f"{t} [timer.py:199:stop] epoch=0/micro_step={step}/global_step={step}, RunningAvgSamplesPerSec=265.3, "
                f"CurrSamplesPerSec={265 - step % 7}.4, MemAllocated=4.34GB, MaxMemAllocated=12.81GB\n"
            )
    return out


@pytest.fixture(scope="module")
def browser(chromium: str) -> Any:
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


#: the texts plotly drew over the first figure: panel titles, and the alert markers' numbers
ANNOTATIONS = "#figure-1 .annotation-text"


class Shown:
    """A report open in the browser, with what its console said."""

    def __init__(self, browser: Any, html: Path) -> None:
        self.page = browser.new_page(viewport={"width": 1200, "height": 900})
        self.console: list[str] = []
        self.page.on("console", lambda m: self.console.append(f"{m.type}: {m.text}"))
        self.page.on("pageerror", lambda e: self.console.append(f"error: {e}"))
        self.page.goto(html.as_uri())
        self.page.wait_for_selector("html[data-ready='1']", timeout=60_000)

    def x_of(self, step: float) -> tuple[float, float]:
        """Where on the screen the first panel shows `step`, halfway down."""
        r0, r1 = self.page.evaluate("document.getElementById('figure-1').layout.xaxis.range")
        box = self.page.locator("#figure-1 .draglayer .xy .nsewdrag").bounding_box()
        return box["x"] + (step - r0) / (r1 - r0) * box["width"], box["y"] + box["height"] / 2

    def hover(self, step: float) -> list[str]:
        """The hover box's lines with the cursor at `step`: the step, then `name : value` per trace.
        The cursor leaves the panels first, so that the box read is not one still shown from before
        (after a zoom, plotly redraws it where the cursor was)."""
        self.page.mouse.move(1, 1)
        self.page.wait_for_selector("#figure-1 .hoverlayer .legend", state="detached", timeout=10_000)
        self.page.mouse.move(*self.x_of(step))
        self.page.wait_for_selector("#figure-1 .hoverlayer .legend", timeout=10_000)
        return self.page.locator("#figure-1 .hoverlayer text").all_text_contents()


def cases(tmp: Path) -> dict[str, Path]:
    """The logs of the browser tests: our tr8-like and DeepSpeed-Chat-like logs, README's example,
    and the real samples they imitate where present."""
    found = {"tr8": write_tr8(tmp / "tr8.log"), "readme": EXAMPLES / "megatron-ds-fp16-resume-collapse.log"}
    (tmp / "dschat.log").write_text("".join(ds_chat_lines()))
    found["dschat"] = tmp / "dschat.log"
    return found


@pytest.mark.parametrize("case", ["tr8", "dschat", "readme", "real-tr8", "real-dschat"])
def test_each_case_draws_in_the_browser_with_no_console_message(
    browser: Any, tmp_path: Path, case: str, request: pytest.FixtureRequest
) -> None:
    """A screenshot per case (kept in the test's tmp_path): the page drew every figure, said
    nothing on its console, and the screenshot is a picture, not a blank page."""
    real = {
        "real-tr8": "megatron-deepspeed/bigscience-tr8-104b-exp12-spike-8740-nan-9027.log",
        "real-dschat": "deepspeed/dschat-step2-reward-opt350m-fused-optimizer-grad-overflow-full.log",
    }
    log = real_samples() / real[case] if case in real else cases(tmp_path)[case]
    html = tmp_path / f"{case}.html"
    assert report(str(log), "--out", str(html)).returncode == 0
    shown = Shown(browser, html)
    shot = tmp_path / f"{case}.png"
    shown.page.screenshot(path=str(shot), full_page=True)
    assert shown.console == []
    assert_not_blank(shot)
    page = Page(html.read_text())
    assert len(page.markers) == alerts_with_step(log)
    drawn = [t for t in shown.page.locator(ANNOTATIONS).all_text_contents() if t.isdigit()]
    assert sorted(int(n) for n in drawn) == sorted(page.markers)  # the markers' numbers, as drawn


def test_hover_reads_every_panel_at_the_cursor_and_a_drag_zooms(browser: Any, tmp_path: Path) -> None:
    log, html = write_tr8(tmp_path / "tr8.log"), tmp_path / "tr8.html"
    assert report(str(log), "--out", str(html)).returncode == 0
    shown = Shown(browser, html)
    step = 8123
    lines = shown.hover(step)
    assert lines[0] == f"{step:,}"
    values = dict(line.split(" : ") for line in lines[1:])
    assert float(values["loss"]) == pytest.approx(tr8_loss(step), rel=1e-5)  # the 6 digits the log has
    assert float(values["loss_scale"]) == 65536
    assert {"loss", "grad_norm", "loss_scale", "lr", "step_time_s"} <= set(values)  # every panel's
    x0, y = shown.x_of(8100)
    x1, _ = shown.x_of(8200)
    shown.page.mouse.move(x0, y)
    shown.page.mouse.down()
    shown.page.mouse.move(x1, y, steps=8)
    shown.page.mouse.up()
    drawn = "document.getElementById('figure-1')._fullLayout.xaxis.range"  # (once redrawn)
    shown.page.wait_for_function(f"Math.abs({drawn}[0] - 8100) < 3 && Math.abs({drawn}[1] - 8200) < 3")
    lo, hi = shown.page.evaluate("document.getElementById('figure-1').layout.xaxis.range")
    assert lo == pytest.approx(8100, abs=2) and hi == pytest.approx(8200, abs=2)
    assert shown.hover(8150)[0] == "8,150"  # the hover still reads the steps once zoomed
    assert shown.console == []


def test_a_marker_links_to_its_row_of_the_alert_table(browser: Any, tmp_path: Path) -> None:
    html = tmp_path / "r.html"
    assert report(str(EXAMPLES / "megatron-ds-fp16-resume-collapse.log"), "--out", str(html)).returncode == 0
    shown = Shown(browser, html)
    shown.page.locator(ANNOTATIONS, has_text=re.compile("^3$")).click()
    assert shown.page.evaluate("location.hash") == "#alert-3"
    assert shown.console == []


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
    assert "loss" in page.panels and page.figures[0]["layout"]["xaxis"]["title"]["text"] == "tokens"


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

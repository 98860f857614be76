"""Benchmark: `gradwatch report` on a long Megatron-DeepSpeed log, one command.

    .venv/bin/python benchmarks/report.py [--steps 1000000]

Prints the time to read the log (the pipeline that `check` runs, parsers and detectors), the time
to draw it (downsampling, panels, HTML; and PNG where matplotlib is installed) and the HTML's size.
The log is generated once into benchmarks/data/ (git-ignored) with an injected grad-norm spike and
loss spike, so the report has alerts to mark.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from gradwatch import config
from gradwatch.errors import UsageError
from gradwatch.plots import figure, panels
from gradwatch.plots.html import report_page
from gradwatch.plots.png import render_png, require_matplotlib
from gradwatch.plots.series import collect
from gradwatch.synth import Anomaly, RunSpec, write_log

DATA = Path(__file__).resolve().parent / "data"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1_000_000)
    steps = parser.parse_args().steps
    log = DATA / f"megatron-ds-{steps}.log"
    if not log.exists():
        DATA.mkdir(exist_ok=True)
        spikes = (Anomaly("grad_norm_spike", steps * 2 // 5), Anomaly("loss_spike", steps * 7 // 10))
        t = time.perf_counter()
        write_log(log, RunSpec(steps=steps, anomalies=spikes))
        print(f"generated {log.name} ({log.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - t:.1f} s")
    wanted = {m for p in panels.PANELS for m in p.metrics}
    t = time.perf_counter()
    run = collect(log, config.load(None), wanted)
    read = time.perf_counter() - t
    print(f"read  {steps:,} steps, {log.stat().st_size / 1e6:.0f} MB: {read:.1f} s ({len(run.alerts)} alerts)")
    t = time.perf_counter()
    drawn = figure.report_panels(run, panels.PANELS)
    page = report_page([(run, drawn)])
    html_s = time.perf_counter() - t
    print(f"draw  HTML: {html_s:.2f} s, {len(page.encode()) / 1e6:.2f} MB, {len(drawn)} panels")
    try:
        require_matplotlib()
    except UsageError as e:
        print(f"draw  PNG: skipped ({e})")
        return
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        render_png([figure.Section(str(log), drawn)], Path(tmp) / "report.png")
        print(f"draw  PNG: {time.perf_counter() - t:.2f} s")


if __name__ == "__main__":
    main()

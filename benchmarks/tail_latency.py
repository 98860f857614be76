"""Append-to-alert latency and CPU share of `gradwatch tail`, with inotify and with polling.

    python benchmarks/tail_latency.py [--spikes 20] [--rate 20]

This process plays the trainer: it appends Megatron-DeepSpeed lines at `--rate` lines/s (each
line flushed on its own) to a log that `gradwatch tail --output jsonl` follows in a subprocess,
with a grad-norm spike (x50) every 25th line. Latency is the time from the spike's write returning
to its alert arriving on tail's stdout (both measured here, on one monotonic clock). CPU share is
tail's user+system time over wall time, from /proc: idle (5 s with no writes) and following.

Targets (issue 4): p99 < 100 ms with inotify and < poll interval + 100 ms when polling (0.25 s);
under 2% of a core idle and under 10% following 20 lines/s.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.tail_writer import megatron_line, write_lines  # noqa: E402

SPIKE_EVERY = 25  # lines; more than the detector's 20 quiet lines, so each spike is a new incident
IDLE_S = 5.0
MODES = {"inotify": [], "polling (0.25 s)": ["--poll", "0.25"]}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(mode_args: list[str], spikes: int, rate: float, workdir: Path) -> dict[str, float]:
    log = workdir / f"main_log{len(mode_args)}.txt"
    write_lines(str(log), 1000, 100)  # history: warm baselines
    tail = subprocess.Popen(
        [sys.executable, "-m", "gradwatch", "tail", str(log), "--output", "jsonl", *mode_args],
        stdout=subprocess.PIPE,
        text=True,
    )
    arrived: dict[int, float] = {}
    started = threading.Event()

    def read() -> None:
        assert tail.stdout is not None
        for line in tail.stdout:
            obj = json.loads(line)
            if obj["type"] == "status":
                started.set()
            elif obj["type"] == "alert" and obj["detector"] == "grad_norm_spike" and obj["severity"] == "warning":
                arrived[obj["step"]] = time.monotonic()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    if not started.wait(30):
        raise SystemExit("tail did not start")
    cpu0, t0 = cpu_seconds(tail.pid), time.monotonic()
    time.sleep(IDLE_S)
    idle = (cpu_seconds(tail.pid) - cpu0) / (time.monotonic() - t0)

    written: dict[int, float] = {}
    cpu0, t0 = cpu_seconds(tail.pid), time.monotonic()
    with open(log, "a") as fh:
        for i in range(spikes * SPIKE_EVERY):
            step = 1100 + i
            spike = i % SPIKE_EVERY == SPIKE_EVERY - 1
            fh.write(megatron_line(step, spike))
            fh.flush()
            if spike:
                written[step] = time.monotonic()
            time.sleep(max(0.0, t0 + (i + 1) / rate - time.monotonic()))
    following = (cpu_seconds(tail.pid) - cpu0) / (time.monotonic() - t0)
    deadline = time.monotonic() + 2.0
    while len(arrived) < len(written) and time.monotonic() < deadline:
        time.sleep(0.01)
    tail.send_signal(signal.SIGINT)
    tail.wait(timeout=30)
    latencies = sorted(arrived[s] - t for s, t in written.items() if s in arrived)
    if not latencies:
        raise SystemExit("no alert arrived")
    return {
        "alerts": len(latencies),
        "missed": len(written) - len(latencies),
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, round(0.99 * (len(latencies) - 1)))],
        "max_ms": 1000 * latencies[-1],
        "cpu_idle_pct": 100 * idle,
        "cpu_following_pct": 100 * following,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spikes", type=int, default=20, help="spikes per mode (each takes 25 lines)")
    ap.add_argument("--rate", type=float, default=20.0, help="lines per second")
    args = ap.parse_args()
    print(f"{args.rate:g} lines/s, a spike every {SPIKE_EVERY} lines, {args.spikes} spikes per mode")
    print(f"{'mode':<18}{'alerts':>7}{'missed':>7}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}", end="")
    print(f"{'CPU idle':>10}{'CPU follow':>12}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, mode_args in MODES.items():
            r = run(mode_args, args.spikes, args.rate, Path(tmp))
            print(
                f"{name:<18}{r['alerts']:>7.0f}{r['missed']:>7.0f}{r['p50_ms']:>9.1f}{r['p99_ms']:>9.1f}"
                f"{r['max_ms']:>9.1f}{r['cpu_idle_pct']:>9.2f}%{r['cpu_following_pct']:>11.2f}%",
                flush=True,
            )


if __name__ == "__main__":
    main()

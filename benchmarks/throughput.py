"""Benchmark: `gradwatch check` throughput and memory against grep and cat, one command.

    .venv/bin/python benchmarks/throughput.py [--size-mb 1024] [--formats megatron-deepspeed,olmo,...] [--jobs 1,2]

For each format, generates (once, into benchmarks/data/, git-ignored) a realistic log of about
SIZE MB with src/gradwatch/synth.py: Megatron-DeepSpeed fp16 with its timer and DeepSpeed lines,
Megatron-LM's dated records (fp16: a skipped iteration now and then, printed without its grad
norm), OLMo multi-line records, HF Trainer dict lines, JSON lines, torchtitan's coloured metrics
lines. `FORMAT:N` logs every N steps (e.g.
`hf-trainer:10`, the Trainer's `logging_steps`, whose tqdm bars then count steps, not dicts).
Then, in the same run and on the same warm file, times `cat FILE > /dev/null`, `grep -c PATTERN
FILE` and `gradwatch check --output json FILE` (the full pipeline: parsing, all detectors, the
report), each as a child process whose peak RSS is read with wait4 (the largest of gradwatch and
the worker processes it waited for). Prints MB/s, the ratio to grep and peak RSS per format and
`--jobs` value, then start-up times: `gradwatch --help` and `check` on a one-line file. Figures
vary with the machine's load: compare ratios, not seconds.

gradwatch's modules are byte-compiled first, as `pip install` does: an editable install under
PYTHONDONTWRITEBYTECODE=1 (set on some build machines) compiles every module from source at each
start, some 0.1 s of every run and of every worker pool, which no installed copy pays.
"""

from __future__ import annotations

import argparse
import compileall
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gradwatch
from gradwatch.synth import RunSpec, write_sized

DATA = Path(__file__).resolve().parent / "data"
GRADWATCH = [sys.executable, "-m", "gradwatch"]
#: what grep counts in each format: its record lines
PATTERNS = {
    "megatron-deepspeed": " iteration ",
    "megatron-lm": " iteration ",
    "olmo": "[step=",
    "composer": "[batch=",
    "torchtitan": "step:",
    "hf-trainer": "'loss'",
    "jsonl": '"loss"',
}


def timed(argv: list[str]) -> tuple[float, float, int]:
    """Run argv; return (wall seconds, peak RSS in MB, exit code) of that child alone.

    Output goes to a real file: GNU grep stops at the first match when it sees /dev/null.
    """
    with tempfile.TemporaryFile() as sink:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
    return wall, usage.ru_maxrss / 1024, os.waitstatus_to_exitcode(status)


def best(argv: list[str], repeat: int) -> tuple[float, float, int]:
    runs = [timed(argv) for _ in range(repeat)]
    return min(runs, key=lambda r: r[0])


def log_for(name: str, size_mb: int) -> Path:
    """The log of `name` (`FORMAT` or `FORMAT:N`, logging every N steps), generated once."""
    fmt, _, every = name.partition(":")
    DATA.mkdir(parents=True, exist_ok=True)
    path = DATA / f"{fmt}{'-every' + every if every else ''}-{size_mb}mb.log"
    if not path.exists():
        print(f"generating {path.name} ...", file=sys.stderr, flush=True)
        tmp = path.with_suffix(".tmp")
        write_sized(tmp, RunSpec(fmt=fmt, seed=1, log_interval=int(every or 1)), size_mb << 20)
        tmp.rename(path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--formats", default="megatron-deepspeed,megatron-lm,olmo,hf-trainer,jsonl,torchtitan")
    parser.add_argument("--repeat", type=int, default=1, help="runs per command; the fastest counts")
    parser.add_argument(
        "--jobs", default="auto", help="comma-separated `check --jobs` values to time, e.g. 1,2 (auto: its default)"
    )
    args = parser.parse_args()
    compileall.compile_dir(Path(gradwatch.__file__).parent, quiet=1)  # as `pip install` does
    print(
        f"machine: {os.cpu_count()} cores, Python {sys.version.split()[0]}; page cache warm (cat first); "
        "gradwatch byte-compiled"
    )
    print(
        f"{'format':<20}{'MB':>7}{'cat s':>8}{'grep s':>8}{'jobs':>6}{'check s':>9}{'MB/s':>8}{'x grep':>8}"
        f"{'RSS MB':>8}  exit"
    )
    for fmt in args.formats.split(","):
        path = log_for(fmt, args.size_mb)
        mb = path.stat().st_size / 1e6
        cat, _, _ = best(["sh", "-c", f"cat '{path}' > /dev/null"], args.repeat)
        grep, _, _ = best(["grep", "-cF", PATTERNS[fmt.partition(":")[0]], str(path)], args.repeat)
        for jobs in args.jobs.split(","):
            flag = [] if jobs == "auto" else ["--jobs", jobs]
            check, rss, code = best([*GRADWATCH, "check", "--output", "json", *flag, str(path)], args.repeat)
            print(
                f"{fmt:<20}{mb:>7.0f}{cat:>8.2f}{grep:>8.2f}{jobs:>6}{check:>9.2f}{mb / check:>8.0f}"
                f"{check / grep:>8.1f}{rss:>8.0f}  {code}",
                flush=True,
            )
    with tempfile.TemporaryDirectory() as tmp:
        one = Path(tmp) / "one.log"
        one.write_text(" iteration        1/     100 | lm loss: 1.1E+01 | grad norm: 1.0 |\n")
        help_s, help_rss, _ = best([*GRADWATCH, "--help"], 3)
        one_s, one_rss, _ = best([*GRADWATCH, "check", str(one)], 3)
    print(
        f"start-up: `gradwatch --help` {help_s:.2f} s ({help_rss:.0f} MB); "
        f"`gradwatch check` on a one-line file {one_s:.2f} s ({one_rss:.0f} MB)"
    )


if __name__ == "__main__":
    main()

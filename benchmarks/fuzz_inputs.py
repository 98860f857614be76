"""Fuzzing the readers: real log lines, mutated at random, through the parsers and detectors.

Each round takes a stretch of a real published log (`/work/shared/samples`), mutates some of its
lines (a number made thousands of digits long, in ASCII or another script's digits; nan, inf,
1e309, a negative step; control bytes, escapes, invalid UTF-8; a line cut, doubled or joined to
the next; a megabyte of one character), sometimes repeats it into a block of megabytes (so that
the bulk readers of a locked format read it too), and feeds it to `FileCheck` in chunks cut at
random, in this process, as `gradwatch check` does. Any exception is a finding: its type, where
it was raised and the input are written to `--out`. A round longer than `--slow` seconds is a
finding too (a hang in the making). At the end it prints the rounds, the findings and the peak
RSS of the process; it exits 1 where there was a finding.

    .venv/bin/python benchmarks/fuzz_inputs.py --seconds 600 --out /tmp/fuzz
"""

from __future__ import annotations

import argparse
import random
import resource
import signal
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from gradwatch import config
from gradwatch.pipeline import FileCheck

SAMPLES = Path(__file__).resolve().parents[2] / "shared" / "samples"
LOG_SUFFIXES = (".log", ".txt", ".out", ".jsonl")
#: Lines kept per sample file (its head): enough for its shapes.
LINES_PER_FILE = 3000
#: The most chunks one input is fed in.
MAX_CHUNKS = 2000


class Slow(Exception):
    """A round took longer than allowed."""


def sample_logs() -> list[list[bytes]]:
    """The lines (with their newlines) of each published log in the samples."""
    logs = []
    for path in sorted(SAMPLES.rglob("*")):
        if path.is_file() and path.name.endswith(LOG_SUFFIXES):
            lines = path.read_bytes().splitlines(keepends=True)[:LINES_PER_FILE]
            if lines:
                logs.append(lines)
    return logs


def _digit_runs(line: bytes) -> list[tuple[int, int]]:
    runs, start = [], None
    for k, byte in enumerate(line + b" "):
        if 48 <= byte <= 57:
            start = k if start is None else start
        elif start is not None:
            runs.append((start, k))
            start = None
    return runs


def _replace_number(rng: random.Random, line: bytes, new: bytes) -> bytes:
    runs = _digit_runs(line)
    if not runs:
        return new + line
    start, end = rng.choice(runs)
    return line[:start] + new + line[end:]


def _long_digits(rng: random.Random, line: bytes) -> bytes:
    """One number of the line, or every one, made long (past `int()`'s 4,300 digits, mostly)."""
    digits = rng.choice([b"9", b"1", b"0", "\u0663".encode(), "\uff19".encode()])
    long = digits * rng.choice([19, 400, 4300, 4301, 5000, 5000, 30000])
    if rng.random() < 0.5:
        return _replace_number(rng, line, long)
    for start, end in reversed(_digit_runs(line)):
        line = line[:start] + long + line[end:]
    return line


def _odd_number(rng: random.Random, line: bytes) -> bytes:
    odd = [b"nan", b"-inf", b"inf", b"1e309", b"-1", b"-9223372036854775809", b"9223372036854775808", b"1e-400"]
    odd += [b"0x1F", b"1_000", b"1.2.3", b"--5", b"", b"NaN%", b"1e99999999999", b"\xd9\xa3"]
    return _replace_number(rng, line, rng.choice(odd))


def _bytes_in(rng: random.Random, line: bytes) -> bytes:
    junk = [b"\x00", b"\r", b"\x1b[2J", b"\x1b]0;x\x07", b"\xff\xfe", b"\xe2\x80\xae", b"\t", b"\x0b", b"|", b":", b"="]
    at = rng.randrange(len(line) + 1)
    return line[:at] + rng.choice(junk) * rng.choice([1, 1, 3, 1000]) + line[at:]


def _cut(rng: random.Random, line: bytes) -> bytes:
    return line[: rng.randrange(len(line) + 1)] + b"\n"


def _huge(rng: random.Random, line: bytes) -> bytes:
    return line.rstrip(b"\n") + rng.choice([b"9", b"a", b" ", b"[", b"{", b"\r"]) * (1 << 20) + b"\n"


def _swap_words(rng: random.Random, line: bytes) -> bytes:
    words = line.split(b" ")
    rng.shuffle(words)
    return b" ".join(words)


MUTATIONS: dict[str, Callable[[random.Random, bytes], bytes]] = {
    "long_digits": _long_digits,
    "odd_number": _odd_number,
    "bytes_in": _bytes_in,
    "cut": _cut,
    "huge": _huge,
    "swap_words": _swap_words,
}


def mutated(rng: random.Random, lines: list[bytes]) -> tuple[bytes, list[str]]:
    """A stretch of `lines` with some of them mutated, and the mutations applied."""
    start = rng.randrange(len(lines))
    stretch = list(lines[start : start + rng.choice([5, 50, 400, 3000])])
    numbered = [k for k, line in enumerate(stretch) if any(48 <= byte <= 57 for byte in line)]
    applied = []
    for _ in range(rng.choice([1, 2, 5, 20])):
        name = rng.choice(list(MUTATIONS))
        if name == "huge" and rng.random() < 0.7:
            continue  # megabyte lines are slow to read: fewer of them
        # mostly a line with a number: the parsers' own lines have one
        k = rng.choice(numbered) if numbered and rng.random() < 0.8 else rng.randrange(len(stretch))
        if k >= len(stretch):
            continue  # (a line joined to the one before)
        stretch[k] = MUTATIONS[name](rng, stretch[k])
        applied.append(name)
        if rng.random() < 0.1 and k + 1 < len(stretch):  # joined to the next line
            stretch[k] = stretch[k].rstrip(b"\n") + stretch.pop(k + 1)
    data = b"".join(stretch)
    if rng.random() < 0.15:  # a block the bulk readers read
        data *= max(1, (3 << 20) // max(len(data), 1))
    return data, applied


def check(data: bytes, settings: config.Settings, rng: random.Random) -> None:
    """Feed `data` to one file's parsers and detectors in chunks cut at random (at most about
    `MAX_CHUNKS` of them: the detectors run after each)."""
    run = FileCheck("fuzz.log", settings)
    pos = 0
    while pos < len(data):
        size = max(rng.choice([1, 7, 4096, 1 << 16, 4 << 20]), len(data) // MAX_CHUNKS)
        run.feed(data[pos : pos + size])
        pos += size
    run.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--slow", type=float, default=60.0, help="a round longer than this is a finding")
    parser.add_argument("--out", type=Path, default=Path("fuzz-findings"), help="where findings are written")
    args = parser.parse_args()

    logs = sample_logs()
    if not logs:
        raise SystemExit(f"no sample logs under {SAMPLES}")
    settings = config.load()
    rng = random.Random(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)

    def too_slow(signum: int, frame: object) -> None:
        raise Slow(f"round longer than {args.slow:g} s")

    signal.signal(signal.SIGALRM, too_slow)
    findings: Counter[str] = Counter()
    rounds = lines_read = bytes_read = 0
    slowest = 0.0
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        data, applied = mutated(rng, rng.choice(logs))
        signal.setitimer(signal.ITIMER_REAL, args.slow)
        started = time.monotonic()
        try:
            check(data, settings, random.Random(rounds))
        except Exception as e:  # noqa: BLE001 - every exception is a finding
            where = traceback.extract_tb(e.__traceback__)[-1]
            key = f"{type(e).__name__} at {Path(where.filename).name}:{where.lineno}"
            if not findings[key]:
                (args.out / f"finding-{len(findings)}.log").write_bytes(data)
                (args.out / f"finding-{len(findings)}.txt").write_text(
                    f"{key}\nmutations: {applied}\n\n{traceback.format_exc()}"
                )
            findings[key] += 1
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        slowest = max(slowest, time.monotonic() - started)
        rounds += 1
        lines_read += data.count(b"\n")
        bytes_read += len(data)

    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"rounds        {rounds:>12,}")
    print(f"lines         {lines_read:>12,}")
    print(f"MB            {bytes_read / 1e6:>12,.1f}")
    print(f"slowest round {slowest:>12.2f} s")
    print(f"peak RSS      {peak_mb:>12,.0f} MB")
    print(f"findings      {sum(findings.values()):>12,}  ({len(findings)} kinds, inputs in {args.out})")
    for key, count in findings.most_common():
        print(f"  {count:>6,}  {key}")
    if findings:
        raise SystemExit(1)


if __name__ == "__main__":
    main()

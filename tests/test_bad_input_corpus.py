"""The bad-input corpus of issue #27: inputs that crashed or hung gradwatch, each run through the real
CLI in a subprocess, with the message and exit code it must end with, under a timeout (a hang
fails the test) and with its peak RSS measured (`conftest.measured_cmd`): under `MAX_RSS_MB` for every input.

A poisoned line (a number of 5,000 digits, which `int()` refuses) is tried in each line shape
that reads a number, amid a Megatron log: the line is dropped with a warning and the run reads on,
in check, scan, report, export and `tail -`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from gradwatch.parsers._text import MAX_DIGITS, holds_long_number
from tests.conftest import gradwatch_cmd, measured_cmd, peak_rss_mb, real_samples
from tests.test_bad_input import megatron_log

#: Peak resident memory allowed to any run of the corpus.
MAX_RSS_MB = 400
#: A run longer than this is a hang.
TIMEOUT_S = 90
DIGITS = "9" * 5000


@dataclass
class Run:
    code: int
    out: str
    err: str
    peak_mb: float


def run_measured(args: list[str], cwd: Path, stdin: Path | None = None, timeout: float = TIMEOUT_S) -> Run:
    """`gradwatch ARGS` in a subprocess, with its peak RSS; killed (and the test failed) at `timeout`."""
    out_path, err_path, peak_path = cwd / ".stdout", cwd / ".stderr", cwd / ".peak"
    measured, peak_env = measured_cmd(peak_path)
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "120", **peak_env}
    with (
        open(out_path, "wb") as out,
        open(err_path, "wb") as err,
        open(stdin or os.devnull, "rb") as given,
    ):
        proc = subprocess.Popen([*measured, *args], cwd=cwd, env=env, stdin=given, stdout=out, stderr=err)
    deadline = time.monotonic() + timeout
    while True:
        pid, status = os.waitpid(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() > deadline:
            proc.kill()
            os.waitpid(proc.pid, 0)
            pytest.fail(f"gradwatch {' '.join(args)} still ran after {timeout} s: a hang")
        time.sleep(0.05)
    proc.returncode = os.waitstatus_to_exitcode(status)
    run = Run(proc.returncode, out_path.read_text(errors="replace"), err_path.read_text(errors="replace"), 0.0)
    run.peak_mb = peak_rss_mb(peak_path)
    assert "Traceback" not in run.err + run.out, run.err[-3000:]
    assert run.peak_mb < MAX_RSS_MB, f"peak RSS {run.peak_mb:.0f} MB"
    return run


# ---- a poisoned line in every shape that reads a number --------------------------------------------
POISONED_SHAPES = {
    "megatron checkpoint": f"saving checkpoint at iteration {DIGITS} to /ckpt",
    "megatron checkpoint, other digits": "saving checkpoint at iteration " + "\u0663" * 5000 + " to /ckpt",
    "megatron loaded": f"  successfully loaded checkpoint from /ckpt at iteration {DIGITS}",
    "megatron record": (
        f" iteration {DIGITS}/  159576 | consumed samples:     17600 | elapsed time per iteration (ms): 1.0 | "
        "learning rate: 6.000E-05 | global batch size:   176 | lm loss: 4.0E+00 | loss scale: 1.0 | "
        "grad norm: 1.500 | number of skipped iterations:   0 | number of nan iterations:   0 |"
    ),
    "megatron total": f" iteration       10/{DIGITS} | lm loss: 4.0E+00 | grad norm: 1.5 |",
    "megatron vocab": f" > padded vocab (size: {DIGITS}) with 0 dummy tokens (new size: {DIGITS})",
    "deepspeed step": f"[Rank 0] step={DIGITS}, skipped={DIGITS}, lr=[6e-05], mom=[(0.9, 0.95)]",
    "deepspeed overflow": f"[deepscale] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: {DIGITS}, reducing to 1",
    "deepspeed checkpoint": f"[INFO] [engine.py:3000:save_checkpoint] Saving model checkpoint: /c/global_step{DIGITS}",
    "hf dict": "{'loss': 1.2, 'grad_norm': 0.5, 'learning_rate': 1e-05, 'epoch': " + DIGITS + "}",
    "hf bar": f" 50%|#####     | {DIGITS}/{DIGITS} [00:01<00:01,  1.00it/s]",
    "jsonl": '{"step": ' + DIGITS + ', "loss": 1.0, "grad_norm": 0.5}',
    "olmo": f"[step={DIGITS}/{DIGITS}]\n    train/CrossEntropyLoss={DIGITS}",
    "torchtitan": f"[titan] 2024-01-01 00:00:00,000 - root - INFO - step: {DIGITS}  loss:  3.0  memory: 1GiB(1%)",
    "nemo bar": f"Epoch 0:  50%|#| {DIGITS}/1000 [00:01<00:01, 1.00it/s, loss=2.52, global_step={DIGITS}]",
    "nemo checkpoint": f"Epoch 0, global step {DIGITS}: 'val_loss' reached 2.5 (best 2.5), saving model to '/c'",
    "composer": f"[batch={DIGITS}/{DIGITS}]:\n\t Train loss/train/total: 2.0",
    "generic": f"step {DIGITS} loss 1.0 grad_norm 0.5",
    "generic progress": f"Epoch [{DIGITS}][{DIGITS}/{DIGITS}] loss: 1.0",
}


def poisoned_log(line: str) -> str:
    """A Megatron log of 10 records with `line` after the fifth: before the format is known, so
    every parser reads it."""
    records = megatron_log(10).splitlines(keepends=True)
    return "".join([*records[:5], line + "\n", *records[5:]])


@pytest.mark.parametrize("shape", POISONED_SHAPES)
def test_a_number_too_long_for_int_is_no_crash_in_any_line_shape(tmp_path: Path, shape: str) -> None:
    (tmp_path / "train.log").write_text(poisoned_log(POISONED_SHAPES[shape]))
    run = run_measured(["check", "train.log"], tmp_path)
    assert run.code == 0 and "10 records" in run.out, run.out + run.err


def test_a_poisoned_log_is_read_by_every_command(tmp_path: Path) -> None:
    """check, scan, report, export and `tail -` read the records around the poisoned lines."""
    (tmp_path / "train.log").write_text(poisoned_log("\n".join(POISONED_SHAPES.values())))
    assert "10 records" in run_measured(["check", "train.log"], tmp_path).out
    assert run_measured(["scan", "train.log", "--state", "st"], tmp_path).code == 0
    assert "1 log" in run_measured(["report", "train.log", "--out", "r.html"], tmp_path).out
    assert "10 records" in run_measured(["export", "train.log", "--out", "r.csv"], tmp_path).out
    tail = run_measured(["tail", "-"], tmp_path, stdin=tmp_path / "train.log")
    assert tail.code == 0 and "10 records" in tail.out, tail.out + tail.err


def test_a_cron_scan_notifies_the_healthy_log_beside_a_poisoned_one(tmp_path: Path) -> None:
    """The poisoned file crashed the scan before it saved: the healthy one was never notified."""
    (tmp_path / "healthy.log").write_text(megatron_log(400, spike_at=2000))
    (tmp_path / "poisoned.log").write_text(poisoned_log("\n".join(POISONED_SHAPES.values())))
    notify = f"sh -c 'cat >> {tmp_path / 'notes'}; echo >> {tmp_path / 'notes'}'"
    args = ["scan", str(tmp_path / "*.log"), "--state", "st", "--notify-cmd", notify, "--fail-on", "warning"]
    first = run_measured(args, tmp_path)
    assert first.code == 1 and "grad_norm_spike" in first.out, first.out + first.err
    notes = (tmp_path / "notes").read_text()
    assert "grad_norm_spike" in notes and "healthy.log" in notes
    with open(tmp_path / "poisoned.log", "a") as fh:
        fh.write(POISONED_SHAPES["megatron checkpoint"] + "\n")
    assert run_measured(args, tmp_path).code == 0  # read on from the saved state: nothing new


# ---- the rest of the corpus: an input, its command, its exit code and a fragment of its message ---
@dataclass(frozen=True)
class Case:
    make: Callable[[Path], list[str]]  # writes the input into the folder, returns the arguments
    code: int
    fragment: str


def _fifo(*args: str) -> Callable[[Path], list[str]]:
    def make(tmp: Path) -> list[str]:
        os.mkfifo(tmp / "pipe.log")
        return list(args)

    return make


def _fed_fifo(*args: str) -> Callable[[Path], list[str]]:
    """A named pipe with a writer process that writes a log of 30 records into it (and gives up
    after a minute when nobody reads)."""

    def make(tmp: Path) -> list[str]:
        os.mkfifo(tmp / "pipe.log")
        (tmp / "train.log").write_text(megatron_log(30))
        subprocess.Popen(["timeout", "60", "sh", "-c", "cat train.log > pipe.log"], cwd=tmp)
        return list(args)

    return make


def _looped(tmp: Path, *args: str) -> list[str]:
    """A folder with two symlinks to its parent and one to itself, a log and a pipe inside."""
    (tmp / "runs" / "a").mkdir(parents=True)
    (tmp / "runs" / "a" / "train.log").write_text(megatron_log(30))
    os.mkfifo(tmp / "runs" / "a" / "pipe.log")
    for name, target in (("up1", ".."), ("up2", ".."), ("self", ".")):
        (tmp / "runs" / "a" / name).symlink_to(target)
    return list(args)


def _config(text: str | bytes) -> Callable[[Path], list[str]]:
    def make(tmp: Path) -> list[str]:
        (tmp / "train.log").write_text(megatron_log(30))
        data = text.encode() if isinstance(text, str) else text
        (tmp / "bad.yaml").write_bytes(data)
        return ["check", "train.log", "--config", "bad.yaml"]

    return make


def _state(text: str) -> Callable[[Path], list[str]]:
    def make(tmp: Path) -> list[str]:
        (tmp / "train.log").write_text(megatron_log(30))
        (tmp / "st").write_text(text)
        (tmp / "st").chmod(0o600)
        return ["scan", "train.log", "--state", "st"]

    return make


def _negative_offset(tmp: Path) -> list[str]:
    """A state whose offset was edited to be negative: read again from the start, once."""
    (tmp / "train.log").write_text(megatron_log(30))
    run_measured(["scan", "train.log", "--state", "st"], tmp)
    state = (tmp / "st").read_text()
    assert '"offset":' in state
    head, rest = state.split('"offset":', 1)
    (tmp / "st").write_text(head + '"offset":-5' + rest[rest.index(",") :])
    with open(tmp / "train.log", "a") as fh:
        fh.write(megatron_log(40)[len(megatron_log(30)) :])
    return ["scan", "train.log", "--state", "st"]


def _file(name: str, data: bytes, *args: str) -> Callable[[Path], list[str]]:
    def make(tmp: Path) -> list[str]:
        (tmp / name).write_bytes(data)
        return list(args)

    return make


def restarting_log(records: int, every: int = 1) -> str:
    """A Megatron log whose step goes back after every `every` records, `records` in all (a job
    replaying from a checkpoint again and again): detectors that start over at each resume did
    quadratic work on it (benchmarks/restarts.py times it)."""
    lines = []
    for i in range(records):
        step = 1_000_000 + i % every - i // every
        loss, grad = 3 + i % 7 / 100, 1 + i % 5 / 10
        lines.append(f" iteration {step:8d}/ 9000000 | lm loss: {loss:.4f} | grad norm: {grad:.3f} |\n")
    return "".join(lines)


NEMO_BAR = "Epoch 0:   3%|#| 34/1100 [5:29<171:22, 1.73it/s, loss=2.52, global_step=33]"
ALIAS_BOMB = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)
)
CORPUS = {
    "check of a named pipe": Case(_fed_fifo("check", "pipe.log"), 0, "30 records"),
    "report of a named pipe": Case(_fed_fifo("report", "pipe.log", "--out", "r.html"), 0, "1 log"),
    "export of a named pipe": Case(_fed_fifo("export", "pipe.log", "--out", "r.csv"), 0, "30 records"),
    "scan of a named pipe": Case(_fifo("scan", "pipe.log", "--state", "st"), 2, "pipe.log: is a named pipe"),
    "check of /dev/zero": Case(lambda t: ["check", "/dev/zero"], 2, "/dev/zero: is a device"),
    "check of a folder with symlink loops": Case(lambda t: _looped(t, "check", "runs"), 0, "30 records"),
    "scan of ** over symlink loops": Case(
        lambda t: _looped(t, "scan", "runs/**/*.log", "--state", "st"), 0, "1 file checked"
    ),
    "report of ** over symlink loops": Case(
        lambda t: _looped(t, "report", "runs/**/*.log", "--out", "r.html"), 0, "1 log"
    ),
    "--lock-wait nan": Case(
        lambda t: ["scan", "x.log", "--state", "st", "--lock-wait", "nan"], 2, "not a number of seconds"
    ),
    "--lock-wait inf": Case(
        lambda t: ["scan", "x.log", "--state", "st", "--lock-wait", "inf"], 2, "not a number of seconds"
    ),
    "--lock-wait -1": Case(lambda t: ["scan", "x.log", "--state", "st", "--lock-wait", "-1"], 2, "not in the range"),
    "tail --poll nan": Case(lambda t: ["tail", "x.log", "--poll", "nan"], 2, "not a number of seconds"),
    "--webhook that does not parse": Case(
        lambda t: ["scan", "x.log", "--state", "st", "--webhook", "http://[::1"], 2, "--webhook must be"
    ),
    "yaml alias bomb": Case(_config(ALIAS_BOMB), 2, "more than 100,000 values once its aliases are expanded"),
    "yaml alias of itself": Case(_config("detectors: &d\n  loss_spike: [*d]\n"), 2, "contains itself"),
    "yaml nested 5,000 deep": Case(_config("detectors: " + "[" * 5000 + "]" * 5000), 2, "nested more than 64"),
    "yaml nested 70 deep": Case(_config("detectors: " + "[" * 70 + "]" * 70), 2, "nested more than 64"),
    "yaml of 2 MB": Case(_config("# " + "x" * (2 << 20)), 2, "larger than 1 MB"),
    "--config /dev/zero": Case(lambda t: ["check", "x.log", "--config", "/dev/zero"], 2, "not a regular file"),
    "--config a named pipe": Case(_fifo("config", "show", "--config", "pipe.log"), 2, "pipe.log: not a regular file"),
    "state nested 100,000 deep": Case(_state("[" * 100_000 + "]" * 100_000), 0, "damaged"),
    "state with a negative offset": Case(_negative_offset, 0, "40 records"),
    "scan of an empty file": Case(_file("e.log", b"", "scan", "e.log", "--state", "st"), 2, "no training records"),
    "scan of binary garbage": Case(
        _file("b.log", bytes(range(256)) * 400, "scan", "b.log", "--state", "st"), 2, "no training records"
    ),
    "a megabyte of pipes after a record": Case(
        _file("p.log", (megatron_log(31).rstrip() + "|" * (1 << 20) + "\n").encode(), "check", "p.log"),
        0,
        "31 records",
    ),
    "a megabyte of letters in a NeMo bar": Case(
        _file("n.log", (NEMO_BAR + "a" * (1 << 20) + "\n").encode(), "check", "n.log"), 0, "1 record"
    ),
    "a step going back at each of 20,000 records": Case(
        _file("r.log", restarting_log(20_000).encode(), "check", "r.log"), 0, "20,000 records"
    ),
}


@pytest.mark.parametrize("name", CORPUS)
def test_bad_input_corpus(tmp_path: Path, name: str) -> None:
    case = CORPUS[name]
    run = run_measured(case.make(tmp_path), tmp_path)
    assert run.code == case.code, run.out + run.err
    assert case.fragment in run.out + run.err, run.out + run.err


def test_tail_of_a_folder_with_symlink_loops_starts_and_follows(tmp_path: Path) -> None:
    """`tail DIR` searched the loops for ever and never started."""
    _looped(tmp_path)
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "120"}
    cmd = [*gradwatch_cmd(), "tail", "runs", "--poll", "0.2"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(8)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    assert "Traceback" not in out
    assert "added: runs/a/train.log" in out and "30 records" in out, out
    assert "pipe.log" not in out.split("tail stopped")[0].split("added:", 1)[-1], out


def test_tail_of_a_large_backlog_on_stdin_stays_in_bounded_memory(tmp_path: Path) -> None:
    """80 MB waiting in the pipe when `tail -` starts: it took 2.3 GB, handed on in one piece."""
    one = megatron_log(2000)
    (tmp_path / "big.log").write_text(one * ((80 << 20) // len(one) + 1))
    run = run_measured(["tail", "-"], tmp_path, stdin=tmp_path / "big.log", timeout=300)
    assert run.code in (0, 1) and "records" in run.out, run.out + run.err


@pytest.mark.parametrize("offset", [0, 1, 97, 2150, 2151, 2152, 4300])
def test_a_run_of_digits_is_too_long_just_past_the_limit_wherever_it_starts(offset: int) -> None:
    """The line guard looks at stretches of half the limit: a run is caught at any alignment."""
    for digit in ("7", "\u0663"):
        for n, expected in ((MAX_DIGITS, False), (MAX_DIGITS + 1, True)):
            assert holds_long_number("x" * offset + digit * n + "y") is expected, (digit, n)


def test_a_short_fuzz_run_over_real_lines_finds_nothing(tmp_path: Path) -> None:
    """benchmarks/fuzz_inputs.py for 20 s (its 10-minute run is in the README): no exception. A
    slow round counts only past 10 minutes, a hang: durations are the benchmark's business."""
    real_samples()
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "fuzz_inputs.py"
    args = ["--seconds", "20", "--seed", "7", "--slow", "600", "--out", str(tmp_path)]
    p = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=900)
    assert p.returncode == 0 and "rounds" in p.stdout, p.stdout + p.stderr  # (it exits 1 on a finding)

"""Bad input through the real CLI: every case ends in a clear message, a documented exit code, no traceback.

Logs are written in the real Megatron-DeepSpeed format into pytest's tmp_path and checked with
`gradwatch check` in a subprocess, as a user would run it. Starting the CLI costs about a second
(pandas), so most bad files are checked together in one run (`zoo`), which also shows that one bad
file does not spoil the report of the others; a few runs check single files for their exit code.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import random
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from tests.conftest import EXAMPLES, measured_cmd, peak_rss_mb, run_cli

FORMATS_TRIED = ("megatron", "olmo", "hf_trainer", "torchtitan")
#: Trainer errors that try to drive the terminal (escapes, a bell) and rich (markup).
HOSTILE_TRACEBACK = (
    'Traceback (most recent call last):\n  File "x.py", line 1\nRuntimeError: [bold red]boom\u202e\x1b[2J\n'
)
HOSTILE_NAN_ERROR = (
    'Traceback (most recent call last):\n  File "train.py", line 9, in step\n'
    "RuntimeError: [bold red]x[/] loss is nan \x1b]0;pwned\x07\x1b[2J\x1b[31mred\x1b[0m\n"
)


# ---- writing logs -------------------------------------------------------------------------------
def megatron_line(step: int, loss: float, grad_norm: float, scale: float = 65536.0, total: int = 159576) -> str:
    """One Megatron-DeepSpeed `iteration N/M | ...` line, fields as the msft fork prints them."""
    return (
        f" iteration {step:8d}/{total:8d} | consumed samples: {step * 176:12d} | "
        "elapsed time per iteration (ms): 59665.7 | learning rate: 6.000E-05 | global batch size:   176 | "
        f"lm loss: {loss:.6E} | loss scale: {scale:.1f} | grad norm: {grad_norm:.3f} | num zeros: 0.0 | "
        "number of skipped iterations:   0 | number of nan iterations:   0 |"
    )


def run_values(
    n: int, *, interval: int = 10, spike_at: int | None = None, seed: int = 0, loss0: float = 4.0
) -> list[tuple[int, float, float]]:
    """(step, loss, grad norm) of a healthy run: loss slowly decaying with ~1% noise, grad norm ~10% noise.

    `spike_at` (a step) multiplies that step's grad norm by 50: a `grad_norm_spike` warning.
    """
    rng = random.Random(seed)
    out = []
    for i in range(1, n + 1):
        step = i * interval
        loss = loss0 * (0.75 + 0.25 * math.exp(-i / 500)) * (1 + rng.gauss(0, 0.01))
        grad_norm = max(1.5 * (1 + rng.gauss(0, 0.1)), 0.1)
        if step == spike_at:
            grad_norm *= 50
        out.append((step, loss, grad_norm))
    return out


def megatron_log(n: int, **kwargs: Any) -> str:
    """A Megatron-DeepSpeed log of `n` records, one per line, ending with a newline."""
    return "".join(megatron_line(s, loss, g) + "\n" for s, loss, g in run_values(n, **kwargs))


def printed(value: float, fmt: str) -> float:
    """`value` as the log shows it (what a parser can read back)."""
    return float(format(value, fmt))


def ranked(text: str) -> str:
    """Each line printed by three ranks, plus two lines where ranks' output ran together."""
    out: list[str] = []
    for i, line in enumerate(text.splitlines()):
        out += [f"[default0]:{line}", f"[default7]:{line}", f"0: {line}"]
        if i == 2:
            out.append(
                "[default0]:[Rank 0] (after 20 iterations) memory (MB) | allocated: 3452.1 | max allocated: 9012.3 | "
                "reserved: 21502.0 | max reserved: 29316.0[Rank 6] (after 20 iterations) memory (MB) | "
                "allocated: 3452.1 | max allocated: 9012.3 | reserved: 21502.0 | max reserved: 29316.0"
            )
        if i == 5:
            out.append(f"{line}[Rank 6] (after 20 iterations) memory (MB) | allocated: 3452.1 | max reserved: 29316.0")
    return "\n".join(out) + "\n"


def cut_log(field: str, chars: int) -> str:
    """30 records (loss just under 1: `9.xxxxxxE-01`), the last cut `chars` after `field`, no final newline."""
    lines = [megatron_line(*v) for v in run_values(30, loss0=1.0)]
    last = lines[-1]
    lines[-1] = last[: last.index(field) + len(field) + chars]
    return "\n".join(lines)


def non_utf8_log() -> bytes:
    """50 records with invalid UTF-8 inside a field, before a record, and on a line of its own."""
    lines = [megatron_line(*v).encode() + b"\n" for v in run_values(50)]
    lines[10] = lines[10].replace(b"| num zeros: 0.0 |", b"| num zeros: \xff\xfe\xc3( \x80 |")
    lines[20] = b"\xff\xc0\xc1" + lines[20]
    lines.insert(30, b"\xfe\xff\xfa garbage \xc3\x28 line \xe2\x82\n")
    return b"".join(lines)


def garbled_log(extra: str) -> str:
    """20 good records, one line with numbers no parser should choke on, 5 more good records."""
    after = "".join(megatron_line(step, 3.9, 1.5) + "\n" for step in range(210, 260, 10))
    return megatron_log(20) + extra + "\n" + after


GARBLED = {
    "huge-step": " iteration 99999999999999999999999999/     2000 | lm loss: 1e999 | grad norm: 1e400 |",
    "huge-validation-step": " validation loss at iteration 99999999999999999999999 | lm loss value: 3.0 |",
    "scale-cut": "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to -",
    "scale-dot": "Reducing dynamic loss scale from 65536 to .",
}


def zoo_files() -> dict[str, bytes | None]:
    """The bad (and a few good) files, by name relative to the zoo directory; None: left missing."""
    gz_text = megatron_log(300, spike_at=2500).encode()
    gz_cut = gzip.compress(megatron_log(3000).encode())
    files: dict[str, bytes | None] = {
        "empty.log": b"",
        "garbage.log": os.urandom(300_000) + b"\x00" * 1000 + random.Random(7).randbytes(10_000),
        "notes.txt": b"epoch 1 done, loss looked fine\nepoch 2 done\n",
        "latin.log": non_utf8_log(),
        "cut-in-grad-norm.log": cut_log("| grad norm: ", 2).encode(),
        "cut-in-loss-value.log": cut_log("| lm loss: ", 4).encode(),
        "cut-after-step.log": cut_log("| consumed samp", 0).encode(),
        "ranks.log": ranked(megatron_log(200, seed=3)).encode(),
        "ranks-spike.log": ranked(megatron_log(200, spike_at=1500, seed=3)).encode(),
        "gone.log": None,
        "good.log": gz_text,
        "packed.log.gz": gzip.compress(gz_text),
        "packed-without-suffix.log": gzip.compress(gz_text),
        "cut.log.gz": gz_cut[: len(gz_cut) // 2],
        "bad-header.log.gz": b"\x1f\x8b" + b"\xff" * 8 + random.Random(8).randbytes(500),
        "hf-zero-loss.log": "".join(
            f"{{'loss': {x}, 'grad_norm': 1.2, 'learning_rate': 4.9e-05, 'epoch': {i / 100}}}\n"
            for i, x in enumerate([0.0] * 5 + [2.0] * 6, 1)
        ).encode(),
        "hostile.log": (
            megatron_log(50) + HOSTILE_TRACEBACK + megatron_line(510, 3.9, 1.5) + "\n" + HOSTILE_NAN_ERROR
        ).encode(),
        # a directory argument: searched recursively for *.log *.txt *.out *.jsonl and .gz
        "tree/main.log": megatron_log(40).encode(),
        "tree/a/stdout.txt": megatron_log(40, seed=1).encode(),
        "tree/a/b/slurm-123.out": megatron_log(40, seed=2).encode(),
        "tree/a/metrics.jsonl": "".join(f'{{"step": {s}, "loss": {3 - s / 1000}}}\n' for s in range(1, 41)).encode(),
        "tree/a/b/old.log.gz": gzip.compress(megatron_log(40, seed=4).encode()),
        "tree/a/notes.md": b"not a log\n",
        "tree/a/records.csv": b"step,loss\n1,2.0\n",
    }
    for name, extra in GARBLED.items():
        files[f"garbled-{name}.log"] = garbled_log(extra).encode()
    return files


# ---- running the CLI ----------------------------------------------------------------------------
def no_traceback(p: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert "Traceback" not in p.stdout, p.stdout
    assert "Traceback" not in p.stderr, p.stderr
    return p


def strict_json(text: str) -> dict[str, Any]:
    """Parse exactly one JSON object; a bare NaN/Infinity fails the test."""
    data = json.loads(text, parse_constant=lambda c: pytest.fail(f"invalid JSON constant {c} in output"))
    assert isinstance(data, dict)
    return data


def check(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`gradwatch check ARGS` (text output), asserting there is no traceback."""
    return no_traceback(run_cli("check", *args, env=env))


def check_report(*args: str) -> tuple[int, dict[str, Any]]:
    """`gradwatch check --output json ARGS`: the exit code and the report, which must agree."""
    p = no_traceback(run_cli("check", "--output", "json", *args))
    report = strict_json(p.stdout)
    assert report["summary"]["exit_code"] == p.returncode, (p.returncode, report["summary"])
    return p.returncode, report


def only_file(report: dict[str, Any]) -> dict[str, Any]:
    assert len(report["files"]) == 1, report["files"]
    file: dict[str, Any] = report["files"][0]
    return file


@dataclass
class Zoo:
    """One `gradwatch check` over every file of `zoo_files()`, in JSON and in text."""

    root: Path
    names: list[str]
    rc: int
    report: dict[str, Any]
    text: subprocess.CompletedProcess[str]

    def path(self, name: str) -> Path:
        return self.root / name

    def file(self, name: str) -> dict[str, Any]:
        matches = [f for f in self.report["files"] if f["path"] == str(self.path(name))]
        assert len(matches) == 1, (name, [f["path"] for f in self.report["files"]])
        return matches[0]

    def alerts(self, name: str, min_severity: str = "info") -> list[dict[str, Any]]:
        order = ("info", "warning", "critical")
        return [
            a
            for a in self.report["alerts"]
            if a["path"] == str(self.path(name)) and order.index(a["severity"]) >= order.index(min_severity)
        ]


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Zoo:
    root = tmp_path_factory.mktemp("zoo")
    files = zoo_files()
    args = []
    for name, data in files.items():
        path = root / name
        if data is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        if not name.startswith("tree/"):
            args.append(str(path))
    args.append(str(root / "tree"))
    rc, report = check_report(*args)
    text = check(*args, env={"COLUMNS": "250"})
    return Zoo(root, list(files), rc, report, text)


def test_one_bad_file_spoils_only_its_own_entry(zoo: Zoo) -> None:
    """Every file is reported; the run as a whole exits 2 because some files could not be read."""
    assert zoo.rc == 2 and zoo.text.returncode == 2
    logs = [n for n in zoo.names if not n.startswith("tree/") or n.endswith((".log", ".txt", ".out", ".jsonl", ".gz"))]
    assert sorted(f["path"] for f in zoo.report["files"]) == sorted(str(zoo.path(n)) for n in logs)
    errors = [line for line in zoo.text.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [f"error: {f['error']}" for f in zoo.report["files"] if f["error"]]  # and on stderr
    for f in zoo.report["files"]:
        assert f["path"].startswith(str(zoo.root))
        assert (f["error"] is not None) or f["records"] > 0, f


# ---- empty, binary, no known format ---------------------------------------------------------
def test_empty_file_says_so_and_lists_the_formats(zoo: Zoo) -> None:
    f = zoo.file("empty.log")
    assert f["records"] == 0 and f["format"] is None and f["first_step"] is None and f["last_step"] is None
    assert f["error"].startswith(f"{zoo.path('empty.log')}: is empty")
    assert all(name in f["error"] for name in FORMATS_TRIED)
    assert f"{zoo.path('empty.log')}: is empty" in zoo.text.stdout


def test_binary_garbage_has_no_records_and_a_clear_message(zoo: Zoo) -> None:
    f = zoo.file("garbage.log")
    assert f["records"] == 0
    assert f["error"].startswith(f"{zoo.path('garbage.log')}: has ") and "no training records" in f["error"]
    assert "formats.custom" in f["error"]


def test_file_in_no_known_format_lists_formats_and_how_to_add_one(zoo: Zoo) -> None:
    error = zoo.file("notes.txt")["error"]
    assert error.startswith(f"{zoo.path('notes.txt')}: has 2 lines but no training records")
    assert "tried:" in error and all(name in error for name in FORMATS_TRIED)
    assert "formats.custom" in error and "gradwatch config init" in error


@pytest.mark.parametrize(
    ("name", "exit_code"),
    [
        ("empty.log", 2),
        ("latin.log", 0),
        ("ranks-spike.log", 1),
    ],
)
def test_exit_code_of_a_single_file(zoo: Zoo, name: str, exit_code: int) -> None:
    p = check(str(zoo.path(name)), env={"COLUMNS": "250"})
    assert p.returncode == exit_code
    assert str(zoo.path(name)) in p.stdout
    assert f"(exit {exit_code})" in p.stdout


@pytest.mark.parametrize("fmt", ["megatron", "errors"])
@pytest.mark.parametrize("command", ["check", "export"])
def test_a_format_given_that_finds_no_records_is_an_error(tmp_path: Path, command: str, fmt: str) -> None:
    """`--format megatron` on an HF Trainer log: no records in that format, exit 2. DeepSpeed's
    progress lines became the records (`lr` only), the format "deepspeed", and the critical NaN
    of the log went unsaid with exit 0 (found by QA). The same for an auxiliary parser other than
    DeepSpeed's named as the format (`errors` writes events only)."""
    log = EXAMPLES / "hf-trainer-nan.log"
    lines = len(log.read_text().splitlines())
    if command == "check":
        p = no_traceback(run_cli("check", "--output", "json", "--format", fmt, str(log)))
        f = json.loads(p.stdout)["files"][0]
        assert (f["records"], f["format"], p.returncode) == (0, None, 2)
        error = f["error"]
    else:
        p = no_traceback(run_cli("export", "--format", fmt, str(log), "--out", str(tmp_path / "r.csv")))
        assert p.returncode == 2
        error = p.stderr.removeprefix("error: ").strip()
    given = "given with --format; without it every known format is tried"
    assert error == f"{log}: has {lines} lines but no training records in format {fmt} ({given})"
    assert run_cli("check", "--format", "hf_trainer", str(log)).returncode == 1  # its critical NaN


def test_unknown_format_option_is_a_usage_error(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text(megatron_log(20))
    p = check(str(log), "--format", "megatronn")
    assert p.returncode == 2
    assert p.stdout == ""
    assert "unknown format 'megatronn'" in p.stderr and "megatron" in p.stderr.split("known formats:")[1]


# ---- encoding, huge lines, cut files -------------------------------------------------------------
def test_non_utf8_bytes_inside_megatron_lines_keep_the_records(zoo: Zoo, tmp_path: Path) -> None:
    """Invalid UTF-8 in a field, before a record and on a line of its own: every record is still read."""
    f = zoo.file("latin.log")
    assert (f["format"], f["records"], f["first_step"], f["last_step"], f["error"]) == ("megatron", 50, 10, 500, None)
    assert zoo.alerts("latin.log") == []

    out = tmp_path / "latin.csv"
    p = no_traceback(run_cli("export", str(zoo.path("latin.log")), "--out", str(out)))
    assert p.returncode == 0, p.stderr
    records = pd.read_csv(out)
    values = run_values(50)
    assert records["step"].tolist() == [s for s, _, _ in values]
    for i in (10, 20):
        step, loss, grad_norm = values[i]
        row = records[records["step"] == step].iloc[0]
        assert row["loss"] == pytest.approx(printed(loss, ".6E"))
        assert row["grad_norm"] == pytest.approx(printed(grad_norm, ".3f"))


def _wait_with_rusage(args: list[str], stdout: Path, stderr: Path) -> tuple[int, int]:
    """Run `gradwatch ARGS` and return (exit code, peak RSS in bytes) of that very process."""
    peak_file = stdout.with_suffix(".peak")
    measured, peak_env = measured_cmd(peak_file)
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "120", **peak_env}
    with open(stdout, "wb") as out, open(stderr, "wb") as err:
        code = subprocess.run([*measured, *args], stdout=out, stderr=err, env=env).returncode
    return code, int(peak_rss_mb(peak_file) * (1 << 20))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="peak RSS read from /proc/self/status (Linux)")
def test_50mb_line_without_newline_finishes_in_bounded_memory(tmp_path: Path) -> None:
    """A 50 MB line with no newline: the run finishes, memory stays bounded, the records before it count.

    The same file without records is exit 2 ("no training records").
    """
    block = "x" * (1 << 20)
    logs = [tmp_path / "records-then-long.log", tmp_path / "only-long.log"]
    for log, n in zip(logs, (20, 0), strict=True):
        with open(log, "w") as fh:
            fh.write(megatron_log(n))
            for _ in range(50):
                fh.write(block)
        assert log.stat().st_size >= 50 << 20
    out, err = tmp_path / "out.json", tmp_path / "err.txt"
    rc, peak = _wait_with_rusage(["check", "--output", "json", *map(str, logs)], out, err)
    assert "Traceback" not in err.read_text() + out.read_text()
    report = strict_json(out.read_text())
    assert rc == report["summary"]["exit_code"] == 2
    first, second = report["files"]
    assert (first["records"], first["first_step"], first["last_step"], first["error"]) == (20, 10, 200, None)
    assert second["records"] == 0 and second["error"].startswith(f"{logs[1]}: has 1 line but no training records")
    assert peak < 400 << 20, f"peak RSS {peak >> 20} MiB for two 50 MB lines"


def test_lines_longer_than_the_limit_are_cut_wherever_the_chunks_were_cut() -> None:
    """Each line over `MAX_LINE_BYTES` is cut there (a record after the cut is not read) and
    reported at its own line, whatever the chunk size. (A line was cut only where it crossed the
    end of a chunk, and only the first was reported.)"""
    from gradwatch import config
    from gradwatch.parsers.stream import MAX_LINE_BYTES, LogStream
    from gradwatch.pipeline import build_parsers

    lines = megatron_log(60).splitlines(keepends=True)
    lines[29] = "x" * MAX_LINE_BYTES + lines[29]  # record 30 begins past the cut
    lines[44] = "y" * (3 * MAX_LINE_BYTES) + "\n"  # in place of record 45
    data = "".join(lines).encode() + b"z" * (MAX_LINE_BYTES + 5)  # no newline at the end
    cut_at = [30, 45, 61]
    for chunk in (1000, 4096, 1 << 20, (4 << 20) + 17, 64 << 20):
        stream = LogStream(build_parsers(config.load(), None))
        for at in range(0, len(data), chunk):
            stream.feed(data[at : at + chunk])
        stream.close()
        batch = stream.take()
        assert batch.records["step"].tolist() == [10 * s for s in range(1, 61) if s not in (30, 45)], chunk
        assert [(e.kind.value, e.line) for e in batch.events] == [("parse_warning", n) for n in cut_at], chunk
        assert stream.lines == 61


def test_a_dict_after_more_than_the_limit_of_tqdm_redraws_is_read() -> None:
    """A line of tqdm's redraws keeps its newest pieces: the HF Trainer dict glued after the last
    bar, and that bar's count as its step (the line's start was kept, and the dict lost)."""
    from gradwatch import config
    from gradwatch.parsers.stream import MAX_LINE_BYTES, LogStream
    from gradwatch.pipeline import build_parsers

    dicts = "{'loss': 3.0, 'grad_norm': 1.0, 'learning_rate': 5e-05, 'epoch': 0.0}\n" * 30
    redraws = "\r".join(f" 50%|█████     | {i}/99999 [01:00<01:00, 1.00it/s]" for i in range(1, 20001))
    assert len(redraws.encode()) > MAX_LINE_BYTES
    data = (dicts + redraws + "\r{'loss': 2.5, 'grad_norm': 1.5, 'learning_rate': 4e-05, 'epoch': 0.01}\n").encode()
    for chunk in (4096, 1 << 20, 64 << 20):
        stream = LogStream(build_parsers(config.load(), None))
        for at in range(0, len(data), chunk):
            stream.feed(data[at : at + chunk])
        stream.close()
        batch = stream.take()
        assert batch.records["step"].tolist() == [*range(1, 31), 20000], chunk
        assert batch.records["loss"].tolist()[-1] == 2.5
        assert [(e.kind.value, e.line) for e in batch.events] == [("parse_warning", 31)]


def _cut_as_specified(line: bytes, limit: int) -> bytes:
    """What a line over `limit` is cut to, spelled out: without a `\r` that ends it, its longest
    tail of whole `\r`-pieces that fits, or else the start of its last piece (of a line without
    `\r`: its start)."""
    if len(line) <= limit:
        return line
    line = line.removesuffix(b"\r")  # a Windows line end
    if len(line) <= limit:
        return line
    pieces = line.split(b"\r")
    for k in range(1, len(pieces)):
        if len(tail := b"\r".join(pieces[k:])) <= limit:
            return tail
    return pieces[-1][:limit]


def test_long_lines_are_cut_as_specified_whatever_the_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Random lines of pieces and redraws, fed in random chunks with a limit of 24 bytes: the
    lines parsed are the whole lines cut as specified, and each cut is reported once."""
    from gradwatch import config
    from gradwatch.parsers import stream as stream_module
    from gradwatch.pipeline import build_parsers

    limit = 24
    monkeypatch.setattr(stream_module, "MAX_LINE_BYTES", limit)
    rng = random.Random(7)
    for _ in range(300):
        alphabet = rng.choice([b"aaaaaaab\r\r\n", b"a\r\n" + b"a" * 60, b"a" * 60 + b"\n"])
        data = bytes(rng.choice(alphabet) for _ in range(400))
        if rng.random() < 0.3:  # Windows line ends
            data = data.replace(b"\n", b"\r\n")
        stream = stream_module.LogStream(build_parsers(config.load(), None))
        seen: list[bytes] = []

        def parse_block(
            block: bytes | memoryview, stream: stream_module.LogStream = stream, seen: list[bytes] = seen
        ) -> None:
            seen.append(bytes(block))  # what the stream would parse, and its lines counted as it counts them
            stream.lines += seen[-1].count(b"\n")

        monkeypatch.setattr(stream, "_parse_block", parse_block)
        at = 0
        while at < len(data):
            step = rng.choice([1, 2, 3, limit - 1, limit, limit + 1, limit + 2, 2 * limit + 3, 100])
            stream.feed(data[at : at + step])
            at += step
        stream.close()
        lines = data.split(b"\n")
        if lines[-1] == b"":
            lines.pop()
        assert b"".join(seen) == b"".join(_cut_as_specified(line, limit) + b"\n" for line in lines), data
        warned = [e.line for e in stream.out.events if e.kind.value == "parse_warning"]
        assert warned == [n for n, line in enumerate(lines, 1) if len(line) > limit], data


def test_a_nan_loss_is_called_so_in_every_format(tmp_path: Path) -> None:
    """Not "Megatron left the loss field out" for a JSON line that printed NaN (found by QA)."""
    log = tmp_path / "run.jsonl"
    log.write_text("".join(f'{{"step": {s}, "loss": {"NaN" if s == 31 else 2.5}}}\n' for s in range(1, 60)))
    p = no_traceback(run_cli("check", "--output", "json", str(log)))
    [alert] = [a for a in json.loads(p.stdout)["alerts"] if a["detector"] == "nonfinite" and a["step"] == 31]
    assert alert["message"] == "loss is NaN"


@pytest.mark.parametrize(
    "text",
    [
        "loading checkpoint from /ckpt at iteration 24000\riteration 24001/24700 | lm loss: 2.0 |\n",
        "Continuing training from global step 100\r{'loss': 2.0, 'grad_norm': 1.0, 'epoch': 0.1}\n",
    ],
)
def test_a_resume_and_a_record_joined_by_a_carriage_return_are_read_once(tmp_path: Path, text: str) -> None:
    """The pieces of a `\r`-joined line share its number: resume_regression took the record
    again and again, for ever (`check`, `scan`, `tail` spun at 100% CPU; found by QA)."""
    log = tmp_path / "joined.log"
    log.write_text(text)
    p = no_traceback(run_cli("check", "--output", "json", str(log), timeout=30))
    assert p.returncode == 0 and json.loads(p.stdout)["files"][0]["records"] == 1


def test_a_resume_on_the_line_of_its_first_record_is_judged_at_that_record(tmp_path: Path) -> None:
    """The checkpoint load comes first on its line: the record after it on that line is the
    first one judged after the resume (the loss back at the random-init level)."""
    lines = [megatron_line(s, loss, g) for s, loss, g in run_values(100)]
    back = megatron_line(1010, 10.9, 12.0)
    lines.append(f" loading checkpoint from /ckpt at iteration 1000\r{back}")
    lines += [megatron_line(s, loss, g) for s, loss, g in run_values(120)[101:]]
    log = tmp_path / "resumed.log"
    log.write_text("\n".join(lines) + "\n")
    p = no_traceback(run_cli("check", "--output", "json", str(log), timeout=30))
    found = [(a["detector"], a["step"], a["line"]) for a in json.loads(p.stdout)["alerts"]]
    assert ("resume_regression", 1010, 101) in found, found


@pytest.mark.parametrize(("before", "resumed"), [(1010, 1001), (1000, 1010)])
def test_a_record_before_the_load_on_its_line_is_not_the_first_after_the_resume(
    tmp_path: Path, before: int, resumed: int
) -> None:
    """A record `\r`-joined before the load on its line: past the checkpoint's step (the run went
    on, died, and resumes below it) or at it (the usual case). Either way it came before the
    resume: taken as the first record after it, it hid the loss back at init level (review)."""
    lines = [megatron_line(s, loss, g) for s, loss, g in run_values(99)]
    lines.append(f"{megatron_line(before, 3.0, 1.5)}\r loading checkpoint from /ckpt at iteration 1000")
    lines.append(megatron_line(resumed, 10.9, 12.0))
    lines += [megatron_line(s, loss, g) for s, loss, g in run_values(120)[101:]]
    log = tmp_path / "resumed.log"
    log.write_text("\n".join(lines) + "\n")
    p = no_traceback(run_cli("check", "--output", "json", str(log), timeout=30))
    found = [(a["detector"], a["step"], a["line"], a["severity"]) for a in json.loads(p.stdout)["alerts"]]
    assert ("resume_regression", resumed, 101, "critical") in found, found


@pytest.mark.parametrize("probe", [3, 6])
def test_a_restart_within_the_probe_of_a_resume_is_judged_too(tmp_path: Path, probe: int) -> None:
    """A run that resumes, logs two steps and restarts again: the second restart is a resume of
    its own (it was taken as the third record after the first); and a crash loop at init level
    is one alert, not one per restart."""
    lines = [megatron_line(s, loss, g) for s, loss, g in run_values(100)]
    lines.append(" loading checkpoint from /ckpt at iteration 1000")
    lines += [megatron_line(1010, 3.0, 1.5), megatron_line(1020, 3.0, 1.5)]
    lines += [megatron_line(s, 10.9, 12.0) for s in (1010, 1020, 1010, 1020, 1030, 1040, 1050, 1060)]
    log = tmp_path / "restarts.log"
    log.write_text("\n".join(lines) + "\n")
    config = tmp_path / "c.yaml"
    config.write_text(f"detectors: {{resume_regression: {{probe: {probe}}}}}\n")
    p = no_traceback(run_cli("check", "--config", str(config), "--output", "json", str(log), timeout=30))
    found = [
        (a["step"], a["line"], a["severity"], a["message"].rsplit("(", 1)[-1])
        for a in json.loads(p.stdout)["alerts"]
        if a["detector"] == "resume_regression"
    ]
    assert found == [(1010, 104, "critical", "the step went back from 1020 to 1010)")], found


def test_a_second_failed_resume_after_training_went_on_is_an_incident_of_its_own(tmp_path: Path) -> None:
    """A crash loop is one incident; two failed resumes with training between them are two."""
    lines = [megatron_line(s, loss, g) for s, loss, g in run_values(100)]
    for load in (1000, 2000):
        lines.append(f" loading checkpoint from /ckpt at iteration {load}")
        lines += [megatron_line(load + 10 * k, 10.9 if k < 4 else 3.0, 1.5) for k in range(1, 101)]
    log = tmp_path / "resumed.log"
    log.write_text("\n".join(lines) + "\n")
    p = no_traceback(run_cli("check", "--output", "json", str(log), timeout=30))
    found = [(a["step"], a["severity"]) for a in json.loads(p.stdout)["alerts"] if a["detector"] == "resume_regression"]
    assert found == [(1010, "critical"), (2010, "critical")], found


@pytest.mark.parametrize("name", ["cut-in-grad-norm.log", "cut-in-loss-value.log", "cut-after-step.log"])
def test_file_cut_mid_line_keeps_every_record_before_the_cut(zoo: Zoo, name: str) -> None:
    """The 29 complete records count, the cut line gives its step, and a cut value is no false alarm.

    In `cut-in-loss-value.log` the last line ends in `lm loss: 9.87`: read as a loss it would be a
    10x spike; in every case the cut line is also no NaN step (its loss field is gone).
    """
    f = zoo.file(name)
    assert (f["records"], f["first_step"], f["last_step"], f["error"]) == (30, 10, 300, None)
    assert zoo.alerts(name) == []


def test_partial_last_line_is_parsed_when_possible(tmp_path: Path) -> None:
    log = tmp_path / "cut.log"
    log.write_text(cut_log("| grad norm: ", 2))
    out = tmp_path / "cut.csv"
    p = no_traceback(run_cli("export", str(log), "--out", str(out)))
    assert p.returncode == 0, p.stderr
    records = pd.read_csv(out)
    values = run_values(30, loss0=1.0)
    assert records["step"].tolist() == [s for s, _, _ in values]
    assert records["loss"].tolist() == pytest.approx([printed(v[1], ".6E") for v in values])
    assert records["grad_norm"].iloc[:-1].tolist() == pytest.approx([printed(v[2], ".3f") for v in values[:-1]])
    assert pd.isna(records["grad_norm"].iloc[-1])  # `grad norm: 1.` was cut: not read as 1.0


# ---- ranks -----------------------------------------------------------------------------------
def test_interleaved_ranks_read_as_one_run(zoo: Zoo) -> None:
    f = zoo.file("ranks.log")
    assert (f["format"], f["first_step"], f["last_step"], f["error"]) == ("megatron", 10, 2000, None)
    assert zoo.alerts("ranks.log") == []


def test_interleaved_ranks_report_a_spike_once(zoo: Zoo) -> None:
    warnings = zoo.alerts("ranks-spike.log", "warning")
    assert [(a["detector"], a["severity"], a["step"]) for a in warnings] == [("grad_norm_spike", "warning", 1500)]
    line = zoo.path("ranks-spike.log").read_text().splitlines()[warnings[0]["line"] - 1]
    assert "    1500/" in line


# ---- config ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("yaml_text", "expected"),
    [
        ("detectors:\n  grad_norm_spike: [1, 2\n", ":3:1: invalid YAML"),
        ("detectors:\n  grad_norm_spike:\n    windw: 3\n", "unknown key 'detectors.grad_norm_spike.windw'"),
        ("detectors:\n  grad_norm_spike:\n    window: lots\n", "detectors.grad_norm_spike.window must be an integer"),
    ],
    ids=["invalid-yaml", "unknown-key", "wrong-type"],
)
def test_bad_config_is_exit_2_naming_file_and_key(tmp_path: Path, yaml_text: str, expected: str) -> None:
    log = tmp_path / "run.log"
    log.write_text(megatron_log(20))
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(yaml_text)
    p = check(str(log), "--config", str(cfg))
    assert p.returncode == 2
    assert p.stdout == ""
    assert p.stderr.startswith(f"error: {cfg}")
    assert expected in p.stderr


# ---- missing files, directories, gzip --------------------------------------------------------
def test_missing_file_next_to_a_good_one_still_reports_the_good_one(zoo: Zoo) -> None:
    gone, good = zoo.path("gone.log"), zoo.path("good.log")
    assert zoo.file("gone.log")["error"] == f"{gone}: no such file"
    assert zoo.file("gone.log")["records"] == 0
    assert (zoo.file("good.log")["records"], zoo.file("good.log")["error"]) == (300, None)
    assert [(a["step"], a["line"]) for a in zoo.alerts("good.log", "warning")] == [(2500, 250)]
    assert f"{gone}: no such file" in zoo.text.stdout
    assert f"{good}:250" in zoo.text.stdout  # the good file's alert, with file:line


def test_missing_file_alone_is_exit_2(tmp_path: Path) -> None:
    p = check(str(tmp_path / "gone.log"))
    assert p.returncode == 2
    assert f"{tmp_path / 'gone.log'}: no such file" in p.stdout


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root can read any file")
def test_unreadable_file_is_exit_2(tmp_path: Path) -> None:
    log = tmp_path / "locked.log"
    log.write_text(megatron_log(20))
    log.chmod(0)
    rc, report = check_report(str(log))
    assert rc == 2
    assert only_file(report)["error"].startswith(f"{log}: cannot read")


def test_directory_is_searched_recursively_for_logs(zoo: Zoo) -> None:
    tree = zoo.path("tree")
    found = {
        Path(f["path"]).relative_to(tree).as_posix(): f["records"]
        for f in zoo.report["files"]
        if Path(f["path"]).is_relative_to(tree)
    }
    assert found == {
        "main.log": 40,
        "a/stdout.txt": 40,
        "a/b/slurm-123.out": 40,
        "a/metrics.jsonl": 40,
        "a/b/old.log.gz": 40,
    }


def test_directory_without_logs_is_exit_2(tmp_path: Path) -> None:
    (tmp_path / "empty-dir").mkdir()
    (tmp_path / "empty-dir" / "readme.md").write_text("no logs here\n")
    p = check(str(tmp_path / "empty-dir"))
    assert p.returncode == 2
    assert "no log files found" in p.stderr and "empty-dir" in p.stderr


def test_gzip_is_read_transparently(zoo: Zoo) -> None:
    """A .gz log gives the same report as the plain one; gzip is found by its magic bytes, not its name."""
    names = ("good.log", "packed.log.gz", "packed-without-suffix.log")
    for name in names:
        f = zoo.file(name)
        assert (f["format"], f["records"], f["first_step"], f["last_step"]) == ("megatron", 300, 10, 3000)
        assert [(a["detector"], a["step"], a["line"]) for a in zoo.alerts(name, "warning")] == [
            ("grad_norm_spike", 2500, 250)
        ]


def test_truncated_gzip_keeps_what_came_before_the_damage(zoo: Zoo) -> None:
    """What came before the damage is checked, and the check fails: the rest went unchecked."""
    p = check(str(zoo.path("cut.log.gz")), "--output", "json")
    assert p.returncode == 2 and json.loads(p.stdout)["summary"]["exit_code"] == 2
    f = zoo.file("cut.log.gz")
    assert f["error"].startswith(f"{zoo.path('cut.log.gz')}: damaged gzip data")
    assert 0 < f["records"] < 3000 and f["first_step"] == 10
    assert zoo.alerts("cut.log.gz") == []  # the cut last line is no false alarm
    assert f"{zoo.path('cut.log.gz')}: damaged gzip data" in zoo.text.stdout


def test_report_and_compare_draw_a_damaged_gzip_up_to_the_damage_and_fail(zoo: Zoo, tmp_path: Path) -> None:
    """As `check` does: the page is written with what was read, and the command exits 2 with the
    file's error (they exited 0, as if the whole log had been drawn)."""
    cut, good = str(zoo.path("cut.log.gz")), str(zoo.path("good.log"))
    report = no_traceback(run_cli("report", cut, "--out", str(tmp_path / "r.html")))
    compare = no_traceback(run_cli("compare", good, cut, "--out", str(tmp_path / "c.html")))
    for p, out in ((report, "r.html"), (compare, "c.html")):
        assert p.returncode == 2, p.stderr
        assert p.stderr.startswith(f"error: {cut}: damaged gzip data") and p.stderr.count("error:") == 1
        assert f"wrote {tmp_path / out}" in p.stdout and (tmp_path / out).stat().st_size > 0
    assert "loss" in compare.stdout  # the trend table is still printed


def test_export_of_a_damaged_gzip_writes_what_came_before_the_damage(zoo: Zoo, tmp_path: Path) -> None:
    """Export wrote nothing, while its message said the part before the damage was checked."""
    out = tmp_path / "r.csv"
    p = no_traceback(run_cli("export", str(zoo.path("cut.log.gz")), "--out", str(out)))
    records = pd.read_csv(out)
    assert p.returncode == 2 and len(records) == zoo.file("cut.log.gz")["records"] > 0
    assert p.stderr.strip().endswith(f"what came before it was read (wrote its {len(records):,} records to {out})")


def test_compare_refuses_standard_input(zoo: Zoo, tmp_path: Path) -> None:
    p = no_traceback(run_cli("compare", "-", str(zoo.path("good.log")), "--out", str(tmp_path / "c.html")))
    assert (p.returncode, p.stderr) == (2, "error: compare reads log files, not standard input: save the log first\n")


def test_gzip_with_a_damaged_header_is_a_clear_error(zoo: Zoo) -> None:
    f = zoo.file("bad-header.log.gz")
    assert f["records"] == 0 and f["error"].startswith(f"{zoo.path('bad-header.log.gz')}: damaged gzip data")


# ---- garbled values and hostile content ------------------------------------------------------
@pytest.mark.parametrize("name", GARBLED)
def test_garbled_numbers_do_not_crash(zoo: Zoo, name: str) -> None:
    f = zoo.file(f"garbled-{name}.log")
    assert f["records"] >= 25 and (f["first_step"], f["last_step"]) == (10, 250)


@pytest.mark.parametrize(
    "config", ["", "detectors: {loss_collapse: {fraction: 1.0e+308}, loss_spike: {min_rel_delta: 1.0e+308}}"]
)
def test_values_and_settings_near_the_largest_float_print_no_numpy_warnings(tmp_path: Path, config: str) -> None:
    """A garbled `1.7E+308` loss or grad norm, or a ratio of 1e308, is inf in the detectors'
    arithmetic: numpy's "overflow encountered" warnings went to the user's terminal."""
    values = [(s, 1.7e308 if s % 770 == 0 else loss, 1.7e308 if s % 500 == 0 else g) for s, loss, g in run_values(300)]
    log = tmp_path / "huge.log"
    log.write_text("".join(megatron_line(*v) + "\n" for v in values))
    cfg = tmp_path / "c.yaml"
    cfg.write_text(config)
    p = no_traceback(run_cli("check", "--config", str(cfg), str(log)))
    assert p.returncode in (0, 1) and p.stderr == "", p.stderr


@pytest.mark.parametrize("out", ["report.html", "report.png", "compare.html", "compare.png"])
def test_values_near_the_largest_float_are_drawn(tmp_path: Path, out: str) -> None:
    """Axis ticks over a span near the largest float overflowed (`nice_ticks`), and matplotlib's
    transforms with them: a traceback from `report` and `compare` (review)."""
    pytest.importorskip("matplotlib")
    values = [(s, 1.7e308 if s % 770 == 0 else loss, 1.7e308 if s % 500 == 0 else g) for s, loss, g in run_values(300)]
    log = tmp_path / "huge.log"
    log.write_text("".join(megatron_line(*v) + "\n" for v in values))
    other = tmp_path / "other.log"
    other.write_text(megatron_log(300))
    command = out.split(".")[0]
    logs = [str(log)] if command == "report" else [str(log), str(other)]
    p = no_traceback(run_cli(command, *logs, "--out", str(tmp_path / out)))
    assert p.returncode == 0 and p.stderr == "" and (tmp_path / out).stat().st_size > 1000, p.stderr


def test_step_beyond_int64_in_a_big_file_does_not_crash(tmp_path: Path) -> None:
    """Past the first chunk, record lines of a known shape are read in bulk: garbage steps too."""
    lines = megatron_log(34_000, interval=1).splitlines(keepends=True)
    lines[33_000] = megatron_line(10**25, 3.9, 1.5) + "\n"
    log = tmp_path / "big.log"
    log.write_text("".join(lines))
    assert log.stat().st_size > 9 << 20
    rc, report = check_report(str(log))
    assert rc in (0, 1)
    f = only_file(report)
    assert f["records"] in (33_999, 34_000) and (f["first_step"], f["last_step"]) == (1, 34_000)


def test_loss_of_zero_then_a_real_loss_does_not_crash(zoo: Zoo) -> None:
    """HF Trainer logs `'loss': 0.0` under some fp16/label bugs; a later real loss must not divide by zero."""
    assert zoo.file("hf-zero-loss.log")["records"] == 11
    assert "loss_spike" in {a["detector"] for a in zoo.alerts("hf-zero-loss.log", "warning")}


def test_a_crash_before_the_first_record_is_shown_with_its_file(tmp_path: Path) -> None:
    """The job died at start-up: the file has no records, and the text report showed only that,
    while the JSON had the critical alert (found by QA). The crash is what it exits by (1), not
    "no training records" (2): the file was read, and it tells of a crash (issue #24)."""
    log = tmp_path / "startup.log"
    log.write_text('Traceback (most recent call last):\n  File "train.py", line 3\nImportError: no apex\n')
    p = no_traceback(run_cli("check", str(log)))
    assert p.returncode == 1 and "trainer error before the first step: ImportError: no apex" in p.stdout
    assert "1 critical" in p.stdout.splitlines()[-1]


def test_markup_and_escapes_in_the_log_do_not_reach_the_terminal(zoo: Zoo) -> None:
    """Trainer errors are untrusted text: rich markup stays literal, escapes and bells are removed."""
    found = [(a["detector"], a["severity"], a["step"]) for a in zoo.alerts("hostile.log")]
    assert found == [
        ("trainer_error", "critical", 500),
        ("trainer_error", "info", 510),
        ("nonfinite", "critical", 510),
    ], found
    for control in ("\x1b", "\x07", "\x9b", "\u202e"):
        assert control not in zoo.text.stdout
    assert "[bold red]x[/] loss is nan" in zoo.text.stdout  # shown literally, not interpreted as markup
    assert "trainer error: RuntimeError: [bold red]boom\n" in zoo.text.stdout  # its escape removed
    assert "pwned" not in zoo.text.stdout


@pytest.mark.parametrize(
    ("config", "log"),
    [
        # a spike candidate with one value before it: the noise of no differences
        (
            "detectors: {loss_spike: {warmup: 1}}",
            '{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 3.0}\n{"step": 3, "loss": 2.5}\n',
        ),
        # a stall limit asked of no gaps, when the file ends
        (
            "detectors: {stall: {min_gaps: 0}}",
            "2024-03-02 08:00:00.000 node:0 olmo.train:908 INFO [step=1/10,epoch=0]\n"
            "    train/CrossEntropyLoss=10.1\n2024-03-02 08:05:00.000 node:0 olmo.train:900 INFO done\n",
        ),
    ],
)
def test_a_config_that_asks_for_windows_of_no_values_is_no_crash(tmp_path: Path, config: str, log: str) -> None:
    """Limits the config loader accepts (a warm-up of 1 log, no gaps needed) make a median of no
    values: NaN, which judges nothing, as `np.median` had it (found by review: an IndexError)."""
    (tmp_path / "cfg.yaml").write_text(config)
    (tmp_path / "run.log").write_text(log)
    p = run_cli("check", "--config", str(tmp_path / "cfg.yaml"), "--output", "json", str(tmp_path / "run.log"))
    assert "Traceback" not in p.stderr and p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["files"][0]["records"] >= 1

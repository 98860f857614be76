"""A large file read by worker processes gives exactly what a sequential read gives.

The sizes that decide the split are shrunk so that small logs cross many segment boundaries:
multi-line OLMo records, Megatron records printed by two ranks, tracebacks and overflow lines
all end up cut between two workers somewhere. Workers are real processes (forkserver).
"""

from __future__ import annotations

import gzip
import json
import math
import multiprocessing.forkserver
import os
import pickle
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gradwatch import config, pipeline, segments, workers
from gradwatch.alerts import Alert
from gradwatch.events import Event, EventKind
from gradwatch.parsers import new_parsers
from gradwatch.parsers.stream import MAX_LINE_BYTES, Batch, BatchFacts, LogStream
from gradwatch.pipeline import FileSummary, check_path
from gradwatch.sources import archive, stdin
from gradwatch.synth import FORMATS, Anomaly, RunSpec, generate, write_sized
from tests.conftest import gradwatch_cmd, real_folders, real_samples, run_cli

SETTINGS = config.load()


@pytest.fixture
def small_segments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers, "MIN_PARALLEL_BYTES", 0)
    monkeypatch.setattr(archive, "CHUNK_BYTES", 48 << 10)
    monkeypatch.setattr(segments, "HEAD_BYTES", 48 << 10)  # the first chunk is read before the split
    monkeypatch.setattr(segments, "SEGMENT_BYTES", 96 << 10)
    monkeypatch.setattr(segments, "IN_ORDER_BYTES", 64 << 10)
    monkeypatch.setattr(segments, "BATCH_RECORDS", 97)  # a segment's batch reaches the detectors in pieces
    monkeypatch.setattr(segments, "WARMUP_BYTES", 16 << 10)


def _run(path: Path, jobs: int) -> tuple[FileSummary, list[Alert], pd.DataFrame, list[tuple]]:
    batches: list[Batch] = []
    summary, alerts = check_path(path, SETTINGS, on_batch=batches.append, jobs=jobs)
    records = pd.concat([b.records for b in batches], ignore_index=True)
    events = [(e.kind, e.line, e.step, e.data) for b in batches for e in b.events]
    events += [("skip count", *row) for b in batches for row in _skip_rows(b)]
    return summary, alerts, records, events


def _skip_rows(batch: Batch) -> list[tuple[int, int, int]]:
    counts = batch.skip_counts
    return list(zip(counts.line.tolist(), counts.step.tolist(), counts.skipped.tolist(), strict=True))


def _same(
    path: Path, split: bool | None = True, rereads: range | None = None, in_order: range | None = None
) -> tuple[FileSummary, list[Alert]]:
    """Check `path` sequentially and with 2 workers; assert every result is the same (and, unless
    `split` is None, whether the file was read by workers; unless `rereads` is None, how many
    segments were read again, their workers' guess of what they carried in being wrong; unless
    `in_order` is None, how many of all segments, in percent, were read in order)."""
    seq_summary, seq_alerts, seq_records, seq_events = _run(path, jobs=1)
    handed: list[int] = []
    readers: list[segments.SegmentReader] = []
    real_batches, real_exit = segments.SegmentReader.batches, segments.SegmentReader.__exit__

    def counted(self: segments.SegmentReader, *args: object) -> Iterator[object]:
        for item in real_batches(self, *args):  # type: ignore[arg-type]
            handed.append(1)
            yield item

    def leaving(self: segments.SegmentReader, *exc: object) -> None:
        readers.append(self)
        real_exit(self, *exc)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(segments.SegmentReader, "batches", counted)
        mp.setattr(segments.SegmentReader, "__exit__", leaving)
        par_summary, par_alerts, par_records, par_events = _run(path, jobs=2)
    assert split is None or (len(handed) > 3) == split, f"{len(handed)} segments"
    assert rereads is None or sum(r.rereads for r in readers) in rereads, [r.rereads for r in readers]
    share = 100 * sum(r.in_order for r in readers) // max(1, sum(r.segments for r in readers))
    assert in_order is None or share in in_order, f"{share}% of the segments read in order"
    pd.testing.assert_frame_equal(par_records, seq_records)
    assert par_events == seq_events
    assert [a.to_json() for a in par_alerts] == [a.to_json() for a in seq_alerts]
    for name in ("format", "records", "first_step", "last_step", "lines", "error"):
        assert getattr(par_summary, name) == getattr(seq_summary, name), name
    assert par_summary.last_values.keys() == seq_summary.last_values.keys()
    for k, v in seq_summary.last_values.items():
        assert par_summary.last_values[k] == v or (math.isnan(v) and math.isnan(par_summary.last_values[k]))
    assert par_summary.spike_score.percent() == seq_summary.spike_score.percent()
    return par_summary, par_alerts


def _write(tmp_path: Path, spec: RunSpec, *, twice: bool = False) -> Path:
    lines = list(generate(spec))
    if twice:  # every record printed by two ranks, one copy after the other
        lines = [copy for line in lines for copy in ([line, line] if "consumed samples" in line else [line])]
    path = tmp_path / f"{spec.fmt}.log"
    path.write_text("".join(lines))
    return path


SPECS = [
    RunSpec(fmt="megatron-deepspeed", steps=3000, seed=3, anomalies=(Anomaly("loss_scale_collapse", 1500),)),
    RunSpec(fmt="megatron-deepspeed", steps=3000, seed=4, anomalies=(Anomaly("grad_norm_spike", 2200),)),
    RunSpec(fmt="megatron-lm", steps=3000, seed=5, anomalies=(Anomaly("nonfinite", 2500),)),
    RunSpec(fmt="olmo", steps=3000, seed=6, z_loss=True, anomalies=(Anomaly("logit_norm_drift", 1800),)),
    RunSpec(fmt="composer", steps=3000, seed=7, anomalies=(Anomaly("loss_spike", 2000),)),
    RunSpec(fmt="torchtitan", steps=3000, seed=8, anomalies=(Anomaly("throughput_drop", 2000),)),
    # the step is counted from the file's start: each worker guesses it, this process checks the guess
    RunSpec(fmt="hf-trainer", steps=3000, seed=10, restarts=(1200,), anomalies=(Anomaly("loss_spike", 2000),)),
    RunSpec(fmt="jsonl", steps=3000, seed=11, anomalies=(Anomaly("grad_norm_spike", 2000),)),
]


_READ_AS_A_WORKER = """
import pickle
import sys

from gradwatch import segments

with open(sys.argv[1], "rb") as fh:
    task = pickle.load(fh)
segment = segments.read_segment(task)
print(len(segment.records["line"]), "pandas" in sys.modules)
"""


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.fmt}-{s.anomalies[0].kind}")
def test_a_worker_reads_its_segment_without_importing_pandas(tmp_path: Path, spec: RunSpec) -> None:
    """What the fork server preloads and a worker runs stays clear of pandas (a fifth of a second
    and some 30 MB per worker): frames are built in the main process only."""
    path = _write(tmp_path, spec)
    data = path.read_bytes()
    head = data.index(b"\n", len(data) // 4) + 1
    stream = LogStream(new_parsers(), str(path))
    stream.feed(data[:head])
    task = segments._Task(str(path), stream.snapshot(), head, len(data), last=True, warmup=segments.WARMUP_BYTES)
    (tmp_path / "task").write_bytes(pickle.dumps(task))
    done = subprocess.run(
        [sys.executable, "-c", _READ_AS_A_WORKER, str(tmp_path / "task")], capture_output=True, text=True, check=True
    )
    records, pandas_imported = done.stdout.split()
    assert int(records) > 1000
    assert pandas_imported == "False"


_CHECK_NOTING_PANDAS = """
import sys
from concurrent.futures import ProcessPoolExecutor

from gradwatch import segments, workers

workers.MIN_PARALLEL_BYTES, segments.HEAD_BYTES, segments.SEGMENT_BYTES = 0, 48 << 10, 96 << 10
submit, at_first_segment = ProcessPoolExecutor.submit, []


def noting(self, fn, *args, **kwargs):
    if fn is segments.read_segment and not at_first_segment:
        at_first_segment.append("pandas" in sys.modules)
    return submit(self, fn, *args, **kwargs)


ProcessPoolExecutor.submit = noting
sys.argv = ["gradwatch", "check", "--jobs", sys.argv[2], "--output", "json", sys.argv[1]]
try:
    from gradwatch.cli import main

    main()
except SystemExit:
    pass
print(at_first_segment, "pandas" in sys.modules, "pyarrow" in sys.modules, file=sys.stderr)
"""


@pytest.mark.parametrize(
    ("spec", "jobs"),
    [*((spec, 2) for spec in SPECS), (SPECS[3], 1)],
    ids=lambda v: f"{v.fmt}-{v.anomalies[0].kind}" if isinstance(v, RunSpec) else f"jobs{v}",
)
def test_check_imports_no_pandas(tmp_path: Path, spec: RunSpec, jobs: int) -> None:
    """`check` builds no DataFrame: its detectors and summaries read the batches' numpy columns,
    so it never pays the third of a second pandas takes to import (with `--jobs 2`, the workers
    get their segments as soon as the head is parsed: loading the settings, the detectors'
    classes, imports no pandas either). Every format, so that every detector runs: a run of
    logit norms (OLMo's) imported pandas for a median of blocks with NaN. With workers, this
    process parses nothing, not even the head, and does not import Arrow either."""
    path = _write(tmp_path, spec)
    argv = [sys.executable, "-c", _CHECK_NOTING_PANDAS, str(path), str(jobs)]
    done = subprocess.run(argv, capture_output=True, text=True)
    assert done.stderr.splitlines()[-1] == ("[False] False False" if jobs > 1 else "[] False True"), done.stderr
    assert json.loads(done.stdout)["files"][0]["records"] > 1000


_MAIN_SCRIPT_NOTING_RUNS = """
import sys

with open(sys.argv[3] if __name__ == "__main__" else __file__ + ".runs", "a") as runs:
    runs.write(__name__ + "\\n")

from gradwatch import segments, workers
from gradwatch.cli import main

if __name__ == "__main__":
    workers.MIN_PARALLEL_BYTES, segments.SEGMENT_BYTES = 0, 96 << 10
    sys.argv = ["gradwatch", "check", "--jobs", "2", "--output", "json", sys.argv[1]]
    main()
"""


def test_workers_do_not_run_the_main_script_again(tmp_path: Path) -> None:
    """multiprocessing starts each worker by running the main script again (the `gradwatch`
    console script: the CLI's imports, 0.04 s a worker), unless it is a package's `__main__`:
    `gradwatch.cli.main` makes it `python -m gradwatch`'s, and it runs here only."""
    path = _write(tmp_path, SPECS[0])
    script = tmp_path / "main_script.py"
    script.write_text(_MAIN_SCRIPT_NOTING_RUNS)
    runs = tmp_path / "main_script.py.runs"
    done = subprocess.run([sys.executable, str(script), str(path), "x", str(runs)], capture_output=True, text=True)
    assert json.loads(done.stdout)["files"][0]["records"] > 1000, done.stderr
    assert runs.read_text().split() == ["__main__"]


_WRAPPER_WITH_ITS_OWN_PARSER = """
import re
import sys

from gradwatch import segments, workers
from gradwatch.api import Parser, register_parser

_LINE = re.compile(r"mylab step (\\d+) loss ([0-9.]+)")


class MyLab(Parser):
    name = "mylab"
    description = "mylab lines"
    scan = r"mylab "

    def parse(self, text, line, ts, out):
        m = _LINE.search(text)
        if m is None:
            return False
        out.record(self.name, int(m.group(1)), line, ts, {"loss": float(m.group(2))})
        return True


register_parser(MyLab)

if __name__ == "__main__":
    from gradwatch.cli import main

    workers.MIN_PARALLEL_BYTES, segments.SEGMENT_BYTES = 0, 96 << 10
    sys.argv = ["gradwatch", "check", "--jobs", sys.argv[2], "--output", "json", sys.argv[1]]
    main()
"""


def test_a_script_of_ones_own_that_defines_a_parser_is_run_again_in_the_workers(tmp_path: Path) -> None:
    """A script that registers a parser class of its own and runs the CLI: the workers unpickle
    that class from the script, so they must still run it (found by review: they did not)."""
    script = tmp_path / "wrapper.py"
    script.write_text(_WRAPPER_WITH_ITS_OWN_PARSER)
    log = tmp_path / "mylab.log"
    log.write_text("".join(f"mylab step {i} loss {2 + 1 / i:.4f}\n" for i in range(1, 20001)))
    reports = []
    for jobs in ("1", "2"):
        done = subprocess.run([sys.executable, str(script), str(log), jobs], capture_output=True, text=True)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
        reports.append(json.loads(done.stdout))
    assert reports[1] == reports[0] and reports[1]["files"][0]["records"] == 20000


_FAILING_PARSER_MODULE = """
from gradwatch.api import Parser


class Flaky(Parser):
    name = "flaky"
    description = "raises on its fifth line"
    scan = r"mylab "

    def parse(self, text, line, ts, out):
        if line == 5:
            raise RuntimeError("boom")
        out.record(self.name, line, line, ts, {"loss": 2.0 + 1 / line})
        return True
"""

_RUN_WITH_FAILING_PARSER = """
import sys

from gradwatch import segments, workers
from gradwatch.api import register_parser
from flaky_module import Flaky

register_parser(Flaky)

if __name__ == "__main__":
    from gradwatch.cli import main

    workers.MIN_PARALLEL_BYTES, segments.SEGMENT_BYTES = 0, 96 << 10
    sys.argv = ["gradwatch", "check", "--jobs", sys.argv[2], "--output", "json", sys.argv[1]]
    main()
"""


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_plugin_that_fails_in_a_worker_is_reported_once(tmp_path: Path, jobs: str) -> None:
    """A worker prints no plugin failure: the main process reports each once, from the worker's
    result (the head's worker printed it, and the main process again as it took the worker's
    stream; found by review)."""
    (tmp_path / "flaky_module.py").write_text(_FAILING_PARSER_MODULE)
    script = tmp_path / "run.py"
    script.write_text(_RUN_WITH_FAILING_PARSER)
    log = tmp_path / "mylab.log"
    log.write_text("".join(f"mylab step {i}\n" for i in range(1, 20001)))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run([sys.executable, str(script), str(log), jobs], capture_output=True, text=True, env=env)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count("error: plugin parser 'flaky'") == 1, done.stderr


@pytest.mark.usefixtures("small_segments")
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.fmt}-{s.anomalies[0].kind}")
def test_parallel_read_equals_sequential(tmp_path: Path, spec: RunSpec) -> None:
    path = _write(tmp_path, spec)
    assert path.stat().st_size > 4 * segments.SEGMENT_BYTES  # many boundaries
    summary, alerts = _same(path)
    assert summary.records > 1000
    assert any(a.detector == spec.anomalies[0].kind for a in alerts)


@pytest.mark.usefixtures("small_segments")
def test_lines_longer_than_the_limit_are_cut_alike_by_workers(tmp_path: Path) -> None:
    """Each line over `MAX_LINE_BYTES` is cut and reported at its line by whichever worker reads
    it, as in one process (where a line was cut depended on the chunks, and each stream reported
    only its first)."""
    lines = list(generate(RunSpec(fmt="megatron-deepspeed", steps=3000, seed=3)))
    record = next(k for k in range(1500, len(lines)) if "consumed samples" in lines[k])
    lines[record] = "x" * MAX_LINE_BYTES + lines[record]  # the record is cut off
    lines[2500] = "y" * (3 * MAX_LINE_BYTES) + "\n"
    path = tmp_path / "long-lines.log"
    path.write_text("".join(lines) + "z" * (MAX_LINE_BYTES + 5))
    batches: list[Batch] = []
    check_path(path, SETTINGS, on_batch=batches.append, jobs=2)
    warned = [e.line for b in batches for e in b.events if e.kind is EventKind.PARSE_WARNING]
    assert warned == [record + 1, 2501, len(lines) + 1]
    _same(path)


@pytest.mark.usefixtures("small_segments")
def test_records_repeated_by_ranks_across_boundaries_are_one_record(tmp_path: Path) -> None:
    spec = RunSpec(fmt="megatron-deepspeed", steps=3000, seed=8)
    once, _ = check_path(_write(tmp_path, spec), SETTINGS, jobs=1)
    twice, _ = _same(_write(tmp_path, spec, twice=True))
    assert twice.records == once.records > 2000


@pytest.mark.usefixtures("small_segments")
def test_traceback_and_multiline_records_cut_by_a_boundary(tmp_path: Path) -> None:
    spec = RunSpec(fmt="olmo", steps=2500, seed=9)
    text = "".join(generate(spec))
    # put a traceback right at each segment boundary (a multi-line event cut between workers)
    traceback = (
        "Traceback (most recent call last):\n"
        '  File "train.py", line 10, in <module>\n'
        "    main()\n"
        "RuntimeError: CUDA error: an illegal memory access was encountered\n"
    )
    cut = segments.SEGMENT_BYTES
    pieces, pos = [], 0
    while pos + cut < len(text):
        nl = text.index("\n", pos + cut - 100) + 1
        pieces += [text[pos:nl], traceback]
        pos = nl
    pieces.append(text[pos:])
    path = tmp_path / "olmo-tracebacks.log"
    path.write_text("".join(pieces))
    summary, _ = _same(path)
    assert summary.records > 1000


@pytest.mark.usefixtures("small_segments")
def test_real_logs_read_in_parallel_equal_sequential() -> None:
    real_samples()  # (skips, saying why, where the samples are absent)
    logs = (p for folder in real_folders() for p in folder.rglob("*") if p.is_file())
    big = sorted(p for p in logs if p.stat().st_size > 3 * segments.SEGMENT_BYTES)
    assert big, "no real log large enough to split"
    for path in big:
        _same(path, split=None)  # some hold too few records for their format to be known early


@pytest.mark.usefixtures("small_segments")
@pytest.mark.parametrize("fmt", FORMATS)
def test_plain_logs_are_read_in_parallel_to_their_end(tmp_path: Path, fmt: str) -> None:
    """In a log of any format as trainers print it (JSON lines carrying their step, HF dicts each
    with its tqdm bar), every warm-up tells what its segment needs (`LogStream.carried`): no
    segment makes the rest of the file be read in order."""
    path = _write(tmp_path, RunSpec(fmt=fmt, steps=3000, seed=13))
    _same(path, rereads=range(0, 1))


@pytest.mark.usefixtures("small_segments")
@pytest.mark.parametrize("fmt", ["megatron-lm", "composer"])
def test_events_after_a_stretch_without_records_or_dates_take_the_step_before(tmp_path: Path, fmt: str) -> None:
    """NCCL chatter longer than a warm-up, without a date (Megatron-LM's older lines have none),
    with errors in it: a worker there has only the head's step, and the file is read in order."""
    lines = list(generate(RunSpec(fmt=fmt, steps=1500, seed=1, timestamps=False)))
    chatter = []
    for k in range(10):
        chatter += [f"NCCL INFO some chatter line {k}.{i} " + "x" * 60 + "\n" for i in range(300)]
        chatter.append(f"RuntimeError: CUDA error: an illegal memory access was encountered ({k})\n")
    lines[len(lines) // 2 : len(lines) // 2] = chatter
    path = tmp_path / f"{fmt}.log"
    path.write_text("".join(lines))
    _same(path, rereads=range(1, 10))


@pytest.mark.usefixtures("small_segments")
def test_composer_records_counted_from_the_file_start_are_counted_as_one_process_counts(tmp_path: Path) -> None:
    """`[token=N/M]:` markers without a batch count: each record is one more than the one before."""
    rng = np.random.default_rng(2)
    lines = []
    for k in range(1, 4001):
        lines += [
            f"[token={k * 4096}/16384000]:\n",
            f"\t Train loss/train/total: {8 - k / 1000 + rng.normal(0, 0.05):.4f}\n",
            f"\t Train l2_norm/grad/global: {1 + rng.random():.4f}\n",
        ]
    path = tmp_path / "composer-tokens.log"
    path.write_text("".join(lines))
    summary, _ = _same(path, rereads=range(1, 10))
    assert summary.last_step == 4000


def _without_steps(lines: list[str], first: int, last: int) -> list[str]:
    """JSON lines with the step key taken out of lines [first, last): each record there counts
    on from the one before it."""
    step = re.compile(r'"step": \d+, ')
    return lines[:first] + [step.sub("", line, count=1) for line in lines[first:last]] + lines[last:]


@pytest.mark.usefixtures("small_segments")
def test_json_lines_without_steps_across_segments_are_read_again_from_the_step_before(tmp_path: Path) -> None:
    """A stretch of step-less records longer than a warm-up: the workers after its start guess
    the count wrong, and their segments are read again from the step the one before ended on,
    in order; after the stretch, guesses hold again and the segments are read in parallel."""
    lines = list(generate(RunSpec(fmt="jsonl", steps=12000, seed=14, anomalies=(Anomaly("loss_spike", 9000),))))
    path = tmp_path / "stepless.jsonl"
    path.write_text("".join(_without_steps(lines, len(lines) * 2 // 5, len(lines) * 3 // 5)))
    summary, alerts = _same(path, rereads=range(1, 10), in_order=range(1, 40))
    assert summary.last_step == 12000
    assert any(a.detector == "loss_spike" for a in alerts)


@pytest.mark.usefixtures("small_segments")
def test_json_lines_that_never_give_their_step_are_counted_as_one_process_counts(tmp_path: Path) -> None:
    lines = list(generate(RunSpec(fmt="jsonl", steps=3000, seed=15)))
    path = tmp_path / "stepless.jsonl"
    path.write_text("".join(_without_steps(lines, 0, len(lines))))
    summary, _ = _same(path, rereads=range(1, 10))
    assert summary.last_step == 3000


@pytest.mark.usefixtures("small_segments")
def test_hf_dicts_logged_every_few_steps_are_counted_as_one_process_counts(tmp_path: Path) -> None:
    """With `logging_steps` 10 the dicts are counted in optimizer steps (the stride that two
    dicts told their steps show): a worker guesses the count from what it read before its
    segment, right every time, and reads in parallel."""
    path = _write(tmp_path, RunSpec(fmt="hf-trainer", steps=30000, log_interval=10, seed=16))
    summary, _ = _same(path, rereads=range(0, 1), in_order=range(0, 1))
    assert summary.last_step == 30000


@pytest.mark.usefixtures("small_segments")
def test_hf_dicts_logged_every_few_steps_are_counted_on_after_resumes(tmp_path: Path) -> None:
    """After a resume the bars count from its global step and the dicts from the count then
    (dicts logged after the checkpoint are logged again): a worker whose segment follows the
    resume's guesses wrong, once. The segments after it are told of the resume by the newest
    stream known (`Parser.hint`), and guess right again."""
    spec = RunSpec(fmt="hf-trainer", steps=30000, log_interval=10, seed=16, restarts=(9000, 19000))
    path = _write(tmp_path, spec)
    summary, _ = _same(path, rereads=range(0, 3), in_order=range(0, 13))
    assert summary.last_step > 3000  # dicts logged twice are counted twice


@pytest.mark.usefixtures("small_segments")
def test_an_overflow_like_one_before_a_stretch_of_chatter_is_counted_as_one_process_counts(tmp_path: Path) -> None:
    """After the head, a stretch of chatter without records holds overflows at one step: 65536,
    then 32768 (past the head), then 65536 again, past a warm-up of chatter. The last one is no
    copy of the one before it: a worker that started from the head, which remembered the first
    65536, must not take it for one. What the overflow memory holds at the latest step is part
    of what a segment is checked against (`DeepSpeedParser.carried`)."""
    lines = list(generate(RunSpec(fmt="megatron-deepspeed", steps=400, seed=5)))
    records = [i for i, line in enumerate(lines) if "consumed samples" in line]
    overflow = "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: {}, reducing to {}\n"
    chatter = [f"NCCL INFO Channel {i % 32:02d} : chatter {'x' * 60}\n" for i in range(4000)]
    stretch = [overflow.format(65536, 32768), *chatter[:600], overflow.format(32768, 16384)]
    stretch += [*chatter[600:2600], overflow.format(65536, 32768), *chatter[2600:]]
    cut = records[40] + 1  # the head (48 KiB) ends in the stretch, after its first overflow only
    path = tmp_path / "chatter.log"
    path.write_text("".join(lines[:cut] + stretch + lines[cut:]))
    assert len("".join(lines[:cut])) < segments.HEAD_BYTES < len("".join(lines[:cut] + stretch[:602]))
    _same(path)


@pytest.mark.usefixtures("small_segments")
def test_an_overflow_replayed_after_a_resume_is_counted_again(tmp_path: Path) -> None:
    """The job dies after an overflow and resumes from a checkpoint before it; the replayed step
    overflows again at the same scale. That is a new overflow, not a rank's copy (a record came
    between them), for one process as for the worker whose warm-up begins after the first."""
    lines = list(generate(RunSpec(fmt="megatron-deepspeed", steps=4000, seed=3)))
    records = {int(m.group(1)): i for i, line in enumerate(lines) if (m := re.match(r" iteration\s+(\d+)/", line))}
    first, second = [i for i, line in enumerate(lines) if "OVERFLOW" in line and i > 100][:2]
    step = next(s for s, i in sorted(records.items()) if i > first)
    crash = max(i for i in records.values() if i < second)
    resumed = [f"loading checkpoint from /ckpt at iteration {step - 10}\n", *lines[records[step - 10] + 1 :]]
    path = tmp_path / "replayed.log"
    path.write_text("".join(lines[: crash + 1] + resumed))
    stream = LogStream(new_parsers(), str(path))
    stream.feed(path.read_bytes())  # one block: the records between the two are read in bulk
    stream.close()
    replayed = [e for e in stream.take().events if e.kind == EventKind.OVERFLOW and e.step == step]
    assert len(replayed) == 2 * lines[first:crash].count(lines[first]) > 0
    _same(path)


@pytest.mark.usefixtures("small_segments")
@pytest.mark.parametrize("bars", [True, False])
def test_overflows_printed_by_two_ranks_are_one_after_a_wrong_guess(tmp_path: Path, bars: bool) -> None:
    """HF dicts logged every 10 steps with stale bars after them (their counts 2 steps late, as
    line-buffered captures print them), or with no bars: the guesses are wrong, and the rest of
    the file is read in order from where the segment before ended, where DeepSpeed's parser
    knows the overflow a rank copy repeats (a warm-up read from a wrong step did not)."""
    lines = []
    for k in range(1, 4001):
        stamp = f"2024-03-02 08:{(k // 60) % 60:02d}:{k % 60:02d},000"
        lines += [
            f"[{stamp}] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank {rank} Skipping step. "
            "Attempted loss scale: 65536, but hysteresis is 2. Reducing hysteresis to 1\n"
            for rank in (0, 1)
        ]
        lines.append(
            f"{{'loss': {3 + (k % 7) / 10:.4f}, 'grad_norm': 1.25, 'learning_rate': 5e-05, 'epoch': {k / 5000:.2f}}}\n"
        )
        if bars:
            lines.append(f" {k * 100 // 4000:3d}%|###       | {k * 10 + 2}/40000 [01:00<10:00, 1.00s/it]\n")
    path = tmp_path / "overflows.log"
    path.write_text("".join(lines))
    summary, alerts = _same(path, rereads=range(1, 10))
    assert summary.records == 4000
    assert any(a.detector == "loss_scale_collapse" for a in alerts)


@pytest.mark.usefixtures("small_segments")
@pytest.mark.parametrize("fmt", ["jsonl", "megatron-deepspeed"])  # (HF dicts have no time: no pace)
def test_a_hang_longer_than_a_warm_up_is_timed_by_the_clock_before_it(tmp_path: Path, fmt: str) -> None:
    """After the last record, hours of dated watchdog lines and no record, across segments: the
    stall is measured from the last record's time, which no later warm-up holds."""
    lines = list(generate(RunSpec(fmt=fmt, steps=3000, seed=21)))
    lines = [line for line in lines if "after training is done" not in line]  # it did not end: it hung
    path = tmp_path / f"{fmt}.log"
    path.write_text("".join(lines))
    last = check_path(path, SETTINGS, jobs=1)[0]  # the clock where the records end
    watchdog = [
        f"[{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(1.75e9 + 10 * i))},000] [WARNING] [watchdog.py:88] "
        f"rank 0 still waiting for allreduce #{i}\n"
        for i in range(3000)
    ]
    path.write_text("".join(lines + watchdog))
    summary, alerts = _same(path)
    assert summary.last_step == last.last_step
    assert any(a.detector == "stall" and a.step == last.last_step for a in alerts)


@pytest.mark.usefixtures("small_segments")
@pytest.mark.parametrize(
    ("fmt", "timestamps"), [("jsonl", True), ("jsonl", False), ("megatron-deepspeed", True), ("olmo", True)]
)
def test_a_traceback_longer_than_a_warm_up_is_one_error(tmp_path: Path, fmt: str, timestamps: bool) -> None:
    """The warm-up after its start holds frames only: the traceback open before it is told by
    the clock, or (JSON lines without times: no clock) by the open record itself. From there the
    file is read in order; OLMo's records, open at every boundary, are then each read once."""
    lines = list(generate(RunSpec(fmt=fmt, steps=3000, seed=32, timestamps=timestamps)))
    frames = [
        f'  File "/opt/model/layers.py", line {100 + i}, in forward_{i}\n    return self.inner(x)\n'
        for i in range(1500)
    ]
    lines[len(lines) // 2 : len(lines) // 2] = [
        "Traceback (most recent call last):\n",
        *frames,
        "ValueError: shapes do not match\n",
    ]
    path = tmp_path / f"{fmt}.log"
    path.write_text("".join(lines))
    assert len("".join(frames)) > 4 * (16 << 10)  # (the fixture's warm-up)
    _same(path, rereads=range(1, 10))
    batches: list[Batch] = []
    check_path(path, SETTINGS, on_batch=batches.append, jobs=2)
    errors = [e for b in batches for e in b.events if e.kind == EventKind.ERROR]
    assert [e.data.get("message", e.data) for e in errors] and len(errors) == 1, errors


@pytest.mark.usefixtures("small_segments")
def test_a_traceback_open_from_the_head_on_is_told_by_its_parser(tmp_path: Path) -> None:
    """A traceback begun right after the head: the next warm-up holds only its frames, and the
    step and the clock there are the head's, as in a sequential read. Only the open traceback
    differs (`LogStream.carried`): the file is read in order from there."""
    lines = list(generate(RunSpec(fmt="jsonl", steps=3000, seed=33, timestamps=False)))
    head = 0  # the lines the main process reads itself: those whole in its first chunk
    while len("".join(lines[: head + 1])) <= segments.HEAD_BYTES:
        head += 1
    frames = [
        f'  File "/opt/model/layers.py", line {i}, in forward_{i}\n    return self.inner(x)\n' for i in range(3000)
    ]
    filler = "-" * 300 + "\n"  # a plain line across the chunk's end: the traceback begins after the head
    lines[head:head] = [filler, "Traceback (most recent call last):\n", *frames, "ValueError: shapes do not match\n"]
    path = tmp_path / "early-traceback.jsonl"
    path.write_text("".join(lines))
    _same(path, rereads=range(1, 10))


@pytest.mark.usefixtures("small_segments")
def test_records_open_where_reading_in_order_begins_are_read_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OLMo records longer than the warm-up: a worker cannot tell the record open at its start,
    and the file is read in order from the segment before's end, whose worker finished the record
    open there (the next one must not record it again), then from segment to segment (a record
    open at a boundary is finished by the next segment)."""
    monkeypatch.setattr(segments, "WARMUP_BYTES", 300)
    path = _write(tmp_path, RunSpec(fmt="olmo", steps=3000, seed=34))
    summary, _ = _same(path, rereads=range(1, 10))
    assert summary.records == 3000


@pytest.mark.usefixtures("small_segments")
@pytest.mark.parametrize("fmt", ["olmo", "olmo-core"])
def test_a_last_record_cut_by_the_last_boundary_is_read(
    tmp_path: Path, fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last segment begins inside the file's last record, which began in the segment before:
    its worker reads on to the end of the file, which ends the record (it lost it before)."""
    path = _write(tmp_path, RunSpec(fmt=fmt, steps=3000, seed=4))
    text = path.read_bytes()
    cut = text.index(b"\n", text.rindex(b"[step=")) + 1  # just after the last record's first line
    real_bounds = segments.segment_bounds

    def cut_in_the_last_record(path: Path, start: int, size: int) -> list[tuple[int, int]]:
        bounds = [(a, b) for a, b in real_bounds(path, start, size) if b <= cut]
        return [*bounds[:-1], (bounds[-1][0], cut), (cut, len(text))]

    monkeypatch.setattr(segments, "segment_bounds", cut_in_the_last_record)
    summary, _ = _same(path)
    assert summary.records == 3000


@pytest.mark.usefixtures("small_segments")
@pytest.mark.parametrize(("fmt", "segment"), [("composer", 400), ("composer", 1500), ("olmo", 800), ("olmo-core", 400)])
def test_records_longer_than_a_segment_are_read_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str, segment: int
) -> None:
    """Segments smaller than a record, and stretches of chatter that make guesses wrong, then
    right again: a record that a task finished past its end stays open through the next
    segments, which must not record it again (`_Task.taken_through`)."""
    monkeypatch.setattr(segments, "SEGMENT_BYTES", segment)
    monkeypatch.setattr(segments, "WARMUP_BYTES", 3000)
    lines = list(generate(RunSpec(fmt=fmt, steps=600, seed=21)))
    for k in (5, 3, 2):
        at = len(lines) * (k - 1) // k
        lines[at:at] = [f"NCCL INFO chatter {k}.{i} " + "z" * 50 + "\n" for i in range(80)]
    path = tmp_path / f"{fmt}.log"
    path.write_text("".join(lines))
    summary, _ = _same(path, rereads=range(1, 200))
    assert summary.records == 600


@pytest.mark.usefixtures("small_segments")
def test_a_record_spanning_many_segments_is_read_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Composer records of 60 metric lines, each longer than a warm-up: every guess inside one
    is wrong, so segments are read in order, with a guess tried now and then. The task before a
    guess reads on to finish the record open at its end; when the guess fails, the segments read
    in order after it must drop that record however many of them it spans."""
    monkeypatch.setattr(segments, "SEGMENT_BYTES", 400)
    monkeypatch.setattr(segments, "WARMUP_BYTES", 1000)
    lines = []
    for k in range(1, 121):
        lines.append(f"[batch={k}/120]:\n")
        lines += [f"\t Train extra/metric_{j}: {j / 7:.5f}\n" for j in range(60)]
        lines.append(f"\t Train loss/train/total: {8 - k / 10:.4f}\n")
    path = tmp_path / "long-records.log"
    path.write_text("".join(lines))
    summary, _ = _same(path, rereads=range(1, 400))
    assert summary.records == 120


@pytest.mark.usefixtures("small_segments")
def test_composers_step_time_reference_is_checked_at_each_segment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The head ends inside a record, so every worker starts with it open; a warm-up that begins
    with the last line of another record (its `time/train`) gives that line to the open record,
    and the record after has no `time/train`: the worker's step-time reference is not the
    sequential one at its segment (`ComposerParser.carried`), and the segment is read in order."""
    lines = []
    for k in range(1, 401):
        lines += [f"[batch={k}/400]:\n", f"\t Train loss/train/total: {8 - k / 100:.4f}\n"]
        lines += ["some chatter\n"] if k == 301 else [f"\t Train time/train: {k / 100:.4f}\n"]
    offsets = np.cumsum([0, *map(len, lines)])
    text = "".join(lines)
    monkeypatch.setattr(segments, "HEAD_BYTES", int(offsets[3 * 99 + 2]) + 5)  # into record 100's time line
    boundary = int(offsets[3 * 301])  # record 302 begins the second segment
    monkeypatch.setattr(segments, "WARMUP_BYTES", boundary - int(offsets[3 * 299 + 2]))  # from record 300's time
    monkeypatch.setattr(
        segments, "segment_bounds", lambda path, start, size: [(start, boundary), (boundary, len(text))]
    )
    path = tmp_path / "composer.log"
    path.write_text(text)
    summary, _ = _same(path, rereads=range(1, 2))
    assert summary.records == 400


@pytest.mark.usefixtures("small_segments")
def test_a_parser_that_cannot_say_what_it_counts_on_is_read_in_order(tmp_path: Path) -> None:
    """NeMo lines without `global_step` count on from the record before, and the NeMo parser does
    not say so (`Parser.carried`): one worker reads the segments in turn, its stream going on."""
    rng = np.random.default_rng(18)
    lines = []
    for step in range(1, 6001):
        shown = "" if step % 1000 > 600 else f" | global_step: {step}"  # long stretches without
        loss = 8.0 - step / 2000 + rng.normal(0, 0.05) + (4.0 if step == 4200 else 0.0)
        lines.append(
            f"Training epoch 0, iteration {step}/6000 | lr: 0.0006 | consumed_samples: {step * 32}"
            f" | global_batch_size: 32{shown} | reduced_train_loss: {loss:.4f} | train_step_timing in s: 4.1\n"
        )
    path = tmp_path / "nemo.log"
    path.write_text("".join(lines))
    summary, alerts = _same(path, rereads=range(0, 1))
    assert summary.format == "nemo" and summary.last_step == 6000
    assert any(a.detector == "loss_spike" for a in alerts)


@pytest.mark.usefixtures("small_segments")
@pytest.mark.parametrize("fmt", ["megatron-deepspeed", "jsonl"])
def test_a_last_line_without_its_newline_is_read(tmp_path: Path, fmt: str) -> None:
    """A log still being written ends in the middle of a line: the last segment's worker reads it
    when it closes the stream, and it is one of that segment's lines (its records, its events)."""
    spec = RunSpec(fmt=fmt, steps=3000, seed=3)
    path = tmp_path / f"{fmt}.log"
    path.write_text("".join(generate(spec)).rstrip("\n"))
    summary, _ = _same(path)
    assert summary.last_step == 3000


def test_segments_of_a_dense_log_hold_no_more_records_than_a_sparse_log_s() -> None:
    """The segments read ahead wait in this process for the detectors: their size is cut where
    the head shows more than `SEGMENT_RECORDS` records to `SEGMENT_BYTES`."""
    sizes = {}
    for fmt in ("jsonl", "megatron-deepspeed"):
        stream = LogStream(new_parsers())
        stream.feed("".join(generate(RunSpec(fmt=fmt, steps=2000, seed=17))).encode())
        sizes[fmt] = size = segments.segment_size(stream)
        assert size * sum(stream.out.counts.values()) / stream.bytes <= segments.SEGMENT_RECORDS
    assert segments.SEGMENT_BYTES // 4 < sizes["jsonl"] < sizes["megatron-deepspeed"] == segments.SEGMENT_BYTES


def test_only_large_plain_files_with_jobs_are_split(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = tmp_path / "run.log"
    plain.write_bytes(b"x\n" * 1000)
    gz = tmp_path / "run.log.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    assert not workers.splittable(plain, jobs=4)  # too small to be worth it
    monkeypatch.setattr(workers, "MIN_PARALLEL_BYTES", 0)
    assert workers.splittable(plain, jobs=4)
    assert not workers.splittable(plain, jobs=1)
    assert not workers.splittable(gz, jobs=4)
    assert not workers.splittable(None, jobs=4)  # standard input
    assert not workers.splittable(tmp_path / "missing.log", jobs=4)


@pytest.mark.usefixtures("small_segments")
def test_no_worker_processes_to_be_had_means_one_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where a login node's process limit refuses workers, the file is read here instead."""

    def refuse(path: Path, jobs: int) -> None:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    path = _write(tmp_path, SPECS[0])
    expected, expected_alerts = check_path(path, SETTINGS, jobs=1)
    monkeypatch.setattr(segments, "SegmentReader", refuse)
    summary, alerts = check_path(path, SETTINGS, jobs=2)
    assert summary.error is None and summary.records == expected.records
    assert [a.to_json() for a in alerts] == [a.to_json() for a in expected_alerts]


@pytest.mark.usefixtures("small_segments")
@pytest.mark.parametrize("fmt", ["megatron-deepspeed", "olmo"])
def test_a_preamble_longer_than_the_first_chunk_grows_the_head(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str
) -> None:
    """Launcher and NCCL chatter filling the first chunks: the head is read on, chunk by chunk,
    until the format is known, and the rest is still split (once, the head was one chunk: the
    whole file was read in order)."""
    monkeypatch.setattr(segments, "HEAD_LIMIT", 1 << 20)
    chatter = [
        f"node{i % 64:03d}:{i}:{i} [0] NCCL INFO Channel {i % 32:02d} : 0[0] -> 1[1] via P2P/IPC\n" for i in range(3000)
    ]
    path = tmp_path / f"{fmt}.log"
    path.write_text("".join(chatter + list(generate(RunSpec(fmt=fmt, steps=3000, seed=36)))))
    assert len("".join(chatter)) > 4 * segments.HEAD_BYTES
    summary, _ = _same(path, split=True)
    assert summary.records >= 3000  # (and as read in order: `_same`)


@pytest.mark.usefixtures("small_segments")
def test_no_format_within_the_head_limit_means_reading_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past `HEAD_LIMIT` without a format, the workers are let go and the rest of the file is
    read in order here, going on from the head's stream (the head is not read twice), as a file
    in no known format (or one whose records begin late) would be anyway."""
    monkeypatch.setattr(segments, "HEAD_LIMIT", 96 << 10)
    chatter = [
        f"node{i % 64:03d}:{i}:{i} [0] NCCL INFO Channel {i % 32:02d} : 0[0] -> 1[1] via P2P/IPC\n" for i in range(3000)
    ]
    path = tmp_path / "late.log"
    path.write_text("".join(chatter + list(generate(RunSpec(fmt="jsonl", steps=3000, seed=37)))))
    starts: list[int] = []
    real_read_chunks = pipeline.read_chunks

    def noted(file: Path, size: int, first: int | None = None, start: int = 0) -> Iterator[bytes]:
        starts.append(start)
        return real_read_chunks(file, size, first, start)

    monkeypatch.setattr(pipeline, "read_chunks", noted)
    monkeypatch.setattr(stdin, "read_chunks", noted)  # (how a file is read whole: `read_log`)
    summary, _ = _same(path, split=False)
    assert summary.records == 3000
    assert starts[0] == 0 and segments.HEAD_LIMIT <= starts[-1] < path.stat().st_size  # jobs 1, then 2


@pytest.mark.usefixtures("small_segments")
def test_a_head_is_taken_chunk_by_chunk_as_a_read_in_order_takes_it(tmp_path: Path) -> None:
    """Which records a batch holds depends on when it is taken: DeepSpeed's progress records
    count while no trainer's record came (past `UNDECIDED_HOLD_LINES` lines), and Megatron's
    records that begin later drop only the ones after them. A worker reading the head takes a
    batch after each chunk, as a read in order does (found by a real log: all at once, it lost
    DeepSpeed's records)."""
    progress = (
        "[2021-05-27 19:49:{:02d},947] [INFO] [logging.py:60:log_dist] [Rank 0] step={}, skipped=0, lr=[1e-05, 1e-05]\n"
    )
    chatter = [f"node{i % 64:03d} NCCL INFO Channel {i % 32:02d} : 0[0] -> 1[1] via P2P/IPC\n" for i in range(6000)]
    iterations = [
        f" iteration {i:8d}/    1000 | elapsed time per iteration (ms): 1504.3 | learning rate: 1.875E-05 |"
        f" lm loss: 1.27902{i}E+01 | loss scale: 1024.0 |\n"
        for i in (1, 2)
    ]
    path = tmp_path / "late_trainer.log"
    path.write_text(progress.format(1, 0) + "".join(chatter) + progress.format(2, 1) + "".join(iterations))
    summary, _ = _same(path, split=None)
    assert (
        summary.records == 3
    )  # DeepSpeed's step 0 (its step 1 comes in the batch Megatron's records begin in), iterations 1 and 2


def test_default_jobs_is_bounded() -> None:
    assert 1 <= workers.default_jobs() <= 8


@pytest.fixture(scope="module")
def big_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A generated Megatron-DeepSpeed log just over the size from which files are split."""
    log = tmp_path_factory.mktemp("big") / "main_log.txt"
    spec = RunSpec(fmt="megatron-deepspeed", seed=12, anomalies=(Anomaly("grad_norm_spike", 60_000),))
    write_sized(log, spec, workers.MIN_PARALLEL_BYTES + (4 << 20))
    return log


def test_cli_jobs_on_a_large_log_reports_what_one_process_reports(big_log: Path) -> None:
    """The real command, large enough to be split: `python -m gradwatch` must start its workers."""
    one = run_cli("check", "--output", "json", "--jobs", "1", str(big_log), timeout=600)
    two = run_cli("check", "--output", "json", "-j", "2", str(big_log), timeout=600)
    assert two.stderr == one.stderr == ""  # no progress bar where stderr is not a terminal
    assert two.returncode == one.returncode == 1
    assert json.loads(two.stdout) == json.loads(one.stdout)
    assert any(a["detector"] == "grad_norm_spike" for a in json.loads(two.stdout)["alerts"])


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux not installed")
def test_progress_shows_on_a_terminal_while_a_large_log_is_checked(big_log: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    sock, session = f"gw-progress-{os.getpid()}", "check"
    tmux = ["tmux", "-L", sock]
    check = " ".join([*gradwatch_cmd(), "check", "--jobs", "1", "--output", "json", str(big_log)])
    command = f"sh -c '{check} > {out}; echo CHECK-DONE; sleep 60'"
    subprocess.run([*tmux, "new-session", "-d", "-s", session, "-x", "100", "-y", "10", command], check=True)
    try:
        seen, deadline = [], time.monotonic() + 120
        while True:
            screen = subprocess.run([*tmux, "capture-pane", "-p", "-t", session], capture_output=True, text=True)
            rows = screen.stdout.splitlines()
            seen += [r for r in rows if "main_log.txt" in r]
            if any("CHECK-DONE" in r for r in rows):
                break
            assert time.monotonic() < deadline, "\n".join(rows)
            time.sleep(0.1)
        assert seen, "no progress line while checking"
        total = f"/{big_log.stat().st_size / 1e6:.1f} MB"  # rich counts decimal megabytes
        assert all(total in r for r in seen), seen
        assert any("MB/s" in r for r in seen), seen  # it moved, at a speed
        assert not any("main_log.txt" in r for r in rows)  # transient: gone when the check ends
        assert json.loads(out.read_text())["summary"]["alerts"] >= 1
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)


def test_workers_start_early_only_for_a_log_they_will_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`check` starts the workers' fork server before its own imports when a log given on the
    command line will be read by workers, and only then."""
    started: list[int] = []
    monkeypatch.setattr(multiprocessing.forkserver, "ensure_running", lambda: started.append(1))
    monkeypatch.setattr(workers, "MIN_PARALLEL_BYTES", 1000)
    small, big = tmp_path / "small.log", tmp_path / "big.log"
    small.write_bytes(b"x\n")
    big.write_bytes(b"x\n" * 1000)
    (tmp_path / "big.log.gz").write_bytes(gzip.compress(big.read_bytes()) + bytes(2000))
    workers.start_early([str(small), "-", str(tmp_path), str(tmp_path / "big.log.gz"), "missing.log"], None)
    workers.start_early([str(big)], 1)
    assert not started
    workers.start_early([str(small), str(big)], 2)
    assert started == [1]


def test_a_batch_whose_events_are_out_of_line_order_is_not_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pieces take the events of their lines; events out of order (a plugin's) would land twice,
    so such a batch reaches the detectors whole."""
    monkeypatch.setattr(segments, "BATCH_RECORDS", 2)
    records = {"step": np.arange(1, 6), "line": np.arange(10, 60, 10), "ts": np.zeros(5), "nonfinite": np.full(5, "")}
    events = [Event(EventKind.CHECKPOINT_SAVE, line) for line in (45, 15, 25)]
    pieces = list(segments._pieces(BatchFacts(events=events), records, None, 100))
    assert len(pieces) == 1 and pieces[0][0].events == events
    assert pieces[0][0].records["step"].tolist() == [1, 2, 3, 4, 5]
    ordered = sorted(events, key=lambda e: e.line)
    pieces = list(segments._pieces(BatchFacts(events=ordered), records, None, 100))
    assert [[e.line for e in p.events] for p, _, _ in pieces] == [[15], [25], [45]]
    assert [p.records["line"].tolist() for p, _, _ in pieces] == [[10, 20], [30, 40], [50]]
    assert [size for _, _, size in pieces] == [0, 0, 100]


@pytest.mark.usefixtures("small_segments")
def test_segments_are_read_jobs_plus_one_ahead_again_once_guessing_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stretch of JSON lines without steps early on makes a guess wrong; once the segments read
    in order are past it and guessing is tried again, 3 segments (2 jobs + 1) are read ahead
    again, not one at a time. Counted as the reader hands tasks out and takes (or drops) them."""
    lines = list(generate(RunSpec(fmt="jsonl", steps=12000, seed=14)))
    a, b = len(lines) // 10, len(lines) // 5
    lines[a:b] = [re.sub(r'"step": \d+, ', "", line, count=1) for line in lines[a:b]]
    path = tmp_path / "stepless-stretch.jsonl"
    path.write_text("".join(lines))
    ahead = [0]
    seen: list[tuple[int, int]] = []  # (segments read ahead, wrong guesses so far) at each hand-out
    readers: list[segments.SegmentReader] = []
    segment_futures: set[object] = set()
    real_init, real_result = segments.SegmentReader.__init__, segments.SegmentReader._result

    def init(self: segments.SegmentReader, path: Path, jobs: int) -> None:
        real_init(self, path, jobs)
        readers.append(self)
        submit = self._pool.submit

        def counted(fn, *args, **kwargs):  # type: ignore[no-untyped-def]
            future = submit(fn, *args, **kwargs)
            if fn is segments.read_segment:
                ahead[0] += 1
                segment_futures.add(future)
                seen.append((ahead[0], self.rereads))
                cancel = future.cancel

                def dropped() -> bool:
                    ahead[0] -= 1
                    return cancel()

                future.cancel = dropped  # type: ignore[method-assign]
            return future

        self._pool.submit = counted  # type: ignore[method-assign]

    def result(self: segments.SegmentReader, future):  # type: ignore[no-untyped-def]
        ahead[0] -= future in segment_futures  # (not the head's)
        return real_result(self, future)

    monkeypatch.setattr(segments.SegmentReader, "__init__", init)
    monkeypatch.setattr(segments.SegmentReader, "_result", result)
    check_path(path, SETTINGS, jobs=2)
    assert sum(r.rereads for r in readers) >= 1, "the stretch should have made a guess wrong"
    assert max(depth for depth, _ in seen) == 3
    assert max(depth for depth, wrong in seen if wrong) == 3, seen

"""Crashes that launchers, Slurm, shells, NCCL and progress bars report in a line: each one is a
`trainer_error` critical alert, one per incident however many ranks print it; their look-alikes
(a stop on purpose, a warning about the setup, an OOM a trainer caught) stay quiet."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gradwatch.events import EventKind
from gradwatch.parsers.base import ParseOutput
from gradwatch.parsers.crash_lines import classify
from gradwatch.parsers.errors_parser import ErrorParser
from tests.conftest import REAL_MORE, run_cli
from tests.test_bad_input import no_traceback
from tests.test_trainer_error import megatron_records

#: an NCCL debug line's prefix: host:pid:tid [cuda device] source:line
NCCL = "gpu-node-7:48213:48907 [3] transport/net_ib.cc:1295 NCCL WARN "
BAR = "Epoch 0:  45%|████▌     | 450/1000 [05:00<06:07,  1.50it/s, loss=2.31, v_num=3]"
HYDRA = "Error executing job with overrides: ['trainer.max_epochs=1']"
TRACEBACK = ["Traceback (most recent call last):", '  File "train.py", line 31, in main', "    trainer.fit(model)"]
OOM = "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 15.78 GiB total capacity)"

CRASHES = {
    "slurm-oom-killer": (
        "slurmstepd: error: Detected 1 oom_kill event in StepId=81234.0. Some of your processes may have "
        "been killed by the cgroup out-of-memory handler."
    ),
    "srun-segfault": "srun: error: node-12: task 3: Segmentation fault (core dumped)",
    "srun-exit-code": "srun: error: node-12: tasks 0-7: Exited with exit code 1",
    "srun-killed": "srun: error: nid[001-004]: tasks 0,2: Killed",
    "srun-oom": "srun: error: node-12: task 0: Out Of Memory",
    "exit-code": "Exited with exit code 137",
    "node-failure": (
        "slurmstepd: error: *** JOB 81234 ON node-12 CANCELLED AT 2024-03-02T08:00:00 DUE TO NODE "
        "FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***"
    ),
    "slurm-failed": "slurmstepd: error: *** JOB 81234 FAILED (non-zero exit code or other failure mode) ***",
    "bus-error": "Bus error (core dumped)",
    "segfault": "Segmentation fault (core dumped)",
    "killed": "Killed",
    "shell-job-report": (
        "/var/spool/slurmd/job81234/slurm_script: line 20: 48213 Killed                  python pretrain.py --fp16"
    ),
    "fatal-python-error": "Fatal Python error: Aborted",
    "nccl-ib-completion": (
        f"{NCCL}NET/IB : Got completion from peer 10.0.0.2<53249> with error 12, opcode 0, len 0, vendor err 129 (Recv)"
    ),
    "nccl-ib-status": (
        f"{NCCL}NET/IB: Got completion from peer 10.0.0.2<53249> with status=12 opcode=1 len=0 vendor err 129 (Send)"
    ),
    "nccl-call-failed": f"{NCCL}Call to ibv_create_cq failed",
    "nccl-cuda-failure": f"{NCCL}Cuda failure 'out of memory'",
    "nccl-socket-closed": f"{NCCL}socketProgress: Connection closed by remote peer gpu-node-8<57557>",
    "nccl-watchdog-hang": (
        "[F302 08:00:00.000000000 ProcessGroupNCCL.cpp:1306] [PG ID 0 PG GUID 0(default_pg) Rank "
        "3] Terminating the process after attempting to dump debug info, due to ProcessGroupNCCL "
        "watchdog hang."
    ),
    "lightning-child-died": (
        "[rank: 1] Child process with PID 48213 terminated with code -9. Forcefully terminating all "
        "other processes to avoid zombies 🧟"
    ),
    "mpirun-signal": "mpirun noticed that process rank 3 with PID 0 on node gpu-node-7 exited on signal 9 (Killed).",
    "oom-exception": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    "oom-after-bar": f"{BAR}{OOM}",
    "watchdog-after-bar": (
        f"{BAR}[rank0]:[E ProcessGroupNCCL.cpp:1316] [Rank 0] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600081 milliseconds "
        "before timing out."
    ),
}

#: the run's end on purpose: no crash
ENDS = {
    "user-scancel": "slurmstepd: error: *** JOB 81234 ON node-12 CANCELLED AT 2024-03-02T08:00:00 ***",
    "old-user-scancel": "slurmstepd: error: *** STEP 81234.0 CANCELLED AT 2024-03-02T08:00:00 ***",
    "time-limit": (
        "slurmstepd: error: *** STEP 81234.0 ON node-12 CANCELLED AT 2024-03-02T08:00:00 DUE TO TIME LIMIT ***"
    ),
    "preemption": "slurmstepd: error: *** JOB 81234 ON node-12 CANCELLED AT 2024-03-02T08:00:00 DUE TO PREEMPTION ***",
    "srun-sigterm": "srun: error: node-12: tasks 0-7: Terminated",
    "shell-sigterm": "run.sh: line 3:  4242 Terminated              python pretrain.py",
    "lightning-ctrl-c": "Detected KeyboardInterrupt, attempting graceful shutdown ...",
    "lightning-done": "`Trainer.fit` stopped: `max_epochs=10` reached.",
}

#: no crash and no end: warnings about the setup, an OOM the trainer caught (it skips the batch),
#: a clean exit, words that only look like a signal's name
NOTHING = {
    "nccl-iommu": f'{NCCL}Missing "iommu=pt" from kernel command line which can lead to system instablity or hang!',
    "nccl-no-ib": "gpu-node-7:48213:48213 [0] misc/ibvwrap.cc:63 NCCL WARN Failed to open libibverbs.so[.1]",
    "nccl-retry": f"{NCCL}Call to connect returned Connection refused, retrying",
    "fairseq-caught-oom": (
        "2024-03-02 08:00:00 | WARNING | fairseq.trainer | OOM: Ran out of memory with exception: CUDA "
        "out of memory. Tried to allocate 20.00 MiB"
    ),
    "clean-exit": "srun: error: node-12: task 0: Exited with exit code 0",
    "killed-word": "Killed 3 stale dataloader workers before the epoch",
    "aborted-word": "validation: Aborted batches: 0",
}


@pytest.mark.parametrize("line", CRASHES.values(), ids=CRASHES.keys())
def test_a_crash_line_is_an_error(line: str) -> None:
    found = classify(line)
    assert found is not None and found.kind is EventKind.ERROR, found


@pytest.mark.parametrize("line", ENDS.values(), ids=ENDS.keys())
def test_a_stop_on_purpose_is_the_runs_end(line: str) -> None:
    found = classify(line)
    assert found is not None and found.kind is EventKind.RUN_END, found


@pytest.mark.parametrize("line", NOTHING.values(), ids=NOTHING.keys())
def test_a_look_alike_reports_nothing(line: str) -> None:
    assert classify(line) is None


@pytest.mark.parametrize(
    ("line", "death"),
    [(CRASHES["srun-exit-code"], True), (CRASHES["killed"], True), (CRASHES["node-failure"], False)],
)
def test_a_launchers_death_report_is_told_from_a_cause(line: str, death: bool) -> None:
    """A death report after the run's end is that end's echo (see the look-alikes end to end)."""
    out = ParseOutput()
    assert ErrorParser().parse(line, 7, None, out)
    [event] = out.events
    assert (event.kind, event.line, bool(event.data.get("death"))) == (EventKind.ERROR, 7, death)


def test_an_error_glued_onto_a_bar_leaves_the_bar_to_the_other_parsers() -> None:
    """The bar may be a record (the crash's step): the line is not consumed, and the error is
    quoted from where it begins."""
    out = ParseOutput()
    assert not ErrorParser().parse(f"{BAR}{OOM}", 3, None, out)
    assert [(e.kind, e.line, e.data["text"]) for e in out.events] == [(EventKind.ERROR, 3, OOM)]


@pytest.mark.parametrize(
    "exception",
    [
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    ],
)
def test_an_oom_ending_a_traceback_is_one_error_at_the_exception(exception: str) -> None:
    """The exception names the OOM: the traceback's one event, not a second one for the marker."""
    out, parser = ParseOutput(), ErrorParser()
    for n, text in enumerate([*TRACEBACK, exception], start=1):
        parser.parse(text, n, None, out)
    parser.flush(out)
    assert [(e.kind, e.line, e.data["text"]) for e in out.events] == [(EventKind.ERROR, 4, exception)]


def _check(tmp_path: Path, lines: list[str]) -> tuple[int, list[tuple[Any, ...]]]:
    """`gradwatch check` on a log of `lines`: its exit code and its warning-or-worse alerts."""
    log = tmp_path / "run.log"
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    p = no_traceback(run_cli("check", "--output", "json", str(log)))
    alerts = json.loads(p.stdout)["alerts"]
    found = [(a["detector"], a["severity"], a["step"], a["line"], a["message"]) for a in alerts]
    return p.returncode, [a for a in found if a[1] != "info"]


@pytest.mark.parametrize("line", CRASHES.values(), ids=CRASHES.keys())
def test_a_crash_line_is_one_critical_alert(tmp_path: Path, line: str) -> None:
    code, found = _check(tmp_path, [*megatron_records(10, 50), line])
    assert (code, [(d, s, step, at) for d, s, step, at, _ in found]) == (1, [("trainer_error", "critical", 500, 51)])
    quoted = line.removeprefix(BAR)  # (long ones shortened)
    assert found[0][4].startswith(f"trainer error: {quoted[:120]}"), found[0][4]


def test_every_ranks_report_of_one_crash_is_one_alert(tmp_path: Path) -> None:
    """NCCL on every rank, then srun on every node, then Slurm: one crash."""
    failure = "NCCL WARN Cuda failure 'unspecified launch failure'"
    lines = [f"gpu-node-{r // 8}:{4000 + r}:{5000 + r} [{r % 8}] {failure}" for r in range(16)]
    lines += [f"srun: error: gpu-node-{n}: tasks {8 * n}-{8 * n + 7}: Exited with exit code 1" for n in range(2)]
    lines += [CRASHES["slurm-failed"]]
    code, found = _check(tmp_path, [*megatron_records(10, 50), *lines])
    assert (code, [(d, s, step, line) for d, s, step, line, _ in found]) == (
        1,
        [("trainer_error", "critical", 500, 51)],
    )


def test_a_crash_before_any_step_is_one_critical_alert_at_its_line(tmp_path: Path) -> None:
    """No record at all: the crash is still reported, and it is what `check` exits by (1, alerts),
    not "no training records" (2): the file was read, and it tells of a crash."""
    code, found = _check(tmp_path, ["using world size: 16", CRASHES["node-failure"], CRASHES["srun-exit-code"]])
    assert code == 1
    assert found == [
        ("trainer_error", "critical", None, 2, f"trainer error before the first step: {CRASHES['node-failure']}")
    ]


def _bars(count: int) -> str:
    """Lightning's bar redrawn `count` times on one line (`\\r`), steps 1 to `count`."""
    return "\r".join(
        f"Epoch 0:  {n // 10}%|##    | {n}/1000 [00:{n % 60:02d}<05:00,  1.50it/s, loss={3 - n / 1000:.3f}, v_num=3]"
        for n in range(1, count + 1)
    )


@pytest.mark.parametrize(
    ("glued", "after", "line", "quoted"),
    [
        (OOM, [], 1, OOM),
        (CRASHES["watchdog-after-bar"][len(BAR) :], [], 1, CRASHES["watchdog-after-bar"][len(BAR) :]),
        (TRACEBACK[0], [*TRACEBACK[1:], OOM], 4, OOM),
        (HYDRA, [*TRACEBACK, OOM], 5, OOM),
        # the log ends inside Hydra's traceback, or right after Hydra's line, as a job killed
        # while printing them leaves them
        (HYDRA, TRACEBACK, 4, f"a traceback cut short after {TRACEBACK[1].strip()}"),
        (HYDRA, [], 1, HYDRA),
    ],
    ids=["oom", "nccl-watchdog", "traceback", "hydra", "hydra-cut-short", "hydra-alone"],
)
def test_a_crash_glued_onto_a_progress_bar_takes_the_bars_step(
    tmp_path: Path, glued: str, after: list[str], line: int, quoted: str
) -> None:
    """tqdm leaves the bar without a newline: the error is printed on its line. The bar, read
    as a record, is the step the run died at (found as a Lightning bar, then a Hydra error,
    then a traceback that the log ends inside)."""
    code, found = _check(tmp_path, [_bars(450) + glued, *after])
    assert (code, [(d, s, step, at) for d, s, step, at, _ in found]) == (1, [("trainer_error", "critical", 450, line)])
    assert found[0][4].startswith(f"trainer error: {quoted[:120]}"), found[0][4]


def test_a_bars_crash_in_a_megatron_log_takes_the_latest_records_step(tmp_path: Path) -> None:
    code, found = _check(tmp_path, [*megatron_records(10, 50), _bars(3) + OOM])
    assert (code, found) == (1, [("trainer_error", "critical", 500, 51, f"trainer error: {OOM}")])


@pytest.mark.parametrize("end", ENDS.values(), ids=ENDS.keys())
def test_a_stop_on_purpose_and_the_launchers_echo_of_it_are_no_crash(tmp_path: Path, end: str) -> None:
    """Stopped, the processes exit with a code or die of a signal, which launchers report."""
    echo = [CRASHES["srun-exit-code"], CRASHES["srun-killed"], "Killed", CRASHES["lightning-child-died"]]
    assert _check(tmp_path, [*megatron_records(10, 50), end, *echo]) == (0, [])


def test_look_alikes_are_quiet(tmp_path: Path) -> None:
    lines = megatron_records(10, 30)
    lines[5:5] = NOTHING.values()
    assert _check(tmp_path, lines) == (0, [])


def test_a_cause_after_the_end_is_still_a_warning(tmp_path: Path) -> None:
    """The end's echo is quiet, not what broke after it (a save on a failing node)."""
    lines = [*megatron_records(10, 50), "`Trainer.fit` stopped: `max_epochs=10` reached.", CRASHES["bus-error"]]
    lines.append(CRASHES["nccl-cuda-failure"])
    _, found = _check(tmp_path, lines)
    assert [(s, m) for _, s, _, _, m in found] == [
        ("warning", f"error after the run ended: {CRASHES['nccl-cuda-failure']}")
    ]


@pytest.mark.parametrize(
    ("name", "step", "opener"),
    [
        ("lightning/nemo-speech-issue3493-tacotron2-bar-then-traceback-step32.log", 32, "a traceback cut short"),
        ("fairseq/fairseq-issue512-overflow-cascade-to-min-scale-traceback-10198.log", 10198, "a traceback cut short"),
        ("megatron-lm/megatron-lm-issue1140-nccl-watchdog-timeout-second-iteration.log", None, "[E ProcessGroupNCCL"),
    ],
)
def test_real_crashes_of_more_trainers(name: str, step: int | None, opener: str) -> None:
    path = REAL_MORE / name
    if not path.is_file():
        pytest.skip(f"real log not found at {path} (kept outside the repository)")
    p = no_traceback(run_cli("check", "--output", "json", str(path)))
    [alert] = [a for a in json.loads(p.stdout)["alerts"] if a["detector"] == "trainer_error"]
    assert (alert["severity"], alert["step"]) == ("critical", step)
    assert alert["message"].split(": ", 1)[1].startswith(opener), alert["message"]

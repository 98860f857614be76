"""trainer_error: a crash in the log is one critical alert, at the exception every rank printed first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import REAL, run_cli
from tests.test_bad_input import megatron_line, no_traceback, run_values

ECC = [
    "Traceback (most recent call last):",
    '  File "/gpfswork/Megatron-DeepSpeed/pretrain_gpt.py", line 222, in <module>',
    "    pretrain(train_valid_test_datasets_provider, model_provider, forward_step)",
    "RuntimeError: transform: failed to synchronize: cudaErrorECCUncorrectable: uncorrectable ECC error encountered",
]


def ranks(lines: list[str], ranks: int) -> list[str]:
    """The same lines printed by several ranks, interleaved as torchrun's prefixes show them."""
    return [f"[rank{r}]: {line}" for line in lines for r in range(ranks)]


def _check(tmp_path: Path, lines: list[str]) -> list[tuple[str, str, int | None, int | None, str]]:
    log = tmp_path / "run.log"
    log.write_text("\n".join(lines) + "\n")
    p = no_traceback(run_cli("check", "--output", "json", str(log)))
    return [
        (a["detector"], a["severity"], a["step"], a["line"], a["message"])
        for a in json.loads(p.stdout)["alerts"]
        if a["detector"] in ("trainer_error", "nonfinite")
    ]


def megatron_records(first: int, count: int) -> list[str]:
    """`count` healthy Megatron records, steps `first`, `first + 10`, ..."""
    return [megatron_line(first + s - 10, loss, g) for s, loss, g in run_values(count)]


def test_the_tracebacks_of_every_rank_are_one_alert_at_the_first_exception(tmp_path: Path) -> None:
    lines = megatron_records(10, 50) + ranks(ECC, 8)
    found = _check(tmp_path, lines)
    message = f"trainer error: {ECC[-1]}"
    assert found == [("trainer_error", "critical", 500, 50 + 4 * 8 - 7, message)], found


def test_a_crash_after_a_resume_is_a_new_incident(tmp_path: Path) -> None:
    """Errors up to the next training record are one crash; the resumed run's crash is another."""
    cuda = "[rank3]: RuntimeError: CUDA error: an illegal memory access was encountered"
    timeout = "[rank0]:[E ProcessGroupNCCL.cpp:1316] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7)"
    lines = [*megatron_records(10, 30), *ECC, cuda, *megatron_records(300, 20), timeout, timeout]
    found = _check(tmp_path, lines)
    assert [(d, s, step, line) for d, s, step, line, _ in found] == [
        ("trainer_error", "critical", 300, 34),
        ("trainer_error", "info", 310, 37),
        ("trainer_error", "critical", 490, 56),
    ], found
    assert found[1][4] == "training went on after the error"
    assert found[2][4] == f"trainer error: {timeout.removeprefix('[rank0]:')}"


def test_an_error_before_the_first_step_says_so(tmp_path: Path) -> None:
    lines = ["using world size: 8", *ECC[:-1], "ModuleNotFoundError: No module named 'apex'", *megatron_records(10, 5)]
    found = _check(tmp_path, lines)
    message = "trainer error before the first step: ModuleNotFoundError: No module named 'apex'"
    assert [(d, step, line, m) for d, _, step, line, m in found] == [
        ("trainer_error", None, 5, message),
        ("trainer_error", 10, 6, "training went on after the error"),
    ]


def test_nan_errors_are_nonfinite_s_alone(tmp_path: Path) -> None:
    nan = (
        "RuntimeError: Rank 0, device 0, iteration 500: Unexpected result nan (message='found NaN in local grad norm')"
    )
    found = _check(tmp_path, [*megatron_records(10, 50), nan])
    assert [(d, step) for d, _, step, _, _ in found] == [("nonfinite", 500)], found


def test_the_detector_can_be_turned_off(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text("\n".join(megatron_records(10, 50) + ECC) + "\n")
    config = tmp_path / "c.yaml"
    config.write_text("detectors:\n  trainer_error:\n    enabled: false\n")
    p = no_traceback(run_cli("check", "--config", str(config), "--output", "json", str(log)))
    assert p.returncode == 0 and json.loads(p.stdout)["alerts"] == []


@pytest.mark.skipif(not REAL.is_dir(), reason=f"real logs not found at {REAL} (kept outside the repository)")
@pytest.mark.parametrize(
    ("name", "step", "line", "exception"),
    [
        ("bigscience-tr1-13b-ecc-crash-43680.log", 43680, 20, "RuntimeError: transform: failed to synchronize"),
        ("alcf-readme-fp16-ckpt-save-crash-iter200.log", 200, 27, "AttributeError: 'GPTModel' object"),
    ],
)
def test_real_crashes_are_reported(name: str, step: int, line: int, exception: str) -> None:
    p = no_traceback(run_cli("check", "--output", "json", str(REAL / "megatron-deepspeed" / name)))
    [alert] = [a for a in json.loads(p.stdout)["alerts"] if a["severity"] != "info"]
    assert (alert["detector"], alert["step"], alert["line"], p.returncode) == ("trainer_error", step, line, 1)
    assert alert["message"].startswith(f"trainer error: {exception}")


IGNORED = [
    "Exception ignored in: <function _MultiProcessingDataLoaderIter.__del__ at 0x7f2b1c0e8ca0>",
    "Traceback (most recent call last):",
    '  File "/opt/conda/lib/python3.10/site-packages/torch/utils/data/dataloader.py", line 1478, in __del__',
    "    self._shutdown_workers()",
    "AssertionError: can only test a child process",
]


def test_an_exception_python_ignored_is_no_error(tmp_path: Path) -> None:
    """`Exception ignored in: ...` and its traceback, as a DataLoader prints at shutdown: not a crash."""
    assert _check(tmp_path, [*megatron_records(10, 50), *ranks(IGNORED, 4)]) == []


def test_an_ignored_exception_without_a_traceback_does_not_hide_the_next_crash(tmp_path: Path) -> None:
    lines = [
        *megatron_records(10, 30),
        IGNORED[0],
        "TypeError: 'NoneType' object is not callable",
        *megatron_records(310, 20),
        *ECC,
    ]
    found = _check(tmp_path, lines)
    assert [(d, step, line) for d, _, step, line, _ in found] == [("trainer_error", 500, 56)], found


def test_an_error_after_the_trainer_finished_is_a_warning(tmp_path: Path) -> None:
    """Training is done; the save or upload after it may not be."""
    upload = "huggingface_hub.errors.HfHubHTTPError: 503 Server Error: Service Unavailable for url"
    lines = [*megatron_records(10, 50), "[after training is done] datetime: 2024-03-02 08:00:00", *ECC[:-1], upload]
    found = _check(tmp_path, lines)
    message = f"error after the run ended: {upload}"
    assert [(d, s, step, m) for d, s, step, _, m in found] == [("trainer_error", "warning", 500, message)], found


OOM = [*ECC[:-1], "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"]  # no marker in it


def _srun(lines: list[str], label: str) -> list[str]:
    """srun --label: `0: ` before each line, the line's own indentation after it."""
    return [f"{label}: {line}" for line in lines]


@pytest.mark.parametrize(
    "crash",
    [
        pytest.param(_srun(OOM, "0"), id="srun-label"),
        pytest.param(_srun(OOM, " 3"), id="srun-padded-label"),  # ten tasks or more
        pytest.param(
            [OOM[0].join(["  45%|████▌     | 450/1000 [10:00<12:00,  1.3s/it]", ""]), *OOM[1:]], id="after-bar"
        ),
        pytest.param([*ECC[:-1], "torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised"], id="dotted"),
        pytest.param([*ECC[:-1], "ray.exceptions.RayTaskError(RuntimeError): ray::train()"], id="ray"),
        pytest.param([*ECC[:-1], "StopIteration"], id="bare-name"),
        pytest.param(
            [*ECC[:-1], "FileNotFoundError: [Errno 2] No such file: '/data/nanogpt/train.bin'"], id="nan-word"
        ),
    ],
)
def test_tracebacks_as_launchers_and_libraries_print_them(tmp_path: Path, crash: list[str]) -> None:
    """Found by QA: srun's label ate the frames' indentation (or, padded, was not stripped), a
    bar before `Traceback` hid it, exception names not ending in Error were not one, and a path
    with `nanogpt` in it was taken for a NaN report."""
    found = _check(tmp_path, [*megatron_records(10, 50), *crash])
    exception = crash[-1].split(": ", 1)[-1] if crash[-1].startswith(("0: ", " 3: ")) else crash[-1]
    assert [(d, s, step, m) for d, s, step, _, m in found] == [
        ("trainer_error", "critical", 500, f"trainer error: {exception}")
    ], found


def test_the_log_ending_inside_a_traceback_is_a_crash(tmp_path: Path) -> None:
    """The process was killed while printing it: no exception line, but a crash all the same."""
    found = _check(tmp_path, [*megatron_records(10, 50), *ECC[:-1]])
    message = f"trainer error: a traceback cut short after {ECC[1].strip()}"
    assert [(d, s, step, line, m) for d, s, step, line, m in found] == [
        ("trainer_error", "critical", 500, 53, message)
    ], found


def test_ctrl_c_and_a_launchers_sigterm_are_no_crash(tmp_path: Path) -> None:
    interrupted = [*ECC[:-1], "KeyboardInterrupt"]
    sigterm = "[2022-10-31 10:55:14,192] [INFO] [launch.py:295:sigkill_handler] Main process received SIGTERM, exiting"
    assert _check(tmp_path, [*megatron_records(10, 50), *ranks(interrupted, 4), sigterm]) == []


def test_a_requeued_job_failing_again_before_its_first_record_is_a_crash_of_its_own(tmp_path: Path) -> None:
    missing = "FileNotFoundError: [Errno 2] No such file or directory: '/ckpt/iter_0000500/mp_rank_00'"
    lines = [*megatron_records(10, 50), *ECC, " loading checkpoint from /ckpt at iteration 500", *ECC[:-1], missing]
    found = _check(tmp_path, lines)
    assert [(s, step, line) for _, s, step, line, _ in found] == [("critical", 500, 54), ("critical", 500, 59)], found


def test_an_error_long_after_the_end_is_a_warning_however_the_log_is_read(tmp_path: Path) -> None:
    """The end message and the error in different batches: the records after the error made it a
    critical (found by QA: `--jobs 1` and `--jobs 2` disagreed, and so did `tail`)."""
    filler = [f"[2024-03-02 08:00:00] INFO saving shard {i} of the final checkpoint" for i in range(120_000)]
    disk_full = "OSError: [Errno 28] No space left on device"
    lines = [
        *megatron_records(10, 50),
        "[after training is done] datetime: 2024-03-02 08:00:00",
        *filler,
        *ECC[:-1],
        disk_full,
    ]
    found = _check(tmp_path, [*lines, *megatron_records(510, 4)])
    assert [(s, m) for _, s, _, _, m in found][:1] == [("warning", f"error after the run ended: {disk_full}")], found


@pytest.mark.parametrize(
    "line",
    [
        "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=123.0. Some of your processes may have been killed",
        "[2024-03-02 08:00:00,000] [ERROR] [launch.py:321:sigkill_handler] ['python'] exits with return code = -9",
        "E0302 08:00:00.000 torch/distributed/elastic/multiprocessing/api.py:826] failed (exitcode: 1) local_rank: 0",
    ],
    ids=["oom-killer", "deepspeed-launcher", "torchrun"],
)
def test_a_job_killed_without_a_traceback_is_a_crash(tmp_path: Path, line: str) -> None:
    """The kernel's OOM killer or a launcher seeing a rank die: no traceback, the job is dead (QA)."""
    found = _check(tmp_path, [*megatron_records(10, 50), line])
    assert [(d, s, step, m) for d, s, step, _, m in found] == [
        ("trainer_error", "critical", 500, f"trainer error: {line}")
    ], found


def test_an_error_after_slurms_time_limit_is_a_warning(tmp_path: Path) -> None:
    limit = "slurmstepd: error: *** JOB 1999618 ON r6i4n5 CANCELLED AT 2021-05-27T21:52:36 DUE TO TIME LIMIT ***"
    found = _check(tmp_path, [*megatron_records(10, 50), limit, *OOM])
    assert [(s, step) for _, s, step, _, _ in found] == [("warning", 500)], found


FROZEN = [
    "Traceback (most recent call last):",
    '  File "/w/pretrain_gpt.py", line 5, in <module>',
    "    from megatron import get_args",
    '  File "<frozen importlib._bootstrap>", line 1027, in _find_and_load',
    '  File "/w/apex/__init__.py", line 9, in <module>',
    "    import amp_C",
    "ModuleNotFoundError: No module named 'amp_C'",
]


@pytest.mark.parametrize("label", ["", "0: "])
def test_frames_without_source_under_srun_labels(tmp_path: Path, label: str) -> None:
    """A frame Python shows no source for (`<frozen ...>`) put the source lines of srun's
    unindented frames off by one: the exception was eaten as a source line (review)."""
    found = _check(tmp_path, [*megatron_records(10, 50), *(label + line for line in FROZEN)])
    assert [(s, m) for _, s, _, _, m in found] == [("critical", f"trainer error: {FROZEN[-1]}")]


@pytest.mark.parametrize(
    "cut",
    [
        FROZEN[:1],  # the header alone
        FROZEN[:3],  # a frame and its source
        ["Exception ignored in: <function Pool.__del__>", *FROZEN[:3]],
        [line.strip() for line in FROZEN[:2]],  # srun-labelled, unindented
        [*FROZEN[:3], "Warning: the traceback above was cut"],
    ],
    ids=["header", "frame", "ignored", "unindented-frame", "warning-line"],
)
def test_a_record_cutting_a_traceback_short_is_read(tmp_path: Path, cut: list[str]) -> None:
    """Megatron's records start with a space: taken for a frame, the record after a traceback
    cut short was lost (review); a `Warning:` line cutting it is no exception either."""
    lines = [*megatron_records(10, 50), *cut, *megatron_records(510, 10)]
    log = tmp_path / "run.log"
    log.write_text("\n".join(lines) + "\n")
    p = no_traceback(run_cli("check", "--output", "json", str(log)))
    report = json.loads(p.stdout)
    assert report["files"][0]["records"] == 60 and report["alerts"] == [], report["alerts"]


@pytest.mark.parametrize(
    "end",
    [
        ["torch.distributed.elastic.multiprocessing.api.SignalException: Process 4021 got signal: 15"],
        ["[2024-03-08 08:00:30,100] [INFO] [launch.py:351:main] Process 4021 exits with return code = 0"],
    ],
    ids=["torchrun-sigterm", "clean-exit"],
)
def test_a_run_stopped_on_purpose_is_no_crash(tmp_path: Path, end: list[str]) -> None:
    """scancel or a time limit reaches torchrun as SIGTERM, which it raises (review)."""
    assert _check(tmp_path, [*megatron_records(10, 50), *FROZEN[:3], *end]) == []

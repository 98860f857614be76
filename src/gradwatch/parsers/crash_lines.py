"""One-line reports of a crash or of the run's end, whoever printed them: the trainer (CUDA,
NCCL, Megatron), a launcher (torchrun, DeepSpeed, Lightning, srun, mpirun), Slurm, a shell.

A crash is one of two things. A cause: a CUDA or NCCL error, a collective timeout, the OOM
killer, a node failure, a segfault caught by Python. Or a death report: a launcher or shell
saying that a process it watched died (an exit code, a signal); before the run's end it is the
only sign of a crash whose traceback went elsewhere, after it the end's own echo (`scancel`
and a time limit kill the processes, which then exit with a code). A stop on purpose (Ctrl-C,
SIGTERM, Slurm's time limit, preemption or a user's `scancel`) and a trainer's own "done" are
the run's end. A `NCCL WARN` is a crash where it says something failed, not where it warns
about the setup (`Missing "iommu=pt"`); a CUDA OOM is one where it is an exception's message,
even glued onto a progress bar, not where a trainer (fairseq) caught it and skips the batch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gradwatch.events import EventKind

#: causes, anywhere in a line
_CAUSES = (
    "Unexpected result nan",  # Megatron's NaN checks (`nonfinite` reports them, `Event.reports_nan`)
    "found NaN in local",
    "Spiky loss",
    "CUDA error:",
    "NCCL error",
    "cudaError",
    "Watchdog caught collective operation timeout",
    "ProcessGroupNCCL watchdog hang",  # newer torch: `Terminating the process ... due to ... watchdog hang`
    "oom-kill event",  # slurmstepd: the kernel's OOM killer took a process of the job (no traceback)
    "oom_kill event",  # (newer Slurm: `Detected 1 oom_kill event in StepId=123.0`)
    "Fatal Python error",  # faulthandler: `Fatal Python error: Segmentation fault`, `Aborted`
)
#: death reports, anywhere in a line (a clean exit aside)
_DEATHS = (
    "exits with return code =",  # DeepSpeed's launcher (`= 0` when clean)
    "failed (exitcode:",  # torchrun (torch.distributed.elastic)
    "Forcefully terminating all other processes",  # Lightning: `Child process with PID N terminated with code C`
    "exited on signal",  # mpirun: `process rank 3 with PID 0 on node n1 exited on signal 9 (Killed)`
    "Exited with exit code",  # srun, and its imitators (`= 0` never printed by srun; taken as clean)
)
_CLEAN_EXIT = re.compile(r"exits with return code = 0\b|Exited with exit code 0\b")
#: the run's end on purpose, anywhere in a line
_ENDS = (
    "exiting program",  # Megatron: `[exiting program after N minutes]`, `exiting program at iteration N`
    "[after training is done]",  # Megatron
    "Training completed",  # HF Trainer
    "`Trainer.fit` stopped:",  # Lightning: `max_epochs=10` reached
    "Detected KeyboardInterrupt",  # Lightning's Ctrl-C: `attempting graceful shutdown`
    "Execution finished",  # ALCF ezpz launcher
    "Job finished",
    "received SIGTERM, exiting",  # DeepSpeed's launcher, killed (a time limit, scancel)
    "DUE TO TIME LIMIT",  # slurmstepd: `*** JOB 123 ON nid01 CANCELLED AT ... DUE TO TIME LIMIT ***`
)
#: slurmstepd on a job or step: `*** JOB 123 ON node-1 CANCELLED AT <time> [DUE TO <why>] ***`
#: (older Slurm: without `ON node`), or `*** JOB 123 FAILED (non-zero exit code or other failure mode) ***`
_SLURM = re.compile(
    r"\*\*\* (?:JOB|STEP) \S+ (?:ON \S+ )?(?:CANCELLED AT \S+(?: DUE TO (?P<why>[^*]+?))? \*\*\*|(?P<failed>FAILED)\b)"
)
_SLURM_WORDS = ("*** JOB ", "*** STEP ")
#: Slurm's reasons to cancel that are no crash: the user's `scancel` gives none
_SLURM_STOPS = ("TIME LIMIT", "PREEMPTION")
#: how a shell names a signal that killed its child (bash's `strsignal`); SIGTERM is a stop
_SIGNALS = ("Segmentation fault", "Bus error", "Killed", "Aborted", "Floating point exception", "Illegal instruction")
_STOP_SIGNAL = "Terminated"
_SIGNAL = "|".join((*_SIGNALS, _STOP_SIGNAL))
_SRUN_OOM = "Out Of Memory"  # srun: a task's cgroup ran out of memory
#: the signal alone on its line (`Segmentation fault (core dumped)`), a script's job report
#: (`run.sh: line 12: 4242 Killed    python train.py`), srun's `srun: error: node-1: task 3: Bus error`
_SIGNAL_REPORT = re.compile(
    rf"^\s*(?P<alone>{_SIGNAL})(?: \(core dumped\))?\s*$"
    rf"|\bline \d+: +\d+ (?P<job>{_SIGNAL})\b"
    rf"|srun: error: \S+: tasks? [\d,\[\]-]+: (?P<task>{_SIGNAL}|{_SRUN_OOM})\b"
)
_SIGNAL_WORDS = (*_SIGNALS, _STOP_SIGNAL, _SRUN_OOM)
_NCCL_WARN = "NCCL WARN"
#: a `NCCL WARN` that says something failed: `Got completion from peer ... with status=12`, `Call to
#: ibv_create_cq failed`, `Cuda failure 'out of memory'`, `socketProgress: Connection closed by remote peer`
_NCCL_FAILED = re.compile(r"(?i)fail|\berror|Got completion|connection closed|abort|timed? ?out")
#: ... except where NCCL goes on without it: old NCCL falling back to sockets without InfiniBand
#: (`Failed to open libibverbs.so[.1]`), a network plugin not found, a connection retried
_NCCL_GOES_ON = re.compile(r"libibverbs|Plugin|retrying")
#: a CUDA (or ROCm) OOM as an exception's message (`torch.OutOfMemoryError: CUDA out of memory.`),
#: wherever it starts in the line (after a bar)
_OOM_WORDS = ("CUDA out of memory", "HIP out of memory")
_OOM = re.compile(r"\w(?:Error|Exception): (?:CUDA|HIP) out of memory")

#: what the errors parser's `scan` must find for the lines `classify` reads
KEYWORDS = (*_CAUSES, *_DEATHS, *_ENDS, *_SLURM_WORDS, *_SIGNAL_WORDS, _NCCL_WARN, *_OOM_WORDS)


@dataclass(frozen=True)
class CrashLine:
    """What a line says: a crash (`EventKind.ERROR`) or the run's end (`EventKind.RUN_END`)."""

    kind: EventKind
    #: a launcher or shell reporting a process's death: no cause of its own (see the module's docstring)
    death: bool = False


_STOP = CrashLine(EventKind.RUN_END)
_CAUSE = CrashLine(EventKind.ERROR)
_DEATH = CrashLine(EventKind.ERROR, death=True)


def classify(text: str) -> CrashLine | None:
    """What a line reports, or None: most lines report nothing. (Plain searches first: the
    errors parser is offered every line that another parser's keywords found.)"""
    if any(word in text for word in _SIGNAL_WORDS) and (m := _SIGNAL_REPORT.search(text)):
        return _STOP if _STOP_SIGNAL in (m.group("alone"), m.group("job"), m.group("task")) else _DEATH
    if any(word in text for word in _SLURM_WORDS) and (m := _SLURM.search(text)):
        why = m.group("why")
        if m.group("failed") is None and (why is None or why.startswith(_SLURM_STOPS)):
            return _STOP
        return _CAUSE if m.group("failed") is None else _DEATH
    if any(cause in text for cause in _CAUSES) or _nccl_failed(text) or _oom(text):
        return _CAUSE
    if any(death in text for death in _DEATHS):
        return None if _CLEAN_EXIT.search(text) else _DEATH
    if any(end in text for end in _ENDS):
        return _STOP
    return None


def _nccl_failed(text: str) -> bool:
    at = text.find(_NCCL_WARN)
    if at < 0:
        return False
    message = text[at + len(_NCCL_WARN) :]
    return _NCCL_FAILED.search(message) is not None and _NCCL_GOES_ON.search(message) is None


def _oom(text: str) -> bool:
    return any(word in text for word in _OOM_WORDS) and _OOM.search(text) is not None

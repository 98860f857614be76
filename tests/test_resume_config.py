"""resume_config: one alert per restart naming what changed from the start before, both values.

The detector is fed what parsers give (records and config / checkpoint-load events, in line order),
built here; the logs at the end go through the real parsers and the real CLI.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gradwatch.alerts import Alert
from gradwatch.detectors.base import ColumnBatch
from gradwatch.detectors.resume_config import ResumeConfig
from gradwatch.events import Event, EventKind
from gradwatch.records import RecordBuilder, columns_of
from tests.conftest import EXAMPLES, REAL, check_json, real_samples, run_cli
from tests.test_tail import tails  # noqa: F401  (the fixture: `gradwatch tail` subprocesses)

BF16 = {"precision": "bf16", "lr": 3e-4, "seed": 1234, "load_optimizer": True, "data_path": "/data/a"}


def config(line: int, source: str = "megatron-args", **keys: Any) -> Event:
    return Event(EventKind.CONFIG, line, data={"config": keys, "raw": {}, "source": source})


def load(line: int, iteration: int) -> Event:
    return Event(EventKind.CHECKPOINT_LOAD, line, data={"iteration": iteration})


class Log:
    """A run as parsers give it: records and events, numbered by line in the order added."""

    def __init__(self) -> None:
        self.records: list[tuple[int, int, float, float]] = []  # line, step, lr, samples
        self.events: list[Event] = []
        self.line = 0

    def event(self, make: Any, *args: Any, **keys: Any) -> Log:
        self.line += 1
        self.events.append(make(self.line, *args, **keys))
        return self

    def steps(self, first: int, last: int, lr: Any = 3e-4, batch: int = 2048, samples0: int = 0) -> Log:
        """Records of steps first..last; `lr` a number or a function of the step."""
        for step in range(first, last + 1):
            self.line += 1
            value = lr(step) if callable(lr) else lr
            self.records.append((self.line, step, value, float(samples0 + step * batch)))
        return self

    def batches(self, cuts: list[int]) -> list[ColumnBatch]:
        """The log as batches cut after these lines."""
        out, lo = [], 0
        for hi in [*cuts, self.line]:
            rows = [r for r in self.records if lo < r[0] <= hi]
            builder = RecordBuilder()
            if rows:
                line, step, lr, samples = (np.array(c) for c in zip(*rows, strict=True))
                metrics = {"lr": lr.astype(float), "samples": samples.astype(float), "loss": np.full(len(rows), 2.0)}
                nonfinite = np.full(len(rows), "", dtype=object)
                builder.add_columns(step, line, np.full(len(rows), np.nan), metrics, nonfinite, "x")
            events = [e for e in self.events if lo < e.line <= hi]
            out.append(ColumnBatch(columns=columns_of(builder.take_columns() or {}), events=events))
            lo = hi
        return out


def run(log: Log, cuts: list[int] | None = None, detector: ResumeConfig | None = None) -> list[Alert]:
    det = detector or ResumeConfig(path="run.log")
    alerts = [a for batch in log.batches(cuts or []) for a in det.update(batch)]
    return alerts + det.finish()


def story() -> Log:
    """The seed's story: a bf16 run's arguments, a restart with fp16, no optimizer state and the
    LR schedule overridden, from the checkpoint of iteration 400."""
    log = Log().event(config, **BF16).steps(1, 450)
    fp16 = {**BF16, "precision": "fp16", "load_optimizer": False, "override_lr_scheduler": True}
    return log.event(config, **fp16).event(load, 400).steps(401, 420)


def test_the_seeds_story_is_one_warning_naming_every_difference() -> None:
    [alert] = run(story())
    assert (alert.detector, str(alert.severity), alert.step, alert.line) == ("resume_config", "warning", 401, 452)
    assert alert.message == (
        "restart at step 401 (checkpoint of iteration 400 loaded): precision bf16 -> fp16; "
        "optimizer state not loaded (load_optimizer false); override_lr_scheduler true: the LR "
        "schedule is taken from the arguments, not the checkpoint"
    )
    assert "collapses" in alert.hint and "optimizer state" in alert.hint


def test_a_clean_restart_raises_nothing() -> None:
    """The same arguments, the checkpoint loaded, lr and samples going on where they were."""
    log = Log().event(config, **BF16).steps(1, 450).event(config, **BF16).event(load, 400).steps(401, 500)
    assert run(log) == []


def test_a_replay_of_the_same_steps_raises_nothing() -> None:
    """BLOOM's universal-checkpoint restarts: 94768, 94769, 94768, 94768, 94769 ... all equal."""
    log = Log().steps(94768, 94769).steps(94768, 94768).steps(94768, 94770).steps(94768, 94769)
    assert run(log) == []


def test_the_lr_schedule_restarting_is_a_warning() -> None:
    """No configuration printed: the records tell it (warm-up from 0 again after the load)."""
    log = Log().steps(1, 300, lr=lambda s: 3e-4 * min(1.0, s / 100)).event(load, 250)
    log.steps(251, 260, lr=lambda s: 3e-4 * (s - 250) / 100)
    [alert] = run(log)
    assert str(alert.severity) == "warning"
    assert (
        alert.message
        == "restart at step 251 (checkpoint of iteration 250 loaded): lr 0.0003 before at step 251 -> 3e-06 after"
    )


def test_a_warm_up_replayed_from_its_checkpoint_is_no_lr_change() -> None:
    """During warm-up the lr moves fast: a restart is compared with the lr at the same step."""
    warm = lambda s: 3e-4 * min(1.0, s / 2000)  # noqa: E731
    log = Log().steps(1, 1500, lr=warm).event(load, 1000).steps(1001, 1100, lr=warm)
    assert run(log) == []


def test_consumed_samples_going_back_and_the_ramp_up_starting_again() -> None:
    rampup = {**BF16, "rampup_batch_size": "192 16 9765625"}
    log = Log().event(config, **rampup).steps(1, 300).event(config, **rampup).event(load, 300)
    log.steps(301, 310, batch=192, samples0=-300 * 192)
    [alert] = run(log)
    assert alert.message == (
        "restart at step 301 (checkpoint of iteration 300 loaded): consumed samples went back: "
        "616,448 before at step 301 -> 192 after; samples per step 2,048 before -> 192 after: the "
        "batch ramp-up started again (rampup_batch_size 192 16 9765625)"
    )


def test_seed_and_data_path_alone_are_info() -> None:
    changed = {**BF16, "seed": 42, "data_path": "/data/b"}
    log = Log().event(config, **BF16).steps(1, 100).event(config, **changed).event(load, 100).steps(101, 110)
    [alert] = run(log)
    assert str(alert.severity) == "info"
    assert alert.message.endswith("): seed 1234 -> 42; data_path /data/a -> /data/b")


def test_blocks_are_compared_with_the_same_block_before() -> None:
    """Megatron's `initial_scale_power` 32 and the DeepSpeed JSON's 12 disagree at every start:
    no change; a restart that prints only the arguments is no change either."""
    log = Log().event(config, **BF16, initial_scale_power=32)
    log.event(config, "deepspeed-json", initial_scale_power=12).steps(1, 100)
    log.event(config, **BF16, initial_scale_power=32).event(load, 100).steps(101, 110)
    assert run(log) == []


def test_a_restart_from_random_weights_is_a_warning() -> None:
    log = Log().event(config, **BF16).steps(1, 100).event(config, **BF16)
    log.event(lambda line: Event(EventKind.START_FROM_RANDOM, line)).steps(1, 10)
    [alert] = run(log)
    assert (
        alert.message
        == "restart at step 1 (started from random weights): no checkpoint found: started from random weights"
    )


def test_a_first_start_is_judged_alone_only_when_it_continues_a_run() -> None:
    no_optim = {**BF16, "load_optimizer": False}
    fresh = Log().event(config, **no_optim).steps(1, 20)
    assert run(fresh) == []
    continued = Log().event(config, **no_optim).event(load, 24000).steps(24001, 24020)
    [alert] = run(continued)
    assert alert.message == (
        "restart at step 24001 (checkpoint of iteration 24000 loaded): optimizer state not loaded "
        "(load_optimizer false)"
    )


def test_the_end_of_a_previous_log_is_the_start_before_the_first() -> None:
    old = ResumeConfig(path="job1.log")
    run(Log().event(config, **BF16).steps(1, 450), detector=old)
    new = ResumeConfig(path="job2.log")
    new.continue_from(old.end())
    log = Log().event(config, **{**BF16, "precision": "fp16"}).event(load, 400).steps(401, 420)
    [alert] = run(log, detector=new)
    assert (
        alert.message
        == "restart at step 401 (checkpoint of iteration 400 loaded, after job1.log): precision bf16 -> fp16"
    )
    assert str(alert.severity) == "warning"


@pytest.mark.parametrize("seed", range(5))
def test_alerts_do_not_depend_on_batch_boundaries(seed: int) -> None:
    log = story()
    log.event(config, **{**BF16, "seed": 7}).event(load, 410).steps(411, 430, lr=1e-5)
    log.steps(425, 440)
    whole = run(log)
    assert len(whole) == 3, whole
    cuts = sorted(random.Random(seed).sample(range(1, log.line), 40))
    assert run(log, cuts) == whole
    assert run(log, list(range(1, log.line))) == whole


# ---- logs through the real parsers and CLI ------------------------------------------------------


def arguments(**args: Any) -> list[str]:
    """Megatron's `arguments` block (keys padded with dots, as every fork prints them)."""
    lines = ["------------------------ arguments ------------------------"]
    lines += [f"  {key} {'.' * (48 - len(key))} {value}" for key, value in sorted(args.items())]
    return [*lines, "-------------------- end of arguments ---------------------"]


def iterations(first: int, last: int, lr: float = 6e-5, batch: int = 2048, samples0: int = 0) -> list[str]:
    """Megatron-DeepSpeed `iteration N/M` lines, steps first..last."""
    return [
        f" iteration {step:8d}/  100000 | consumed samples: {samples0 + step * batch:12d} | "
        f"elapsed time per iteration (ms): 9965.1 | learning rate: {lr:.3E} | global batch size: {batch:5d} | "
        f"lm loss: {2.1 + (step % 7) / 100:.6E} | loss scale: 1.0 | grad norm: {0.2 + (step % 5) / 100:.3f} | "
        "num zeros: 0.0 | number of skipped iterations:   0 | number of nan iterations:   0 |"
        for step in range(first, last + 1)
    ]


def loading(iteration: int) -> list[str]:
    return [
        f" loading checkpoint from /ckpt at iteration {iteration}",
        f"  successfully loaded checkpoint from /ckpt at iteration {iteration}",
    ]


BF16_ARGS = {"bf16": True, "fp16": False, "lr": 6e-5, "seed": 1234, "no_load_optim": None, "finetune": False}
FP16_ARGS = {**BF16_ARGS, "bf16": False, "fp16": True, "no_load_optim": True, "override_lr_scheduler": True}


def write(path: Path, *parts: list[str]) -> Path:
    path.write_text("\n".join(line for part in parts for line in part) + "\n")
    return path


def audits(result: dict[str, Any]) -> list[tuple[str, int | None, str]]:
    return [(a["severity"], a["step"], a["message"]) for a in result["alerts"] if a["detector"] == "resume_config"]


def test_a_restart_in_fp16_without_optimizer_state_in_one_log(tmp_path: Path) -> None:
    log = write(
        tmp_path / "run.log",
        arguments(**BF16_ARGS),
        iterations(1, 450),
        arguments(**FP16_ARGS),
        loading(400),
        iterations(401, 420),
    )
    assert audits(check_json(str(log))) == [
        (
            "warning",
            401,
            "restart at step 401 (checkpoint of iteration 400 loaded): precision bf16 -> fp16; optimizer "
            "state not loaded (load_optimizer false); override_lr_scheduler true: the LR schedule is taken "
            "from the arguments, not the checkpoint",
        )
    ]


def test_a_clean_restart_in_one_log_raises_nothing(tmp_path: Path) -> None:
    log = write(
        tmp_path / "run.log",
        arguments(**BF16_ARGS),
        iterations(1, 450),
        arguments(**BF16_ARGS),
        loading(400),
        iterations(401, 480),
    )
    assert check_json(str(log))["alerts"] == []


def test_check_previous_compares_the_first_start_with_the_old_logs_last(tmp_path: Path) -> None:
    old = write(tmp_path / "slurm-1234.out", arguments(**BF16_ARGS), iterations(1, 450))
    new = write(tmp_path / "slurm-1235.out", arguments(**{**BF16_ARGS, "fp16": True, "bf16": False}), loading(400))
    new.write_text(new.read_text() + "\n".join(iterations(401, 420, lr=3e-4)) + "\n")
    assert audits(check_json(str(new))) == []  # alone, the new log says nothing of a change
    p = run_cli("check", "--output", "json", "--previous", str(old), str(new))
    assert p.returncode == 1, p.stderr
    assert audits(json.loads(p.stdout)) == [
        (
            "warning",
            401,
            f"restart at step 401 (checkpoint of iteration 400 loaded, after {old}): precision bf16 -> "
            "fp16; lr 6e-05 before at step 401 -> 0.0003 after",
        )
    ]
    same = write(tmp_path / "slurm-1236.out", arguments(**BF16_ARGS), loading(450), iterations(451, 470))
    p = run_cli("check", "--output", "json", "--previous", str(old), str(same))
    assert p.returncode == 0 and audits(json.loads(p.stdout)) == [], p.stdout


def test_previous_that_does_not_exist_is_a_usage_error(tmp_path: Path) -> None:
    log = write(tmp_path / "run.log", iterations(1, 20))
    p = run_cli("check", "--previous", str(tmp_path / "nope.log"), str(log))
    assert p.returncode == 2 and "Traceback" not in p.stderr and "nope.log" in p.stderr


def test_tail_previous_audits_the_first_start(tmp_path: Path, tails: Any) -> None:  # noqa: F811
    old = write(tmp_path / "job1.log", arguments(**BF16_ARGS), iterations(1, 450))
    new = write(tmp_path / "job2.log", arguments(**FP16_ARGS), loading(400), iterations(401, 420))
    t = tails(str(new), "--previous", str(old))
    t.started()
    summary = t.stop()
    found = [o for o in t.objs if o["type"] == "alert" and o["detector"] == "resume_config"]
    assert [(o["severity"], o["step"]) for o in found] == [("warning", 401)], t.objs
    assert "precision bf16 -> fp16" in found[0]["message"] and f"after {old}" in found[0]["message"]
    assert summary["exit_code"] == 1


def test_the_shipped_resume_example_prints_no_configuration_so_its_audit_is_quiet() -> None:
    """It starts at the load of iteration 24000 with no arguments block: nothing to compare with."""
    assert audits(check_json(str(EXAMPLES / "megatron-ds-fp16-resume-collapse.log"))) == []


@pytest.mark.parametrize(
    "name",
    [
        "megatron-deepspeed/bloom-tr11-176b-universal-ckpt-resume-others-94768.log",
        "megatron-deepspeed/bloom-tr11-176b-universal-ckpt-resume-tp1pp72-94768.log",
        "megatron-deepspeed/bigscience-tr8b-104b-emb-norm-exp07-resume-spike-overflow.log",
        "megatron-deepspeed/alcf-auroragpt2b-cooldown-resume-loss12-iter136004.log",
        "megatron-deepspeed/bigscience-2021-megds-3d-ds-on-full.log",
    ],
)
def test_real_restarts_that_change_nothing_raise_nothing(name: str) -> None:
    real_samples()
    assert audits(check_json(str(REAL / name))) == []


def test_the_audit_of_a_log_does_not_depend_on_where_its_bytes_were_cut() -> None:
    from gradwatch import config as settings
    from gradwatch.pipeline import FileCheck

    lines = [*arguments(**BF16_ARGS), *iterations(1, 450), *arguments(**FP16_ARGS), *loading(400)]
    lines += [*iterations(401, 430, lr=3e-4), *loading(420), *iterations(421, 440, lr=3e-4)]
    data = ("\n".join(lines) + "\n").encode()

    def audit(sizes: list[int]) -> list[tuple[Any, ...]]:
        check = FileCheck("run.log", settings.load())
        check.detectors = [ResumeConfig(path="run.log")]
        alerts, pos = [], 0
        for size in [*sizes, len(data)]:
            alerts += check.feed(data[pos : pos + size])
            pos += size
        alerts += check.close()
        return [(a.step, a.line, str(a.severity), a.message) for a in alerts]

    whole = audit([])
    assert [step for step, *_ in whole] == [401], whole
    rng = random.Random(3)
    assert audit([rng.randint(1, 3000) for _ in range(60)]) == whole


def collapsing(first: int, last: int, scale0: float = 8192.0) -> list[str]:
    """fp16 iterations after a bad resume: every step overflows and skips (the scale halves to 1),
    the loss far above its level before."""
    lines = []
    for k, step in enumerate(range(first, last + 1)):
        scale = max(scale0 / 2**k, 1.0)
        lines.append(
            f" iteration {step:8d}/  100000 | consumed samples: {step * 2048:12d} | "
            f"elapsed time per iteration (ms): 9965.1 | learning rate: 6.000E-05 | global batch size:  2048 | "
            f"lm loss: {7.5 + k / 10:.6E} | loss scale: {scale:.1f} | grad norm: {40.0 + k:.3f} | "
            "num zeros: 0.0 | number of skipped iterations:   1 | number of nan iterations:   0 |"
        )
    return lines


def test_the_seeds_story_end_to_end_is_one_critical_incident_naming_precision_and_optimizer(tmp_path: Path) -> None:
    """A bf16 run's arguments, a restart in fp16 without optimizer state, overflows every step and
    the loss scale falling to 1: one critical incident, told from the restart, whose headline names
    the precision change and the optimizer state."""
    log = write(
        tmp_path / "run.log",
        arguments(**BF16_ARGS),
        iterations(1, 450),
        arguments(**FP16_ARGS),
        loading(400),
        iterations(401, 410),
        collapsing(411, 430),
    )
    result = check_json(str(log))
    incidents = result["incidents"]
    assert len(incidents) == 1, incidents
    incident = incidents[0]
    assert incident["severity"] == "critical"
    assert "bf16 -> fp16" in incident["headline"] and "optimizer state not loaded" in incident["headline"]
    assert {a["incident"] for a in result["alerts"] if a["severity"] != "info"} == {incident["id"]}


def test_a_run_of_successive_job_logs_audits_each_jobs_start_against_the_one_before(tmp_path: Path) -> None:
    """`--run` with the `slurm-%j.out` of three jobs, given in an order no glob would fix
    (`slurm-99` sorts after `slurm-100`): each later job's start is a restart of the run, audited
    against the job before, and the incident it causes is told from that restart."""
    first = write(tmp_path / "slurm-99.out", arguments(**BF16_ARGS), iterations(1, 450))
    second = write(tmp_path / "slurm-100.out", arguments(**BF16_ARGS), loading(450), iterations(451, 900))
    fp16 = {**BF16_ARGS, "fp16": True, "bf16": False}
    third = write(tmp_path / "slurm-101.out", arguments(**fp16), loading(900), iterations(901, 950, lr=3e-4))
    alone = run_cli("check", "--output", "json", str(third), str(second), str(first))
    assert audits(json.loads(alone.stdout)) == []  # each file alone says nothing of a change
    p = run_cli("check", "--output", "json", "--run", "job", str(third), str(second), str(first))
    assert p.returncode == 1, p.stderr
    result = json.loads(p.stdout)
    assert [Path(f["path"]).name for f in result["files"]] == ["slurm-99.out", "slurm-100.out", "slurm-101.out"]
    assert audits(result) == [
        (
            "warning",
            901,
            f"restart at step 901 (checkpoint of iteration 900 loaded, after {second}): precision bf16 -> "
            "fp16; lr 6e-05 before at step 901 -> 0.0003 after",
        )
    ]
    (incident,) = [i for i in result["incidents"] if i["severity"] == "warning"]
    assert incident["resumed_at"] == 900 and incident["headline"].startswith("resumed at 900"), incident


def test_rank_files_of_one_job_are_not_successive_jobs(tmp_path: Path) -> None:
    """Two ranks' files log the same steps: one job, no restart between them, whatever their order."""
    rank0 = write(tmp_path / "rank0.log", arguments(**BF16_ARGS), iterations(1, 300))
    rank1 = write(tmp_path / "rank1.log", arguments(**BF16_ARGS), iterations(2, 300))
    p = run_cli("check", "--output", "json", "--run", "job", str(rank1), str(rank0))
    assert p.returncode == 0 and json.loads(p.stdout)["alerts"] == [], p.stdout


def test_the_next_jobs_log_ends_the_incident_of_the_job_before_and_restarts_the_run(tmp_path: Path) -> None:
    """A later job's log that says nothing of a load still starts where the run went on from: an
    incident at the end of the job before is over, and the new job's trouble is its own, told from
    the restart."""

    def spike(lines: list[str], step: int) -> list[str]:
        return [line.replace("grad norm: 0.2", "grad norm: 90.0") if f" {step}/" in line else line for line in lines]

    write(tmp_path / "slurm-7.out", arguments(**BF16_ARGS), spike(iterations(1, 450), 440))
    write(tmp_path / "slurm-8.out", arguments(**BF16_ARGS), spike(iterations(451, 900), 460))
    p = run_cli(
        "check", "--output", "json", "--run", "job", str(tmp_path / "slurm-8.out"), str(tmp_path / "slurm-7.out")
    )
    incidents = json.loads(p.stdout)["incidents"]
    spikes = [i for i in incidents if any(a["detector"] == "grad_norm_spike" for a in i["alerts"])]
    assert [(i["first_step"], i["ended"], i["resumed_at"]) for i in spikes] == [(440, "over", None), (460, "over", 450)]
    assert spikes[1]["headline"].startswith("resumed at 450 (next job's log)"), spikes[1]


def test_tail_run_audits_the_next_jobs_log_when_it_appears(tmp_path: Path, tails: Any) -> None:  # noqa: F811
    """`tail --run` over `slurm-*.out`: the requeued job's log appears while following, and its
    first start is audited against where the job before left the run."""
    write(tmp_path / "slurm-1.out", arguments(**BF16_ARGS), iterations(1, 450))
    t = tails(str(tmp_path / "slurm-*.out"), "--run", "job")
    t.started()
    later = tmp_path / "slurm-2.out"
    write(later, arguments(**FP16_ARGS), loading(400), iterations(401, 420))
    found = t.wait_for(lambda o: o["type"] == "alert" and o["detector"] == "resume_config", what="restart audit")
    assert (found["path"], found["step"]) == (str(later), 401)
    assert "precision bf16 -> fp16" in found["message"] and "slurm-1.out" in found["message"], found
    t.stop()


def test_scan_run_audits_the_next_jobs_log_found_by_a_later_scan(tmp_path: Path) -> None:
    """cron's `scan --run` over `slurm-*.out`: the requeued job's log found at a later scan is
    audited against where the files read before left the run."""
    state = tmp_path / "state.json"
    write(tmp_path / "slurm-1.out", arguments(**BF16_ARGS), iterations(1, 450))

    def scanned() -> list[tuple[str, int | None, str]]:
        p = run_cli("scan", "--run", "job", "--state", str(state), "--output", "json", str(tmp_path / "slurm-*.out"))
        assert p.returncode in (0, 1), p.stderr
        return audits(json.loads(p.stdout))

    assert scanned() == []
    write(tmp_path / "slurm-2.out", arguments(**{**BF16_ARGS, "fp16": True, "bf16": False}), loading(450))
    with (tmp_path / "slurm-2.out").open("a") as fh:
        fh.write("\n".join(iterations(451, 470)) + "\n")
    ((severity, step, message),) = scanned()
    assert (severity, step) == ("warning", 451) and "precision bf16 -> fp16" in message, message
    assert "slurm-1.out" in message, message

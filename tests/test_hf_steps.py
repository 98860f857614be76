"""HF Trainer dicts get the optimizer step where the log tells it (a bar on the dict's line, a
`global_step`/`step` key, DeepSpeed's `step=N, skipped=K` counters), their ordinal only where it
tells nothing, and the file's summary says which; the bulk path counts as one by one does."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gradwatch.parsers.hf_steps import Count, counted_steps
from tests.conftest import REAL
from tests.test_stream import _assert_reads_as_plain, _bulk_records, _parse

_DICT = "{{'loss': {:.4f}, 'grad_norm': 0.5, 'learning_rate': 1e-05, 'epoch': 0.1}}\n"
_COUNTER = (
    "[2024-03-02 08:01:59,824] [INFO] [logging.py:96:log_dist] [Rank 0] step={}, skipped=0, lr=[1e-05], "
    "mom=[(0.9, 0.95)]\n"
)
_BAR_AFTER = "   0%|          | {}/38750 [01:59<128:59:51, 11.99s/it]\n"


def _deepspeed_log(dicts: int, every: int, print_every: int) -> str:
    """Dicts logged every `every` steps, DeepSpeed's counter every `print_every` steps, each dict's
    bar after it (a line-buffered capture)."""
    out = []
    for step in range(1, dicts * every + 1):
        if step % print_every == 0:
            out.append(_COUNTER.format(step))
        if step % every == 0:
            out += [_DICT.format(2 + 1 / step), _BAR_AFTER.format(step)]
    return "".join(out)


def _check(path: Path) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "gradwatch", "check", "--output", "json", str(path)], capture_output=True, text=True
    )
    assert done.returncode in (0, 1), done.stderr
    [summary] = json.loads(done.stdout)["files"]
    return summary  # type: ignore[no-any-return]


def test_a_counter_newer_than_the_previous_dict_is_its_step() -> None:
    start = Count()
    first = start.after(10)
    assert first == Count(10, 1, True)
    second = first.after(20)
    assert second == Count(20, 10, True)  # two told in a row: the stride is `logging_steps`
    assert second.after(None) == Count(30, 10, False)
    assert second.after(20) == Count(30, 10, False)  # the previous dict's own counter: not newer
    assert start.after(None) == Count(1, 1, False)  # nothing told: the ordinal


def test_counted_steps_are_those_of_one_dict_at_a_time() -> None:
    rng = random.Random(3)
    for _ in range(300):
        n = rng.randint(1, 30)
        counters = np.array([rng.choice([-1, -1, rng.randint(0, 200)]) for _ in range(n)], dtype=np.int64)
        start = Count(rng.randint(0, 50), rng.randint(1, 5), rng.random() < 0.5)
        steps, strides, told = counted_steps(start, counters)
        count = start
        for k in range(n):
            count = count.after(None if counters[k] < 0 else int(counters[k]))
            assert (steps[k], strides[k], told[k]) == (count.step, count.stride, count.told)


def test_deepspeed_counters_give_the_dicts_their_optimizer_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """`logging_steps` 10 and DeepSpeed's counter every 10 steps: the dicts are steps 10, 20, ...
    (not 1, 2, ...), read in bulk, as the plain path reads them."""
    data = _deepspeed_log(300, every=10, print_every=10).encode()
    bulk = _bulk_records(monkeypatch)
    fmt, records, _, _ = _parse(data)
    assert fmt == "hf_trainer"
    assert list(records.step) == list(range(10, 3001, 10))
    assert bulk[0] >= 250
    _assert_reads_as_plain(data, seed=5)


def test_sparser_counters_set_the_stride_of_the_dicts_between() -> None:
    """Dicts every step, a counter every 10: ordinals that agree with the counters; dicts every 5
    steps and a counter every 5: 5, 10, ...; the bar after each dict is no step of the next."""
    for every, print_every in ((1, 10), (5, 5), (10, 20)):
        data = _deepspeed_log(200, every=every, print_every=print_every).encode()
        _, records, _, _ = _parse(data)
        steps = list(records.step)
        if print_every == every or every == 1:
            assert steps == list(range(every, 200 * every + 1, every))
        else:  # a counter every other dict: the dicts between follow the last counted one
            assert steps[:2] == [1, 20] and steps[-1] == 2000
        _assert_reads_as_plain(data, seed=every)


def test_a_step_key_tells_the_step() -> None:
    text = "".join(
        f"{{'loss': 2.0, 'grad_norm': 0.5, 'learning_rate': 1e-05, 'epoch': 0.1, 'global_step': {s}}}\n"
        for s in range(50, 1550, 50)
    )
    _, records, _, _ = _parse(text.encode())
    assert list(records.step) == list(range(50, 1550, 50))
    _assert_reads_as_plain(text.encode(), seed=1)


def test_the_summary_says_which_steps_the_records_carry(tmp_path: Path) -> None:
    told = tmp_path / "counted.log"
    told.write_text(_deepspeed_log(40, every=10, print_every=10))
    summary = _check(told)
    assert (summary["layout"], summary["first_step"], summary["last_step"]) == ("optimizer steps", 10, 400)
    ordinal = tmp_path / "ordinal.log"
    ordinal.write_text("".join(_DICT.format(2 + 1 / k) for k in range(1, 41)))
    summary = _check(ordinal)
    assert (summary["layout"], summary["last_step"]) == ("steps: dict ordinals", 40)


@pytest.mark.skipif(not (REAL / "hf-trainer").is_dir(), reason="real samples absent")
def test_real_dicts_without_anything_telling_their_steps_are_ordinals() -> None:
    for path in sorted((REAL / "hf-trainer").glob("*.log")):
        summary = _check(path)
        assert summary["layout"] == "steps: dict ordinals" and summary["first_step"] == 1


def test_a_dict_read_one_by_one_takes_the_counter_read_in_bulk_before_it() -> None:
    """DeepSpeed's counter lines are read a block at once (not this parser's keyword); a dict
    read one by one among bulk ones (a nan grad norm) still takes the counter just before it,
    here 30 steps after the dict before (the dicts of two steps left out), not 10."""
    out, steps = [], []
    for step in range(10, 3001, 10):
        out.append(_COUNTER.format(step))
        if step > 500 and step % 70 in (50, 60):
            continue  # no dict logged: the next dict is read one by one
        odd = step > 500 and step % 70 == 0
        out += [_DICT.replace("0.5", "nan" if odd else "0.5").format(2 + 1 / step), _BAR_AFTER.format(step)]
        steps.append(step)
    text = "".join(out).encode()
    assert b"nan" in text
    _, records, _, _ = _parse(text)
    assert list(records.step) == steps
    _assert_reads_as_plain(text, seed=7)

"""The stream's fast paths read exactly what the plain line-by-line path reads.

`LogStream` searches blocks for candidate lines and reads the main format's records in bulk; both
are optimisations, so the records and events must equal those of offering every line to every
parser, and must not depend on where the input was cut into chunks.
"""

from __future__ import annotations

import pickle
import random
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradwatch.events import EventKind
from gradwatch.parsers import new_parsers
from gradwatch.parsers.base import ParseOutput
from gradwatch.parsers.stream import LOCK_AFTER_RECORDS, LogStream, _decoded
from gradwatch.synth import FORMATS, Anomaly, RunSpec, generate
from tests.conftest import EXAMPLES, real_folders


def _parse(data: bytes, chunks: list[int] | None = None, every_line: bool = False, pickled: bool = False):
    """Format, records, events (with their times; after each batch's, its skip counters as
    (line, step, skipped)) and the clock of each batch (latest time, step, time of that step);
    `pickled`: the stream is pickled and restored after each chunk, as `scan` does between runs."""
    stream = LogStream(new_parsers())
    if every_line:
        stream._scan = None  # the plain path: every line to every parser
    frames, events, clocks = [], [], []
    pos = 0
    for size in [*(chunks or [len(data)]), None]:
        if size is None:
            stream.feed(data[pos:])
            stream.close()
        else:
            stream.feed(data[pos : pos + size])
            pos += size
        batch = stream.take()
        frames.append(batch.records)
        events += batch.events
        skips = batch.skip_counts
        events += zip(skips.line.tolist(), skips.step.tolist(), skips.skipped.tolist(), strict=True)
        clocks.append((batch.last_ts, batch.last_step, batch.last_step_ts))
        if pickled:
            stream = pickle.loads(pickle.dumps(stream))
    records = pd.concat(frames, ignore_index=True)
    events = [e if isinstance(e, tuple) else (e.kind, e.line, e.step, e.ts, sorted(e.data.items())) for e in events]
    return stream.format, records, events, clocks


def _random_chunks(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    sizes, total = [], 0
    while total < n:
        size = rng.choice([1, 7, 100, 4096, 65536])
        sizes.append(size)
        total += size
    return sizes


def _assert_same(a, b) -> None:
    assert a[0] == b[0]
    pd.testing.assert_frame_equal(a[1], b[1], check_exact=True)  # times: to the bit, not to 1e-5
    assert a[2] == b[2]
    # the clock of each batch (of the last one when the input was cut differently)
    assert a[3] == b[3] if len(a[3]) == len(b[3]) else a[3][-1] == b[3][-1]


def _assert_reads_as_plain(data: bytes, seed: int) -> None:
    """The fast paths read `data` as the plain path does, whole and cut at random chunk boundaries."""
    _assert_same(_parse(data), _parse(data, every_line=True))
    chunks = _random_chunks(len(data), seed=seed)
    _assert_same(_parse(data, chunks), _parse(data, chunks, every_line=True))


def _synth(fmt: str) -> bytes:
    spec = RunSpec(fmt=fmt, steps=600, seed=3, anomalies=(Anomaly("grad_norm_spike", 400),))
    return "".join(generate(spec)).encode()


@pytest.mark.parametrize("fmt", FORMATS)
def test_fast_paths_equal_the_plain_path_on_synthetic_logs(fmt: str) -> None:
    data = _synth(fmt)
    plain = _parse(data, every_line=True)
    assert len(plain[1]) > 50, "the generator's log should be read"
    _assert_same(_parse(data), plain)
    chunks = _random_chunks(len(data), seed=1)
    _assert_same(_parse(data, chunks), _parse(data, chunks, every_line=True))


def _real_files() -> list[Path]:
    return sorted(path for folder in real_folders() for path in folder.rglob("*.log"))


@pytest.mark.parametrize("path", _real_files(), ids=lambda p: p.name[:40])
def test_fast_paths_equal_the_plain_path_on_real_logs(path: Path) -> None:
    data = path.read_bytes()
    plain = _parse(data, every_line=True)
    _assert_same(_parse(data), plain)
    chunks = _random_chunks(len(data), seed=2)
    _assert_same(_parse(data, chunks), _parse(data, chunks, every_line=True))


def test_real_logs_are_present_or_this_says_why() -> None:
    if not _real_files():
        pytest.skip("real samples not present: ../shared/samples/real (third-party logs, not shipped)")


def test_a_format_known_before_a_record_closed_by_a_line_no_parser_takes_locks_as_read_one_by_one() -> None:
    """OLMo's 20th record is closed by a line no parser takes, so nothing locks the format there;
    one by one it locks at the next record's first line, and an HF evaluation dict after it is no
    record. The fast path spent its one lock check a block on a line with no bulk record before
    it, and read the dict as a record."""

    def record(k: int) -> list[str]:
        return [f"2024-03-02 08:00:{k:02d}.000 node-025:0  olmo.train:908  INFO    [step={k}/100,epoch=0]",
                "    train/CrossEntropyLoss=3.1"]  # fmt: skip

    save = "[2024-03-02 08:10:59,126] [INFO] [engine.py:3000:save] saving a checkpoint"
    lines = [line for k in range(1, 21) for line in record(k)]
    lines += ["NCCL chatter", save, *record(21), save, "{'eval_loss': 2.5, 'eval_runtime': 1.0, 'epoch': 0.5}"]
    data = ("\n".join(lines) + "\n").encode()
    _assert_reads_as_plain(data, seed=5)
    assert _parse(data)[0] == "olmo" and len(_parse(data)[1]) == 21


@pytest.mark.parametrize("wrapped", [17, 200])
def test_a_rank_copy_read_in_bulk_is_dropped_however_many_records_follow_it(wrapped: int) -> None:
    """Another rank's copy of the last record of a block opens the next one, then come records
    hard-wrapped over two lines (read one by one): the copy, read in bulk when the block is
    done, is told from the records before it. It was kept once 16 records came after it."""
    line = (
        " iteration {:8d}/  159576 | consumed samples:       488048 | elapsed time per iteration (ms): 61947.6 | "
        "learning rate: 6.000E-05 | global batch size:   176 | lm loss: 3.317482E+00 | loss scale: 65536.0 | "
        "grad norm: 23.4 | num zeros: 0.0 | number of skipped iterations:   0 | number of nan iterations:   0 |"
    )
    head = "".join(line.format(k) + "\n" for k in range(1, 31))
    rest = [line.format(30)]  # the copy
    for k in range(31, 31 + wrapped):
        record = line.format(k)
        cut = record.index("| lm loss")
        rest += [record[:cut], record[cut:]]
    data = (head + "\n".join(rest) + "\n").encode()
    cut_at_copy = [len(head.encode())]
    read = _parse(data, cut_at_copy)
    _assert_same(read, _parse(data, cut_at_copy, every_line=True))
    assert len(read[1]) == 30 + wrapped


def test_bulk_path_reads_a_nan_step_and_a_validation_record_in_order() -> None:
    """A record of another shape in the middle of bulk-read records keeps its place and its NaN flag."""
    line = (
        " iteration {:8d}/  159576 | consumed samples:       488048 | elapsed time per iteration (ms): 61947.6 | "
        "learning rate: 6.000E-05 | global batch size:   176 |{loss} loss scale: 65536.0 | grad norm: 23.4 | "
        "num zeros: 0.0 | number of skipped iterations:   0 | number of nan iterations:   0 |\n"
    )
    text = "".join(line.format(i, loss=" lm loss: 3.317482E+00 |") for i in range(1, 2000))
    text += line.format(2000, loss="")
    text += " validation loss at iteration 2000 | lm loss value: 7.174200E+00 | lm loss PPL: 1.305315E+03 |\n"
    text += "".join(line.format(i, loss=" lm loss: 3.317482E+00 |") for i in range(2001, 4000))
    data = (text * 3).encode()  # and a second and third pass: the step goes back (a resume)
    fast = _parse(data, chunks=[len(data) // 3, len(data) // 3])
    _assert_same(fast, _parse(data, every_line=True))
    records = fast[1]
    nan_rows = records[records.nonfinite == "loss"]
    assert list(nan_rows.step) == [2000, 2000, 2000]
    assert records.line.is_monotonic_increasing


# ---- the bulk readers of JSON lines, HF Trainer dicts and torchtitan lines --------------------

BULK_FORMATS = ("megatron-deepspeed", "jsonl", "hf-trainer", "torchtitan")
_TRACEBACK = 'Traceback (most recent call last):\n  File "train.py", line 3, in <module>\n    main()'
_TITAN = "[rank0]:[titan] 2024-03-02 08:00:30,325 - root - INFO - "
_BAR = " 10%|█         | {}/100000 [00:10<01:30,  1.00s/it]"
_DS_PROGRESS = (
    "[2024-03-02 10:32:28,543] [INFO] [logging.py:60:log_dist] [Rank 0] step={n}, skipped=5, "
    "lr=[2.712e-05, 2.712e-05], mom=[(0.9, 0.95), (0.9, 0.95)]"
)
_DS_OVERFLOW = (
    "[2024-03-02 08:00:29,825] [INFO] [loss_scaler.py:181:update_scale] [deepspeed] OVERFLOW! "
    "Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768"
)
#: Lines that must go one by one, per format: each makes a replacement for a record line (and
#: its step); several are not records at all, some open a traceback over the lines that follow.
ODD_LINES = {
    "jsonl": [
        lambda s, n: s.replace('"loss": ', '"loss": NaN, "x": ', 1),
        lambda s, n: s.replace('"loss": ', '"loss": "nan", "x": ', 1),
        lambda s, n: '{"loss": 1.5, "lr": 0.1}',  # no step: the one after the previous record's
        lambda s, n: f'{{"step": {n}, "loss": null, "grad_norm": null}}',  # not a record
        lambda s, n: s.replace(", ", ",").replace(": ", ":"),
        lambda s, n: " " + s,
        lambda s, n: s.replace('"loss": ', '"loss": -0, "x": ', 1),
        lambda s, n: s.replace('"loss": ', '"loss": 1e400, "x": ', 1),
        lambda s, n: re.sub(r'("loss": [-0-9.]*)[0-9]', "\\g<1>\u0661", s, count=1),  # not a digit to json
        lambda s, n: s.replace('{"step": ', '{"step": 0', 1),  # not JSON
        lambda s, n: "[rank1]:" + s,
        lambda s, n: "\x1b[32m" + s,
        lambda s, n: s[: len(s) // 2] + "\r" + s[len(s) // 2 :],
        lambda s, n: s.replace('"loss"', '"val_loss": 3.5, "loss"', 1),
        lambda s, n: s[: len(s) // 2],
        lambda s, n: s.replace(f'"step": {n},', f'"step": {max(0, n - 7)},', 1),
        lambda s, n: s.replace('"loss"', '"train": {"x": 1}, "loss"', 1),
        lambda s, n: s.replace('"loss"', '"flag": true, "loss"', 1),
        lambda s, n: s.replace('"step": ', '"iteration": 7, "step": ', 1),
        lambda s, n: _TRACEBACK,
        lambda s, n: "ValueError: bad batch",
        lambda s, n: s + "\n" + s,
        # values and spacing that the layout search (jsonl_rows) must hand to the regex or per line
        lambda s, n: s.replace('"loss": ', '"loss": 00', 1),
        lambda s, n: s.replace('"loss": ', '"loss": +', 1),
        lambda s, n: s.replace('"loss": ', '"loss": .', 1),
        lambda s, n: re.sub(r'"loss": [^,]*', '"loss": 1e100', s),
        lambda s, n: re.sub(r'"loss": [^,]*', '"loss": -0', s),
        lambda s, n: re.sub(r'"loss": [^,]*', '"loss": 5.', s),
        lambda s, n: re.sub(r'"loss": [^,]*', '"loss": Null', s),
        lambda s, n: re.sub(r'"step": \d+', '"step": 1234567890123456', s),
        lambda s, n: re.sub(r'"step": \d+', '"step": null', s),
        lambda s, n: s.replace(", ", ",\t", 1),
        lambda s, n: s.replace(": ", ":  ", 1),
        lambda s, n: s.replace("}", "} ", 1),
        lambda s, n: s.replace('"loss"', '"Loss"', 1),
        lambda s, n: s.replace("{", "{\0", 1),
    ],
    "hf-trainer": [
        lambda s, n: s.replace("'loss': ", "'loss': nan, 'x': ", 1),
        lambda s, n: s.replace("'loss': ", "'loss': '0.91', 'x': ", 1),
        lambda s, n: _BAR.format(n) + s,  # tqdm glue: the bar's count is the step
        lambda s, n: _BAR.format(n + 3) + "\r" + s,
        lambda s, n: s.replace("'", "\u2018", 2),
        lambda s, n: s + "\n{'eval_loss': 2.5, 'eval_runtime': 1.0, 'epoch': 0.5}",
        # evaluation dicts that the per-line path counts as training dicts (review)
        lambda s, n: s + "\n{'eval_loss': None, 'grad_norm': 0.5, 'epoch': 0.5}",
        lambda s, n: s + "\n{'eval_loss': 0.9, \"loss\": 0.7, 'epoch': 0.5}",
        lambda s, n: s + "\n" + _BAR.format(n + 9) + "\r{'eval_loss': 2.5, 'eval_runtime': 1.0}",
        lambda s, n: s + f"\n  Continuing training from global step {max(0, n - 5)}",
        lambda s, n: "{'train_runtime': 10.0, 'train_loss': 2.0, 'epoch': 1.0}",
        lambda s, n: "{'lr': 0.1, 'batch_size': 8}",
        lambda s, n: s.replace("'loss': ", "'loss': None, 'x': ", 1),
        lambda s, n: s.replace("'loss': ", "'loss': tensor(2.5), 'x': ", 1),
        lambda s, n: re.sub(r"('loss': [-0-9.]*)[0-9]", "\\g<1>\u0661", s, count=1),  # a digit to float()
        lambda s, n: "[rank0]:" + s,
        lambda s, n: s[: len(s) // 2],
        lambda s, n: _TRACEBACK,
        lambda s, n: "ValueError: bad batch",
        lambda s, n: _DS_OVERFLOW,
        lambda s, n: s + "\n" + _BAR.format(n + 2),
        lambda s, n: s + "\n" + s,
        # spacing, values and bars that the layout search (hf_rows) must hand to the regex or per line
        lambda s, n: s.replace(", ", ",  ", 1),
        lambda s, n: s.replace("': ", "':", 1),
        lambda s, n: s.replace(", ", ",\t", 1),
        lambda s, n: s + " \t",
        lambda s, n: s.replace("}", "}\r", 1),
        lambda s, n: " " + s,
        lambda s, n: re.sub(r"'grad_norm': [^,}]*", "'grad_norm': 'high'", s),
        lambda s, n: re.sub(r"'loss': [^,}]*", "'loss': None", s),
        lambda s, n: re.sub(r"'grad_norm': [^,}]*", "'grad_norm': None", s),
        lambda s, n: re.sub(r"'loss': [^,}]*", "'loss': 1e400", s),
        lambda s, n: re.sub(r"'loss': [^,}]*", "'loss': 123456789012345678.5", s),
        lambda s, n: re.sub(r"'loss': [^,}]*", "'loss': 1E-5", s),
        lambda s, n: re.sub(r"'loss': [^,}]*", "'loss': +1.5", s),
        lambda s, n: re.sub(r"'loss': [^,}]*", "'loss': -0", s),
        lambda s, n: re.sub(r"'loss': [^,}]*", "'loss': 00.50", s),
        lambda s, n: re.sub(r"'learning_rate': [^,}]*", "'learning_rate': 5.", s),
        lambda s, n: re.sub(r"('grad_norm': [-0-9.]*)[0-9]", "\\g<1>\u0663", s, count=1),
        lambda s, n: s.replace("}", ", 'extra': 1.0}", 1),
        lambda s, n: re.sub(r", 'epoch': [^}]*", "", s),
        lambda s, n: s.replace("'grad_norm'", "'grad_norm_x'", 1),
        lambda s, n: s.replace("{", "{\0", 1),
        lambda s, n: s + "\n" + _BAR.format(n).replace("|", "\u2502", 1),
        lambda s, n: s + "\n" + _BAR.format(n).replace(" ", "\t", 1),
        lambda s, n: s + "\n" + _BAR.format(n).replace("\u2588", "\r", 1),
        lambda s, n: s + "\n" + _BAR.format("1\u0663"),
        lambda s, n: s + "\n" + _BAR.format(10**15 + n),
        lambda s, n: s + "\n" + _BAR.format(n).replace(" 10%", "1000%"),
        lambda s, n: s + "\n        " + _BAR.format(n),
    ],
    # record lines that the layout search (megatron_rows) must hand to the regex or the per-line path
    "megatron-deepspeed": [
        lambda s, n: re.sub(r"lm loss: \S+", "lm loss: nan", s),
        lambda s, n: re.sub(r"grad norm: \S+", "grad norm: inf", s),
        lambda s, n: re.sub(r"grad norm: \S+", "grad norm: 1e400", s),
        lambda s, n: re.sub(r"lm loss: \S+", "lm loss: ", s),
        lambda s, n: s.replace("lm loss: ", "lm loss: 7 ", 1),
        lambda s, n: s.replace("loss scale: ", "loss scale: 1.2.3", 1),
        lambda s, n: s.replace("grad norm: ", "grad norm: 1e400", 1),
        lambda s, n: s.replace("grad norm: ", "grad norm: +", 1),
        lambda s, n: s.replace("grad norm: ", "grad norm: -", 1),
        lambda s, n: s.replace("grad norm: ", "grad norm: .", 1),
        lambda s, n: s.replace("grad norm: ", "grad norm: e", 1),
        lambda s, n: re.sub(r"consumed samples: +\d+", "consumed samples: 1_000", s),
        lambda s, n: s.replace(" | lm loss", " |\tlm loss", 1),
        lambda s, n: s.replace("lm loss:", "lm  loss:", 1),
        lambda s, n: s.replace("| lm loss", "| x: 1 | lm loss", 1),
        lambda s, n: re.sub(r" lm loss: \S+ \|", "", s),
        lambda s, n: s.replace("iteration ", "iteration=", 1),
        lambda s, n: s.replace("iteration", "xiteration", 1),
        lambda s, n: re.sub(r"iteration +(\d+)/", lambda m: f"iteration {int(m.group(1)) + 10**10}/", s),
        lambda s, n: re.sub(r"iteration +(\d+)/", "iteration 99999999999999999999/", s),
        lambda s, n: "[default3]:" + s,
        lambda s, n: "[2024-03-02 08:00:29,825] " + s,
        lambda s, n: re.sub(r"(lm loss: [-0-9.E+]*)[0-9]", "\\g<1>\u0661", s, count=1),
        lambda s, n: s[: len(s) // 2] + "\r" + s[len(s) // 2 :],
        lambda s, n: s + " ",
        lambda s, n: s.rstrip("| "),
        lambda s, n: s[: len(s) // 2],
        lambda s, n: s + "\n" + s,
        lambda s, n: s + "\n" + s.replace("lm loss: ", "lm loss: 9", 1),
        lambda s, n: _TRACEBACK,
        lambda s, n: _DS_OVERFLOW,
        # DeepSpeed progress lines, which the stream reads all at once where nothing else wants them
        lambda s, n: s + "\n" + _DS_PROGRESS.format(n=n),
        lambda s, n: s + "\n" + _DS_PROGRESS.format(n=n).replace("mom=[", "mom=[checkpoint "),
        lambda s, n: s + "\n" + _DS_PROGRESS.format(n=n).replace("mom=[", "mom=[loss scale "),
        lambda s, n: s + "\n" + _DS_PROGRESS.format(n=n).replace("lr=[", "lr=[]"),
        lambda s, n: s + "\n" + _DS_PROGRESS.format(n=n).replace("-03-", "-13-"),
        lambda s, n: s + "\n[default0]:" + _DS_PROGRESS.format(n=n),
        lambda s, n: s + "\n" + _DS_PROGRESS.format(n=n) + "\r" + _DS_PROGRESS.format(n=n + 1),
        lambda s, n: _TRACEBACK + "\n" + _DS_PROGRESS.format(n=n),
        lambda s, n: s[: len(s) // 2] + "\n" + _DS_PROGRESS.format(n=n),
        lambda s, n: s.rstrip("| ") + "\n" + _DS_PROGRESS.format(n=n) + "\n" + s,
        lambda s, n: _DS_PROGRESS.format(n=123456789012345679 + n),
        # what comes before `iteration` as the per-line path reads it (a review found these)
        lambda s, n: "iteration 3/4 " + s,
        lambda s, n: "x\x1b]0;title\x07" + s.lstrip(),
        lambda s, n: "saving checkpoint at iteration 7\r" + s,
        lambda s, n: "[2024-03-02 09:00:00,000] x\r" + s,
        lambda s, n: "2024-03-02 080000" + s,
        lambda s, n: re.sub(r"(lm loss: \S+) \|", "\\1\\0|", s),
        lambda s, n: re.sub(r"/ +(\d+) \|", "/" + "9" * 400 + " |", s),
        lambda s, n: s.replace("consumed tokens", "consume\td tokens"),
        # Megatron-LM's time before a record, read all at once where it has the usual shape
        lambda s, n: f" [2024-03-02 08:{n % 60:02d}:29]" + s,
        lambda s, n: f"[2024-03-02 08:{n % 60:02d}:29]" + s,
        lambda s, n: "  [2024-03-02 08:00:29]" + s,
        lambda s, n: " [2024-13-02 08:00:29]" + s,
        lambda s, n: " [2024-03-45 08:00:29]" + s,
        lambda s, n: " [0000-03-02 08:00:29]" + s,
        lambda s, n: " [2024-03-02T08:00:29]" + s,
        lambda s, n: " [2024-03-02 08:00:29.5]" + s,
        lambda s, n: " [2024-03-02 0800:29]" + s,
        lambda s, n: " [2024-03-02 08:00:2\u0669]" + s,
        lambda s, n: " [2024-03-02 08:00:29\x1b[0m]" + s,
        lambda s, n: " [2024-03-02 08:00:29] saving checkpoint at iteration 7 " + s,
        lambda s, n: "x" * 60 + " iteration 1/2 " + s,  # an earlier `iteration` past the first 64 characters
        lambda s, n: "[default0]: [2024-03-02 08:00:29]" + s,
    ],
    "torchtitan": [
        lambda s, n: s.replace("loss: ", "loss: nan  x: ", 1),
        lambda s, n: s + f"\n{_TITAN}\x1b[33mvalidate step: {n:2d}  \x1b[32mloss:  3.1234\x1b[39m",
        lambda s, n: s + f"\n{_TITAN}validate step: {n + 5:2d}  loss:  3.1234",
        lambda s, n: s + f"\n{_TITAN}Loading the checkpoint at step {max(1, n - 9)}.",
        lambda s, n: s + f"\n{_TITAN}Training starts at step {max(1, n - 9)}.",
        lambda s, n: s + f"\n{_TITAN}Finished saving the checkpoint (or staging if async is enabled)in 1.23 seconds.",
        lambda s, n: s + "\n" + s.replace("[rank0]:", "[rank1]:", 1),  # a copy from another rank
        lambda s, n: s.replace("[rank0]:", "[default3]:", 1),
        lambda s, n: s.replace("[rank0]:[titan] ", "", 1),
        lambda s, n: s.replace("mfu: ", "mfu: N/A  x: ", 1),
        lambda s, n: s[: len(s) // 2],
        lambda s, n: "\n".join("[rank0]: " + t for t in _TRACEBACK.split("\n")),
        lambda s, n: "[rank0]: ValueError: bad batch",
        lambda s, n: s + f"\n{_TITAN}Training completed",
        lambda s, n: s.replace("2024-03-", "2024-13-", 1),
        lambda s, n: re.sub(r"(loss: +[-0-9.]*)[0-9]", "\\g<1>\u0661", s, count=1),
        lambda s, n: s.replace("[rank0]:", "[rank0]:[rank0]:", 1),
        lambda s, n: s.replace("grad_norm:  ", "grad_norm:  nan  x: ", 1),
        lambda s, n: s + "\n" + s.replace("[rank0]:", "[rank1]:", 1).replace(f"step: {n:2d}", f"step: {n - 1:2d}"),
        lambda s, n: _DS_OVERFLOW,
        # lines the layout search (torchtitan_rows) does not fit, which the regex reads or refuses
        lambda s, n: s.replace("  \x1b[32mloss", "   \x1b[32mloss", 1),
        lambda s, n: s.replace("loss: ", "loss:", 1),
        lambda s, n: s.replace("tflops: ", "tflops:\t", 1),
        lambda s, n: re.sub(r"(loss: +\d+)\.", "\\1x", s, count=1),
        lambda s, n: s.replace("\x1b[32m", "\x1b[33m", 1),
        lambda s, n: re.sub(r"\x1b\[[\d;]*m", "", s),
        lambda s, n: re.sub(r"  \x1b\[[\d;]*mgrad_norm: +\S+", "", s, count=1),
        lambda s, n: re.sub(r"  \x1b\[[\d;]*mgrad_norm: +\S+", "", s, count=1).replace("[rank0]:", "", 1),
        lambda s, n: s.replace("  \x1b[34mtps:", "  \x1b[34mlr: 0.001  \x1b[34mtps:", 1),
        lambda s, n: s + " \t\r",
        lambda s, n: re.sub(r"step: +\d+", "step: 123456789012345", s, count=1),
        lambda s, n: re.sub(r"step: +\d+", "step: 1234567890123456", s, count=1),
        lambda s, n: re.sub(r"mfu: [\d.]+%", "mfu: N/A", s, count=1),
        lambda s, n: re.sub(r"tps: \d+", "tps: 1,234,567", s, count=1),
        lambda s, n: re.sub(r"loss: +\S+", "loss: -1.5e-03", s, count=1),
        lambda s, n: s.replace(" - root - ", " - torchtitan.train - ", 1),
        lambda s, n: s.replace("GiB(", " GiB(", 1),
        lambda s, n: s.replace("[rank0]:", "[rank123456]:", 1),
    ],
}


def _with_odd_lines(fmt: str, seed: int, rate: float) -> bytes:
    """A synthetic run (a resume, an anomaly) with odd lines in place of, or after, record lines:
    at random, then each kind once in turn in the second half."""
    rng = random.Random(seed)
    spec = RunSpec(fmt=fmt, steps=1500, seed=seed, restarts=(700,), anomalies=(Anomaly("loss_spike", 1100),))
    lines = "".join(generate(spec)).split("\n")
    odd = ODD_LINES[fmt]
    for i in range(30, len(lines)):
        if rng.random() < rate:
            lines[i] = rng.choice(odd)(lines[i], i)
    records = [k for k, line in enumerate(lines) if k > len(lines) // 2 and "loss" in line]
    for i, make in zip(records[::20], odd, strict=False):
        lines[i] = make(lines[i], i)
    return "\n".join(lines).encode()


def _bulk_records(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A counter of the records the bulk readers write (one list item, updated in place)."""
    count = [0]
    record_columns = ParseOutput.record_columns

    def counting(self: ParseOutput, parser: str, steps, *args) -> None:
        count[0] += len(steps)
        record_columns(self, parser, steps, *args)

    monkeypatch.setattr(ParseOutput, "record_columns", counting)
    return count


@pytest.mark.parametrize("fmt", BULK_FORMATS)
def test_bulk_readers_take_the_ordinary_record_lines(fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    bulk = _bulk_records(monkeypatch)
    records = _parse("".join(generate(RunSpec(fmt=fmt, steps=2000, seed=5))).encode())[1]
    assert bulk[0] >= 0.95 * len(records), f"{bulk[0]} of {len(records)} records read in bulk"


def _megatron_lm_line(step: int, skipped: bool) -> str:
    """A record as Megatron-LM prints it; a skipped iteration has no grad norm nor num zeros."""
    fields = [
        f"consumed samples: {step * 512:12d}",
        "elapsed time per iteration (ms): 9954.2",
        "learning rate: 3.000000E-04",
        "global batch size:   512",
        f"lm loss: {2 + 1 / step:.6E}",
        "loss scale: 131072.0",
    ]
    if not skipped:
        fields += [f"grad norm: {0.9 + step % 7 / 100:.3f}", "num zeros: 0"]
    fields += [f"number of skipped iterations: {int(skipped):3d}", "number of nan iterations:   0"]
    clock = f"2024-03-02 {step // 3600 % 24:02d}:{step // 60 % 60:02d}:{step % 60:02d}"
    return f" [{clock}] iteration {step:8d}/   98745 | " + " | ".join(fields) + " |\n"


@pytest.mark.parametrize("every", [40, 7])
def test_a_record_of_another_shape_now_and_then_leaves_the_rest_in_bulk(
    every: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fp16 skips an iteration now and then, and Megatron-LM prints it without its grad norm: that
    record is read one by one, and the bulk reader goes on looking for the usual shape (it
    followed the odd one and back, two rescans each, then read the rest of the block one by one)."""
    data = "".join(_megatron_lm_line(step, skipped=step % every == 0) for step in range(1, 3001)).encode()
    bulk = _bulk_records(monkeypatch)
    _assert_same(_parse(data), _parse(data, every_line=True))
    assert bulk[0] >= 3000 - 3000 // every - 10, f"{bulk[0]} of 3000 records read in bulk"


@pytest.mark.parametrize("every_line", [False, True])
def test_a_key_with_a_tab_is_no_template_for_the_usual_keys(every_line: bool) -> None:
    """`consume<tab>d samples` is no field (`norm_key` keeps a tab): the template made of its
    record must not take the next records' `consumed samples` for it. It did, line by line (any
    space between the words), and those records lost their samples until another shape came."""
    lines = [_megatron_lm_line(step, skipped=False) for step in range(1, 41)]
    lines[9] = lines[9].replace("consumed samples", "consume\td samples")
    stream_records = _parse("".join(lines).encode(), every_line=every_line)[1]
    samples = stream_records["samples"].to_numpy()
    assert np.isnan(samples[9]) and not np.isnan(np.delete(samples, 9)).any()


def test_a_rank_copy_after_many_records_of_another_shape_is_one_record() -> None:
    """Records of another shape read one by one (skipped iterations) no longer end a block's
    bulk round: a copy of a record read in bulk is told from its original, read one by one (an
    escape before it), however many came before the round's end (review of 4ef9d03)."""
    lines = []
    for step in range(1, 301):
        line = _megatron_lm_line(step, skipped=step > 100 and step % 5 == 0)
        lines += ["\x1b[0m" + line, line] if step == 100 else [line]
    data = "".join(lines).encode()
    read = _parse(data)
    _assert_same(read, _parse(data, every_line=True))
    assert len(read[1]) == 300


def test_a_nan_step_after_records_read_in_bulk_is_flagged_as_read_one_by_one() -> None:
    """A record without its loss field is a NaN step once a loss was seen: one read in bulk,
    whose block is recorded only after the NaN step was read one by one, counts (it did only
    after the bulk records were written; older)."""
    lines = [_megatron_lm_line(step, skipped=False).replace("lm loss: ", "lm loss: x") for step in range(1, 41)]
    lines += [_megatron_lm_line(step, skipped=False) for step in range(41, 100)]
    lines[59] = re.sub(r" lm loss: \S+ \|", "", lines[59])  # step 60: a NaN step
    data = "".join(lines).encode()
    read = _parse(data)
    _assert_same(read, _parse(data, every_line=True))
    assert read[1]["nonfinite"].tolist()[59] == "loss"


def test_a_change_of_shape_for_good_is_read_in_bulk(monkeypatch: pytest.MonkeyPatch) -> None:
    """From a resume on, every record has its grad norm: two records of the new shape in a row
    and the bulk reader looks for it."""
    lines = [_megatron_lm_line(step, skipped=step < 1500) for step in range(1, 3001)]
    data = "".join(lines).encode()
    bulk = _bulk_records(monkeypatch)
    _assert_reads_as_plain(data, seed=3)
    assert bulk[0] >= 2 * 2900, f"{bulk[0]} of 6000 records read in bulk (twice: whole, then cut)"


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("fmt", BULK_FORMATS)
def test_fast_paths_equal_the_plain_path_with_odd_lines(fmt: str, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Odd lines go one by one between bulk records; results equal the plain path's, whole and cut
    at random chunk boundaries (lines cut in two, blocks that end inside a traceback)."""
    data = _with_odd_lines(fmt, seed, rate=0.01)
    bulk = _bulk_records(monkeypatch)
    _assert_reads_as_plain(data, seed)
    assert bulk[0] > 100, "the bulk reader should have read records of this log"


@pytest.mark.parametrize("fmt", BULK_FORMATS)
def test_bulk_readers_resume_from_a_pickled_stream(fmt: str) -> None:
    """`scan` pickles the stream between runs (and `check --jobs` copies it into workers)."""
    data = _with_odd_lines(fmt, seed=7, rate=0.01)
    chunks = [len(data) // 5] * 4
    _assert_same(_parse(data, chunks, pickled=True), _parse(data, chunks, every_line=True))


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.log")), ids=lambda p: p.name)
def test_fast_paths_equal_the_plain_path_on_example_logs(path: Path) -> None:
    data = path.read_bytes()
    _assert_same(_parse(data), _parse(data, every_line=True))
    chunks = _random_chunks(len(data), seed=4)
    _assert_same(_parse(data, chunks), _parse(data, chunks, every_line=True))


def _titan_line(rank: int, step: int, second: int) -> str:
    return (
        f"[rank{rank}]:[titan] 2024-03-02 08:{second // 60:02d}:{second % 60:02d},{rank:03d} - root - INFO - "
        f"\x1b[31mstep: {step:2d}  \x1b[32mloss:  3.{step:04d}  \x1b[33mgrad_norm:  0.7675  "
        f"\x1b[34mmemory:  9.46GiB(64.99%)  \x1b[35mtps: 7,322  \x1b[36mtflops: 0.52  \x1b[37mmfu: 0.17%\x1b[39m\n"
    )


def test_torchtitan_copies_from_every_rank_are_one_record_and_a_later_line_sees_the_last(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each step printed by 4 ranks is read in bulk as one record; "Training completed" (an event
    without a time of its own) gets the time of the last record, as when read line by line."""
    text = "".join(_titan_line(rank, step, step * 10) for step in range(1, 301) for rank in range(4))
    data = (text + _TITAN.replace("08:00:30,325", "08:59:59,000") + "Training completed\n").encode()
    bulk = _bulk_records(monkeypatch)
    fast = _parse(data)
    _assert_same(fast, _parse(data, every_line=True))
    assert list(fast[1].step) == list(range(1, 301)) and bulk[0] > 250
    [(_, _, step, ts, _)] = [e for e in fast[2] if e[0] is EventKind.RUN_END]
    assert step == 300 and ts == fast[1].ts.iloc[-1]


@pytest.mark.parametrize("bars", ["every 10 steps", "none"])
def test_hf_dicts_are_read_in_bulk_whatever_the_bars_count(bars: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With logging_steps > 1 the bar on the next line counts steps, not dicts, and with tqdm off
    there is none: the dicts are read in bulk all the same, each the next step, as line by line."""
    line = "{{'loss': 2.{:04d}, 'grad_norm': 0.5, 'learning_rate': 1e-05, 'epoch': 0.1}}\n"
    line += _BAR + "\n" if bars != "none" else ""
    data = "".join(line.format(k, 10 * k) for k in range(1, 400)).encode()
    bulk = _bulk_records(monkeypatch)
    fast = _parse(data)
    _assert_same(fast, _parse(data, every_line=True))
    assert list(fast[1].step) == list(range(1, 400)) and bulk[0] >= 350


def test_jsonl_record_without_a_step_after_bulk_records_takes_the_next_step() -> None:
    lines = [f'{{"step": {k}, "loss": 2.5, "grad_norm": null, "lr": 0.0001}}\n' for k in range(1, 300)]
    lines[150] = '{"loss": 9.5}\n'  # after step 150, instead of 151
    data = "".join(lines).encode()
    fast = _parse(data)
    _assert_same(fast, _parse(data, every_line=True))
    assert fast[1].step[150] == 151 and fast[1].loss[150] == 9.5


def _hf_dict(k: int) -> str:
    return f"{{'loss': 2.{k:04d}, 'grad_norm': 0.5, 'learning_rate': 1e-05, 'epoch': 0.1}}\n"


def _hf_log(dicts: int, extra: dict[int, str]) -> bytes:
    """HF dicts each followed by a bar counting it; `extra[k]` is printed after the bar of dict k."""
    return "".join(_hf_dict(k) + _BAR.format(k) + "\n" + extra.get(k, "") for k in range(1, dicts + 1)).encode()


@pytest.mark.parametrize(
    ("extra", "steps"),
    [
        # the count goes back to 250 (these bars do not: only the count says what the plain path says)
        ("  Continuing training from global step 250\n", [299, 300, 251, 252]),
        # a nan dict without a bar after it
        ("{'loss': nan, 'grad_norm': nan, 'learning_rate': 1e-05, 'epoch': 0.1}\n", [299, 300, 301, 302]),
        # an evaluation dict glued to a bar takes the bar's count, the next dict does not
        (_BAR.format(999) + "\r{'eval_loss': 2.5, 'eval_runtime': 1.0, 'epoch': 0.5}\n", [299, 300, 999, 301]),
    ],
    ids=["resume", "nan-dict", "eval-after-bar"],
)
def test_hf_bulk_dicts_stop_where_the_count_may_change(
    extra: str, steps: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """After such a line the bars no longer tell the dicts' steps: the count of the plain path wins."""
    data = _hf_log(400, {300: extra})
    bulk = _bulk_records(monkeypatch)
    fast = _parse(data)
    _assert_same(fast, _parse(data, every_line=True))
    assert list(fast[1].step[298:302]) == steps and bulk[0] >= 250


def _titan_log(steps: list[int], extra: dict[int, str]) -> bytes:
    """Rank 0 lines of these steps, 10 s apart; `extra[k]` is printed after the k-th line."""
    return "".join(_titan_line(0, step, 10 * k) + extra.get(k, "") for k, step in enumerate(steps)).encode()


@pytest.mark.parametrize(
    ("steps", "extra"),
    [
        # a copy that goes line by line (two prefixes) right after its bulk original
        (range(1, 301), {200: _titan_line(1, 201, 2000).replace("[rank1]:", "[rank1]:[rank1]:")}),
        # a validation line of another step, then an event that takes the latest time
        (range(1, 301), {200: _TITAN.replace("08:00:30", "09:30:00") + "validate step: 250  loss:  3.1\n"}),
        # the step goes back without a load line: steps 150 to 200 twice
        ([*range(1, 201), *range(150, 301)], {220: ""}),
        # a checkpoint load: the same steps again
        ([*range(1, 201), *range(150, 301)], {199: _TITAN + "Loading the checkpoint at step 149.\n"}),
    ],
    ids=["odd-copy", "validation", "step-back", "load"],
)
def test_torchtitan_lines_read_one_by_one_see_the_bulk_lines_before_them(
    steps: list[int], extra: dict[int, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    extra = {k: v + "[rank0]: CUDA error: an illegal memory access\n" for k, v in extra.items()}
    data = _titan_log(list(steps), extra)
    bulk = _bulk_records(monkeypatch)
    fast = _parse(data)
    _assert_same(fast, _parse(data, every_line=True))
    # all but the records before the format is known and the odd line's neighbours: past the odd
    # line, the rest of the block is read in bulk again
    assert bulk[0] >= len(fast[1]) - LOCK_AFTER_RECORDS - 3


def test_torchtitan_block_after_a_load_does_not_take_the_old_steps_for_new_ones() -> None:
    """A block that begins after a load: `out.last_step` is still the step before the crash, which
    the replayed steps reach again; an event there takes the load's time, not a replayed line's."""
    head = _titan_log(list(range(1, 201)), {199: _TITAN + "Training starts at step 150.\n"})
    tail = "[rank0]: CUDA error: an illegal memory access\n" + "".join(
        _titan_line(0, step, 3000 + 10 * step) for step in range(150, 301)
    )
    data = head + tail.encode()
    _assert_same(_parse(data, [len(head)]), _parse(data, [len(head)], every_line=True))


def test_jsonl_bulk_values_are_the_per_line_values_to_the_sign_of_zero() -> None:
    """json reads `-0` as the int 0 (so 0.0) and `-0.0` as -0.0; the bulk reader too."""
    lines = [f'{{"step": {k}, "loss": {v}, "lr": 0.1}}\n' for k, v in enumerate(["-0.0", "-0", "2.5"] * 100)]
    data = "".join(lines).encode()
    fast, plain = _parse(data), _parse(data, every_line=True)
    _assert_same(fast, plain)
    assert (np.signbit(fast[1].loss) == np.signbit(plain[1].loss)).all() and np.signbit(fast[1].loss).sum() == 100


def test_jsonl_logged_validation_loss_goes_line_by_line_for_its_event() -> None:
    """Every line has a `val_loss` key, null but on evaluation steps: those are events."""
    lines = [f'{{"step": {k}, "loss": 2.5, "val_loss": {"3.5" if k % 50 == 0 else "null"}}}\n' for k in range(1, 400)]
    data = "".join(lines).encode()
    fast = _parse(data)
    _assert_same(fast, _parse(data, every_line=True))
    assert [e[2] for e in fast[2] if e[0] is EventKind.VALIDATION] == list(range(50, 400, 50))


def test_a_parser_that_is_not_the_files_format_reads_nothing_in_bulk() -> None:
    """A JSON line opens a Megatron log and JSON lines follow once Megatron took the file: they are
    nobody's records, though the stream asks JSONL (first in registry order) for bulk matches."""
    iteration = " iteration {:8d}/  159576 | lm loss: 3.317482E+00 | grad norm: 1.0 |\n"
    json_line = '{{"step": {}, "loss": 1.5, "lr": 0.1}}\n'
    head = (json_line.format(0) + "".join(iteration.format(k) for k in range(1, 31))).encode()
    data = head + "".join(iteration.format(k) + json_line.format(k) for k in range(31, 300)).encode()
    fast = _parse(data, [len(head)])
    _assert_same(fast, _parse(data, [len(head)], every_line=True))
    assert fast[0] == "megatron" and len(fast[1]) == 300


@pytest.mark.parametrize(
    "foreign", ["{'loss': 2.5, 'grad_norm': 1.0, 'learning_rate': 1e-05, 'epoch': 0.5}", '{"step": 7, "loss": 2.5}']
)
def test_a_line_of_another_format_after_the_records_that_lock_the_format_is_nobodys_record(foreign: str) -> None:
    """The 20th record locks the file's format: a line of another trainer after it, in the same
    block, is read by the file's parser alone, however the records before it were read (in
    bulk they were counted only at the block's end, and the other parser took the line)."""
    iteration = " iteration {:8d}/  159576 | lm loss: 3.317482E+00 | grad norm: 1.0 |\n"
    data = ("".join(iteration.format(k) for k in range(1, 26)) + foreign + "\n").encode()
    fast = _parse(data)
    _assert_same(fast, _parse(data, every_line=True))
    assert fast[0] == "megatron" and len(fast[1]) == 25 and fast[3][-1][1] == 25


def test_a_ranks_copy_after_many_changes_of_shape_and_the_lock_is_dropped_as_the_plain_path_drops_it() -> None:
    """Records of three shapes (with and without the loss, cut short), one dated, ranks' copies,
    and a line read one by one where the records before it lock the format: reading on from
    that line took one of the block's rescans, the last one ran out before a copy was flushed,
    and the copy, flushed after later records evicted the one it repeats, was kept."""
    head = " iteration {:8d}/  159576 | consumed samples:       488048 | elapsed time per iteration (ms): 61947.6 | "
    head += "learning rate: 6.000E-05 | global batch size:   176 "
    tail = "| num zeros: 0.0 | number of skipped iterations:   0 | number of nan iterations:   0 |"
    shapes = {
        "full": head + "| lm loss: 3.635094E+00 | loss scale: 65536.0 | grad norm: 23.4 " + tail,
        "noloss": head + "| loss scale: 65536.0 | grad norm: nan " + tail,
        "short": head,
    }
    steps = "9 10 12n 13 14 17n 18 19 20 64 65 66 67 68n 69 69 70 70 71d 72 E 72 74s 80 81s 94s 129 130n 134s 153"
    steps += " 155s 156s 159 161n 173n 185s 188 189n"
    lines = []
    for token in steps.split():
        if token == "E":
            lines.append("[Eval batch=72/10] Eval on eval data")
            continue
        kind = {"n": "noloss", "s": "short"}.get(token[-1], "full")
        line = shapes[kind].format(int(token.rstrip("nsd")))
        lines.append(" [2024-03-02 08:04:42]" + line if token.endswith("d") else line)
    data = "".join(line + "\n" for line in lines).encode()
    fast = _parse(data)
    _assert_same(fast, _parse(data, every_line=True))
    assert fast[1].step.tolist().count(72) == 1


def test_a_short_block_with_the_pipes_of_a_record_is_read_as_the_plain_path_reads_it() -> None:
    """A tail appends a few bytes at a time: a block shorter than a record's head or keys."""
    data = "".join(generate(RunSpec(fmt="megatron-deepspeed", steps=100, seed=1))).encode()
    for tail in (b"|" * 14 + b"\n", b"iteration 5/9 |\n", b"|\n"):
        chunks = [len(data)]
        _assert_same(_parse(data + tail, chunks), _parse(data + tail, chunks, every_line=True))


def test_a_record_without_time_after_a_rescan_takes_no_earlier_time() -> None:
    """A record without a timestamp takes the time of the first dated line after it; where a
    record of another template made the stream search the rest of the block again, that search
    must not take a dated line before it (its positions are the rest's, not the block's)."""
    line = (
        " iteration {:8d}/  159576 | consumed samples:       488048 | elapsed time per iteration (ms): 61947.6 | "
        "learning rate: 6.000E-05 | global batch size:   176 |{extra} lm loss: 3.317482E+00 | loss scale: 65536.0 | "
        "grad norm: 23.4 | num zeros: 0.0 | number of skipped iterations:   0 | number of nan iterations:   0 |\n"
    )
    head = "".join(line.format(i, extra="") for i in range(1, 40))
    block = "".join(line.format(i, extra="") for i in range(40, 60)) + "2024-01-01 00:00:00 a dated line\n"
    for odd in ("", " other field: 1.0 |"):  # the second block searched again after step 80, or not
        rest = "".join(line.format(i, extra=odd if i == 80 else "") for i in range(60, 90))
        stream = LogStream(new_parsers())
        stream.feed(head.encode())
        stream.take()
        stream.feed((block + rest).encode())
        batch = stream.take()
        assert batch.last_step == 89
        assert batch.last_step_ts is None, odd  # no dated line after the last record


_RECORDS_WITHOUT_TIME = {
    "megatron": " iteration {:8d}/  159576 | lm loss: 3.317482E+00 | loss scale: 65536.0 | grad norm: 1.0 |",
    "hf_trainer": "{{'loss': 2.5, 'grad_norm': 1.0, 'learning_rate': 1e-05, 'epoch': {}}}",
}
#: Dated lines after the last record, each read another way: one by one (an overflow), all at once
#: (DeepSpeed's progress), skipped (a noise line), and a line whose date is not one (no time)
_AFTER_THE_LAST_RECORD = {
    "overflow": (_DS_OVERFLOW.replace("08:00:29", "09:00:01"), "2024-03-02 09:00:01.825"),
    "progress": (_DS_PROGRESS.format(n=80).replace("10:32:28", "09:00:02"), "2024-03-02 09:00:02.543"),
    "noise": ("[2024-03-02 09:00:03,000] [INFO] [engine.py:3000:save] saving a checkpoint", "2024-03-02 09:00:03"),
    "no time": ("2024-13-45 99:99:99 a date that is none", None),
}


def _clock_wherever_cut(data: bytes) -> tuple:
    """The final clock of `data` (latest time, step, time of that step), asserted the same on the
    plain path, and cut into two blocks near the end, at a line's end or inside a line."""
    whole = _parse(data)
    _assert_same(whole, _parse(data, every_line=True))
    cuts = [i + 1 for i, byte in enumerate(data) if byte == ord("\n")][:-1]
    for cut in [*cuts[-8:], *(c - 9 for c in cuts[-8:])]:
        for every_line in (False, True):
            assert _parse(data, [cut], every_line=every_line)[3][-1] == whole[3][-1], (cut, every_line)
    return whole[3][-1]


def _utc(text: str) -> float:
    return pd.Timestamp(text, tz="UTC").timestamp()


@pytest.mark.parametrize("fmt", sorted(_RECORDS_WITHOUT_TIME))
@pytest.mark.parametrize("first", ["overflow", "progress", "noise"])
def test_a_records_time_is_the_first_dated_line_after_it_wherever_the_input_is_cut(fmt: str, first: str) -> None:
    """The latest record has no time of its own: it takes the first readable time after it,
    whether that line is read one by one, all at once or skipped, and however the input was cut
    into blocks (once the time of a later line won where the record was in an earlier block)."""
    record = _RECORDS_WITHOUT_TIME[fmt]
    after = [_AFTER_THE_LAST_RECORD["no time"][0], _AFTER_THE_LAST_RECORD[first][0]]
    after += [line for name, (line, _) in _AFTER_THE_LAST_RECORD.items() if name not in (first, "no time")]
    lines = [record.format(k) for k in range(1, 60)] + [_DS_PROGRESS.format(n=50)] + [record.format(60)] + after
    data = "".join(line + "\n" for line in lines).encode()
    assert _parse(data)[0] == fmt and len(_parse(data)[1]) == 60
    assert _clock_wherever_cut(data)[2] == _utc(_AFTER_THE_LAST_RECORD[first][1])


def test_a_ranks_copy_of_the_last_record_does_not_move_where_its_time_is_looked_for() -> None:
    """Another rank prints the last iteration again after a dated line: the copy is dropped, so
    the record's time is still that dated line's, not the one after the copy."""
    record = _RECORDS_WITHOUT_TIME["megatron"]
    lines = [record.format(k) for k in range(1, 61)]
    lines += ["[2024-03-02 09:00:01,000] [INFO] between the copies", record.format(60)]
    lines += ["[2024-03-02 09:00:05,000] [INFO] after the copy"]
    data = "".join(line + "\n" for line in lines).encode()
    assert len(_parse(data)[1]) == 60
    assert _clock_wherever_cut(data)[1:] == (60, _utc("2024-03-02 09:00:01"))


_CLOSED_BY_THE_NEXT_LINE = {
    "composer": "[batch={k}/100]:\n\t Train loss/train/total: 3.1000\n\t Train l2_norm/grad/global: 1.0000\n",
    "olmo": (
        "2024-13-45 08:00:0{k}.000 node-025:0  olmo.train:908  INFO    [step={k}/100,epoch=0]\n"
        "    train/CrossEntropyLoss=3.1\n    optim/total_grad_norm=1.0\n"
    ),
}


@pytest.mark.parametrize("fmt", sorted(_CLOSED_BY_THE_NEXT_LINE))
def test_a_multi_line_record_takes_the_time_of_the_line_that_closes_it(fmt: str) -> None:
    """A multi-line record is written when the line after it is read: that line is the first
    after the record, and its time is the record's (OLMo's header here has a date that is none)."""
    records = "".join(_CLOSED_BY_THE_NEXT_LINE[fmt].format(k=k) for k in range(1, 4))
    dated = "[2024-03-02 09:00:01,000] [INFO] right after the last record\n[2024-03-02 09:00:05,000] [INFO] later\n"
    data = (records + dated).encode()
    assert _parse(data)[0] == fmt and len(_parse(data)[1]) == 3
    assert _clock_wherever_cut(data)[1:] == (3, _utc("2024-03-02 09:00:01"))


def test_a_stream_saved_before_skip_counters_were_columns_reads_on() -> None:
    """`scan` keeps streams between runs: one pickled without the skip counters' builder loads and counts."""
    stream = LogStream(new_parsers())
    stream.feed((_DS_PROGRESS.format(n=10) + "\n").encode())
    del stream.out.__dict__["skip_counts"]
    restored = pickle.loads(pickle.dumps(stream))
    restored.feed((_DS_PROGRESS.format(n=20) + "\n").encode())
    restored.close()
    counts = restored.take().skip_counts
    assert counts.line.tolist() == [2] and counts.step.tolist() == [20] and counts.skipped.tolist() == [5]


_DATED = [
    "[rank0]:[titan] 2024-03-02 08:01:00,481 - root - INFO - step:  3  loss: 10.88",
    " [2024-04-06 03:02:12] iteration       71/     100 | Megatron-LM's time after a space",
    "nid005143:0 out: [titan] 2024-03-02 08:03:00,000 - LUMI's prefix",
    "[NeMo W 2024-03-02 09:00:00 nemo_logging:349] NeMo's tag",
    "  [2024-03-02 09:00:00] two spaces: not a dated line",
    "2024-03-02 1\u0661:00:00 an Arabic-Indic digit, which re reads as one (and int() too)",
    "[2024-03-02 10:32:28,543] [INFO] [logging.py:60:log_dist] [Rank 0] step=20",
    "2024-03-02T10:40:00 a plain dated line",
    "2024-03-02_10:40:01 an underscore",
    "[2024-03-02-104002] dashes, no colons",
    "[rank3]:2024-03-02 11:00:00,001 launcher prefix then a date",
    "[rank3]:\x1c2024-03-02 11:00:01 a separator that re's \\s takes",
    "[default0]: 2024-03-02 11:00:02 torchrun's prefix",
    "12:  2024-03-02 11:00:03 srun's prefix",
    "[rank0]: ",  # re reads on into the next line: no time of its own
    "12:",
    "2024-13-45 99:99:99 no such date",
    "[2024-03-02 11:00:0x] cut short",
    "1234 not a date",
    "[x] bracket",
]


def _dated(text: str, ascii_only: bool | None = None):
    """The `_DatedLines` of a block `text`, with its codes as the stream makes them (`ascii_only`:
    whether to read them as an ASCII block's, by default when the text is)."""
    from gradwatch.parsers import stream as stream_module

    codes = np.frombuffer(text.encode("ascii", errors="replace"), dtype=np.uint8)
    newlines = np.flatnonzero(codes == 10)
    return stream_module._DatedLines(text, codes, newlines, text.isascii() if ascii_only is None else ascii_only)


def _times_one_by_one(text: str, starts: list[int]) -> list[float]:
    from gradwatch.parsers import stream as stream_module

    return [ts for start in starts if (ts := stream_module._line_time(text, start)) is not None]


@pytest.mark.parametrize("seed", range(40))
def test_the_first_and_last_times_of_a_block_are_those_read_line_by_line(seed: int) -> None:
    """`_DatedLines` asks RE2 for the dated lines of a long stretch: the first time from any line
    on, and the last time of the block, must be those a match per line gives, whether the block
    is ASCII or not (a `?` of its codes then stands for any character)."""
    rng = random.Random(seed)
    lines = [
        rng.choice(_DATED) if rng.random() < 0.7 else rng.choice(["plain text", "nid1:2:3 NCCL"]) for _ in range(60)
    ]
    lines += rng.choice([[], [_DATED[0]] * 12, ["[rank0]: "] * 12, ["nid001:0 NCCL INFO"] * 12])
    text = "\n".join(lines) + "\n"
    line_starts = [0, *(k + 1 for k, c in enumerate(text[:-1]) if c == "\n")]
    for ascii_only in (text.isascii(), False):  # (an ASCII text read as the other kind too)
        dated = _dated(text, ascii_only)
        times = _times_one_by_one(text, dated.starts)
        assert dated.last_time() == (times[-1] if times else None)
        for pos in line_starts[:: rng.randint(1, 9)]:
            after = _times_one_by_one(text, [s for s in dated.starts if s >= pos])
            assert dated.first_time(pos) == (after[0] if after else None), pos


@pytest.mark.parametrize("after", [7, 8, 9, 30])
@pytest.mark.parametrize("line", _DATED)
def test_each_kind_of_dated_line_gives_the_last_time_before_lines_without_one(line: str, after: int) -> None:
    from gradwatch.parsers import stream as stream_module

    text = "\n".join(["plain text", line, *["[rank0]:[titan] no date here"] * after]) + "\n"
    expected = stream_module._line_time(text, len("plain text\n"))
    assert _dated(text).last_time() == expected
    assert _dated(text).first_time(0) == expected


@pytest.mark.parametrize("ascii_only", [True, False])
def test_a_long_stretch_without_dates_is_not_read_line_by_line(
    ascii_only: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LUMI's NCCL lines begin as a launcher prefix does: a block of them, with or without a tqdm
    bar's characters, is searched by RE2, not matched line by line (that took longer than
    reading the block)."""
    from gradwatch.parsers import stream as stream_module

    text = "[2024-03-02 08:00:00,000] first\n" + "nid005143:12345:12345 [0] NCCL INFO Channel\n" * 5000
    text += "[2024-03-02 09:00:00,000] last\n"
    read: list[int] = []
    line_time = stream_module._line_time
    monkeypatch.setattr(stream_module, "_line_time", lambda t, start: read.append(start) or line_time(t, start))
    dated = _dated(text, ascii_only)
    assert dated.first_time(40) == _utc("2024-03-02 09:00")
    assert dated.last_time() == _utc("2024-03-02 09:00")
    assert len(read) < 40


def test_the_logs_clock_is_its_last_dated_line_torchtitans_included() -> None:
    """torchtitan's `[rank0]:[titan] <time>` lines are dated lines: a launcher line dated later
    than the records after it does not stay the log's clock, however the file is cut into
    blocks (it did where a block held both, and `--jobs 2` cut elsewhere than `--jobs 1`)."""
    from gradwatch.parsers._text import timestamp

    lines = list(generate(RunSpec(fmt="torchtitan", steps=400, seed=3)))
    lines.insert(len(lines) - 50, "[2030-01-01 00:00:00,000] [INFO] a launcher line on another clock\n")
    data = "".join(lines).encode()
    last_titan = next(line for line in reversed(lines) if "[titan] " in line)
    expected = timestamp(last_titan[last_titan.index("[titan] ") + len("[titan] ") :])
    assert expected is not None and expected < timestamp("2030-01-01 00:00:00")
    for chunks in ([len(data)], [len(data) - 3000, 3000], [4096] * (len(data) // 4096 + 1)):
        stream = LogStream(new_parsers())
        pos = 0
        for size in chunks:
            stream.feed(data[pos : pos + size])
            pos += size
        stream.close()
        assert stream.out.last_ts == expected, chunks


#: dated lines of each shape a parser reads a time from, with that time
_READABLE_DATES = {
    " [2024-04-06 03:02:12] iteration       71/     100 | lm loss: 1.818812E+00 |": "2024-04-06 03:02:12",
    "nid005143:0 out: [titan] 2024-03-02 08:03:00,000 - root - INFO - step:  3  loss:  3.54399": "2024-03-02 08:03",
    "[NeMo I 2024-03-02 09:00:00 model_checkpoint:497] Scheduled async checkpoint save": "2024-03-02 09:00",
    "\x1b[32m[NeMo I 2024-03-02 09:00:00 model_checkpoint:497]\x1b[0m NeMo's colours on a terminal": "2024-03-02 09:00",
    "\x1b[32m[titan] 2024-03-02 08:03:00,000 - root - INFO - step:  3  loss:  3.54399": "2024-03-02 08:03",
    "(pretraining, pid=4112) [2024-03-02 10:00:00,250] [INFO] a Ray worker's line": "2024-03-02 10:00:00.250",
    "[rank0]:[titan] 2024-03-02 08:01:00,481 - root - INFO - step:  3  loss: 10.88": "2024-03-02 08:01:00.481",
}


@pytest.mark.parametrize("line", sorted(_READABLE_DATES))
def test_the_logs_clock_is_the_time_of_its_last_dated_line_of_any_shape(line: str) -> None:
    """Every shape of dated line that a parser reads a time from is a dated line of the log's
    clock too, wherever the input is cut: one that only a parser read (NeMo's tag, LUMI's prefix)
    set the clock when it was the block's last dated line and lost it to an earlier one in the
    same block (and `--jobs 2` warned of a stall that `--jobs 1` did not see); Megatron-LM's
    timed lines, after a space, were no dated lines at all."""
    earlier = "[2024-03-02 07:00:00,000] [INFO] an earlier dated line\n"
    data = (earlier * 3 + line + "\nplain text\n").encode()
    assert _clock_wherever_cut(data)[0] == _utc(_READABLE_DATES[line])


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text().map(str.encode), st.binary()))
def test_a_block_has_a_byte_per_character_of_its_text(data: bytes) -> None:
    """Valid UTF-8 or not, `codes` are the text's characters, `?` for each one not ASCII."""
    text, codes, ascii_only = _decoded(data)
    assert text == str(data, "utf-8", errors="replace")
    assert codes.tobytes() == text.encode("ascii", errors="replace")
    assert ascii_only == data.isascii()


#: keywords split, or hidden behind a word character, by an escape sequence that the per-line
#: path removes before it reads a line (`clean`); the raw line shows no keyword
_ESCAPED = {
    "hf-trainer": ["  Continuing training\x1b[0m from global step 5"],
    "megatron-deepspeed": [
        "[2024-03-02 08:00:00,000] [INFO] [logging.py:96:log_dist] [Rank 0] \x1b[1mstep=7, skipped=3, lr=[1e-05]",
        'Trace\x1b[0mback (most recent call last):\n  File "train.py", line 3, in <module>\nValueError: boom',
        "[deepspeed] OVER\x1b[31mFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768",
    ],
}


@pytest.mark.parametrize("fmt", list(_ESCAPED))
def test_keywords_that_only_cleaning_shows_are_read_as_the_plain_path(fmt: str) -> None:
    """A line whose keyword an escape sequence splits is still read, in bulk stretches too."""
    lines = "".join(generate(RunSpec(fmt=fmt, steps=600, seed=3))).split("\n")
    records = [k for k, line in enumerate(lines) if "loss" in line and k > 100]
    for k, odd in zip(records[::50], _ESCAPED[fmt] * 4, strict=False):
        lines[k] += "\n" + odd
    data = "\n".join(lines).encode()
    fast, plain = _parse(data), _parse(data, every_line=True)
    _assert_same(fast, plain)
    _assert_reads_as_plain(data, seed=3)

"""Composer's older console logger: one `[level][batch=N]: key: value` line per metric."""

from __future__ import annotations

from gradwatch.parsers import new_parsers
from gradwatch.parsers.stream import LogStream


def _read(text: str):
    stream = LogStream(new_parsers())
    stream.feed(text.encode())
    stream.close()
    return stream.format, stream.take().records


def test_lines_of_one_batch_make_one_record_and_a_repeated_key_begins_the_next() -> None:
    fmt, rec = _read(
        "[metric][batch=0]: time/epoch: 2365 \n"
        "[metric][batch=0]: metrics/train/LanguageCrossEntropy: nan \n"
        "[metric][batch=0]: metrics/train/Books_count: 0 \n"
        "[metric][batch=0]: time/epoch: 2366 \n"
        "[metric][batch=0]: metrics/train/LanguageCrossEntropy: nan \n"
        "[metric][batch=7/100]: loss/train/total: 2.5 \n"
        "[metric][batch=7/100]: l2_norm/grad/global: 0.75 \n"
    )
    assert fmt == "composer"
    assert rec["step"].tolist() == [0, 0, 7]
    assert rec["nonfinite"].tolist() == ["loss", "loss", ""]
    assert rec["loss"].iloc[2] == 2.5 and rec["grad_norm"].iloc[2] == 0.75
    assert rec["line"].tolist() == [1, 4, 6]

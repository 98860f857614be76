"""The layout readers' byte searches: `texts_at` compares many texts at many positions at once,
long ones as 64-bit words; it must say what comparing each text's bytes one by one says."""

from __future__ import annotations

import random

import numpy as np
import pytest

from gradwatch.parsers._bytes import shaped_like, text_at, texts_at


def _one_by_one(block: bytes, positions: np.ndarray, texts: list[bytes]) -> list[bool]:
    return [
        all(p >= 0 and block[p : p + len(t)] == t for p, t in zip(row.tolist(), texts, strict=True))
        for row in positions
    ]


@pytest.mark.parametrize("seed", range(40))
def test_texts_at_says_what_a_byte_by_byte_comparison_says(seed: int) -> None:
    rng = random.Random(seed)
    alphabet = b"ab |:,"
    block = bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 300)))
    texts = [bytes(rng.choice(alphabet) for _ in range(rng.randint(1, 20))) for _ in range(rng.randint(1, 5))]
    # positions where the text is (cut from the block), anywhere, near the end and before the start
    rows = []
    for _ in range(60):
        row = []
        for t in texts:
            kind = rng.random()
            if kind < 0.5 and len(block) >= len(t):
                p = rng.randint(0, len(block) - len(t))
                row.append(p)
                block = block[:p] + t + block[p + len(t) :]
            elif kind < 0.8:
                row.append(rng.randint(0, len(block) + 3))
            else:
                row.append(rng.randint(-12, -1))
        rows.append(row)
    positions = np.array(rows, dtype=np.int64).reshape(-1, len(texts))
    codes = np.frombuffer(block, dtype=np.uint8)
    assert texts_at(codes, positions, texts).tolist() == _one_by_one(block, positions, texts)


def test_texts_at_agrees_with_text_at_for_one_text() -> None:
    block = b"| lm loss: 1.0 | loss scale: 2.0 |\n| lm loss: 3.0 | loss scale: 4.0 |\n"
    codes = np.frombuffer(block, dtype=np.uint8)
    positions = np.arange(len(block) + 2)
    for text in (b" lm loss:", b" loss scale:", b"|", b"0 |\n"):
        expected = text_at(codes, positions, text).tolist()
        assert texts_at(codes, positions[:, None], [text]).tolist() == expected


def test_a_position_before_the_block_holds_no_text() -> None:
    """Before the start nothing is there, even where the words that would be read repeat the text."""
    text = b"abcdefgh" * 2
    codes = np.frombuffer(text + b"|rest", dtype=np.uint8)
    wraps = -(len(codes) - 7)  # numpy would read the words at the block's start from here
    assert texts_at(codes, np.array([[-8], [wraps], [0]]), [text]).tolist() == [False, False, True]
    assert texts_at(codes, np.array([[-1]]), [b"ab"]).tolist() == [False]


def test_shaped_like_takes_digits_where_the_shape_has_zeros_and_its_own_bytes_elsewhere() -> None:
    shape = b"[0000-00-00 00:00:00]"
    rows = [b"[2024-03-02 08:00:30]", b"[2024-03-02T08:00:30]", b"[2024-3-02 08:00:30 ]", b"[2024-03-02 08:00:3x]"]
    window = np.frombuffer(b"".join(rows), dtype=np.uint8).reshape(len(rows), len(shape))
    assert shaped_like(window, shape).tolist() == [True, False, False, False]

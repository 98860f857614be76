"""Arrays built over buffers (`_arrow`) are what `pa.array` and `to_numpy` make of the same values,
at any offset into a sliced array (Arrow's kernels return slices' offsets as they are)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gradwatch.parsers._arrow import indices, mask, numpy_of, strings


@settings(deadline=None)  # the first example imports Arrow's kernels
@given(st.lists(st.booleans(), max_size=70), st.integers(0, 70), st.integers(0, 70))
@example([True, False, False, True, True, False, False, False, False, True], 1, 9)
def test_a_mask_and_its_numpy_are_the_flags_at_any_offset(flags: list[bool], lo: int, length: int) -> None:
    built = mask(np.array(flags, dtype=bool))
    assert built.equals(pa.array(flags, type=pa.bool_()))
    part = built.slice(lo, length)
    assert numpy_of(part).tolist() == part.to_pylist()
    assert numpy_of(part).dtype == np.bool_


@settings(deadline=None)  # the first example imports Arrow's kernels
@given(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=40), st.integers(0, 40))
def test_indices_and_their_numpy_are_the_integers(values: list[int], lo: int) -> None:
    built = indices(np.array(values, dtype=np.int64))
    assert built.equals(pa.array(values, type=pa.int64()))
    assert numpy_of(built.slice(lo)).tolist() == values[lo:]


@settings(deadline=None)  # the first example imports Arrow's kernels
@given(st.lists(st.floats(allow_nan=False), max_size=40), st.integers(0, 40))
def test_floats_cast_by_arrow_come_out_as_they_went_in(values: list[float], lo: int) -> None:
    cast = pc.cast(strings([repr(v) for v in values]), pa.float64()).slice(lo)
    assert numpy_of(cast).tolist() == values[lo:]


@settings(deadline=None)  # the first example imports Arrow's kernels
@given(st.lists(st.text(), max_size=20))
def test_strings_are_the_texts(texts: list[str]) -> None:
    assert strings(texts).to_pylist() == texts


def test_results_of_kernels_are_read_whatever_their_type() -> None:
    lines = strings(["a step=7", "no", "step=12 and step=3"])
    assert numpy_of(pc.find_substring(lines, "step=")).tolist() == [2, -1, 0]
    assert numpy_of(pc.match_substring(lines, "step")).tolist() == [True, False, True]
    assert numpy_of(lines.filter(mask(np.array([False, True, True]))).is_valid()).tolist() == [True, True]

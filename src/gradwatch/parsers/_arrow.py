"""pyarrow for the bulk readers, imported when a file is first read in bulk (`--help` and small
files never pay for it), with the system allocator: Arrow's own pool keeps the memory of the
buffers a block used, which put 15-20 MB on a check's peak RSS.

Arrays go between numpy and Arrow over their buffers (`indices`, `mask`, `strings`, `numpy_of`),
not by `pa.array` and `to_numpy`: those import pandas to look at their argument or result, which
costs a worker a fifth of a second, and a worker has no other use for pandas.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np


def arrow() -> tuple[ModuleType, ModuleType]:
    """`pyarrow` and `pyarrow.compute`."""
    import pyarrow as pa
    import pyarrow.compute as pc

    global _pool_set
    if not _pool_set:
        pa.set_memory_pool(pa.system_memory_pool())
        _pool_set = True
    return pa, pc


_pool_set = False


def indices(positions: np.ndarray) -> Any:
    """`positions` (integers) as an Arrow int64 array: for `take`, or a list array's offsets."""
    pa, _ = arrow()
    values = np.ascontiguousarray(positions, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(values), [None, pa.py_buffer(values)])


def mask(flags: np.ndarray) -> Any:
    """`flags` (booleans) as an Arrow boolean array, for `filter`."""
    pa, _ = arrow()
    bits = np.packbits(np.asarray(flags, dtype=bool), bitorder="little")
    return pa.Array.from_buffers(pa.bool_(), len(flags), [None, pa.py_buffer(bits)])


def strings(texts: list[str]) -> Any:
    """`texts` as an Arrow string array."""
    pa, _ = arrow()
    encoded = [text.encode() for text in texts]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    return pa.LargeStringArray.from_buffers(len(encoded), pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded)))


def string_scalar(text: str) -> Any:
    """`text` as an Arrow large-string scalar, for a kernel's argument (`pa.scalar` imports pandas)."""
    return strings([text])[0]


def numpy_of(array: Any) -> np.ndarray:
    """A boolean, integer or float Arrow array with no nulls (what Arrow's kernels return for
    arrays without them) as numpy: booleans unpacked, numbers a read-only view."""
    n, offset = len(array), array.offset
    data = array.buffers()[1]
    if array.null_count or data is None:
        return array.to_numpy(zero_copy_only=False)  # type: ignore[no-any-return]  # not expected
    pa, _ = arrow()
    if pa.types.is_boolean(array.type):
        bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8), count=offset + n, bitorder="little")
        return bits[offset:].view(bool)
    dtype = np.dtype(array.type.to_pandas_dtype())
    return np.frombuffer(data, dtype=dtype, count=n, offset=offset * dtype.itemsize)

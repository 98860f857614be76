"""pyarrow for the bulk readers, imported when a file is first read in bulk (`--help` and small
files never pay for it), with the system allocator: Arrow's own pool keeps the memory of the
buffers a block used, which put 15-20 MB on a check's peak RSS."""

from __future__ import annotations

from types import ModuleType


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

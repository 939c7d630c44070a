"""Where the process's freed memory goes: back to the OS, so that each stage's transients do not
raise the peak of the stages after it.

Reading a trace makes transients several times the size of the final tables (raw batches,
scanner buffers), and every analysis and writer makes its own; all are freed long before the
run ends.  Two allocator defaults keep such memory resident: pyarrow's default pool (mimalloc)
keeps freed pages for reuse, and glibc's dynamic mmap threshold soon serves multi-megabyte
buffers from the heap, where freed holes stay.  Measured (see docs/BENCHMARKS.md): peak RSS of
a full analysis of df_index_resolver about 280 -> 230 MB at the same CPU time; on a 1 GB trace
1.26 -> 1.15 GB for about 10-17 % more CPU (large buffers are faulted in afresh, not reused).
Both settings are process-wide and change only where memory comes from, never a result;
settings the user made in the environment win.
"""

from __future__ import annotations

import ctypes
import os
import sys

import numpy as np
import pyarrow as pa

_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number
MMAP_THRESHOLD_BYTES = 1 << 20
"""Allocations from this size on get their own mapping, unmapped (returned) when freed."""

_LIBC: list[ctypes.CDLL | None] = []  # looked up once


def _libc() -> ctypes.CDLL | None:
    """glibc, where it is the C library (``malloc_trim``/``mallopt`` exist), else None.

    The symbols are looked up in the running process (``CDLL(None)``), where the C library is
    already loaded: ``ctypes.util.find_library`` would run ``ldconfig`` in a subprocess (1.5 ms,
    inside the first analysis of a process)."""
    if not _LIBC:
        lib = None
        if sys.platform.startswith("linux"):
            try:
                lib = ctypes.CDLL(None)
            except OSError:
                lib = None
        usable = lib is not None and hasattr(lib, "malloc_trim") and hasattr(lib, "mallopt")
        _LIBC.append(lib if usable else None)
    return _LIBC[0]


def prefer_returning_pool() -> None:
    """The system allocator as Arrow's pool, and glibc's mmap threshold fixed at 1 MiB (unless
    ``ARROW_DEFAULT_MEMORY_POOL`` / ``MALLOC_MMAP_THRESHOLD_`` say otherwise)."""
    if not os.environ.get("ARROW_DEFAULT_MEMORY_POOL") and pa.default_memory_pool().backend_name != "system":
        pa.set_memory_pool(pa.system_memory_pool())
    libc = _libc()
    if libc is not None and not os.environ.get("MALLOC_MMAP_THRESHOLD_"):
        libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)


def return_freed_memory() -> None:
    """Give the heap's free pages back to the OS (glibc ``malloc_trim``) between stages, so the
    next stage reuses memory instead of growing the peak; a no-op off glibc."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


_MADV_DONTNEED = 4  # Linux
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def release_pages(buffer: np.ndarray) -> None:
    """Hand the OS the whole pages inside ``buffer``, which stays allocated, its contents lost
    (read back as zeros); a no-op off Linux's glibc.

    Why: a buffer kept for reuse (the event scanner's work buffers, kept between reads so they
    need not regrow) otherwise keeps every page the last use touched resident while it sits
    idle: three scanners after reading df_index_resolver held about 20 MB.  Only pages wholly
    inside the buffer are released, so the allocator's own bookkeeping beside it is untouched.
    """
    libc = _libc()  # None off Linux's glibc
    if libc is None or not hasattr(libc, "madvise"):
        return
    start = buffer.ctypes.data
    first = -(-start // PAGE_BYTES) * PAGE_BYTES  # round up to a page
    last = (start + buffer.nbytes) // PAGE_BYTES * PAGE_BYTES  # round down
    if last > first:
        libc.madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first), _MADV_DONTNEED)

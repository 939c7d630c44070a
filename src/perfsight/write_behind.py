"""Big output files written behind: each window of bytes handed to the disk as soon as it is
written, and dropped from the page cache once it is there.

Why: an analysis writes files nearly as large as the trace it reads (a 10 GB trace: a 7.7 GB
``trace_view.json``, 1.4 GB of ``kernel_details.csv``) that nothing in the run reads back.
Written through the page cache as usual, they pile up as dirty pages until the kernel makes the
writer pay for them, and the cost per byte grows with what is already there.  On the benchmark
VM, 1 MiB writes of 2, 8 and 12 GB took 0.44, 5.6 and 12.4 s that way (nearly all system time),
and 1.2, 3.2 and 4.9 s written behind: linear.  In ``perfsight analyse --memory-limit 2G`` of a
10 GB gzip trace that was 215-223 s -> 200-207 s (system time 83-86 -> 69-71 s), and the 1 GB
trace's time did not move; see docs/BENCHMARKS.md.  It also leaves the memory of the machine
(often the one still training) to the processes that use it.

Only outputs that nothing reads in the same run are written this way: the cache and the
timeline index, which ``perfsight serve`` reads next, measured no faster written behind.
Linux only (``sync_file_range``); elsewhere, and for a file that never fills one window, the
file is written as any other.  Nothing here changes a byte of what is written.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import os
import sys
from collections.abc import Callable
from pathlib import Path

WINDOW_BYTES = 64 << 20
"""Bytes written between two hand-overs to the disk: large enough for the disk to write in big
runs, small enough that a window or two of dirty pages is all a writer ever holds."""

_WAIT_BEFORE, _WRITE, _WAIT_AFTER = 1, 2, 4  # sync_file_range flags (linux/fs.h)


SyncFileRange = Callable[[int, int, int, int], int]


def _sync_file_range() -> SyncFileRange | None:
    """The C library's ``sync_file_range``, or None off Linux (or where it is missing)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


_SYNC_FILE_RANGE = _sync_file_range()


class _WrittenBehind(io.FileIO):
    """A raw file that, every :data:`WINDOW_BYTES`, starts the disk write of the window just
    written, then waits for the window before it and drops that one from the page cache (its
    pages are clean by then, so dropping them loses nothing).  Failures of either call are
    ignored: both only advise the kernel."""

    def __init__(self, path: str | Path, sync_file_range: SyncFileRange) -> None:
        super().__init__(path, "wb")
        self._sync_file_range = sync_file_range
        self._written = 0  # the end of what is written so far
        self._handed = 0  # bytes whose disk write has been started
        self._dropped = 0  # bytes on disk and out of the page cache

    def write(self, data: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        written = super().write(data) or 0  # None only for a non-blocking file, which this is not
        self._written = max(self._written, self.tell())  # a write after a seek back adds nothing
        if self._written - self._handed >= WINDOW_BYTES:
            self._hand_over()
        return written

    def _hand_over(self) -> None:
        fd = self.fileno()
        self._sync_file_range(fd, self._handed, self._written - self._handed, _WRITE)
        if self._handed > self._dropped:
            length = self._handed - self._dropped
            self._sync_file_range(fd, self._dropped, length, _WAIT_BEFORE | _WRITE | _WAIT_AFTER)
            with contextlib.suppress(OSError):
                os.posix_fadvise(fd, self._dropped, length, os.POSIX_FADV_DONTNEED)
            self._dropped = self._handed
        self._handed = self._written


def open_written_behind(path: str | Path) -> io.BufferedWriter:
    """``open(path, "wb")``, written behind where the system allows it (see the module's doc)."""
    if _SYNC_FILE_RANGE is None:
        return open(path, "wb")  # noqa: SIM115 -- the caller closes it, as it would open()'s
    return io.BufferedWriter(_WrittenBehind(path, _SYNC_FILE_RANGE))

"""A big output written behind holds exactly the bytes written, and the windows already on disk
are out of the page cache (what keeps a 10 GB trace's outputs from piling up as dirty pages)."""

from __future__ import annotations

import ctypes
import mmap
import sys
from pathlib import Path

import numpy as np
import pytest

from perfsight import write_behind

WINDOW = 1 << 20


def _resident(path: Path) -> np.ndarray:
    """Per page of ``path``: whether it is in the page cache (``mincore`` of a shared mapping;
    mapping a file and never writing it dirties nothing)."""
    libc = ctypes.CDLL(None, use_errno=True)
    size = path.stat().st_size
    with path.open("r+b") as handle, mmap.mmap(handle.fileno(), size) as mapped:
        first = ctypes.c_char.from_buffer(mapped)
        vector = (ctypes.c_ubyte * -(-size // mmap.PAGESIZE))()
        failed = libc.mincore(ctypes.c_void_p(ctypes.addressof(first)), ctypes.c_size_t(size), vector)
        del first  # the mapping cannot close while a ctypes object points into it
        if failed:
            pytest.skip(f"mincore failed: errno {ctypes.get_errno()}")
        return (np.frombuffer(bytes(vector), np.uint8) & 1).astype(bool)


def _payload(size: int) -> bytes:
    return np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8).tobytes()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sync_file_range is Linux's")
def test_the_windows_on_disk_leave_the_page_cache_and_every_byte_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(write_behind, "WINDOW_BYTES", WINDOW)
    data = _payload(5 * WINDOW + 12_345)
    path = tmp_path / "trace_view.json"
    with write_behind.open_written_behind(path) as handle:
        for start in range(0, len(data), 300_001):  # writes that straddle the windows
            handle.write(data[start : start + 300_001])
    assert path.read_bytes() == data

    path = tmp_path / "kernel_details.csv"
    with write_behind.open_written_behind(path) as handle:
        for start in range(0, len(data), WINDOW):
            handle.write(data[start : start + WINDOW])
        resident = _resident(path)
    # the fifth window's hand-over waited for the fourth and dropped the first four
    dropped = 4 * WINDOW // mmap.PAGESIZE
    assert not resident[:dropped].any(), "windows already on disk stayed in the page cache"
    assert resident[dropped:].all(), "the windows not yet handed over should still be cached"
    assert path.read_bytes() == data


def test_a_small_file_is_an_ordinary_file(tmp_path: Path) -> None:
    path = tmp_path / "small.csv"
    with write_behind.open_written_behind(path) as handle:
        handle.write(b"a,b\n1,2\n")
    assert path.read_bytes() == b"a,b\n1,2\n"

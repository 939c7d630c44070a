"""A process that reads many traces (a cluster worker) reuses one native scanner: every read must
give exactly what a read with a fresh scanner gives, and no earlier result may change."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from conftest import kineto_file
from perfsight import heap
from perfsight.ingest import eventscan, read_trace
from perfsight.model import TABLE_SCHEMAS


def _tables(trace) -> dict:
    return {name: getattr(trace, name) for name in TABLE_SCHEMAS}


def test_reads_with_a_reused_scanner_equal_reads_with_a_fresh_one(monkeypatch: pytest.MonkeyPatch) -> None:
    if not eventscan.available():
        pytest.skip("the native scanner is not built here")
    paths = [
        kineto_file("distributed_info_unavailable/distributed_info_not_found.json.gz"),
        kineto_file("amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz"),
        kineto_file("cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"),
    ]
    fresh = {}
    for path in paths:
        monkeypatch.setattr(eventscan, "_IDLE", {})  # no scanner left over from an earlier read
        fresh[path] = _tables(read_trace(path))
    monkeypatch.setattr(eventscan, "_IDLE", {})
    kept = [(path, _tables(read_trace(path))) for path in paths + paths[::-1]]
    kept_idle = sum(len(idle) for idle in eventscan._IDLE.values())
    assert 1 <= kept_idle <= eventscan.KEEP_IDLE, "a few scanners (scanning, converting) served every read"
    for path, tables in kept:  # compared after all reads: a result sharing the buffers would show it
        for name, table in tables.items():
            assert table.equals(fresh[path][name]), f"{path.name}: {name} differs after a reused scanner"


def _anonymous_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no RssAnon in /proc/self/status")


def _touch_whole_pages(array: np.ndarray) -> np.ndarray:
    """Write one byte in every page wholly inside ``array`` (faulting each in) and return what those
    bytes held before (the contents of a scanner's idle buffers do not matter: see
    ``Scanner.release_pages``)."""
    data = array.view(np.uint8).ravel()
    first = -array.ctypes.data % heap.PAGE_BYTES
    pages = (len(data) - first) // heap.PAGE_BYTES
    at = slice(first, first + pages * heap.PAGE_BYTES, heap.PAGE_BYTES)
    held = data[at].copy()
    data[at] = 1
    return held


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="resident memory read from /proc")
def test_scanners_kept_idle_after_reading_a_large_trace_hold_no_resident_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Three scanners kept after reading df_index_resolver held about 20 MB resident until the
    process ended, raising the peak of every stage after the read."""
    if not eventscan.available():
        pytest.skip("the native scanner is not built here")
    monkeypatch.setattr(eventscan, "_IDLE", {})
    read_trace(kineto_file("df_index_resolver/df_index_resolver.json.gz"))
    idle = [scanner for kept in eventscan._IDLE.values() for scanner in kept]
    assert idle
    before = _anonymous_mb()
    kept_arrays = [array for scanner in idle for work in scanner._work for array in work.values()]
    touched = np.concatenate([_touch_whole_pages(array) for array in kept_arrays])
    after = _anonymous_mb()
    assert not touched.any(), "a released page reads back as zeros"
    mb_touched = len(touched) * heap.PAGE_BYTES / 2**20
    assert after - before > 0.5 * mb_touched, (
        f"touching the idle scanners' {mb_touched:.0f} MB of buffers faulted in only "
        f"{after - before:.1f} MB: they were resident while idle"
    )


def test_a_worker_reading_rank_after_rank_keeps_its_idle_scanners_pages(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Inside ``eventscan.pages_kept()`` (a cluster worker's reads) the idle scanners keep their
    pages: handing them back only to fault them in for the next rank cost 2.5 ms of a 2 MB
    trace's read.  A read outside it hands them back as before, and the tables are the same."""
    if not eventscan.available():
        pytest.skip("the native scanner is not built here")
    path = kineto_file("distributed_info_unavailable/distributed_info_not_found.json.gz")
    monkeypatch.setattr(eventscan, "_IDLE", {})
    alone = _tables(read_trace(path))

    def first_bytes_of_idle_pages() -> np.ndarray:
        idle = [scanner for kept in eventscan._IDLE.values() for scanner in kept]
        assert idle
        arrays = [array for scanner in idle for work in scanner._work for array in work.values()]
        return np.concatenate([_touch_whole_pages(array) for array in arrays])

    with eventscan.pages_kept():
        in_worker = _tables(read_trace(path))
    assert first_bytes_of_idle_pages().any(), "the pages still hold the last read's rows"
    again = _tables(read_trace(path))
    assert not first_bytes_of_idle_pages().any(), "outside the block the pages were handed back"
    for name, table in alone.items():
        assert in_worker[name].equals(table) and again[name].equals(table), name


def test_released_pages_read_back_as_zeros_and_stay_usable() -> None:
    buffer = np.full(8 << 20, 7, np.uint8)  # 8 MiB, every page touched
    before = _anonymous_mb()
    heap.release_pages(buffer)
    if sys.platform.startswith("linux"):
        assert before - _anonymous_mb() > 6, "the pages were handed back"
    buffer[: 1 << 20] = 1  # still the process's memory, writable
    assert int(buffer[: 1 << 20].sum()) == 1 << 20 and buffer[-1] in (0, 7)


def test_a_scanner_whose_heaps_start_tiny_grows_them_and_reads_the_same_tables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Heaps out of room end a batch early and are doubled (``Scanner.make_room``): with 256-byte
    heaps every text and list column of a real trace takes that path many times."""
    if not eventscan.available():
        pytest.skip("the native scanner is not built here")
    path = kineto_file("distributed_info_unavailable/distributed_info_not_found.json.gz")
    monkeypatch.setattr(eventscan, "_IDLE", {})
    usual = _tables(read_trace(path))
    monkeypatch.setattr(eventscan, "_IDLE", {})
    monkeypatch.setattr(eventscan.Scanner, "MIN_HEAP", 256)
    grown = _tables(read_trace(path))
    for name, table in usual.items():
        assert grown[name].equals(table), f"{name} differs when the heaps had to grow"

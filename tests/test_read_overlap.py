"""The reader scans a trace on a thread of its own while the caller cuts the batch before: no
thread may outlive a read (finished, damaged, or stopped early), an error on the scanning thread
reaches the caller, and the rows are the ones a read on one thread gives."""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from perfsight.ingest import chrome_events, eventscan, read_trace
from perfsight.ingest.chrome_events import RAW_SCHEMA, read_events
from perfsight.ingest.jsonstream import prefetched
from perfsight.model import TABLE_SCHEMAS

READER_THREADS = ("perfsight-scan", "perfsight-decompress")

PATHS = [pytest.param(True, id="native"), pytest.param(False, id="portable")]


def _reader_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name in READER_THREADS]


def _native_or_skip(native: bool) -> None:
    if native and not eventscan.available():
        pytest.skip("the native scanner is not built here")


def _one_thread(items: Iterator, depth: int, name: str) -> Iterator:
    """What ``prefetched`` replaces: the items made on the caller's thread."""
    yield from items


@pytest.mark.parametrize("native", PATHS)
def test_no_reader_thread_outlives_a_read_stopped_after_its_first_batch(
    df_trace_path: Path, native: bool
) -> None:
    _native_or_skip(native)
    results, _ = read_events(df_trace_path, native=native)
    first = next(results)
    assert first.table.num_rows > 0 and first.problem is None
    assert _reader_threads(), "decompression (and the native scan) run on threads of their own"
    results.close()
    assert _reader_threads() == []


def test_no_reader_thread_outlives_a_caller_that_fails_midway(df_trace_path: Path) -> None:
    results, _ = read_events(df_trace_path)
    with pytest.raises(ZeroDivisionError):
        for i, _result in enumerate(results):
            if i == 2:
                raise ZeroDivisionError  # the caller's own failure, mid-read
    results.close()
    assert _reader_threads() == []


def test_damage_mid_way_keeps_every_event_before_it_as_a_one_thread_read_does(
    tmp_path: Path, df_trace_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Damage after several batches: the threaded read keeps exactly the rows (and says the same
    warning) a read on the caller's thread keeps, leaves no thread behind, and the portable path
    (never threaded) keeps the same slices."""
    _native_or_skip(True)
    raw = gzip.decompress(df_trace_path.read_bytes())
    middle = raw.index(b'"ph": "X"', int(len(raw) * 0.7))
    path = tmp_path / "damaged.json"
    path.write_bytes(raw[:middle] + b"@@@ not json @@@" + raw[middle:])

    threaded = read_trace(path)
    assert _reader_threads() == []
    with monkeypatch.context() as patch:
        patch.setattr(chrome_events, "prefetched", _one_thread)
        alone = read_trace(path)
    with monkeypatch.context() as patch:
        patch.setattr(eventscan, "_LIB", None)
        portable = read_trace(path)

    assert 0 < threaded.slices.num_rows == alone.slices.num_rows
    for name in TABLE_SCHEMAS:
        assert getattr(threaded, name).equals(getattr(alone, name)), name
    assert threaded.meta.warnings == alone.meta.warnings
    assert any("damaged at byte" in w for w in threaded.meta.warnings)
    assert threaded.slices.equals(portable.slices)


def test_a_threaded_read_gives_the_rows_of_a_one_thread_read(
    df_trace_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _native_or_skip(True)

    def rows() -> tuple[pa.Table, int]:
        results, report = read_events(df_trace_path, native=True)
        tables = [r.table for r in results]
        return pa.concat_tables([RAW_SCHEMA.empty_table(), *tables]), report.events

    threaded, threaded_events = rows()
    monkeypatch.setattr(chrome_events, "prefetched", _one_thread)
    alone, alone_events = rows()
    assert threaded_events == alone_events > 100_000
    assert threaded.num_rows == alone.num_rows and threaded.equals(alone)


def test_an_error_on_the_producing_thread_reaches_the_consumer_after_the_items_before_it() -> None:
    def items() -> Iterator[int]:
        yield 1
        yield 2
        raise OSError("disk gone")

    got = []
    with pytest.raises(OSError, match="disk gone"):
        for item in prefetched(items(), 1, "perfsight-scan"):
            got.append(item)
    assert got == [1, 2]
    assert _reader_threads() == []


def test_a_consumer_that_stops_frees_a_producer_blocked_on_the_full_queue() -> None:
    """The producer never ends by itself and is blocked on the full queue when the consumer stops:
    closing must stop it at once (no hang), and the producer's own clean-up must run."""
    cleaned = threading.Event()

    def endless() -> Iterator[int]:
        try:
            n = 0
            while True:
                n += 1
                yield n
        finally:
            cleaned.set()

    items = prefetched(endless(), 1, "perfsight-scan")
    assert next(items) == 1
    time.sleep(0.1)  # the producer fills the queue and waits on it
    started = time.perf_counter()
    items.close()
    assert time.perf_counter() - started < 1.0
    assert cleaned.is_set()
    assert _reader_threads() == []


def test_reading_a_trace_cut_short_leaves_no_thread(tmp_path: Path, df_trace_path: Path) -> None:
    data = df_trace_path.read_bytes()
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(data[: len(data) * 2 // 3])
    trace = read_trace(cut)
    assert trace.slices.num_rows > 10_000
    assert any("truncated" in w for w in trace.meta.warnings)
    assert _reader_threads() == []


def test_tracks_and_depths_built_beside_the_steps_equal_those_built_in_line(
    df_trace_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from perfsight.ingest import kineto

    assert read_trace(df_trace_path).slices.num_rows >= kineto.BESIDE_FROM, "the thread is used here"
    beside_steps = read_trace(df_trace_path)
    assert not [t for t in threading.enumerate() if t.name == "perfsight-depth"]
    monkeypatch.setattr(kineto, "BESIDE_FROM", 1 << 62)
    in_line = read_trace(df_trace_path)
    for name in TABLE_SCHEMAS:
        assert getattr(beside_steps, name).equals(getattr(in_line, name)), name


def test_an_error_beside_reaches_the_caller_and_leaves_no_thread() -> None:
    from perfsight.ingest.beside import beside

    def fails() -> int:
        raise ValueError("rank 70000 is outside 0..65535")

    with pytest.raises(ValueError, match="outside"), beside(fails, name="perfsight-depth") as result:
        result()
    assert not [t for t in threading.enumerate() if t.name == "perfsight-depth"]

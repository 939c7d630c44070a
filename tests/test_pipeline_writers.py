"""The writers of one rank's outputs, as the pipeline runs them on two threads: whatever order they
finish in, the outputs agree with each other."""

from __future__ import annotations

import functools
import threading
import time
from pathlib import Path

import pytest

from perfsight import pipeline
from perfsight.export.staging import background_writer
from perfsight.ingest import read_trace
from perfsight.store import cache, timeline_index
from shared_data import KINETO, require

NCCL = KINETO / "nccl_parser_config" / "nccl_data.json.gz"


def test_an_index_written_while_the_cached_trace_is_still_saving_is_current(tmp_path: Path) -> None:
    """The index's stamp digests the cached trace's source.json; written before it (the background
    thread slow, as on a slow disk), the index was stale at once and `perfsight serve` rebuilt it."""
    trace = read_trace(require(NCCL))
    result = pipeline.analyse_trace(trace, pipeline.Options())
    saving = threading.Event()

    def save_slowly() -> Path:
        saving.wait(10)
        return cache.save_trace(trace, tmp_path / pipeline.CACHE_DIR)

    with background_writer("test-writer") as background:
        trace_cached = background.submit(save_slowly)
        timer = threading.Timer(1.0, saving.set)  # long after this thread has reached the index
        timer.start()
        try:
            pipeline._write_tables(result, tmp_path, pipeline.Options(), background, trace_cached)
        finally:
            timer.cancel()
            saving.set()
    assert cache.is_fresh(tmp_path / pipeline.CACHE_DIR, trace.meta.sources)
    assert timeline_index.is_current(tmp_path / pipeline.CACHE_DIR)


def test_shared_writers_each_run_once_and_the_idle_thread_takes_what_the_busy_one_has_not_started() -> None:
    """``run_shared``: while the writer thread is held by a long write, this thread writes every
    other piece itself; each piece runs exactly once."""
    from perfsight.export.staging import run_shared

    release = threading.Event()
    ran: list[tuple[str, str]] = []

    def piece(name: str) -> None:
        ran.append((name, threading.current_thread().name))

    with background_writer("test-writer") as background:
        held = background.submit(release.wait, 10)  # the writer thread is busy until released
        run_shared(background, [functools.partial(piece, f"file{i}") for i in range(6)])
        release.set()
        held.result()
    assert sorted(name for name, _ in ran) == [f"file{i}" for i in range(6)]
    assert {thread for _, thread in ran} == {threading.main_thread().name}

    ran.clear()
    writer_took_one = threading.Event()

    def piece_waiting_for_the_writer(name: str) -> None:
        piece(name)
        if threading.current_thread().name == "test-writer":
            writer_took_one.set()
        else:  # this thread holds on until the writer thread has taken a piece from the front
            writer_took_one.wait(10)

    with background_writer("test-writer") as background:
        run_shared(background, [functools.partial(piece_waiting_for_the_writer, f"f{i}") for i in range(6)])
    assert sorted(name for name, _ in ran) == [f"f{i}" for i in range(6)]
    assert ("f0", "test-writer") in ran and ("f5", threading.main_thread().name) in ran


def test_a_shared_writer_that_fails_on_either_thread_fails_the_whole_write() -> None:
    from perfsight.export.staging import run_shared

    def fail() -> None:
        raise OSError("disk full")

    for pieces in ([fail, functools.partial(time.sleep, 0.2)], [functools.partial(time.sleep, 0.2), fail]):
        with pytest.raises(OSError, match="disk full"), background_writer("test-writer") as background:
            run_shared(background, pieces)


def test_shared_writers_with_costs_start_with_the_two_largest_one_on_each_thread() -> None:
    """Given their costs, the largest piece is the writer thread's first and the next largest this
    thread's first, so neither is left to run alone at the end; each piece still runs once."""
    from perfsight.export.staging import run_shared

    ran: list[tuple[str, str]] = []
    writer_took_one = threading.Event()

    def piece(name: str) -> None:
        ran.append((name, threading.current_thread().name))
        if threading.current_thread().name == "test-writer":
            writer_took_one.set()
        else:
            writer_took_one.wait(10)

    costs = {"small": 1.0, "largest": 9.0, "medium": 2.0, "second": 8.0, "third": 3.0}
    with background_writer("test-writer") as background:
        run_shared(background, [functools.partial(piece, name) for name in costs], costs=list(costs.values()))
    assert sorted(name for name, _ in ran) == sorted(costs)
    first = {thread: name for name, thread in reversed(ran)}
    assert first == {"test-writer": "largest", threading.main_thread().name: "second"}

"""The writers of one rank's outputs, as the pipeline runs them on two threads: whatever order they
finish in, the outputs agree with each other."""

from __future__ import annotations

import threading
from pathlib import Path

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

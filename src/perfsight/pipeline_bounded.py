"""Analyse one Kineto trace of any size within a memory budget, chunk of steps by chunk.

The order of work is ``pipeline.analyse_and_write``'s, but nothing whole-trace is ever in
memory: the reader spills the trace under the output folder and gives it back a chunk of whole
steps at a time (``ingest/kineto_spill.py``, chunks as ``model_chunks`` defines them), the
analyses run per chunk and merge (``chunked_analysis.py``: per-row results spilled as sorted
runs, aggregates from partials), and the writers take the chunks and the merged rows in order
(``export/chunked_outputs.py``).  Every output equals the whole-trace path's
(``tests/test_bounded_pipeline.py`` compares every file on the shared traces).  The spill is a
hidden staging folder under the output folder, deleted when the analysis ends, however it ends
(a process killed outright leaves it, hidden from discovery and the server like any staging folder).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from perfsight import memory_budget
from perfsight.model import Trace, empty_table
from perfsight.model_chunks import TraceChunk
from perfsight.pipeline import OUTPUT_DIR, Options, OutputError, RankResult
from perfsight.store import external_sort


def analyse_and_write_bounded(
    path: Path,
    root: Path,
    place: Callable[[int], Path],
    options: Options,
    budget: int,
    progress: Any = None,
    observe: Callable[[TraceChunk], None] | None = None,
) -> RankResult:
    """Analyse the trace at ``path`` within about ``budget`` bytes; write every output into
    ``place(rank)`` (the rank is the trace's, known once it is read), spilling under ``root``.
    ``observe``, when given, is shown each chunk as the analyses read it (a job's rank computes
    its cluster extras so, ``cluster/rank_chunks.py``, with no second read of the spill).

    Returns the small tables (per step, per operator, per kernel name...) and a trace holding
    the rank's metadata, tracks and steps only: the per-row tables and the slices stay on disk,
    in the rank folder's cache, where ``perfsight serve`` and ``perfsight.load`` read them.
    """
    from perfsight.chunked_analysis import analyse_chunks
    from perfsight.export.chunked_outputs import write_outputs_chunked
    from perfsight.export.staging import STAGING_PREFIX, remove_folder
    from perfsight.ingest import spill_trace

    max_slices = memory_budget.slices_per_chunk(budget)
    share = memory_budget.WRITE_SORT_SHARE
    sort_memory = memory_budget.sort_memory(max_slices, share, external_sort.LEAST_BYTES)
    spill = root / f"{STAGING_PREFIX}spill-{uuid.uuid4().hex[:12]}"  # skipped by discovery and the server
    try:
        with OutputError.naming(root):
            spill.mkdir(parents=True)
        with spill_trace(path, spill / "trace", max_slices, rank=options.rank) as spilled:
            rank_dir = place(spilled.meta.rank)
            chunked = analyse_chunks(observed(spilled.chunks(), observe), options, spill / "rows")
            if progress is not None:
                progress.update(1)
            with OutputError.naming(rank_dir):  # staged: complete or absent (export/staging.py)
                write_outputs_chunked(
                    rank_dir,
                    spilled.chunks,
                    chunked.tables,
                    {name: rows.merged for name, rows in chunked.rows.items()},
                    chunked.steps,
                    options,
                    chunked.findings,
                    sort_memory,
                )
            summary = _summary_trace(spilled.meta, spilled.tracks, chunked.steps)
            chunks = len(spilled.chunk_steps)
    finally:
        remove_folder(spill)
    if progress is not None:
        progress.update(1)
    return RankResult(
        trace=summary,
        tables=chunked.tables,
        output_dir=rank_dir / OUTPUT_DIR,
        warnings=chunked.warnings,
        findings=chunked.findings,
        bounded={"memory_limit_bytes": budget, "chunks": chunks},
    )


def observed(
    chunks: Iterator[TraceChunk], observe: Callable[[TraceChunk], None] | None
) -> Iterator[TraceChunk]:
    """The chunks, each shown to ``observe`` first as it passes (one read of the spill serves both)."""
    for chunk in chunks:
        if observe is not None:
            observe(chunk)
        yield chunk


def _summary_trace(meta: Any, tracks: Any, steps: Any) -> Trace:
    """A trace with the rank's metadata, tracks and steps and no events (what a summary reads)."""
    from perfsight.model import COMM_SCHEMA, FLOW_SCHEMA, MEMORY_SCHEMA, SLICE_SCHEMA

    return Trace(
        slices=empty_table(SLICE_SCHEMA),
        tracks=tracks,
        memory=empty_table(MEMORY_SCHEMA),
        flows=empty_table(FLOW_SCHEMA),
        steps=steps,
        comm=empty_table(COMM_SCHEMA),
        meta=dataclasses.replace(meta),
    )

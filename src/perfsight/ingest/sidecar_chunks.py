"""Merge a run folder's capture tables into a trace read in chunks of whole steps (issue 21).

Why: the bounded-memory path never holds a whole trace, but the capture's rows must end up in
each chunk exactly as :func:`perfsight.ingest.sidecar.merge_sidecars` merges them into the whole
trace.  A capture row's match is not local to a chunk: it claims the first trace row starting in
its call on its thread, or the trace row of its collective running at its time, or (nested in
another op) a communication slice the reader made no comm row for, and the first capture row to
claim a trace row wins.  A claimed row may lie in the chunk after the capture row's own time.

So the match is made once, by ``merge_sidecars`` itself, on a small trace holding only what it
reads: the trace's comm rows (one or two per collective) and the communication slices, gathered
in one pass over the chunks, with the whole step table and the rank's metadata.  What it gives is
then cut along the chunks (``model_chunks``' rule): a trace comm row stays with its slice, a
capture row of its own (appended after the trace's rows) goes with the slice it claimed, else by
its time, as do the data-loader rows.  The capture tables are small (a row per collective or
batch); the trace is never read whole.

This module must not match or compute anything itself: every value comes from ``sidecar``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfsight import columns
from perfsight.ingest.sidecar import merge_sidecars
from perfsight.model import NO_ID, RunMetadata, SliceKind, Trace
from perfsight.model_chunks import (
    TraceChunk,
    chunk_by_time,
    chunk_starts,
    comm_chunks,
    local_rows,
    whole_rows,
)

Chunks = Callable[[], Iterator[TraceChunk]]
_ROW_TABLES = ("slices", "flows", "comm", "memory", "comm_tasks", "dataloader")


def merge_sidecars_in_chunks(
    chunks: Chunks, steps: pa.Table, meta: RunMetadata, files: Mapping[str, str | Path]
) -> Chunks:
    """``chunks`` (a callable giving the chunks of one trace in order, again at each call) with the
    capture tables in ``files`` merged into each chunk as ``merge_sidecars`` merges them into the
    whole trace: the same rows, values and whole-trace rows (``TraceChunk.table_rows``).

    ``steps`` is the whole step table and ``meta`` the rank's metadata (its warnings get those of
    the merge).  Reads the chunks once now; the result reads them again at each call."""
    merged = _MergedCapture.of(chunks(), steps, meta, files)
    return lambda: (merged.into(chunk) for chunk in chunks())


@dataclasses.dataclass
class _MergedCapture:
    """The merge's result for the whole trace, and where each of its rows goes."""

    comm: pa.Table
    """The merged comm table; ``slice`` as the whole trace's slice rows."""
    trace_rows: int
    """How many rows of ``comm`` are the trace's own (the capture's own rows follow)."""
    comm_chunk: np.ndarray
    """The chunk of each of the capture's own rows of ``comm``."""
    dataloader: pa.Table
    loader_chunk: np.ndarray

    @classmethod
    def of(
        cls, chunks: Iterator[TraceChunk], steps: pa.Table, meta: RunMetadata, files: Mapping[str, str | Path]
    ) -> _MergedCapture:
        small = _Gathered()
        for chunk in chunks:
            small.add(chunk)
        trace, slice_chunk = small.trace(steps, meta)
        merged = merge_sidecars(trace, files)
        bounds = chunk_starts(steps, small.chunk_steps)
        n = trace.comm.num_rows
        on_slice = columns.int64(merged.comm.column("slice"), NO_ID)
        comm = _with_slice(merged.comm, whole_rows(on_slice, small.slice_keys))
        comm_chunk = comm_chunks(merged.comm.slice(n), slice_chunk, bounds)
        loader_chunk = chunk_by_time(columns.int64(merged.dataloader.column("start_ns"), 0), bounds)
        return cls(comm, n, comm_chunk, merged.dataloader, loader_chunk)

    def into(self, chunk: TraceChunk) -> TraceChunk:
        """``chunk`` with its comm and data-loader rows from the merge."""
        own = np.asarray(chunk.table_rows["comm"], np.int64)
        rows = np.concatenate([own, self.trace_rows + np.flatnonzero(self.comm_chunk == chunk.number)])
        comm = self.comm.take(pa.array(rows, pa.int64()))
        comm = _with_slice(comm, local_rows(columns.int64(comm.column("slice"), NO_ID), chunk.slice_rows))
        loader_rows = np.flatnonzero(self.loader_chunk == chunk.number).astype(np.int64)
        dataloader = self.dataloader.take(pa.array(loader_rows, pa.int64()))
        trace = dataclasses.replace(chunk.trace, comm=comm, dataloader=dataloader)
        table_rows = {**chunk.table_rows, "comm": rows, "dataloader": loader_rows}
        return dataclasses.replace(chunk, trace=trace, table_rows=table_rows)


class _Gathered:
    """What ``merge_comm`` reads of the trace, from the chunks: every comm row, and the slices a
    capture row may claim (the comm rows' own and every communication slice), by whole-trace row."""

    def __init__(self) -> None:
        self.template: Trace | None = None
        self.comm: list[pa.Table] = []
        self.comm_keys: list[np.ndarray] = []
        self.slices: list[pa.Table] = []
        self.keys: list[np.ndarray] = []
        self.chunk_of: list[np.ndarray] = []
        self.chunk_steps: list[tuple[int, ...]] = []
        self.slice_keys = np.zeros(0, np.int64)

    def add(self, chunk: TraceChunk) -> None:
        t = chunk.trace
        if self.template is None:  # the metadata and tracks; no rows (they would keep the chunk's buffers)
            self.template = dataclasses.replace(
                t, **{name: getattr(t, name).schema.empty_table() for name in _ROW_TABLES}
            )
        self.chunk_steps.append(chunk.steps)
        comm_slice = columns.int64(t.comm.column("slice"), NO_ID)
        kinds = pc.cast(t.slices.column("kind"), pa.string())
        communication = columns.numpy(pc.equal(kinds, SliceKind.COMMUNICATION.value), null=False)
        rows = np.union1d(np.flatnonzero(communication), comm_slice[comm_slice >= 0]).astype(np.int64)
        self.slices.append(t.slices.take(pa.array(rows, pa.int64())))
        self.keys.append(chunk.slice_rows[rows])
        self.chunk_of.append(np.full(len(rows), chunk.number, np.int64))
        self.comm.append(_with_slice(t.comm, whole_rows(comm_slice, chunk.slice_rows)))
        self.comm_keys.append(np.asarray(chunk.table_rows["comm"], np.int64))

    def trace(self, steps: pa.Table, meta: RunMetadata) -> tuple[Trace, np.ndarray]:
        """The small trace (slices and comm rows in the whole trace's order, ``slice`` indexing the
        small slices) and the chunk of each of its slices."""
        if self.template is None:
            raise ValueError("the trace gave no chunk")
        keys = np.concatenate(self.keys)
        order = np.argsort(keys, kind="stable")
        self.slice_keys = keys[order]
        slices = pa.concat_tables(self.slices).take(pa.array(order, pa.int64()))
        comm_keys = np.concatenate(self.comm_keys)
        comm_order = np.argsort(comm_keys, kind="stable")
        if not np.array_equal(comm_keys[comm_order], np.arange(len(comm_keys))):  # each row in one chunk
            raise ValueError("the chunks' comm rows (TraceChunk.table_rows['comm']) do not cut one table")
        comm = pa.concat_tables(self.comm).take(pa.array(comm_order, pa.int64()))
        whole = columns.int64(comm.column("slice"), NO_ID)
        comm = _with_slice(comm, local_rows(whole, self.slice_keys))
        trace = dataclasses.replace(self.template, slices=slices, comm=comm, steps=steps, meta=meta)
        return trace, np.concatenate(self.chunk_of)[order]


def _with_slice(comm: pa.Table, values: np.ndarray) -> pa.Table:
    index = comm.schema.get_field_index("slice")
    return comm.set_column(index, comm.schema.field(index), pa.array(values, pa.int64()))


__all__ = ["merge_sidecars_in_chunks"]

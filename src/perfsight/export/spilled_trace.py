"""A rank's trace given chunk by chunk, spilled to disk and read back in the whole trace's row order.

Why: the chunked writers (:mod:`perfsight.export.chunked_outputs`) must write the cached trace,
the trace view and the timeline index in the order the whole trace has, but a chunk holds a few
steps, whose rows are spread over the whole trace.  One pass over the chunks spills each table's
rows as a sorted run (:class:`~perfsight.sorted_runs.RunSpill`) keyed by their rows in the whole
trace, with the chunk's row indices (flow ends, a comm row's slice, an HCCL task's op) turned
into the whole trace's; the merged runs then give each table back a batch at a time.  The same
pass gathers the little the trace view's header needs (the time offset, the memory devices).

This module must not format any output: it gives tables back in order (and writes the cached
trace's, which are the spilled tables themselves).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from perfsight import columns
from perfsight.export import trace_view
from perfsight.heap import return_freed_memory
from perfsight.model import NO_ID, TABLE_SCHEMAS, Trace
from perfsight.model_chunks import TraceChunk
from perfsight.parquet_files import spill_options
from perfsight.sorted_runs import RunSpill
from perfsight.store import cache, timeline_index

SPILLED = ("slices", "flows", "comm", "memory", "dataloader", "comm_tasks")
"""The trace tables with rows per chunk; ``tracks`` is whole in every chunk, ``steps`` is given."""
FLOW_ENDS = ("__row", "__src_start", "__src_track", "__dst_start", "__dst_track")
"""Columns the flows' runs carry beside the model's: the flow's row, and each end's start and track."""
MERGE_ROWS = 65_536
"""Rows a merge of spilled runs holds at once, over all its runs (one batch each): each run's
batch is this over the number of runs, at least :data:`MIN_BATCH_ROWS`."""
MIN_BATCH_ROWS = 1024
BATCH_ROWS = 65_536
"""Rows per batch handed to the writers (:meth:`OrderedTrace.rows`)."""


@dataclasses.dataclass
class OrderedTrace:
    """The trace after the writers' spilling pass: its tables as sorted runs that come back in
    the whole trace's row order, plus its whole small parts.  (Not the reader's spill,
    ``ingest.kineto_spill.SpilledTrace``, which gives the trace back a chunk at a time.)"""

    first: Trace
    """The first chunk's trace without its rows: tracks, metadata, vendor results (whole in each chunk)."""
    spills: dict[str, RunSpill]
    schemas: dict[str, pa.Schema]
    times: trace_view.TimeSpan
    memory_devices: list[str]

    def rows(self, name: str) -> Iterator[pa.Table]:
        """Table ``name`` in the whole trace's row order, in batches of about :data:`BATCH_ROWS`
        (a merge yields as little as one run's share; the writers pay per batch)."""
        return coalesced(self.spills[name].merged(), BATCH_ROWS)


def spill_chunks(chunks: Callable[[], Iterator[TraceChunk]], spill: Path) -> OrderedTrace:
    """One pass over the chunks: each table's rows as a run keyed by their whole-trace rows."""
    spills = {name: RunSpill(spill, name) for name in SPILLED}
    times = trace_view.TimeSpan()
    devices: set[str] = set()
    first: Trace | None = None
    schemas: dict[str, pa.Schema] = {}
    for chunk in chunks():
        t = chunk.trace
        if first is None:
            first = dataclasses.replace(
                t, **{name: getattr(t, name).schema.empty_table() for name in SPILLED}
            )
            schemas = {name: getattr(t, name).schema for name in TABLE_SCHEMAS}
        slice_rows = chunk.slice_rows
        spills["slices"].add(t.slices, slice_rows)
        start = columns.int64(t.slices.column("start_ns"))
        times.add(start)
        times.add(start + columns.int64(t.slices.column("dur_ns")))
        flows = t.flows
        if flows.num_rows:
            src, dst = columns.int64(flows.column("src")), columns.int64(flows.column("dst"))
            track = columns.int64(t.slices.column("track"))
            flows = with_columns(flows, src=slice_rows[src], dst=slice_rows[dst])
            extra = {
                "__row": _rows_of(chunk, "flows"),
                "__src_start": start[src],
                "__src_track": track[src],
                "__dst_start": start[dst],
                "__dst_track": track[dst],
            }
            for name, values in extra.items():
                flows = flows.append_column(name, pa.array(values, pa.int64()))
            spills["flows"].add(flows, _rows_of(chunk, "flows"))
        comm_rows = _rows_of(chunk, "comm")
        if t.comm.num_rows:
            comm = with_columns(t.comm, slice=_whole_rows(t.comm, "slice", slice_rows))
            spills["comm"].add(comm, comm_rows)
        if t.comm_tasks.num_rows:
            tasks = with_columns(
                t.comm_tasks,
                op=_whole_rows(t.comm_tasks, "op", comm_rows),
                slice=_whole_rows(t.comm_tasks, "slice", slice_rows),
            )
            spills["comm_tasks"].add(tasks, _rows_of(chunk, "comm_tasks"))
        if t.memory.num_rows:
            spills["memory"].add(t.memory, _rows_of(chunk, "memory"))
            times.add(columns.int64(t.memory.column("ts_ns")))
            devices |= set(pc.unique(trace_view.memory_keys(t.memory)).to_pylist())
        if t.dataloader.num_rows:
            spills["dataloader"].add(t.dataloader, _rows_of(chunk, "dataloader"))
    if first is None:
        raise ValueError("the trace gave no chunk")
    for run in spills.values():
        run.batch_rows = merge_batch_rows(run)
    return_freed_memory()  # the chunks' tables: gone before the writers grow the heap
    return OrderedTrace(first, spills, schemas, times, sorted(devices))


def _rows_of(chunk: TraceChunk, name: str) -> np.ndarray:
    """The whole trace's row of each of the chunk's rows of table ``name`` (none: no rows)."""
    rows = chunk.table_rows.get(name)
    count = getattr(chunk.trace, name).num_rows
    if rows is None and count == 0:
        return np.zeros(0, np.int64)
    if rows is None or len(rows) != count:
        raise ValueError(
            f"chunk {chunk.number} of rank {chunk.trace.rank}: TraceChunk.table_rows[{name!r}] must give "
            f"the whole trace's row of each of its {count} {name} rows (the chunked writers put them back "
            "in that order)"
        )
    return np.asarray(rows, np.int64)


def with_columns(table: pa.Table, **values: np.ndarray) -> pa.Table:
    """``table`` with the named int64 columns replaced."""
    for name, array in values.items():
        index = table.schema.get_field_index(name)
        field = table.schema.field(name)
        table = table.set_column(index, field, pa.array(array, pa.int64()).cast(field.type))
    return table


def _whole_rows(table: pa.Table, name: str, rows: np.ndarray) -> np.ndarray:
    """Column ``name`` of chunk row indices as the whole trace's (``rows[i]``), NO_ID kept."""
    local = columns.int64(table.column(name))
    if not len(rows):
        return np.full(len(local), NO_ID, np.int64)
    return np.where(local != NO_ID, rows[np.clip(local, 0, len(rows) - 1)], NO_ID)


def write_cached_trace(
    trace: OrderedTrace, steps: pa.Table, folder: Path, spill: Path
) -> tuple[list[Path], list[Path], list[Any], list[Any]]:
    """The cache's trace tables in whole-trace row order; returns what the timeline index reads
    (its slice and flow files, the names and the flow kinds, coded in that same order)."""
    cache.start_trace(folder)
    names, flow_kinds = timeline_index.FirstSeenCodes(), timeline_index.FirstSeenCodes()
    slice_file, flow_file = spill / "timeline_slices.parquet", spill / "timeline_flows.parquet"

    def slices() -> Iterator[pa.Table]:
        done = 0
        with pq.ParquetWriter(slice_file, _SLICE_INDEX, **spill_options(_SLICE_INDEX)) as index:
            for batch in trace.rows("slices"):
                n = batch.num_rows
                index.write_table(
                    pa.table(
                        {
                            "row": pa.array(np.arange(done, done + n, dtype=np.int64)),
                            "track": batch.column("track"),
                            "depth": batch.column("depth"),
                            "start_ns": batch.column("start_ns"),
                            "dur_ns": batch.column("dur_ns"),
                            "kind": pa.array(timeline_index.kind_index(batch.column("kind")), pa.int8()),
                            "name": pa.array(names.add(batch.column("name")), pa.int32()),
                        },
                        schema=_SLICE_INDEX,
                    )
                )
                done += n
                yield batch

    def flows() -> Iterator[pa.Table]:
        with pq.ParquetWriter(flow_file, _FLOW_INDEX, **spill_options(_FLOW_INDEX)) as index:
            for batch in trace.rows("flows"):
                index.write_table(
                    pa.table(
                        {
                            "row": batch.column("__row"),
                            "src": batch.column("src"),
                            "dst": batch.column("dst"),
                            "kind": pa.array(flow_kinds.add(batch.column("kind")), pa.int64()),
                            "src_start_ns": batch.column("__src_start"),
                        },
                        schema=_FLOW_INDEX,
                    )
                )
                yield batch.drop_columns(list(FLOW_ENDS))

    for name, schema in trace.schemas.items():
        path = folder / f"{name}.parquet"
        if name == "tracks":
            cache.write_parquet_batches(path, schema, [trace.first.tracks])
        elif name == "steps":
            cache.write_parquet_batches(path, schema, [steps])
        elif name == "slices":
            cache.write_parquet_batches(path, schema, slices())
        elif name == "flows":
            cache.write_parquet_batches(path, schema, flows())
        else:
            cache.write_parquet_batches(path, schema, trace.rows(name))
    cache.finish_trace(folder, trace.first)
    has_flows = trace.spills["flows"].rows > 0
    return [slice_file], [flow_file] if has_flows else [], names.values, flow_kinds.values


_SLICE_INDEX = pa.schema(
    [("row", pa.int64()), ("track", pa.int32()), ("depth", pa.int16()), ("start_ns", pa.int64()),
     ("dur_ns", pa.int64()), ("kind", pa.int8()), ("name", pa.int32())]
)  # fmt: skip
_FLOW_INDEX = pa.schema(
    [("row", pa.int64()), ("src", pa.int64()), ("dst", pa.int64()), ("kind", pa.int64()),
     ("src_start_ns", pa.int64())]
)  # fmt: skip


def merge_batch_rows(runs: RunSpill) -> int:
    """Rows per run's batch when ``runs`` are merged: :data:`MERGE_ROWS` over them all."""
    return max(MIN_BATCH_ROWS, MERGE_ROWS // max(1, len(runs.runs)))


def coalesced(batches: Iterator[pa.Table], rows: int) -> Iterator[pa.Table]:
    """``batches`` joined into batches of at least ``rows`` rows (the last may be smaller)."""
    parts: list[pa.Table] = []
    held = 0
    for batch in batches:
        parts.append(batch)
        held += batch.num_rows
        if held >= rows:
            yield pa.concat_tables(parts).combine_chunks()
            parts, held = [], 0
    if parts:
        yield pa.concat_tables(parts).combine_chunks()

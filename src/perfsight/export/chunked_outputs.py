"""Every output of a rank written from a trace given chunk by chunk (the bounded-memory path).

Why: a trace larger than memory is analysed chunk by chunk (``perfsight.model_chunks``); its
outputs must still be the files ``pipeline.analyse_and_write`` writes for the whole trace, byte
for byte (Parquet: the same table read back).  Here no writer holds the whole trace or a whole
per-row table:

* one pass over the chunks spills each trace table as sorted runs (:class:`~perfsight.sorted_runs.RunSpill`)
  keyed by each row's row in the whole trace, with the chunk's row indices (flow ends, a comm
  row's slice, an HCCL task's op) turned into the whole trace's; the same pass gathers what the
  trace view's header needs (the time offset, the memory devices);
* the cached trace's tables are then written as Parquet row groups from the merged runs, in
  whole-trace order, and the timeline index is built from the slices spilled in that order
  (DuckDB sorts them into lane order within a memory limit);
* ``trace_view.json`` is written in the whole writer's event order: slices, flow starts, flow
  finishes, memory counters, overlap intervals, each from its merged runs or its row stream;
* the per-row CSVs, the SQLite db and the cached analysis tables take the per-row tables a batch
  at a time (a CSV whose rows come out of its order is sorted by DuckDB on disk, as is the
  timeline index: ``store/external_sort.py``); ``communication.json`` takes one step's ops and
  links at a time, spilled as runs sorted by step; the small tables go to the whole-table
  writers unchanged.

Everything spilled lives in the staging folder (``export/staging.py``) and goes with it.  The
formatting is the whole-trace writers' own: this module only feeds them pieces in order.
What stays whole: the small tables, the largest timeline lane (its pyramid is built from all of
it) and one step's communication ops.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from perfsight import advisor, columns
from perfsight.analysis import communication, kernels, memory, operators, overlap
from perfsight.export import data_pipeline_files, mindspore_csv, sqlite_db, trace_view
from perfsight.export.communication_json import write_communication_json_by_step
from perfsight.export.staging import staged
from perfsight.heap import return_freed_memory
from perfsight.layout import CACHE_DIR, OUTPUT_DIR
from perfsight.model import NO_ID, TABLE_SCHEMAS, Trace
from perfsight.model_chunks import TraceChunk
from perfsight.sorted_runs import RunSpill
from perfsight.store import cache, external_sort, timeline_index

if TYPE_CHECKING:
    from perfsight.pipeline import Options

ROW_TABLES = (
    "overlap_intervals",
    "operator_instances",
    "kernel_details",
    "memory_curve",
    "operator_memory",
    "communication_ops",
    "communication_links",
)
"""The analysis tables with a row per event (or per allocation, per collective): streamed."""

ROW_SCHEMAS: dict[str, pa.Schema] = {
    "overlap_intervals": overlap.OVERLAP_INTERVAL_SCHEMA,
    "operator_instances": operators.OPERATOR_INSTANCES_SCHEMA,
    "kernel_details": kernels.KERNEL_DETAILS_SCHEMA,
    "memory_curve": memory.MEMORY_CURVE_SCHEMA,
    "operator_memory": memory.OPERATOR_MEMORY_SCHEMA,
    "communication_ops": communication.OP_TIME_SCHEMA,
    "communication_links": communication.LINK_SCHEMA,
}
"""The schema of a per-row table whose stream yields no batch at all (an empty table)."""

SPILL_DIR = ".spill"
SPILLED = ("slices", "flows", "comm", "memory", "dataloader", "comm_tasks")
"""The trace tables with rows per chunk; ``tracks`` is whole in every chunk, ``steps`` is given."""
FLOW_ENDS = ("__row", "__src_start", "__src_track", "__dst_start", "__dst_track")
"""Columns the flows' runs carry beside the model's: the flow's row, and each end's start and track."""
DUCKDB_MEMORY = external_sort.MEMORY_LIMIT
"""What the DuckDB sorts (timeline lanes, a CSV's rows out of order) may hold before spilling."""
MERGE_ROWS = 65_536
"""Rows a merge of spilled runs holds at once, over all its runs (one batch each): each run's
batch is this over the number of runs, at least :data:`MIN_BATCH_ROWS`."""
MIN_BATCH_ROWS = 1024

Batches = Callable[[], Iterator[pa.Table]]


def write_outputs_chunked(
    rank_dir: Path,
    chunks: Callable[[], Iterator[TraceChunk]],
    tables: dict[str, pa.Table],
    rows: Mapping[str, Batches],
    steps: pa.Table,
    options: Options,
    findings: list,
) -> None:
    """Write what ``pipeline.analyse_and_write`` writes in ``rank_dir``, from the trace's chunks.

    ``chunks()`` reads the chunks (again at each call); ``rows[name]()`` yields the per-row table
    ``name`` (:data:`ROW_TABLES`) in whole-trace order a batch at a time (several calls allowed);
    ``tables`` holds every other analysis table, in ``analyse_trace``'s order; ``steps`` is the
    whole step table; ``findings`` the advisor's findings for the rank.
    """
    rank_dir = Path(rank_dir)
    with staged(rank_dir, (OUTPUT_DIR, CACHE_DIR)) as stage:
        spill = stage / SPILL_DIR
        trace = _spill_chunks(chunks, spill)
        streams = {n: _stream(n, rows.get(n), tables) for n in ROW_TABLES if n in rows or n in tables}
        tables = {name: table for name, table in tables.items() if name not in streams}
        out, cache_dir = stage / OUTPUT_DIR, stage / CACHE_DIR
        out.mkdir(parents=True, exist_ok=True)
        try:
            index_input = _write_cached_trace(trace, steps, cache_dir, spill)
            timeline_index.write_timeline_index_spilled(
                cache_dir, trace.first.rank, *index_input, spill, memory_limit=DUCKDB_MEMORY
            )
            return_freed_memory()
            ordered = _in_analysis_order(tables, streams)
            if "text" in options.export_types:
                _write_trace_view(out / "trace_view.json", trace, streams["overlap_intervals"])
                _write_csvs(out, tables, streams, spill)
                return_freed_memory()
                data_pipeline_files.write_all(out, tables)
                if trace.spills["comm"].rows:
                    steps_tables = _communication_steps(streams, tables, spill)
                    write_communication_json_by_step(out / "communication.json", steps_tables)
            if "db" in options.export_types:
                db_tables: dict[str, pa.Table | sqlite_db.TableStream] = dict(ordered)
                db_tables["slices"] = (trace.schemas["slices"], trace.spills["slices"].merged)
                sqlite_db.write_db(out / f"perfsight_{trace.first.rank}.db", db_tables)
            cache.save_tables(cache_dir, tables)
            for name, (schema, batches) in streams.items():
                cache.save_table_batches(cache_dir, name, schema, batches())
            advisor.write_advisor_json(out / advisor.ADVISOR_JSON, findings, "rank")
        finally:
            for run in trace.spills.values():
                run.remove()


@dataclasses.dataclass
class _SpilledTrace:
    """The trace after the spilling pass: its tables as sorted runs, plus its whole small parts."""

    first: Trace
    """The first chunk's trace without its rows: tracks, metadata, vendor results (whole in each chunk)."""
    spills: dict[str, RunSpill]
    schemas: dict[str, pa.Schema]
    times: trace_view.TimeSpan
    memory_devices: list[str]


def _spill_chunks(chunks: Callable[[], Iterator[TraceChunk]], spill: Path) -> _SpilledTrace:
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
            flows = _with(flows, src=slice_rows[src], dst=slice_rows[dst])
            extra = {
                "__row": chunk.table_rows["flows"],
                "__src_start": start[src],
                "__src_track": track[src],
                "__dst_start": start[dst],
                "__dst_track": track[dst],
            }
            for name, values in extra.items():
                flows = flows.append_column(name, pa.array(values, pa.int64()))
            spills["flows"].add(flows, chunk.table_rows["flows"])
        comm_rows = chunk.table_rows.get("comm", np.zeros(0, np.int64))
        if t.comm.num_rows:
            spills["comm"].add(_with(t.comm, slice=_whole_rows(t.comm, "slice", slice_rows)), comm_rows)
        if t.comm_tasks.num_rows:
            tasks = _with(
                t.comm_tasks,
                op=_whole_rows(t.comm_tasks, "op", comm_rows),
                slice=_whole_rows(t.comm_tasks, "slice", slice_rows),
            )
            spills["comm_tasks"].add(tasks, chunk.table_rows["comm_tasks"])
        if t.memory.num_rows:
            spills["memory"].add(t.memory, chunk.table_rows["memory"])
            times.add(columns.int64(t.memory.column("ts_ns")))
            devices |= set(pc.unique(trace_view.memory_keys(t.memory)).to_pylist())
        if t.dataloader.num_rows:
            spills["dataloader"].add(t.dataloader, chunk.table_rows["dataloader"])
    if first is None:
        raise ValueError("the trace gave no chunk")
    for run in spills.values():
        run.batch_rows = max(MIN_BATCH_ROWS, MERGE_ROWS // max(1, len(run.runs)))
    return_freed_memory()  # the chunks' tables: gone before the writers grow the heap
    return _SpilledTrace(first, spills, schemas, times, sorted(devices))


def _with(table: pa.Table, **values: np.ndarray) -> pa.Table:
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


def _write_cached_trace(
    trace: _SpilledTrace, steps: pa.Table, folder: Path, spill: Path
) -> tuple[list[Path], list[Path], list[Any], list[Any]]:
    """The cache's trace tables in whole-trace row order; returns what the timeline index reads
    (its slice and flow files, the names and the flow kinds, coded in that same order)."""
    cache.start_trace(folder)
    names, flow_kinds = timeline_index.FirstSeenCodes(), timeline_index.FirstSeenCodes()
    slice_file, flow_file = spill / "timeline_slices.parquet", spill / "timeline_flows.parquet"

    def slices() -> Iterator[pa.Table]:
        done = 0
        with pq.ParquetWriter(slice_file, _SLICE_INDEX) as index:
            for batch in trace.spills["slices"].merged():
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
        with pq.ParquetWriter(flow_file, _FLOW_INDEX) as index:
            for batch in trace.spills["flows"].merged():
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
            cache.write_parquet_batches(path, schema, trace.spills[name].merged())
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


def _write_trace_view(path: Path, trace: _SpilledTrace, overlap_rows: sqlite_db.TableStream) -> None:
    """``trace_view.json`` in the whole writer's event order, a merged batch at a time."""
    times = trace.times
    for batch in overlap_rows[1]():
        times.add(columns.int64(batch.column("start_ns")))
        times.add(columns.int64(batch.column("end_ns")))
    offset = times.offset_ns()
    lanes = trace_view.view_lanes(trace.first, trace.memory_devices)

    def slices() -> Iterator[memoryview]:
        for batch in trace.spills["slices"].merged():
            yield from trace_view.slice_events(batch, lanes, offset)

    def flows() -> Iterator[memoryview]:
        for phase, end in trace_view.FLOW_PHASES:
            prefix = f"__{end}"
            for batch in trace.spills["flows"].merged():
                yield trace_view.flow_events(
                    phase,
                    columns.int64(batch.column("__row")),
                    batch.column("kind"),
                    columns.int64(batch.column(f"{prefix}_track")),
                    columns.int64(batch.column(f"{prefix}_start")),
                    lanes,
                    offset,
                )

    def memory_rows() -> Iterator[memoryview]:
        for batch in trace.spills["memory"].merged():
            yield from trace_view.memory_events(batch, lanes, trace_view.memory_keys(batch), offset)

    def overlaps() -> Iterator[memoryview]:
        for batch in overlap_rows[1]():
            yield from trace_view.overlap_events(batch, lanes, offset)

    trace_view.write_events(path, trace.first, lanes, offset, (slices(), flows(), memory_rows(), overlaps()))


def _write_csvs(
    out: Path, tables: dict[str, pa.Table], streams: dict[str, sqlite_db.TableStream], spill: Path
) -> None:
    """The seed-style CSVs: per-row files a batch at a time, the others as ``write_all`` writes them."""
    for name in mindspore_csv.ROW_FILES:
        if name in streams:
            schema, batches = streams[name]
            mindspore_csv.write_csv_batches(out, name, batches, _external_sort(batches, schema, spill / name))
    mindspore_csv.write_all(out, {n: t for n, t in tables.items() if n not in mindspore_csv.ROW_FILES})


def _external_sort(
    batches: Batches, schema: pa.Schema, spill: Path
) -> Callable[[list[tuple[str, str]]], Batches]:
    """A stable sort of ``batches`` by ascending keys on disk (DuckDB, within :data:`DUCKDB_MEMORY`)."""

    def sort(keys: list[tuple[str, str]]) -> Batches:
        spill.mkdir(parents=True, exist_ok=True)
        path = spill / "unsorted.parquet"
        seq = 0
        with pq.ParquetWriter(path, schema.append(pa.field("__seq", pa.int64()))) as writer:
            for batch in batches():
                n = batch.num_rows
                writer.write_table(
                    batch.append_column("__seq", pa.array(np.arange(seq, seq + n), pa.int64()))
                )
                seq += n

        def sorted_batches() -> Iterator[pa.Table]:
            con = external_sort.connect(spill, DUCKDB_MEMORY)
            order = ", ".join(f'"{name}" ASC' for name, _ in keys)
            source = f"read_parquet({external_sort.quoted(path)})"
            query = f"SELECT * EXCLUDE (__seq) FROM {source} ORDER BY {order}, __seq"
            for batch in con.sql(query).to_arrow_reader(65_536):
                yield pa.Table.from_batches([batch]).cast(schema)
            con.close()

        return sorted_batches

    return sort


def _stream(name: str, batches: Batches | None, tables: Mapping[str, pa.Table]) -> sqlite_db.TableStream:
    """A per-row table as (schema, batches as tables): the schema of its first batch, else the
    table's in ``tables``, else the analysis's (an empty table may yield no batch at all).  A
    table given whole in ``tables`` instead of ``rows`` is one batch."""
    if batches is None:
        table = tables.get(name, ROW_SCHEMAS[name].empty_table())
        return table.schema, lambda: iter([table])

    def as_tables() -> Iterator[pa.Table]:
        for batch in batches():
            yield pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else batch

    first = next(as_tables(), None)
    if first is not None:
        return first.schema, as_tables
    schema = tables[name].schema if name in tables else ROW_SCHEMAS[name]
    return schema, lambda: iter([schema.empty_table()])


RUN_ROWS = 262_144
"""Rows of a per-row table sorted in memory into one run of a spill (communication by step)."""
_STEP_TABLES = ("communication_steps", "communication_step_links", "communication_step_sizes")


def _communication_steps(
    streams: Mapping[str, sqlite_db.TableStream], tables: Mapping[str, pa.Table], spill: Path
) -> Iterator[dict[str, pa.Table]]:
    """Each step's communication tables (``write_communication_json_by_step``), steps ascending:
    the ops and links spilled as runs sorted by step and merged back a step at a time (their
    order within a step is their order in the table); the per-step and size tables are small."""
    ops = _by_step(streams["communication_ops"], spill, "communication_ops")
    links = _by_step(streams["communication_links"], spill, "communication_links")
    sizes = _step_slices(tables["communication_sizes"])
    per_step = {name: _step_slices(tables[name]) for name in _STEP_TABLES}
    try:
        for (step, step_ops), (_, step_links) in zip(_groups(ops), _groups(links), strict=True):
            step_sizes = sizes(step)
            local = np.searchsorted(
                columns.int64(step_ops.column("op")), columns.int64(step_sizes.column("op"))
            )
            yield {
                "communication_ops": step_ops,
                "communication_links": step_links,
                "communication_sizes": _with(step_sizes, op=local),
                **{name: rows(step) for name, rows in per_step.items()},
            }
    finally:
        ops.remove()
        links.remove()


def _step_of(table: pa.Table) -> np.ndarray:
    return columns.int64(table.column("step"), NO_ID)


def _by_step(stream: sqlite_db.TableStream, spill: Path, name: str) -> RunSpill:
    """``stream`` as runs sorted by step, each row with its place in the table (``__pos``)."""
    runs = RunSpill(spill, f"{name}.by_step")
    buffered: list[pa.Table] = []
    done = 0

    def flush() -> None:
        nonlocal done
        if not buffered:
            return
        table = pa.concat_tables(buffered)
        table = table.append_column("__pos", pa.array(np.arange(done, done + table.num_rows), pa.int64()))
        order = np.argsort(_step_of(table), kind="stable")
        table = table.take(pa.array(order))
        runs.add(table, _step_of(table))
        done += table.num_rows
        buffered.clear()

    for batch in stream[1]():
        buffered.append(batch)
        if sum(b.num_rows for b in buffered) >= RUN_ROWS:
            flush()
    flush()
    runs.batch_rows = max(MIN_BATCH_ROWS, MERGE_ROWS // max(1, len(runs.runs)))
    return runs


def _groups(runs: RunSpill) -> Iterator[tuple[int, pa.Table]]:
    """Each step's rows of the merged runs, in their table order (``__pos``, then dropped)."""

    def done(step: int, parts: list[pa.Table]) -> tuple[int, pa.Table]:
        table = pa.concat_tables(parts)
        order = np.argsort(columns.int64(table.column("__pos")), kind="stable")
        return step, table.take(pa.array(order)).drop_columns(["__pos"])

    parts: list[pa.Table] = []
    current: int | None = None
    for batch in runs.merged():
        steps = _step_of(batch)
        cuts = [0, *(np.flatnonzero(np.diff(steps)) + 1).tolist(), len(steps)]
        for a, b in zip(cuts[:-1], cuts[1:], strict=True):
            if current is not None and int(steps[a]) != current:
                yield done(current, parts)
                parts = []
            current = int(steps[a])
            parts.append(batch.slice(a, b - a))
    if current is not None:
        yield done(current, parts)


def _step_slices(table: pa.Table) -> Callable[[int], pa.Table]:
    """The rows of one step of a small table (in their order), by one stable sort up front."""
    steps = _step_of(table)
    order = np.argsort(steps, kind="stable")
    by_step = table.take(pa.array(order))
    sorted_steps = steps[order]

    def rows(step: int) -> pa.Table:
        lo, hi = np.searchsorted(sorted_steps, [step, step + 1])
        return by_step.slice(int(lo), int(hi - lo))

    return rows


def _in_analysis_order(
    tables: Mapping[str, pa.Table], streams: Mapping[str, sqlite_db.TableStream]
) -> dict[str, pa.Table | sqlite_db.TableStream]:
    """Every analysis table in ``analyse_trace``'s order (its ANALYSES, then the source's own)."""
    from perfsight.pipeline import ANALYSES

    both: dict[str, pa.Table | sqlite_db.TableStream] = {**tables, **streams}
    ordered = {name: both[name] for name in ANALYSES if name in both}
    ordered.update((name, table) for name, table in tables.items() if name not in ordered)
    return ordered

"""Every output of a rank written from a trace given chunk by chunk (the bounded-memory path).

Why: a trace larger than memory is analysed chunk by chunk (``perfsight.model_chunks``); its
outputs must still be the files ``pipeline.analyse_and_write`` writes for the whole trace, byte
for byte (Parquet: the same table read back).  Here no writer holds the whole trace or a whole
per-row table:

* the chunks are spilled and read back in the whole trace's row order
  (:mod:`perfsight.export.spilled_trace`), which writes the cached trace's tables as Parquet row
  groups and the timeline index from the slices (DuckDB sorts them into lane order on disk);
* ``trace_view.json`` is written in the whole writer's event order: slices, flow starts, flow
  finishes, memory counters, overlap intervals, each from its merged runs or its row stream;
* the per-row CSVs, the SQLite db and the cached analysis tables take the per-row tables a batch
  at a time (a CSV whose rows come out of its order is sorted by DuckDB on disk,
  ``store/external_sort.py``); ``communication.json`` takes one step's ops and links at a time,
  spilled as runs sorted by step; the small tables go to the whole-table writers unchanged.

Everything spilled lives in the staging folder (``export/staging.py``) and goes with it.  The
formatting is the whole-trace writers' own: this module only feeds them pieces in order.
What stays whole: the small tables, the largest timeline lane (its pyramid is built from all of
it) and one step's communication ops.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from perfsight import advisor, columns
from perfsight.analysis import communication, kernels, memory, operators, overlap
from perfsight.export import data_pipeline_files, mindspore_csv, sqlite_db, trace_view
from perfsight.export.communication_json import write_communication_json_by_step
from perfsight.export.spilled_trace import (
    OrderedTrace,
    merge_batch_rows,
    spill_chunks,
    with_columns,
    write_cached_trace,
)
from perfsight.export.staging import staged
from perfsight.heap import return_freed_memory
from perfsight.layout import CACHE_DIR, OUTPUT_DIR
from perfsight.model import NO_ID
from perfsight.model_chunks import TraceChunk
from perfsight.parquet_files import spill_options
from perfsight.pipeline import ROW_TABLES
from perfsight.sorted_runs import RunSpill
from perfsight.store import cache, external_sort, timeline_index

if TYPE_CHECKING:
    from perfsight.pipeline import Options


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
Batches = Callable[[], Iterator[pa.Table]]


def write_outputs_chunked(
    rank_dir: Path,
    chunks: Callable[[], Iterator[TraceChunk]],
    tables: dict[str, pa.Table],
    rows: Mapping[str, Batches],
    steps: pa.Table,
    options: Options,
    findings: list,
    sort_memory: str = external_sort.MEMORY_LIMIT,
) -> None:
    """Write what ``pipeline.analyse_and_write`` writes in ``rank_dir``, from the trace's chunks.

    ``chunks()`` reads the chunks (again at each call); ``rows[name]()`` yields the per-row table
    ``name`` (:data:`ROW_TABLES`) in whole-trace order a batch at a time (several calls allowed);
    ``tables`` holds every other analysis table, in ``analyse_trace``'s order; ``steps`` is the
    whole step table; ``findings`` the advisor's findings for the rank; ``sort_memory`` what
    each DuckDB sort (timeline lanes, a CSV's rows out of order) may hold before spilling.
    """
    rank_dir = Path(rank_dir)
    with staged(rank_dir, (OUTPUT_DIR, CACHE_DIR)) as stage:
        spill = stage / SPILL_DIR
        trace = spill_chunks(chunks, spill)
        streams = {n: _stream(n, rows.get(n), tables) for n in ROW_TABLES if n in rows or n in tables}
        tables = {name: table for name, table in tables.items() if name not in streams}
        out, cache_dir = stage / OUTPUT_DIR, stage / CACHE_DIR
        out.mkdir(parents=True, exist_ok=True)
        try:
            index_input = write_cached_trace(trace, steps, cache_dir, spill)
            timeline_index.write_timeline_index_spilled(
                cache_dir, trace.first.rank, *index_input, spill, memory_limit=sort_memory
            )
            return_freed_memory()
            ordered = _in_analysis_order(tables, streams)
            if "text" in options.export_types:
                _write_trace_view(out / "trace_view.json", trace, streams["overlap_intervals"])
                _write_csvs(out, tables, streams, spill, sort_memory)
                return_freed_memory()
                data_pipeline_files.write_all(out, tables)
                if trace.spills["comm"].rows:
                    steps_tables = _communication_steps(streams, tables, spill)
                    write_communication_json_by_step(out / "communication.json", steps_tables)
            if "db" in options.export_types:
                db_tables: dict[str, pa.Table | sqlite_db.TableStream] = dict(ordered)
                db_tables["slices"] = (trace.schemas["slices"], lambda: trace.rows("slices"))
                sqlite_db.write_db(out / f"perfsight_{trace.first.rank}.db", db_tables)
            cache.save_tables(cache_dir, tables)
            for name, (schema, batches) in streams.items():
                cache.save_table_batches(cache_dir, name, schema, batches())
            advisor.write_advisor_json(out / advisor.ADVISOR_JSON, findings, "rank")
        finally:
            for run in trace.spills.values():
                run.remove()


def _write_trace_view(path: Path, trace: OrderedTrace, overlap_rows: sqlite_db.TableStream) -> None:
    """``trace_view.json`` in the whole writer's event order, a merged batch at a time."""
    times = trace.times
    for batch in overlap_rows[1]():
        times.add(columns.int64(batch.column("start_ns")))
        times.add(columns.int64(batch.column("end_ns")))
    offset = times.offset_ns()
    lanes = trace_view.view_lanes(trace.first, trace.memory_devices)

    def slices() -> Iterator[memoryview]:
        for batch in trace.rows("slices"):
            yield from trace_view.slice_events(batch, lanes, offset)

    def flows() -> Iterator[memoryview]:
        for phase, end in trace_view.FLOW_PHASES:
            prefix = f"__{end}"
            for batch in trace.rows("flows"):
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
        for batch in trace.rows("memory"):
            yield from trace_view.memory_events(batch, lanes, trace_view.memory_keys(batch), offset)

    def overlaps() -> Iterator[memoryview]:
        for batch in overlap_rows[1]():
            yield from trace_view.overlap_events(batch, lanes, offset)

    trace_view.write_events(path, trace.first, lanes, offset, (slices(), flows(), memory_rows(), overlaps()))


def _write_csvs(
    out: Path,
    tables: dict[str, pa.Table],
    streams: dict[str, sqlite_db.TableStream],
    spill: Path,
    sort_memory: str,
) -> None:
    """The seed-style CSVs: per-row files a batch at a time, the others as ``write_all`` writes them."""
    for name in mindspore_csv.ROW_FILES:
        if name in streams:
            schema, batches = streams[name]
            sort = _external_sort(batches, schema, spill / name, sort_memory)
            mindspore_csv.write_csv_batches(out, name, batches, sort)
    mindspore_csv.write_all(out, {n: t for n, t in tables.items() if n not in mindspore_csv.ROW_FILES})


def _external_sort(
    batches: Batches, schema: pa.Schema, spill: Path, memory_limit: str
) -> Callable[[list[tuple[str, str]]], Batches]:
    """A stable sort of ``batches`` by ascending keys on disk (DuckDB, within ``memory_limit``)."""

    def sort(keys: list[tuple[str, str]]) -> Batches:
        spill.mkdir(parents=True, exist_ok=True)
        path = spill / "unsorted.parquet"
        seq = 0
        numbered = schema.append(pa.field("__seq", pa.int64()))
        with pq.ParquetWriter(path, numbered, **spill_options(numbered)) as writer:
            for batch in batches():
                n = batch.num_rows
                writer.write_table(
                    batch.append_column("__seq", pa.array(np.arange(seq, seq + n), pa.int64()))
                )
                seq += n

        def sorted_batches() -> Iterator[pa.Table]:
            con = external_sort.connect(spill, memory_limit)
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
                "communication_sizes": with_columns(step_sizes, op=local),
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
    runs.batch_rows = merge_batch_rows(runs)
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

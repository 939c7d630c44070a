"""The passes of the spilled Kineto reader after the file is read (see :mod:`.kineto_spill`).

Each pass streams a Parquet file of the spill folder batch by batch (``BATCH_ROWS`` rows) and
writes the next; rows keep the whole trace's order (their ``slice_row``), so that a pass joins a
side file sorted by row (launches, depth) by merging, never by holding it.  DuckDB does the two
operations that need another order (the launch join by correlation id, the per-track sort),
under a memory limit, spilling to the folder.  Every column is computed by the function the
in-memory reader (``kineto.build_trace``) uses, applied to a batch; this module only moves rows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from perfsight import columns
from perfsight.ingest import assemble, kineto
from perfsight.intervals import outermost
from perfsight.model import NO_ID
from perfsight.model_chunks import chunk_of_steps, group_steps, step_counts, steps_by_window
from perfsight.parquet_files import spill_options

BATCH_ROWS = 1 << 16
"""Rows read from a spill file at a time: the unit of every pass's working memory."""

FLUSH_ROWS = 1 << 18
"""Rows held for the chunk files before they are written (all chunks together)."""

DUCKDB_LEAST_BYTES = 256 << 20
"""The least DuckDB may hold for the launch join and the sorts, whatever the budget (see
``memory_budget.READ_SORT_SHARE``); past its limit, it spills."""

ROW_GROUP_ROWS = 1 << 17
"""Rows per row group of the spill files.  Why not one per batch: a Parquet file's metadata
(one entry per row group and column) is held in memory while it is written or read, and with a
row group per scanned batch it grew by ~50 MB per GB of trace."""

ROW = "slice_row"
"""The column holding a slice's row in the whole trace (the order ``read_kineto`` gives)."""


class Spill:
    """Spill files by name under ``folder``, each written in row groups of ``ROW_GROUP_ROWS``
    rows, without statistics (nothing reads them), so that their metadata stays small."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.writers: dict[str, pq.ParquetWriter] = {}
        self.pending: dict[str, list[pa.Table]] = {}

    def write(self, name: str, table: pa.Table) -> None:
        if name not in self.writers:
            self.writers[name] = pq.ParquetWriter(
                self.folder / f"{name}.parquet", table.schema, **spill_options(table.schema)
            )
            self.pending[name] = []
        self.pending[name].append(table)
        if sum(t.num_rows for t in self.pending[name]) >= ROW_GROUP_ROWS:
            self._flush(name)

    def close(self) -> None:
        for name, writer in self.writers.items():
            self._flush(name)
            writer.close()
        self.writers.clear()

    def _flush(self, name: str) -> None:
        if self.pending[name]:
            table = pa.concat_tables(self.pending[name], promote_options="permissive")
            self.writers[name].write_table(table, row_group_size=max(table.num_rows, 1))
        self.pending[name] = []


@dataclasses.dataclass
class Facts:
    """What every row's derived columns need besides the row: small, global."""

    rank: int
    category_values: pa.Array  # lower-cased, by global code
    device_pairs: np.ndarray  # 2 x k (pid, code) of unknown-category device work
    track_of_lane: dict[tuple[int, int, int], int]
    steps: pa.Table


def is_pair(pid: np.ndarray, code: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    """Rows whose (pid, category code) is one of ``pairs`` (a few: a loop over them, not rows)."""
    hit = np.zeros(len(pid), bool)
    for p, c in pairs.T.tolist():
        hit |= (pid == p) & (code == c)
    return hit


def batches(path: Path, columns_: list[str] | None = None) -> Iterator[pa.Table]:
    """``path``'s rows, at most ``BATCH_ROWS`` at a time (``cat`` and ``name`` as dictionaries).

    Row group by row group (``read_row_group``), not ``ParquetFile.iter_batches``: with pyarrow
    26, iterating batches kept memory outside Arrow's pool that grew with the bytes read (a pass
    over a 10 GB trace's spill ended 600 MB above its start; row groups stay flat)."""
    if not path.exists():
        return
    source = pq.ParquetFile(
        path, read_dictionary=[c for c in ("cat", "name") if c in pq.read_schema(path).names]
    )
    for group in range(source.num_row_groups):
        table = source.read_row_group(group, columns=columns_)
        for offset in range(0, table.num_rows, BATCH_ROWS):
            yield table.slice(offset, BATCH_ROWS)
        del table


def read_all(paths: list[Path]) -> pa.Table | None:
    tables = [pq.read_table(p) for p in paths]
    if not tables:
        return None
    return pa.concat_tables(tables, promote_options="permissive").unify_dictionaries().combine_chunks()


class Cursor:
    """The rows of a Parquet file sorted by ``key``, handed out in consecutive key ranges: the
    merge side of a streaming join with the row-ordered passes."""

    def __init__(self, path: Path, key: str) -> None:
        self.key = key
        self.batches = batches(path)
        self.pending: list[pa.Table] = []
        self.done = not path.exists()

    def until(self, end: int) -> pa.Table | None:
        """The rows whose key is below ``end`` (none left behind from earlier calls)."""
        while not self.done and (not self.pending or self.pending[-1].column(self.key)[-1].as_py() < end):
            batch = next(self.batches, None)
            if batch is None:
                self.done = True
            elif batch.num_rows:
                self.pending.append(batch)
        if not self.pending:
            return None
        table = pa.concat_tables(self.pending)
        cut = int(np.searchsorted(table.column(self.key).to_numpy(), end))
        self.pending = [table.slice(cut)] if cut < table.num_rows else []
        return table.slice(0, cut)


def derive(folder: Path, facts: Facts, total: int) -> bool:
    """Pass 2: each row's derived columns (``rows.parquet``) and the launch sides; returns whether
    any host communication row carries collective metadata (``kineto._comm``'s switch)."""
    comm_args = Cursor(folder / "comm_args.parquet", "row")
    spill = Spill(folder)
    write = spill.write
    any_meta = False

    try:
        for table in batches(folder / "slices.parquet"):
            rows = table.column(ROW).to_numpy()
            cat = table.column("cat")
            cat_values = pc.utf8_lower(kineto.dictionary_values(cat))
            device_category, _ = kineto.category_facts(cat_values)
            pid = kineto.int_column(table.column("pid"))
            unknown = is_pair(pid, table.column("code").to_numpy(), facts.device_pairs)
            is_device = kineto.by_dictionary(cat, device_category) | unknown
            kind = kineto.slice_kinds(cat, cat_values, table.column("name"), is_device, unknown)
            pid, tid = kineto.device_lanes(
                pid,
                kineto.int_column(table.column("tid")),
                is_device,
                table.column("device"),
                table.column("stream"),
            )
            batch_lanes, lane = assemble.lanes(pid, tid, is_device)
            track = np.array([facts.track_of_lane[tuple(x)] for x in batch_lanes.tolist()], np.int32)[lane]
            start = table.column("start_ns").to_numpy()
            correlation = kineto.int_column(table.column("correlation"))
            args = _aligned_comm_args(comm_args.until(int(rows[-1]) + 1), rows)
            has_meta = columns.numpy(args.column("has_meta"), null=False)
            device_comm, host_comm, fallback = kineto.comm_candidates(kind, is_device, table.column("name"))
            any_meta |= bool(np.any(has_meta & host_comm))
            derived = {
                ROW: rows,
                "cat": cat,
                "name": table.column("name"),
                "kind": kind,
                "is_device": is_device,
                "pid": pid,
                "tid": tid,
                "track": track,
                "start_ns": start,
                "dur_ns": table.column("dur_ns").to_numpy(),
                "correlation": correlation,
                "external_id": kineto.external_ids(table),
                "step": assemble.step_of(start, facts.steps),
                **{key: table.column(key) for key in kineto.SLICE_ARG_COLUMNS.values()},
                **{name: args.column(name) for name in args.column_names},
                "device_comm": device_comm,
                "host_comm": host_comm,
                "fallback": fallback,
            }
            write("rows", pa.table(derived))
            runtime, device = assemble.launch_sides(correlation, is_device, kind)
            write(
                "runtime",
                pa.table({"corr": correlation[runtime], ROW: rows[runtime], "start_ns": start[runtime]}),
            )
            write("device", pa.table({"corr": correlation[device], ROW: rows[device]}))
    finally:
        spill.close()
    (folder / "slices.parquet").unlink(missing_ok=True)
    (folder / "comm_args.parquet").unlink(missing_ok=True)
    return any_meta


def _aligned_comm_args(args: pa.Table | None, rows: np.ndarray) -> pa.Table:
    """The collective metadata columns for ``rows`` (null where a row has none) and ``has_meta``."""
    position = np.full(len(rows), -1, np.int64)
    if args is not None and args.num_rows:
        position[args.column("row").to_numpy() - rows[0]] = np.arange(args.num_rows)
    has = position >= 0
    out: dict[str, Any] = {}
    for key in kineto.COMM_ARGS:
        if args is not None and args.num_rows:
            out[key] = args.column(key).take(pa.array(np.where(has, position, 0), pa.int64(), mask=~has))
        else:
            out[key] = pa.nulls(len(rows), kineto.ARG_FIELDS[key])
    out["has_meta"] = has
    return pa.table(out)


def duckdb_passes(folder: Path, memory_limit: str) -> None:
    """The launch join (first runtime row per device row's correlation id) and the rows in
    per-track start order, both as external operations within ``memory_limit`` (DuckDB's)."""
    import duckdb

    con = duckdb.connect()
    con.execute("SET enable_progress_bar=false")  # it prints on stdout, where --json writes
    try:
        con.execute(f"SET memory_limit='{memory_limit}'")
        con.execute(f"SET temp_directory='{folder / 'duckdb'}'")
        f = {name: str(folder / f"{name}.parquet") for name in ("runtime", "device", "rows")}
        con.execute(
            f"COPY (SELECT d.{ROW} AS {ROW}, min(r.{ROW}) AS src, arg_min(r.start_ns, r.{ROW}) AS src_start "
            f"FROM read_parquet('{f['device']}') d JOIN read_parquet('{f['runtime']}') r ON d.corr = r.corr "
            f"GROUP BY d.{ROW} ORDER BY {ROW}) TO '{folder / 'launches.parquet'}' (FORMAT parquet)"
        )
        con.execute(
            f"COPY (SELECT {ROW}, track, start_ns, dur_ns, fallback FROM read_parquet('{f['rows']}') "
            f"ORDER BY track, start_ns, dur_ns DESC, {ROW}) "
            f"TO '{folder / 'by_track.parquet'}' (FORMAT parquet)"
        )
    finally:
        con.close()
    (folder / "runtime.parquet").unlink(missing_ok=True)
    (folder / "device.parquet").unlink(missing_ok=True)


def sweep(folder: Path, memory_limit: str) -> None:
    """Nesting depth and outermost flag of every slice, from the rows in per-track start order.

    A slice's depth (``assemble.nesting_depth``) and whether it is outermost
    (``intervals.outermost``) depend only on the slices of its track that start before it and
    are still open at its start: the slices that closed earlier count once as started and once
    as closed.  So each block of rows is given to those functions with the slices still open
    carried before it, and a block never splits rows of one track with one start (a later
    zero-length one closes at that start).  Writes ``depth.parquet`` in row order."""
    import duckdb

    spill = Spill(folder)
    carry: dict[str, np.ndarray] | None = None
    held: pa.Table | None = None
    unsorted = folder / "depth_unsorted.parquet"

    def process(block: pa.Table) -> None:
        nonlocal carry
        part = {name: block.column(name).to_numpy() for name in (ROW, "track", "start_ns", "dur_ns")}
        part["fallback"] = columns.numpy(block.column("fallback"), null=False)
        both = part if carry is None else {k: np.concatenate([carry[k], part[k]]) for k in part}
        skip = 0 if carry is None else len(carry[ROW])
        track = both["track"].astype(np.int64)
        start, dur = both["start_ns"], both["dur_ns"]
        end = start + dur
        depth = assemble.nesting_depth(track, start, dur)
        outer = outermost(track, start, end, both["fallback"])
        out = pa.table({ROW: part[ROW], "depth": depth[skip:], "outer": outer[skip:]})
        spill.write(unsorted.stem, out)
        last_track, last_start = track[-1], start[-1]
        keep = (track == last_track) & (end > last_start)
        carry = {k: v[keep] for k, v in both.items()}

    for batch in batches(folder / "by_track.parquet"):
        block = batch if held is None else pa.concat_tables([held, batch])
        track = block.column("track").to_numpy()
        start = block.column("start_ns").to_numpy()
        other = np.flatnonzero((track != track[-1]) | (start != start[-1]))
        cut = int(other[-1]) + 1 if len(other) else 0
        if cut:
            process(block.slice(0, cut))
        held = block.slice(cut)
    if held is not None and held.num_rows:
        process(held)
    spill.close()
    (folder / "by_track.parquet").unlink(missing_ok=True)
    con = duckdb.connect()
    con.execute("SET enable_progress_bar=false")  # it prints on stdout, where --json writes
    try:
        con.execute(f"SET memory_limit='{memory_limit}'")
        con.execute(f"SET temp_directory='{folder / 'duckdb'}'")
        con.execute(
            f"COPY (SELECT * FROM read_parquet('{unsorted}') ORDER BY {ROW}) "
            f"TO '{folder / 'depth.parquet'}' (FORMAT parquet)"
        )
    finally:
        con.close()
    unsorted.unlink(missing_ok=True)


def _final_steps(
    table: pa.Table, launches: pa.Table | None, steps: pa.Table
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each row's step after ``assemble.device_step`` (launched work takes its launcher's step),
    its launcher's row (NO_ID where none) and start (0 where none)."""
    rows = table.column(ROW).to_numpy()
    step = table.column("step").to_numpy().copy()
    src = np.full(len(rows), NO_ID, np.int64)
    src_start = np.zeros(len(rows), np.int64)
    if launches is not None and launches.num_rows:
        dst = launches.column(ROW).to_numpy() - rows[0]
        src_start[dst] = launches.column("src_start").to_numpy()
        step[dst] = assemble.step_of(src_start[dst], steps)
        src[dst] = launches.column("src").to_numpy()
    return step, src, src_start


def plan(
    folder: Path, facts: Facts, total: int, max_slices: int, truncated: bool
) -> tuple[pa.Table, np.ndarray, list[tuple[int, ...]]]:
    """Pass 3: the steps table's device windows and the chunks (slices per step, then
    ``model_chunks.group_steps``)."""
    steps = facts.steps
    first = np.full(steps.num_rows, np.iinfo(np.int64).max, np.int64)
    last = np.full(steps.num_rows, np.iinfo(np.int64).min, np.int64)
    per_slot = np.zeros(steps.num_rows, np.int64)
    launches = Cursor(folder / "launches.parquet", ROW)
    for table in batches(folder / "rows.parquet", [ROW, "step", "kind", "is_device", "start_ns", "dur_ns"]):
        rows = table.column(ROW).to_numpy()
        step, _, _ = _final_steps(table, launches.until(int(rows[-1]) + 1), steps)
        start = table.column("start_ns").to_numpy()
        is_device = columns.numpy(table.column("is_device"), null=False)
        on_device = kineto.device_work(is_device, table.column("kind").to_numpy())
        low, high = assemble.device_window_bounds(
            steps, step, on_device, start, start + table.column("dur_ns").to_numpy()
        )
        np.minimum(first, low, out=first)
        np.maximum(last, high, out=last)
        per_slot += step_counts(steps, steps_by_window(step, start, steps))
    steps = assemble.with_device_windows(steps, first, last)
    if truncated:
        steps = kineto.last_step_incomplete(steps)
    step_chunk, chunk_steps = group_steps(steps, per_slot, max_slices)
    return steps, step_chunk, chunk_steps


def route(
    folder: Path, facts: Facts, step_chunk: np.ndarray, count: int, any_meta: bool, total: int
) -> list[list[Path]]:
    """Pass 4: every row, with its final step, depth, launcher and comm flag, into its chunk's files."""
    files: list[list[Path]] = [[] for _ in range(count)]
    if not total:
        return files
    steps = facts.steps
    launches = Cursor(folder / "launches.parquet", ROW)
    depth = Cursor(folder / "depth.parquet", ROW)
    buffered: dict[int, list[pa.Table]] = {}
    held = 0
    flows_before = comm_before = 0  # launched and communication rows in earlier batches

    def flush() -> None:
        nonlocal held
        for number, tables in buffered.items():
            target = folder / f"chunk-{number:06d}-{len(files[number]):06d}.parquet"
            joined = pa.concat_tables(tables)
            pq.write_table(joined, target, **spill_options(joined.schema))
            files[number].append(target)
        buffered.clear()
        held = 0

    for table in batches(folder / "rows.parquet"):
        rows = table.column(ROW).to_numpy()
        end = int(rows[-1]) + 1
        step, src, src_start = _final_steps(table, launches.until(end), steps)
        nesting = depth.until(end)
        start = table.column("start_ns").to_numpy()
        chunk = chunk_of_steps(steps, step_chunk, steps_by_window(step, start, steps))
        launched = np.flatnonzero(src != NO_ID)
        if len(launched):  # a launch flow never crosses chunks: launched work follows its launcher
            launcher_start = src_start[launched]
            src_step = steps_by_window(assemble.step_of(launcher_start, steps), launcher_start, steps)
            chunk[launched] = chunk_of_steps(steps, step_chunk, src_step)
        has_meta = columns.numpy(table.column("has_meta"), null=False)
        host = columns.numpy(table.column("host_comm"), null=False)
        host_rows = has_meta & host if any_meta else columns.numpy(nesting.column("outer"), null=False)
        pick = columns.numpy(table.column("device_comm"), null=False) | host_rows
        table = table.drop_columns(["step", "host_comm", "device_comm", "fallback"]).append_column(
            "step", pa.array(step, pa.int32())
        )
        # each launched row's flow and each picked row's comm row in the whole trace's tables:
        # both are in slice-row order there, and the batches come in slice-row order
        flow_row = np.where(src != NO_ID, flows_before + np.cumsum(src != NO_ID) - 1, NO_ID)
        comm_row = np.where(pick, comm_before + np.cumsum(pick) - 1, NO_ID)
        flows_before += int(np.count_nonzero(src != NO_ID))
        comm_before += int(np.count_nonzero(pick))
        table = (
            table.append_column("depth", nesting.column("depth"))
            .append_column("src", pa.array(src, pa.int64()))
            .append_column("pick", pa.array(pick))
            .append_column(FLOW_ROW, pa.array(flow_row, pa.int64()))
            .append_column(COMM_ROW, pa.array(comm_row, pa.int64()))
        )
        for number in np.unique(chunk).tolist():
            mine = np.flatnonzero(chunk == number)
            buffered.setdefault(number, []).append(table.take(pa.array(mine)))
            held += len(mine)
        if held >= FLUSH_ROWS:
            flush()
    flush()
    return files


FLOW_ROW, COMM_ROW, MEMORY_ROW = "__flow_row", "__comm_row", "__memory_row"
"""Columns of the chunk files: a row's place in the whole trace's flows, comm and memory tables
(``TraceChunk.table_rows``, by which the chunked writers put those tables back in order)."""


def route_memory(folder: Path, bounds: list[int], count: int) -> list[list[Path]]:
    """The memory events into the chunk whose time range holds them (``model_chunks.in_window``:
    chunk k from its first step's start to the next chunk's, the ends open)."""
    files: list[list[Path]] = [[] for _ in range(count)]
    edges = np.array(bounds[1:], np.int64)
    before = 0  # memory events in earlier batches: each event's row in the whole memory table
    for i, table in enumerate(batches(folder / "memory.parquet")):
        table = table.append_column(MEMORY_ROW, pa.array(np.arange(before, before + table.num_rows)))
        before += table.num_rows
        chunk = np.searchsorted(edges, table.column("ts_ns").to_numpy(), side="right")
        for number in np.unique(chunk).tolist():
            target = folder / f"memory-{number:06d}-{i:06d}.parquet"
            pq.write_table(
                table.take(pa.array(np.flatnonzero(chunk == number))), target, **spill_options(table.schema)
            )
            files[number].append(target)
    return files

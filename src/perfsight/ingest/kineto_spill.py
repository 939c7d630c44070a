"""Read a Kineto trace of any size into chunks of whole steps, in bounded memory.

Why: :func:`perfsight.ingest.kineto.read_kineto` builds one whole :class:`~perfsight.model.Trace`,
about 1 MB of memory per MB of JSON; a 10 GB trace does not fit.  This reader gives the same rows
as ``split_by_steps(read_kineto(path), max_slices)`` (:mod:`perfsight.model_chunks`), chunk by
chunk, holding at most one chunk and a few batches in memory; the rest lives in Parquet files
under a spill directory.

The passes (each streams its input batch by batch):

1. the file's events, cut by ``kineto._Parts.add`` as the in-memory reader cuts them, are
   written to Parquet; kept in memory are only small facts: the category dictionary, the
   distinct (pid, tid, device, stream, category) lanes with their counts, thread and process
   names, the ProfilerStep markers;
2. each row's kind, device flag, lane, track and host step (the same functions as ``_build``,
   applied to one batch: each depends on the row and on the small global facts only);
3. DuckDB (an external sort and join, under a memory limit, spilling to the spill directory)
   joins launches by correlation id and orders the rows per track by start, where a sweep that
   carries the slices still open gives each its nesting depth and outermost flag exactly;
4. a count of the slices per step decides the chunks (``model_chunks``' rule), then the rows,
   with their final step, depth and launcher, and the memory events go to one file set per chunk.

``SpilledTrace.chunks`` reads those files back one chunk at a time.  This module must not
compute any column its own way: every value comes from the function ``_build`` uses.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from perfsight import columns
from perfsight.heap import prefer_returning_pool, return_freed_memory
from perfsight.ingest import assemble, kineto, kineto_devices
from perfsight.intervals import outermost
from perfsight.model import NO_ID, RunMetadata, Trace, VendorResults
from perfsight.model_chunks import (
    TraceChunk,
    chunk_of_steps,
    chunk_starts,
    group_steps,
    step_counts,
    steps_by_window,
)

BATCH_ROWS = 1 << 16
"""Rows read from a spill file at a time: the unit of every pass's working memory."""

FLUSH_ROWS = 1 << 18
"""Rows held for the chunk files before they are written (all chunks together)."""

DUCKDB_MEMORY = "256MB"
"""DuckDB's memory limit for the launch join and the per-track sort; past it, it spills."""

_T = TypeVar("_T")

ROW = "slice_row"
"""The column holding a slice's row in the whole trace (the order ``read_kineto`` gives)."""


def spill_kineto(path: str | Path, spill_dir: Path, max_slices: int, rank: int | None = None) -> SpilledTrace:
    """Read ``path`` into chunks of whole steps of at most ``max_slices`` slices each (a step
    may exceed it), spilling to a new folder under ``spill_dir`` that :meth:`SpilledTrace.close`
    removes.  Raises :class:`~perfsight.ingest.kineto.TraceReadError` as ``read_kineto`` does."""
    if max_slices < 1:
        raise ValueError(f"max_slices must be at least 1, not {max_slices}")
    path = Path(path)
    prefer_returning_pool()
    spill_dir.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="kineto-spill-", dir=spill_dir))
    try:
        return _spill(path, folder, max_slices, rank)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise


@dataclasses.dataclass
class SpilledTrace:
    """One rank's trace on disk, cut into chunks; the small tables in memory."""

    meta: RunMetadata
    tracks: pa.Table
    steps: pa.Table
    """The whole step table (one row per step: small)."""
    slices: int
    """How many slices the trace holds."""
    folder: Path
    chunk_steps: list[tuple[int, ...]]
    chunk_files: list[list[Path]]
    memory_files: list[list[Path]]
    vendor: VendorResults = dataclasses.field(default_factory=VendorResults)
    """Empty for Kineto (no vendor tool results)."""

    def chunks(self) -> Iterator[TraceChunk]:
        """The chunks in order, each read from disk when reached (call again to read them again)."""
        for number, owned in enumerate(self.chunk_steps):
            yield self._chunk(number, owned)

    def close(self) -> None:
        """Remove the spill folder."""
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> SpilledTrace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _chunk(self, number: int, owned: tuple[int, ...]) -> TraceChunk:
        rank = self.meta.rank
        rows = _read_all(self.chunk_files[number])
        if rows is None:
            return self._empty_chunk(number, owned)
        local = np.arange(rows.num_rows)
        kind = rows.column("kind").to_numpy()
        is_device = columns.numpy(rows.column("is_device"), null=False)
        start = rows.column("start_ns").to_numpy()
        dur = rows.column("dur_ns").to_numpy()
        step = rows.column("step").to_numpy()
        names = rows.column("name")
        slice_rows = rows.column(ROW).to_numpy()
        slices = assemble.slice_table(
            rank, kind, rows.column("cat"), names, is_device,
            rows.column("pid").to_numpy(), rows.column("tid").to_numpy(), rows.column("track").to_numpy(),
            start, dur, step, rows.column("correlation").to_numpy(),
            external_id=rows.column("external_id").to_numpy(),
            depth=rows.column("depth").to_numpy(),
            args=kineto.slice_args(rows),
        )  # fmt: skip
        src = rows.column("src").to_numpy()
        launched = src != NO_ID
        flows = assemble.flows_table(
            rank, np.searchsorted(slice_rows, src[launched]), local[launched], "launch"
        )
        picked = np.flatnonzero(columns.numpy(rows.column("pick"), null=False))
        without = ~columns.numpy(rows.column("has_meta"), null=False)[picked]
        args = rows.select(list(kineto.COMM_ARGS)).take(pa.array(picked, pa.int64(), mask=without))
        comm = kineto.comm_table(names, picked, args, is_device, start, dur, step, rank)
        trace = Trace(
            slices=slices,
            tracks=self.tracks,
            memory=kineto._memory(_read_all(self.memory_files[number]), rank),
            flows=flows,
            steps=self._owned_steps(owned),
            comm=comm,
            meta=self.meta,
            vendor=self.vendor,
        )
        return TraceChunk(trace, slice_rows.astype(np.int64), owned, number, len(self.chunk_steps))

    def _owned_steps(self, owned: tuple[int, ...]) -> pa.Table:
        return self.steps.filter(
            pa.array(np.isin(self.steps.column("step").to_numpy(), np.array(owned, np.int64)))
        )

    def _empty_chunk(self, number: int, owned: tuple[int, ...]) -> TraceChunk:
        """A chunk without slices (a trace without complete events): built by ``_build`` itself."""
        parts = kineto._Parts()
        memory = _read_all(self.memory_files[number])
        if memory is not None:
            parts.memory.append(memory)
        meta = dataclasses.replace(self.meta, warnings=[])
        trace = kineto._build(parts, meta, truncated=False)
        trace = dataclasses.replace(trace, meta=self.meta, steps=self._owned_steps(owned), vendor=self.vendor)
        return TraceChunk(trace, np.zeros(0, np.int64), owned, number, len(self.chunk_steps))


class _SpillParts(kineto._Parts):
    """``kineto._Parts`` whose slices, collective metadata and memory events go to Parquet as soon
    as a batch is cut; what stays in memory does not grow with the trace."""

    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.folder = folder
        self.writers: dict[str, pq.ParquetWriter] = {}
        self.categories: dict[str, int] = {}
        """Every category, numbered in order of first appearance (the order ``_concat`` unifies
        the batches' dictionaries in, so codes equal the in-memory reader's)."""
        self.lanes: list[pa.Table] = []
        self.markers: list[pa.Table] = []
        self.span: tuple[int, int] | None = None

    def add(self, raw: pa.Table) -> None:
        super().add(raw)
        for table in self.complete:
            self._slices(table.unify_dictionaries().combine_chunks())
        self.complete.clear()
        for name, tables in (("comm_args", self.comm_args), ("memory", self.memory)):
            for table in tables:
                self.write(name, table)
            tables.clear()

    def write(self, name: str, table: pa.Table) -> None:
        if name not in self.writers:
            self.writers[name] = pq.ParquetWriter(self.folder / f"{name}.parquet", table.schema)
        self.writers[name].write_table(table)

    def close(self) -> None:
        for writer in self.writers.values():
            writer.close()

    def _slices(self, table: pa.Table) -> None:
        codes = self._category_codes(table.column("cat"))
        first_row = self.slices - table.num_rows
        start = table.column("start_ns").to_numpy()
        end = start + table.column("dur_ns").to_numpy()
        low, high = int(start.min()), int(end.max())
        self.span = (low, high) if self.span is None else (min(self.span[0], low), max(self.span[1], high))
        lanes = pa.table(
            {
                "pid": table.column("pid"),
                "tid": table.column("tid"),
                "device": table.column("device"),
                "stream": table.column("stream"),
                "code": codes,
            }
        )
        self.lanes.append(lanes.group_by(lanes.column_names).aggregate([([], "count_all")]))
        if len(self.lanes) > 64:
            self.lanes = [_merge_lanes(self.lanes)]
        # the step markers: kinds without the unknown-device rows are exact here, since those
        # rows are of unknown categories (kind OTHER) and a marker is a host annotation
        cat_values = pc.utf8_lower(kineto._dictionary_values(table.column("cat")))
        is_device = kineto._by_dictionary(table.column("cat"), kineto._category_facts(cat_values)[0])
        kind = kineto._kinds(table.column("cat"), cat_values, table.column("name"), is_device)
        marks = assemble.step_markers(kind, is_device)
        if len(marks):
            self.markers.append(
                table.select(["name", "start_ns", "dur_ns"])
                .take(pa.array(marks))
                .cast(pa.schema([("name", pa.string()), ("start_ns", pa.int64()), ("dur_ns", pa.int64())]))
            )
        table = table.append_column("code", codes).append_column(
            ROW, pa.array(np.arange(first_row, self.slices, dtype=np.int64))
        )
        self.write("slices", table)

    def _category_codes(self, cat: pa.ChunkedArray) -> pa.Array:
        array = columns.combined(cat)
        for value in array.dictionary.to_pylist():
            self.categories.setdefault(value, len(self.categories))
        mapping = np.array([self.categories[v] for v in array.dictionary.to_pylist()], np.int32)
        return pa.array(mapping[columns.int64(array.indices, 0)] if len(mapping) else np.zeros(0, np.int32))


def _merge_lanes(tables: list[pa.Table]) -> pa.Table:
    merged = pa.concat_tables(tables)
    keys = ["pid", "tid", "device", "stream", "code"]
    summed = merged.group_by(keys).aggregate([("count_all", "sum")])
    return summed.rename_columns({"count_all_sum": "count_all"})


@dataclasses.dataclass
class _Facts:
    """What every row's derived columns need besides the row: small, global."""

    rank: int
    category_values: pa.Array  # lower-cased, by global code
    device_pairs: np.ndarray  # 2 x k (pid, code) of unknown-category device work
    track_of_lane: dict[tuple[int, int, int], int]
    steps: pa.Table


def _spill(path: Path, folder: Path, max_slices: int, rank: int | None) -> SpilledTrace:
    parts = _SpillParts(folder)
    try:
        meta, truncated = kineto.read_into(path, parts, rank)
    finally:
        parts.close()
    facts, tracks = _global_facts(parts, meta)
    total = parts.slices
    del parts
    any_meta = False
    if total:
        any_meta = _between_passes(_derive(folder, facts, total))
        _between_passes(_duckdb_passes(folder))
        _between_passes(_sweep(folder))
    steps, step_chunk, chunk_steps = _between_passes(_plan(folder, facts, total, max_slices, truncated))
    facts.steps = steps
    chunk_files = _between_passes(_route(folder, facts, step_chunk, len(chunk_steps), any_meta, total))
    memory_files = _route_memory(folder, chunk_starts(steps, chunk_steps), len(chunk_steps))
    for name in ("slices", "comm_args", "rows", "launches", "depth", "memory"):
        (folder / f"{name}.parquet").unlink(missing_ok=True)
    for message in meta.warnings:
        kineto.log.warning(message)
    return SpilledTrace(
        meta=meta,
        tracks=tracks,
        steps=steps,
        slices=total,
        folder=folder,
        chunk_steps=chunk_steps,
        chunk_files=chunk_files,
        memory_files=memory_files,
    )


def _between_passes(result: _T) -> _T:
    """``result``, after the pass's freed memory is given back (the next pass reuses it, not more)."""
    return_freed_memory()
    return result


def _global_facts(parts: _SpillParts, meta: RunMetadata) -> tuple[_Facts, pa.Table]:
    """Categories, unknown-device work, tracks and steps, with ``_build``'s warnings in its order."""
    rank = meta.rank
    values = pc.utf8_lower(pa.array(list(parts.categories), pa.string()))
    device_category, known_category = kineto._category_facts(values)
    lanes = _merge_lanes(parts.lanes) if parts.lanes else None
    labels = kineto_devices.process_labels(kineto._concat(parts.process_labels))
    device_pairs = np.zeros((2, 0), np.int64)
    lane_keys: dict[tuple[int, int, int], int] = {}
    if lanes is not None:
        pid = kineto._ints(lanes.column("pid"))
        code = lanes.column("code").to_numpy()
        count = lanes.column("count_all").to_numpy()
        pair_keys = (
            pa.table({"pid": pid, "code": code, "n": count})
            .group_by(["pid", "code"])
            .aggregate([("n", "sum")])
        )
        pair_keys = pair_keys.sort_by([("pid", "ascending"), ("code", "ascending")])
        pairs = np.stack([pair_keys.column("pid").to_numpy(), pair_keys.column("code").to_numpy()])
        pair_is_device, notes = kineto_devices.device_pairs(
            pairs, pair_keys.column("n_sum").to_numpy(), values.to_pylist(), known_category, labels,
            kineto._source(meta), kineto._device_names(meta),
        )  # fmt: skip
        meta.warnings.extend(notes)
        device_pairs = pairs[:, pair_is_device]
        is_device = device_category[code] | _is_pair(pid, code, device_pairs)
        lane_pid, lane_tid = kineto._device_lanes(
            pid, kineto._ints(lanes.column("tid")), is_device, lanes.column("device"), lanes.column("stream")
        )
        ordered, _ = assemble.lanes(lane_pid, lane_tid, is_device)
        lane_keys = {tuple(lane): i for i, lane in enumerate(ordered.tolist())}
    else:
        ordered = np.zeros((0, 3), np.int64)
    if not assemble.is_rank(rank):
        raise ValueError(f"rank {rank!r} is outside 0..{assemble.MAX_RANK}")
    tracks = assemble.track_table(rank, ordered, kineto._track_names(kineto._concat(parts.thread_names)))
    markers = pa.concat_tables(parts.markers) if parts.markers else None
    steps, inferred = assemble.marker_steps(
        rank,
        markers.column("name") if markers is not None else pa.array([], pa.string()),
        markers.column("start_ns").to_numpy() if markers is not None else np.zeros(0, np.int64),
        markers.column("dur_ns").to_numpy() if markers is not None else np.zeros(0, np.int64),
        parts.span,
    )
    if inferred:
        meta.warnings.append(kineto._no_markers_warning(meta))
    return _Facts(rank, values, device_pairs, lane_keys, steps), tracks


def _is_pair(pid: np.ndarray, code: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    """Rows whose (pid, category code) is one of ``pairs`` (a few: a loop over them, not rows)."""
    hit = np.zeros(len(pid), bool)
    for p, c in pairs.T.tolist():
        hit |= (pid == p) & (code == c)
    return hit


def _batches(path: Path, columns_: list[str] | None = None) -> Iterator[pa.Table]:
    if not path.exists():
        return
    source = pq.ParquetFile(
        path, read_dictionary=[c for c in ("cat", "name") if c in pq.read_schema(path).names]
    )
    for batch in source.iter_batches(batch_size=BATCH_ROWS, columns=columns_):
        yield pa.Table.from_batches([batch])


def _read_all(paths: list[Path]) -> pa.Table | None:
    tables = [pq.read_table(p) for p in paths]
    if not tables:
        return None
    return pa.concat_tables(tables, promote_options="permissive").unify_dictionaries().combine_chunks()


class _Cursor:
    """The rows of a Parquet file sorted by ``key``, handed out in consecutive key ranges: the
    merge side of a streaming join with the row-ordered passes."""

    def __init__(self, path: Path, key: str) -> None:
        self.key = key
        self.batches = _batches(path)
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


def _derive(folder: Path, facts: _Facts, total: int) -> bool:
    """Pass 2: each row's derived columns (``rows.parquet``) and the launch sides; returns whether
    any host communication row carries collective metadata (``kineto._comm``'s switch)."""
    comm_args = _Cursor(folder / "comm_args.parquet", "row")
    writers: dict[str, pq.ParquetWriter] = {}
    any_meta = False

    def write(name: str, table: pa.Table) -> None:
        if name not in writers:
            writers[name] = pq.ParquetWriter(folder / f"{name}.parquet", table.schema)
        writers[name].write_table(table)

    try:
        for table in _batches(folder / "slices.parquet"):
            rows = table.column(ROW).to_numpy()
            cat = table.column("cat")
            cat_values = pc.utf8_lower(kineto._dictionary_values(cat))
            device_category, _ = kineto._category_facts(cat_values)
            pid = kineto._ints(table.column("pid"))
            unknown = _is_pair(pid, table.column("code").to_numpy(), facts.device_pairs)
            is_device = kineto._by_dictionary(cat, device_category) | unknown
            kind = kineto._kinds(cat, cat_values, table.column("name"), is_device, unknown)
            pid, tid = kineto._device_lanes(
                pid,
                kineto._ints(table.column("tid")),
                is_device,
                table.column("device"),
                table.column("stream"),
            )
            batch_lanes, lane = assemble.lanes(pid, tid, is_device)
            track = np.array([facts.track_of_lane[tuple(x)] for x in batch_lanes.tolist()], np.int32)[lane]
            start = table.column("start_ns").to_numpy()
            correlation = kineto._ints(table.column("correlation"))
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
                "external_id": kineto._external_ids(table),
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
        for writer in writers.values():
            writer.close()
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


def _duckdb_passes(folder: Path) -> None:
    """The launch join (first runtime row per device row's correlation id) and the rows in
    per-track start order, both as external operations under ``DUCKDB_MEMORY``."""
    import duckdb

    con = duckdb.connect()
    try:
        con.execute(f"SET memory_limit='{DUCKDB_MEMORY}'")
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


def _sweep(folder: Path) -> None:
    """Nesting depth and outermost flag of every slice, from the rows in per-track start order.

    A slice's depth (``assemble.nesting_depth``) and whether it is outermost
    (``intervals.outermost``) depend only on the slices of its track that start before it and
    are still open at its start: the slices that closed earlier count once as started and once
    as closed.  So each block of rows is given to those functions with the slices still open
    carried before it, and a block never splits rows of one track with one start (a later
    zero-length one closes at that start).  Writes ``depth.parquet`` in row order."""
    import duckdb

    writer: pq.ParquetWriter | None = None
    carry: dict[str, np.ndarray] | None = None
    held: pa.Table | None = None
    unsorted = folder / "depth_unsorted.parquet"

    def process(block: pa.Table) -> None:
        nonlocal carry, writer
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
        if writer is None:
            writer = pq.ParquetWriter(unsorted, out.schema)
        writer.write_table(out)
        last_track, last_start = track[-1], start[-1]
        keep = (track == last_track) & (end > last_start)
        carry = {k: v[keep] for k, v in both.items()}

    for batch in _batches(folder / "by_track.parquet"):
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
    if writer is not None:
        writer.close()
    (folder / "by_track.parquet").unlink(missing_ok=True)
    con = duckdb.connect()
    try:
        con.execute(f"SET memory_limit='{DUCKDB_MEMORY}'")
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


def _plan(
    folder: Path, facts: _Facts, total: int, max_slices: int, truncated: bool
) -> tuple[pa.Table, np.ndarray, list[tuple[int, ...]]]:
    """Pass 3: the steps table's device windows and the chunks (slices per step, then
    ``model_chunks.group_steps``)."""
    steps = facts.steps
    first = np.full(steps.num_rows, np.iinfo(np.int64).max, np.int64)
    last = np.full(steps.num_rows, np.iinfo(np.int64).min, np.int64)
    per_slot = np.zeros(steps.num_rows, np.int64)
    launches = _Cursor(folder / "launches.parquet", ROW)
    for table in _batches(folder / "rows.parquet", [ROW, "step", "kind", "is_device", "start_ns", "dur_ns"]):
        rows = table.column(ROW).to_numpy()
        step, _, _ = _final_steps(table, launches.until(int(rows[-1]) + 1), steps)
        start = table.column("start_ns").to_numpy()
        is_device = columns.numpy(table.column("is_device"), null=False)
        on_device = kineto._on_device(is_device, table.column("kind").to_numpy())
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


def _route(
    folder: Path, facts: _Facts, step_chunk: np.ndarray, count: int, any_meta: bool, total: int
) -> list[list[Path]]:
    """Pass 4: every row, with its final step, depth, launcher and comm flag, into its chunk's files."""
    files: list[list[Path]] = [[] for _ in range(count)]
    if not total:
        return files
    steps = facts.steps
    launches = _Cursor(folder / "launches.parquet", ROW)
    depth = _Cursor(folder / "depth.parquet", ROW)
    buffered: dict[int, list[pa.Table]] = {}
    held = 0

    def flush() -> None:
        nonlocal held
        for number, tables in buffered.items():
            target = folder / f"chunk-{number:06d}-{len(files[number]):06d}.parquet"
            pq.write_table(pa.concat_tables(tables), target)
            files[number].append(target)
        buffered.clear()
        held = 0

    for table in _batches(folder / "rows.parquet"):
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
        table = (
            table.append_column("depth", nesting.column("depth"))
            .append_column("src", pa.array(src, pa.int64()))
            .append_column("pick", pa.array(pick))
        )
        for number in np.unique(chunk).tolist():
            mine = np.flatnonzero(chunk == number)
            buffered.setdefault(number, []).append(table.take(pa.array(mine)))
            held += len(mine)
        if held >= FLUSH_ROWS:
            flush()
    flush()
    return files


def _route_memory(folder: Path, bounds: list[int], count: int) -> list[list[Path]]:
    """The memory events into the chunk whose time range holds them (``model_chunks.in_window``:
    chunk k from its first step's start to the next chunk's, the ends open)."""
    files: list[list[Path]] = [[] for _ in range(count)]
    edges = np.array(bounds[1:], np.int64)
    for i, table in enumerate(_batches(folder / "memory.parquet")):
        chunk = np.searchsorted(edges, table.column("ts_ns").to_numpy(), side="right")
        for number in np.unique(chunk).tolist():
            target = folder / f"memory-{number:06d}-{i:06d}.parquet"
            pq.write_table(table.take(pa.array(np.flatnonzero(chunk == number))), target)
            files[number].append(target)
    return files

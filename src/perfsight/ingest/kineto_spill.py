"""Read a Kineto trace of any size into chunks of whole steps, in bounded memory.

Why: :func:`perfsight.ingest.kineto.read_kineto` builds one whole :class:`~perfsight.model.Trace`,
about 1 MB of memory per MB of JSON; a 10 GB trace does not fit.  This reader gives the same rows
as ``split_by_steps(read_kineto(path), max_slices)`` (:mod:`perfsight.model_chunks`), chunk by
chunk, holding at most one chunk and a few batches in memory; the rest lives in Parquet files
under a spill directory.

The passes (each streams its input batch by batch):

1. the file's events, cut by ``kineto.Parts.add`` as the in-memory reader cuts them, are
   written to Parquet; kept in memory are only small facts: the category dictionary, the
   distinct (pid, tid, device, stream, category) lanes with their counts, thread and process
   names, the ProfilerStep markers;
2. each row's kind, device flag, lane, track and host step (the same functions as ``build_trace``,
   applied to one batch: each depends on the row and on the small global facts only);
3. DuckDB (an external sort and join, under a memory limit, spilling to the spill directory)
   joins launches by correlation id and orders the rows per track by start, where a sweep that
   carries the slices still open gives each its nesting depth and outermost flag exactly;
4. a count of the slices per step decides the chunks (``model_chunks``' rule), then the rows,
   with their final step, depth and launcher, and the memory events go to one file set per chunk.

Pass 1 and the global facts are here, passes 2 to 4 in :mod:`.kineto_spill_passes`;
``SpilledTrace.chunks`` reads the chunk files back one chunk at a time.  Neither module may
compute a column its own way: every value comes from the function ``build_trace`` uses.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfsight import columns, memory_budget
from perfsight.heap import prefer_returning_pool, return_freed_memory
from perfsight.ingest import assemble, kineto, kineto_devices
from perfsight.ingest.kineto_spill_passes import (
    COMM_ROW,
    DUCKDB_LEAST_BYTES,
    FLOW_ROW,
    MEMORY_ROW,
    ROW,
    Facts,
    Spill,
    derive,
    duckdb_passes,
    is_pair,
    plan,
    read_all,
    route,
    route_memory,
    sweep,
)
from perfsight.model import NO_ID, RunMetadata, Trace, VendorResults
from perfsight.model_chunks import TraceChunk, chunk_starts

_T = TypeVar("_T")


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
    merged: Callable[[], Iterator[TraceChunk]] | None = None
    """The chunks with a run folder's capture tables merged in (``ingest.sidecar_chunks``, set by
    ``ingest.spill_trace``); None for a Kineto file alone."""

    def chunks(self) -> Iterator[TraceChunk]:
        """The chunks in order, each read from disk when reached (call again to read them again)."""
        return self.merged() if self.merged is not None else self.kineto_chunks()

    def kineto_chunks(self) -> Iterator[TraceChunk]:
        """The chunks of the Kineto file alone (what the capture tables are merged into)."""
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
        rows = read_all(self.chunk_files[number])
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
        memory = read_all(self.memory_files[number])
        table_rows = {
            "flows": rows.column(FLOW_ROW).to_numpy()[launched],
            "comm": rows.column(COMM_ROW).to_numpy()[picked],
            "memory": np.zeros(0, np.int64) if memory is None else memory.column(MEMORY_ROW).to_numpy(),
            "dataloader": np.zeros(0, np.int64),
            "comm_tasks": np.zeros(0, np.int64),
        }
        trace = Trace(
            slices=slices,
            tracks=self.tracks,
            memory=kineto.memory_table(memory, rank),
            flows=flows,
            steps=self._owned_steps(owned),
            comm=comm,
            meta=self.meta,
            vendor=self.vendor,
        )
        return TraceChunk(
            trace, slice_rows.astype(np.int64), owned, number, len(self.chunk_steps), table_rows=table_rows
        )

    def _owned_steps(self, owned: tuple[int, ...]) -> pa.Table:
        return self.steps.filter(
            pa.array(np.isin(self.steps.column("step").to_numpy(), np.array(owned, np.int64)))
        )

    def _empty_chunk(self, number: int, owned: tuple[int, ...]) -> TraceChunk:
        """The chunk of a trace without complete events (every step holds at least its marker):
        its memory rows built by ``build_trace`` itself."""
        parts = kineto.Parts()
        memory = read_all(self.memory_files[number])
        memory_rows = np.zeros(0, np.int64)
        if memory is not None:
            memory_rows = memory.column(MEMORY_ROW).to_numpy()
            parts.memory.append(memory.drop_columns([MEMORY_ROW]))
        meta = dataclasses.replace(self.meta, warnings=[])
        trace = kineto.build_trace(parts, meta, truncated=False)
        trace = dataclasses.replace(
            trace, meta=self.meta, tracks=self.tracks, steps=self._owned_steps(owned), vendor=self.vendor
        )
        empty = np.zeros(0, np.int64)
        table_rows = {
            "flows": empty,
            "comm": empty,
            "memory": memory_rows,
            "dataloader": empty,
            "comm_tasks": empty,
        }
        return TraceChunk(
            trace, np.zeros(0, np.int64), owned, number, len(self.chunk_steps), table_rows=table_rows
        )


class _SpillParts(kineto.Parts):
    """``kineto.Parts`` whose slices, collective metadata and memory events go to Parquet as soon
    as a batch is cut; what stays in memory does not grow with the trace."""

    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.folder = folder
        self.spill = Spill(folder)
        self.categories: dict[str, int] = {}
        """Every category, numbered in order of first appearance (the order ``concat_parts`` unifies
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
        self.spill.write(name, table)

    def close(self) -> None:
        self.spill.close()

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
        cat_values = pc.utf8_lower(kineto.dictionary_values(table.column("cat")))
        is_device = kineto.by_dictionary(table.column("cat"), kineto.category_facts(cat_values)[0])
        kind = kineto.slice_kinds(table.column("cat"), cat_values, table.column("name"), is_device)
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
        any_meta = _between_passes(derive(folder, facts, total))
        sorts = memory_budget.sort_memory(max_slices, memory_budget.READ_SORT_SHARE, DUCKDB_LEAST_BYTES)
        _between_passes(duckdb_passes(folder, sorts))
        _between_passes(sweep(folder, sorts))
    steps, step_chunk, chunk_steps = _between_passes(plan(folder, facts, total, max_slices, truncated))
    facts.steps = steps
    chunk_files = _between_passes(route(folder, facts, step_chunk, len(chunk_steps), any_meta, total))
    memory_files = route_memory(folder, chunk_starts(steps, chunk_steps), len(chunk_steps))
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


def _global_facts(parts: _SpillParts, meta: RunMetadata) -> tuple[Facts, pa.Table]:
    """Categories, unknown-device work, tracks and steps, with ``build_trace``'s warnings in its order."""
    rank = meta.rank
    values = pc.utf8_lower(pa.array(list(parts.categories), pa.string()))
    device_category, known_category = kineto.category_facts(values)
    lanes = _merge_lanes(parts.lanes) if parts.lanes else None
    labels = kineto_devices.process_labels(kineto.concat_parts(parts.process_labels))
    device_pairs = np.zeros((2, 0), np.int64)
    lane_keys: dict[tuple[int, int, int], int] = {}
    if lanes is not None:
        pid = kineto.int_column(lanes.column("pid"))
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
            kineto.source_name(meta), kineto.device_names_of(meta),
        )  # fmt: skip
        meta.warnings.extend(notes)
        device_pairs = pairs[:, pair_is_device]
        is_device = device_category[code] | is_pair(pid, code, device_pairs)
        lane_pid, lane_tid = kineto.device_lanes(
            pid,
            kineto.int_column(lanes.column("tid")),
            is_device,
            lanes.column("device"),
            lanes.column("stream"),
        )
        ordered, _ = assemble.lanes(lane_pid, lane_tid, is_device)
        lane_keys = {tuple(lane): i for i, lane in enumerate(ordered.tolist())}
    else:
        ordered = np.zeros((0, 3), np.int64)
    if not assemble.is_rank(rank):
        raise ValueError(f"rank {rank!r} is outside 0..{assemble.MAX_RANK}")
    tracks = assemble.track_table(
        rank, ordered, kineto.thread_track_names(kineto.concat_parts(parts.thread_names))
    )
    markers = pa.concat_tables(parts.markers) if parts.markers else None
    steps, inferred = assemble.marker_steps(
        rank,
        markers.column("name") if markers is not None else pa.array([], pa.string()),
        markers.column("start_ns").to_numpy() if markers is not None else np.zeros(0, np.int64),
        markers.column("dur_ns").to_numpy() if markers is not None else np.zeros(0, np.int64),
        parts.span,
    )
    if inferred:
        meta.warnings.append(kineto.no_markers_warning(meta))
    return Facts(rank, values, device_pairs, lane_keys, steps), tracks

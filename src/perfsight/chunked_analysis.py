"""Every single-rank analysis of a trace read as chunks of whole steps, in bounded memory (issue 21).

:func:`analyse_chunks` takes the chunks of one rank (:class:`~perfsight.model_chunks.TraceChunk`,
from the spilled reader or :func:`~perfsight.model_chunks.split_by_steps`), runs the analyses of
:data:`perfsight.pipeline.ANALYSES` chunk by chunk and merges what they give, so that every table
equals the one :func:`perfsight.pipeline.analyse_trace` gives on the whole trace (same rows, order,
values, schema).  Tables whose rows grow with the events (:data:`ROW_TABLES`) are never held
whole: each chunk's rows go to a :class:`~perfsight.sorted_runs.RunSpill` keyed by their place in
the whole table and come back merged, a batch at a time.  Every number is computed by the analysis
modules' own functions; this module only cuts, carries, keys and merges.

How each table is made (chunk-local: the analysis on the chunk, the chunks' results concatenated;
partials: per-chunk aggregates merged exactly; re-run: the same function on the merged small input):

=============================  ==============================================================
table                          how
=============================  ==============================================================
step_trace, overlap_breakdown  chunk-local (one row per step, steps in window order), each chunk
                               judged on the whole trace's clock, its first window starting
                               where the earlier chunks' end, the work they left running counted
                               as its own (``clock.CLOCK_KEY``/``REACH_KEY``/``CARRIED_KEY``)
flops_by_step                  chunk-local (FLOPs of a step's own ops)
vendor_step_differences        re-run on the merged step_trace
time_shares                    re-run on the merged overlap_breakdown
overlap_intervals              rows: per lane (lane-major, by start), an interval that touches
                               the chunk boundary merged with the next chunk's first one (same clock
                               and windows as step_trace)
operator_instances             rows: key = the slice's row in the whole trace (``slice`` too)
operator_stats                 partials (counts, integer sums, min, max); the FLOPs float sums
                               (not exact from partials) added again in row order over the
                               spilled calls, one batch per run (``grouping.add_in_row_order``)
operator_ranking               re-run on operator_stats
kernel_details                 rows: key = start_ns (within a chunk, its start/stream order);
                               ``wait_ns`` carries each stream's latest end from chunk to chunk
kernel_stats, op_statistic     partials, groups put back in order of first appearance
memory_curve                   rows: per device (in device order), key = ts_ns (memory rows
                               go to chunks by time, so a device's rows never interleave)
memory_peaks                   re-run on each chunk's peaks (max of maxima, first instant)
operator_memory                rows with state: an allocation with no later event at its
                               address in its chunk is carried to the next chunks, until its
                               release (or another allocation there) is seen; key = its
                               ordinal in time order
communication_ops, _links      rows: key = the op's row in the whole ``Trace.comm``; ``op`` and
                               ``comm_row`` renumbered as the rows come back
communication_sizes, _peers    chunk-local with ``op``/``comm_row`` renumbered, stable-sorted
communication_steps/_links     re-run of step_times / step_links on the chunks' own results
communication_step_sizes       re-run of step_sizes on the merged communication_sizes
data_* (data preparation)      re-run on a small trace: the whole step table, the data-loader
                               rows and the data-loading / synchronisation slices
=============================  ==============================================================

Decisions only the whole trace can make are deferred, never guessed: the clock is the device's
when any chunk has device work, so chunks without any are judged on both clocks until one has
(the host clock's results dropped then); a Kineto rank's op instances are its device
communication rows when it has any (:func:`perfsight.analysis.communication.primary_rows`), so a
chunk without device rows keeps its host-row results apart, used only when no chunk had device rows.

The advisor (``advisor.rank_findings``) runs once at the end on the final tables, a small trace
(see data_*) and the rules' extracts of the per-row tables (``OP_STEPS``: calls and times per
operator and step; ``ALLOCATION_STEPS``: bytes per step and charged operator, for every thread
that could turn out the main one), merged chunk by chunk with the same functions the in-memory
rules call; it never reads a per-row table back.

Assumptions the chunks' rule makes true (checked by the tests on the shared traces): on each
stream, a chunk's device work starts no earlier than the previous chunk's (``wait_ns``), and on
each thread its operators no earlier than the previous chunk's outermost ones (the allocation
extract); the work of a chunk does not run inside the step windows of an earlier one (work running
on into later windows is carried); a host operator does not contain an allocation made in a later
chunk (``operator_memory.name``, as the chunks' rule keeps an operator with its step).

What stays in memory between chunks: per step a few rows (step tables, windows), per group the
merged partials (operator and kernel names, devices, threads x steps x charged operators), the
allocations still open, the communication keys (8 bytes per op), and the data-loader rows.

This module must not compute a metric itself, and must not hold a per-row table of the whole trace.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfsight import advisor, columns, heap, pipeline
from perfsight.advisor.rank_rules import allocation_steps
from perfsight.advisor.rank_rules.allocation_steps import ALLOCATION_STEPS
from perfsight.advisor.rank_rules.view import OP_STEP_AGGREGATES, OP_STEP_KEYS, OP_STEPS, op_steps
from perfsight.analysis import clock, communication, grouping, index, kernels, memory, operators, overlap
from perfsight.analysis.op_statistic import op_statistic_groups, op_statistic_of_groups
from perfsight.model import SliceKind, Trace
from perfsight.model_chunks import TraceChunk
from perfsight.sorted_runs import RunSpill

CLOCKED = ("step_trace", "overlap_breakdown")
"""Per-step tables each chunk computes for its own steps on its whole trace's clock (:class:`_Timeline`)."""

DATA_TABLES = (
    "data_wait",
    "data_queue",
    "data_stages",
    "data_workers",
    "data_stage_batches",
    "data_cpu_utilization",
    "data_stage_queues",
    "data_pipeline_summary",
)
"""Data-preparation tables, re-run on the small trace of :class:`_SmallTrace`."""

MERGE_ROWS = 1 << 20
"""Rows buffered over all runs of a table while it is merged back (one batch per run): a table
of many chunks is read back in smaller batches (at least :data:`MIN_BATCH_ROWS`)."""
MIN_BATCH_ROWS = 1024


def _merge_in_bounded_batches(spill: RunSpill) -> None:
    """Size ``spill``'s read-back batches so that one batch per run stays within :data:`MERGE_ROWS`."""
    for part in spill.groups.values() if isinstance(spill, _GroupedSpill) else [spill]:
        part.batch_rows = max(MIN_BATCH_ROWS, min(part.batch_rows, MERGE_ROWS // max(len(part.runs), 1)))


SMALL_TRACE_KINDS = (SliceKind.DATA_LOADING.value, SliceKind.SYNC.value)
"""Host slice kinds the data analyses and the rank rules read from the trace itself."""


@dataclasses.dataclass
class ChunkedTables:
    """One rank's analysis, as :func:`perfsight.pipeline.analyse_trace` gives it, per-row tables spilled."""

    tables: dict[str, pa.Table]
    """Every table but :data:`ROW_TABLES`, final (aggregates, per-step, data-preparation, vendor)."""
    rows: dict[str, RunSpill]
    """Each of :data:`ROW_TABLES`: ``rows[name].merged()`` yields it in the in-memory order."""
    steps: pa.Table
    """The whole step table (the chunks' own steps, concatenated)."""
    warnings: list[str]
    findings: list
    """``advisor.rank_findings`` for the whole trace."""
    extracts: dict[str, pa.Table | None] = dataclasses.field(default_factory=dict)
    """What the rank rules read of the per-row tables (``advisor.rank_rules``: ``OP_STEPS``,
    ``ALLOCATION_STEPS``), merged from the chunks' own."""

    def table(self, name: str) -> pa.Table:
        """Table ``name`` whole (a per-row one read back from its spill: for small traces and tests)."""
        if name not in self.rows:
            return self.tables[name]
        spill = self.rows[name]
        batches = list(spill.merged())
        if batches:
            return pa.concat_tables(batches)
        assert spill.schema is not None
        return spill.schema.empty_table()

    def remove(self) -> None:
        """Delete the spilled runs."""
        for spill in self.rows.values():
            spill.remove()


def analyse_chunks(chunks: Iterable[TraceChunk], options: pipeline.Options, spill_dir: Path) -> ChunkedTables:
    """All analysis tables of one rank from its chunks in order; per-row tables spill under ``spill_dir``."""
    state = _Merge(Path(spill_dir), options)
    for chunk in chunks:
        try:
            state.add(chunk)
        finally:
            index.release(chunk.trace)
        heap.return_freed_memory()
    return state.finish()


# ---------------------------------------------------------------------------------------------- spills


class _GroupedSpill(RunSpill):
    """A :class:`RunSpill` whose rows come back group by group (groups in sorted order), each
    group in its own key order: a table ordered by a group column first (lane, device)."""

    def __init__(self, folder: Path, name: str) -> None:
        super().__init__(folder, name)
        self.groups: dict[Any, RunSpill] = {}

    def add_group(self, group: Any, table: pa.Table, key: np.ndarray) -> None:
        if self.schema is None:
            self.schema = table.schema
        if table.num_rows == 0:
            return
        if group not in self.groups:
            self.groups[group] = RunSpill(self.folder, f"{self.name}.g{len(self.groups)}", self.batch_rows)
        self.groups[group].add(table, key)
        self.rows += table.num_rows

    def add(self, table: pa.Table, key: np.ndarray) -> None:
        raise TypeError(f"{self.name}: rows go in by group (add_group)")

    def merged(self) -> Iterator[pa.Table]:
        for group in sorted(self.groups):
            yield from self.groups[group].merged()

    def remove(self) -> None:
        for spill in self.groups.values():
            spill.remove()


class _MappedSpill(RunSpill):
    """A :class:`RunSpill` whose batches pass through ``transform`` as they come back (the
    communication tables' ``op`` and ``comm_row``, known only once every chunk was seen)."""

    transform: Callable[[pa.Table], pa.Table] | None = None

    def merged(self) -> Iterator[pa.Table]:
        for batch in super().merged():
            yield batch if self.transform is None else self.transform(batch)


def _set(table: pa.Table, name: str, values: np.ndarray | pa.Array) -> pa.Table:
    """``table`` with column ``name`` replaced by ``values`` (same type)."""
    i = table.schema.get_field_index(name)
    field = table.schema.field(i)
    array = values if isinstance(values, pa.Array | pa.ChunkedArray) else pa.array(values)
    return table.set_column(i, field, array.cast(field.type))


# ---------------------------------------------------------------------------------------------- merge


class _Merge:
    """What is carried from chunk to chunk, and the partial results so far."""

    def __init__(self, folder: Path, options: pipeline.Options) -> None:
        self.folder, self.options = folder, options
        self.first: Trace | None = None
        self.timelines = {name: _Timeline(folder, name) for name in ("host", "device")}
        self.on_device = False  # a chunk had device work: the whole trace is judged on the device clock
        self.flops_by_step: list[pa.Table] = []
        self.steps: list[pa.Table] = []
        self.instances = RunSpill(folder, "operator_instances")
        self.operator_groups: pa.Table | None = None
        self.details = RunSpill(folder, "kernel_details")
        self.stream_reach: dict[int, int] = {}
        self.kernel_groups: pa.Table | None = None
        self.statistic_groups: pa.Table | None = None
        self.curve = _GroupedSpill(folder, "memory_curve")
        self.peaks: list[pa.Table] = []
        self.allocations = _Allocations(folder)
        self.comm = {bucket: _Communication(folder, bucket) for bucket in ("device", "host")}
        self.comm_keys: list[np.ndarray] = []
        self.small = _SmallTrace()
        self.advice = _Advice()

    # -- one chunk

    def add(self, chunk: TraceChunk) -> None:
        if self.first is None:  # what every chunk holds whole: metadata, tracks, vendor results
            self.first = dataclasses.replace(
                chunk.trace,
                slices=chunk.trace.slices.slice(0, 0),
                flows=chunk.trace.flows.slice(0, 0),
                comm=chunk.trace.comm.slice(0, 0),
                memory=chunk.trace.memory.slice(0, 0),
                comm_tasks=chunk.trace.comm_tasks.slice(0, 0),
                dataloader=chunk.trace.dataloader.slice(0, 0),
            )
        if not self.on_device and clock.choose_clock(chunk.trace) == "device":
            self.on_device = True
            self.timelines.pop("host").remove()
        index.release(chunk.trace)
        judged = [timeline.add(chunk.trace, self.options) for timeline in self.timelines.values()]
        for other in judged[:-1]:
            index.release(other)
        trace = judged[-1]  # the device clock's (only the clocked tables differ)
        chunk = dataclasses.replace(chunk, trace=trace)
        self.steps.append(trace.steps)
        self.flops_by_step.append(pipeline.ANALYSES["flops_by_step"](trace, self.options, {}))
        instances = self._operators(chunk)
        self._kernels(trace)
        self._memory(trace)
        made = self.allocations.add(trace)
        self.advice.add_operators(instances)
        if made is not None and made.num_rows:
            names = self.advice.names(made)
            for timeline in self.timelines.values():
                timeline.add_allocations(names, made)
        self._communication(chunk)
        self.small.add(chunk)
        index.release(trace)

    def _operators(self, chunk: TraceChunk) -> pa.Table:
        trace = chunk.trace
        instances = operators.operator_instances(trace)
        key = chunk.slice_rows[columns.int64(instances.column("slice"))] if instances.num_rows else []
        instances = _set(instances, "slice", np.asarray(key, np.int64))
        self.instances.add(instances, np.asarray(key, np.int64))
        if instances.num_rows == 0:
            return instances
        part = operators.operator_groups(instances)
        self.operator_groups = _merged(
            self.operator_groups, part, operators.OPERATOR_KEYS, operators.OPERATOR_AGGREGATES
        )
        return instances

    def _kernels(self, trace: Trace) -> None:
        details = kernels.kernel_details(trace, self.stream_reach)
        self.details.add(details, columns.int64(details.column("start_ns")) if details.num_rows else [])
        if details.num_rows == 0:
            return
        first = (("start_ns", "min"),)
        self.kernel_groups = _merged(
            self.kernel_groups,
            kernels.kernel_groups(details, first_start=True),
            kernels.KERNEL_KEYS,
            kernels.KERNEL_AGGREGATES + first,
        )
        from perfsight.analysis.op_statistic import OP_STATISTIC_AGGREGATES, OP_STATISTIC_KEYS

        self.statistic_groups = _merged(
            self.statistic_groups,
            op_statistic_groups(details, first_start=True),
            OP_STATISTIC_KEYS,
            OP_STATISTIC_AGGREGATES + first,
        )

    def _memory(self, trace: Trace) -> None:
        curve = memory.memory_curve(trace)
        if self.curve.schema is None:
            self.curve.schema = curve.schema
        if curve.num_rows == 0:
            return
        keys = ["rank", "device_type", "device_index"]
        code, first = grouping.group_codes(curve, keys)
        devices = curve.select(keys).take(pa.array(first, pa.int64())).to_pylist()
        for i, device in enumerate(devices):  # a loop over devices (one or two)
            rows = curve if len(devices) == 1 else curve.filter(pa.array(code == i))
            self.curve.add_group(
                _device_key(tuple(device.values())), rows, columns.int64(rows.column("ts_ns"))
            )
        self.peaks.append(memory.memory_peaks(trace, curve))

    def _communication(self, chunk: TraceChunk) -> None:
        comm = chunk.trace.comm
        if comm.num_rows == 0:
            return
        keys = np.asarray(chunk.table_rows["comm"], np.int64)  # each row's row in the whole Trace.comm
        self.comm_keys.append(keys)
        device = bool(columns.numpy(comm.column("is_device"), null=False).any())
        self.comm["device" if device else "host"].add(chunk.trace, keys)

    # -- the end

    def finish(self) -> ChunkedTables:
        if self.first is None:
            raise ValueError("no chunks to analyse")
        options, trace = self.options, self.first
        timeline = self.timelines["device" if self.on_device else "host"]
        for other in self.timelines.values():
            if other is not timeline:
                other.remove()
        tables = timeline.finish()
        tables["flops_by_step"] = _concat(self.flops_by_step)
        steps = _concat(self.steps)
        small = self.small.trace(trace, steps)
        done = dict(tables)
        for name in ("vendor_step_differences",):
            tables[name] = pipeline.ANALYSES[name](small, options, done)
        tables["time_shares"] = overlap.time_shares(tables["overlap_breakdown"])
        for name in DATA_TABLES:
            done[name] = tables[name] = pipeline.ANALYSES[name](small, options, done)
        index.release(small)
        tables["operator_stats"] = self._operator_stats()
        tables["operator_ranking"] = operators.operator_ranking(tables["operator_stats"])
        tables["kernel_stats"] = (
            kernels.kernel_stats_of_groups(_first_seen(self.kernel_groups))
            if self.kernel_groups is not None
            else kernels.KERNEL_STATS_SCHEMA.empty_table()
        )
        tables["op_statistic"] = op_statistic_of_groups(
            _first_seen(self.statistic_groups), tables["operator_stats"]
        )
        tables["memory_peaks"] = _peaks(self.peaks)
        comm_keys = np.sort(np.concatenate(self.comm_keys)) if self.comm_keys else np.zeros(0, np.int64)
        bucket = self.comm["device"] if self.comm["device"].seen else self.comm["host"]
        other = self.comm["host"] if bucket is self.comm["device"] else self.comm["device"]
        other.remove()
        comm_tables, comm_rows = bucket.finish(comm_keys)
        tables.update(comm_tables)
        rows: dict[str, RunSpill] = {
            "overlap_intervals": timeline.intervals,
            "operator_instances": self.instances,
            "kernel_details": self.details,
            "memory_curve": self.curve,
            "operator_memory": self.allocations.finish(),
            **comm_rows,
        }
        for spill in rows.values():
            _merge_in_bounded_batches(spill)
        for name, table in trace.vendor.named_tables().items():
            tables.setdefault(name, table)
        ordered = {name: tables[name] for name in pipeline.ANALYSES if name in tables}
        ordered.update({k: v for k, v in tables.items() if k not in ordered})
        warnings = pipeline.analysis_warnings(ordered, options, trace)
        extracts = {
            OP_STEPS: self.advice.op_steps_table(),
            ALLOCATION_STEPS: timeline.allocation_steps(self.advice.main_thread()),
        }
        findings = advisor.rank_findings({**ordered, **extracts}, small)
        return ChunkedTables(ordered, rows, steps, warnings, findings, extracts)

    def _operator_stats(self) -> pa.Table:
        """Merged from partials, the FLOPs sums taken again over the spilled calls in row order."""
        if self.operator_groups is None:
            return operators.OPERATOR_STATS_SCHEMA.empty_table()
        groups = _set(self.operator_groups, "flops_sum", self._flops_in_row_order(self.operator_groups))
        return operators.operator_stats_of_groups(groups)

    def _flops_in_row_order(self, groups: pa.Table) -> pa.Array:
        """Each (rank, name) group's FLOPs added in operator_instances' row order (as the one-pass
        aggregate adds them: ``grouping.add_in_row_order``), a batch of the spill at a time."""
        keys = groups.select(list(operators.OPERATOR_KEYS)).to_pylist()  # one per operator name
        by_rank: dict[int, tuple[pa.Array, np.ndarray]] = {}
        for rank in {k["rank"] for k in keys}:  # a loop over ranks (one)
            mine = [i for i, k in enumerate(keys) if k["rank"] == rank]
            by_rank[rank] = (pa.array([keys[i]["name"] for i in mine], pa.string()), np.array(mine, np.int64))
        totals = np.zeros(len(keys))
        seen = np.zeros(len(keys), bool)
        for batch in self.instances.merged():
            rank = columns.int64(batch.column("rank"))
            code = np.zeros(batch.num_rows, np.int64)
            for r in np.unique(rank).tolist():  # a loop over ranks (one)
                names, group = by_rank[r]
                on = rank == r
                at = pc.index_in(batch.column("name").filter(pa.array(on)), value_set=names)
                code[on] = group[columns.int64(at)]
            flops = batch.column("flops")
            valid = columns.valid(flops)
            grouping.add_in_row_order(totals, code[valid], columns.numpy(flops, null=0.0)[valid])
            seen[code[valid]] = True
        return pa.array(totals, pa.float64(), mask=~seen)


def _device_key(device: tuple) -> tuple:
    """Sort key of a (rank, device type, device index): the order of ``memory._device_groups``."""
    rank, dtype, dindex = device
    return (rank, dtype.encode() if dtype is not None else b"", dindex)


def _merged(
    so_far: pa.Table | None, part: pa.Table, keys: Iterable[str], aggregations: Iterable[tuple[str, str]]
) -> pa.Table:
    if so_far is None:
        return part
    return grouping.merge_partials([so_far, part], list(keys), list(aggregations))


def _first_seen(groups: pa.Table | None) -> pa.Table | None:
    """Merged groups in the whole table's order of first appearance (by their first start)."""
    if groups is None:
        return None
    order = np.argsort(columns.int64(groups.column("start_ns_min")), kind="stable")
    return groups.take(pa.array(order, pa.int64()))


def _peaks(peaks: list[pa.Table]) -> pa.Table:
    """memory_peaks re-run on the chunks' peaks, each standing as one point of its device's curve."""
    parts = [p for p in peaks if p.num_rows]
    if not parts:
        return memory.MEMORY_PEAKS_SCHEMA.empty_table()
    points = pa.concat_tables(parts).rename_columns(
        ["rank", "device_type", "device_index", "allocated_bytes", "reserved_bytes", "ts_ns"]
    )
    return memory.memory_peaks(None, points)  # type: ignore[arg-type]  # the curve is given


def _concat(parts: list[pa.Table]) -> pa.Table:
    return pa.concat_tables(parts) if len(parts) != 1 else parts[0]


class _Timeline:
    """The clock-dependent tables (:data:`CLOCKED`, overlap_intervals) of the chunks judged on one
    clock, and where their step windows end.  Until a chunk with device work is seen, the chunks
    are judged on both clocks (the host clock's results are dropped once one is)."""

    def __init__(self, folder: Path, clock_name: str) -> None:
        self.clock = clock_name
        self.parts: dict[str, list[pa.Table]] = {name: [] for name in CLOCKED}
        self.intervals = _GroupedSpill(folder, f"overlap_intervals.{clock_name}")
        self.held: dict[int, pa.Table] = {}  # per lane, the last interval (may touch the next chunk's)
        self.reach: int | None = None
        self.carried: clock.Activity | None = None
        self.step_starts = np.zeros(0, np.int64)
        self.step_numbers = np.zeros(0, np.int64)
        self.allocated: dict[int | None, pa.Table] = {}  # per candidate main thread (None: no operators)

    def add(self, trace: Trace, options: pipeline.Options) -> Trace:
        """Analyse one chunk on this clock; returns the chunk as judged (its index is kept)."""
        extra = {**trace.meta.extra, clock.CLOCK_KEY: self.clock}
        if self.reach is not None:
            extra[clock.REACH_KEY] = self.reach
        if self.carried is not None:
            extra[clock.CARRIED_KEY] = self.carried
        judged = dataclasses.replace(trace, meta=dataclasses.replace(trace.meta, extra=extra))
        done: dict[str, pa.Table] = {}
        for name in CLOCKED:
            self.parts[name].append(pipeline.ANALYSES[name](judged, options, done))
        self._intervals(overlap.overlap_intervals(judged))
        steps = self.parts["step_trace"][-1]
        self.step_starts = np.concatenate([self.step_starts, columns.int64(steps.column("start_ns"))])
        self.step_numbers = np.concatenate([self.step_numbers, columns.int64(steps.column("step"))])
        windows = clock.step_windows(judged)
        if windows.num_rows:
            self.reach = int(pc.max(windows.column("end_ns")).as_py())
        if self.reach is not None:  # what runs on past the windows counts in the next chunk's
            self.carried = clock.after(clock.activity(judged, self.clock), self.reach)  # type: ignore[arg-type]
        return judged

    def add_allocations(self, names: dict[int | None, np.ndarray], made: pa.Table) -> None:
        """Bytes the chunk allocated per (step on this clock, operator), for each candidate main thread
        (``names``: the operator charged per allocation, by thread; see ``allocation_steps``)."""
        at = columns.int64(made.column("alloc_ns"))
        steps = allocation_steps.step_of(self.step_starts, self.step_numbers, at)
        size = columns.int64(made.column("size_bytes"))
        for thread in names:  # a new thread had no operators before: charged as with none
            if thread is not None and thread not in self.allocated and None in self.allocated:
                self.allocated[thread] = self.allocated[None]
        for thread, charged in names.items():  # a loop over threads
            part = allocation_steps.allocation_bytes(steps, charged, size)
            self.allocated[thread] = _merged(
                self.allocated.get(thread), part, allocation_steps.KEYS, allocation_steps.AGGREGATES
            )

    def allocation_steps(self, main: int | None) -> pa.Table | None:
        """The rules' allocation extract for the main thread (None: the rank has no operators);
        None without allocations."""
        return self.allocated.get(main, self.allocated.get(None))  # main: no operators while allocating

    def _intervals(self, table: pa.Table) -> None:
        """Spill each lane's intervals but its last, which waits for the next chunk's first one."""
        if self.intervals.schema is None:
            self.intervals.schema = table.schema
        for code, lane in enumerate(overlap.LANES):
            rows = table.filter(pc.equal(table.column("lane"), lane))
            if rows.num_rows == 0:
                continue
            held = self.held.pop(code, None)
            if held is not None:
                first_start = rows.column("start_ns")[0].as_py()
                held_end = held.column("end_ns")[0].as_py()
                if first_start <= held_end:  # touching or overlapping: one merged interval (iv.union)
                    end = max(held_end, rows.column("end_ns")[0].as_py())
                    joined = _set(held, "end_ns", np.array([end], np.int64))
                    rows = pa.concat_tables([joined, rows.slice(1)])
                else:
                    self._spill(code, held)
            self._spill(code, rows.slice(0, rows.num_rows - 1))
            self.held[code] = rows.slice(rows.num_rows - 1)

    def _spill(self, lane: int, rows: pa.Table) -> None:
        self.intervals.add_group(lane, rows, columns.int64(rows.column("start_ns")))

    def finish(self) -> dict[str, pa.Table]:
        """The clocked tables, the held intervals spilled."""
        for code, held in self.held.items():
            self._spill(code, held)
        self.held.clear()
        return {name: _concat(parts) for name, parts in self.parts.items()}

    def remove(self) -> None:
        self.intervals.remove()


class _Advice:
    """The rank rules' extracts of operator_instances, chunk by chunk (``advisor.rank_rules``):
    calls and times per (name, step), calls per thread, and each thread's outermost operators
    (carried across chunks: an allocation is charged to the one running when it is made)."""

    def __init__(self) -> None:
        self.op_steps: pa.Table | None = None
        self.calls: dict[int, int] = {}
        self.outer: dict[int, allocation_steps.OuterOps] = {}  # per thread, this chunk's and the last before
        self.last: dict[int, allocation_steps.OuterOps] = {}
        self.reach: dict[int, int | None] = {}

    def add_operators(self, instances: pa.Table) -> None:
        self.outer = {thread: last for thread, last in self.last.items()}
        if instances.num_rows == 0:
            return
        self.op_steps = _merged(self.op_steps, op_steps(instances), OP_STEP_KEYS, OP_STEP_AGGREGATES)
        thread, start, end, name = allocation_steps.thread_ops(instances)
        threads, counts = np.unique(thread, return_counts=True)
        for t, n in zip(threads.tolist(), counts.tolist(), strict=True):  # a loop over threads
            self.calls[t] = self.calls.get(t, 0) + n
            mine = thread == t
            outer, self.reach[t] = allocation_steps.outermost_ops(
                start[mine], end[mine], name[mine], self.reach.get(t)
            )
            before = self.last.get(t, allocation_steps.OuterOps.none())
            self.outer[t] = before.then(outer)
            if len(self.outer[t].start):
                self.last[t] = self.outer[t].last()

    def names(self, made: pa.Table) -> dict[int | None, np.ndarray]:
        """The operator each allocation of ``made`` is charged to, were each known thread the main one."""
        at = columns.int64(made.column("alloc_ns"))
        fallback = allocation_steps.allocating_names(made)
        out: dict[int | None, np.ndarray] = {None: fallback}
        for thread, outer in self.outer.items():
            charged = allocation_steps.names_at(outer, at)
            out[thread] = np.where(charged == "", fallback, charged)
        return out

    def op_steps_table(self) -> pa.Table | None:
        return self.op_steps

    def main_thread(self) -> int | None:
        if not self.calls:
            return None
        threads = np.array(sorted(self.calls), np.int64)
        return allocation_steps.main_thread(threads, np.array([self.calls[t] for t in threads.tolist()]))


# ---------------------------------------------------------------------------------------- allocations


class _Allocations:
    """operator_memory chunk by chunk: allocations whose address sees no later event in their
    chunk wait (with their operator's name) for the chunks that may release them."""

    def __init__(self, folder: Path) -> None:
        self.spill = RunSpill(folder, "operator_memory")
        self.open: pa.Table | None = None  # raw memory rows of the waiting allocations, by time
        self.open_names = pa.array([], pa.string())
        self.open_keys = np.zeros(0, np.int64)
        self.next_key = 0

    def add(self, trace: Trace) -> pa.Table | None:
        """Spill what the chunk settles; returns the allocations it made (time, size, operator)."""
        if trace.memory.num_rows == 0:
            return None
        carried = 0 if self.open is None else self.open.num_rows
        rows = trace.memory if self.open is None else pa.concat_tables([self.open, trace.memory])
        alloc, following = memory.allocations(rows)
        new = alloc >= carried  # allocations sort by time: the carried (earlier) ones come first
        names = pa.concat_arrays(
            [
                self.open_names,
                columns.combined(memory.allocating_ops(trace, trace.memory, alloc[new] - carried)),
            ]
        )
        keys = np.concatenate([self.open_keys, self.next_key + np.arange(int(new.sum()), dtype=np.int64)])
        self.next_key += int(new.sum())
        waiting = following < 0
        self._emit(
            rows, alloc[~waiting], following[~waiting], names.filter(pa.array(~waiting)), keys[~waiting]
        )
        self.open = rows.take(pa.array(alloc[waiting], pa.int64()))
        self.open_names = names.filter(pa.array(waiting))
        self.open_keys = keys[waiting]
        made = alloc[new]
        return pa.table(
            {
                "alloc_ns": pa.array(columns.int64(rows.column("ts_ns"))[made], pa.int64()),
                "size_bytes": pa.array(columns.int64(rows.column("bytes"))[made], pa.int64()),
                "name": names.slice(carried),
            }
        )

    def _emit(
        self, rows: pa.Table, alloc: np.ndarray, following: np.ndarray, names: pa.Array, keys: np.ndarray
    ) -> None:
        table = memory.allocation_rows(rows, alloc, following, names)
        order = np.argsort(keys, kind="stable")
        self.spill.add(table.take(pa.array(order, pa.int64())), keys[order])

    def finish(self) -> RunSpill:
        if self.open is not None and self.open.num_rows:
            none = np.full(self.open.num_rows, -1, np.int64)
            self._emit(self.open, np.arange(self.open.num_rows), none, self.open_names, self.open_keys)
        if self.spill.schema is None:
            self.spill.schema = memory.OPERATOR_MEMORY_SCHEMA
        return self.spill


# -------------------------------------------------------------------------------------- communication


class _Communication:
    """The communication tables of the chunks of one kind (with device rows, or host rows only)."""

    def __init__(self, folder: Path, bucket: str) -> None:
        self.ops = _MappedSpill(folder, f"communication_ops.{bucket}")
        self.links = _MappedSpill(folder, f"communication_links.{bucket}")
        self.sizes: list[pa.Table] = []
        self.peers: list[pa.Table] = []
        self.step_times: list[pa.Table] = []
        self.step_links: list[pa.Table] = []
        self.primary: list[np.ndarray] = []
        self.seen = False

    def add(self, trace: Trace, keys: np.ndarray) -> None:
        """One chunk's tables, its ops named by ``keys`` (each comm row's slice row in the whole trace)."""
        self.seen = True
        primary = keys[communication.primary_rows(trace.comm)]
        self.primary.append(primary)
        ops = communication.communication_ops(trace)
        links = communication.communication_links(trace)
        self.step_times.append(communication.step_times(ops))
        self.step_links.append(communication.step_links(links))
        op_key = keys[columns.int64(ops.column("comm_row"))] if ops.num_rows else np.zeros(0, np.int64)
        self.ops.add(_set(_set(ops, "op", op_key), "comm_row", op_key), op_key)
        link_key = primary[columns.int64(links.column("op"))] if links.num_rows else np.zeros(0, np.int64)
        per_op = len(communication.LINK_TYPES)
        self.links.add(_set(links, "op", link_key), link_key * per_op + np.arange(len(link_key)) % per_op)
        sizes = communication.communication_sizes(trace)
        self.sizes.append(
            _set(sizes, "op", primary[columns.int64(sizes.column("op"))]) if sizes.num_rows else sizes
        )
        peers = communication.communication_peers(trace)
        self.peers.append(
            _set(peers, "comm_row", keys[columns.int64(peers.column("comm_row"))])
            if peers.num_rows
            else peers
        )

    def remove(self) -> None:
        self.ops.remove()
        self.links.remove()

    def finish(self, comm_keys: np.ndarray) -> tuple[dict[str, pa.Table], dict[str, RunSpill]]:
        """The tables once every chunk was seen: keys become ``op`` (place among the op instances)
        and ``comm_row`` (place in ``Trace.comm``, ordered by slice row)."""
        primary = np.sort(np.concatenate(self.primary)) if self.primary else np.zeros(0, np.int64)

        def op_of(values: pa.ChunkedArray | pa.Array) -> np.ndarray:
            return np.searchsorted(primary, columns.int64(values))

        def row_of(values: pa.ChunkedArray | pa.Array) -> np.ndarray:
            return np.searchsorted(comm_keys, columns.int64(values))

        self.ops.transform = lambda t: _set(
            _set(t, "op", op_of(t.column("op"))), "comm_row", row_of(t.column("comm_row"))
        )
        self.links.transform = lambda t: _set(t, "op", op_of(t.column("op")))
        for spill, schema in (
            (self.ops, communication.OP_TIME_SCHEMA),
            (self.links, communication.LINK_SCHEMA),
        ):
            spill.schema = spill.schema or schema
        sizes = _renumbered(self.sizes, "op", op_of, communication.SIZE_SCHEMA)
        peers = _renumbered(self.peers, "comm_row", row_of, communication.PEER_SCHEMA)
        tables = {
            "communication_sizes": sizes,
            "communication_peers": peers,
            "communication_steps": communication.step_times(
                _concat_or(self.step_times, communication.STEP_TIME_SCHEMA)
            ),
            "communication_step_links": communication.step_links(
                _concat_or(self.step_links, communication.LINK_SCHEMA)
            ),
            "communication_step_sizes": communication.step_sizes(sizes),
        }
        return tables, {"communication_ops": self.ops, "communication_links": self.links}


def _concat_or(parts: list[pa.Table], schema: pa.Schema) -> pa.Table:
    return pa.concat_tables(parts) if parts else schema.empty_table()


def _renumbered(
    parts: list[pa.Table], column: str, number: Callable[[pa.ChunkedArray], np.ndarray], schema: pa.Schema
) -> pa.Table:
    """The chunks' rows with ``column`` renumbered, stable-sorted by it (each chunk's rows are
    already in the whole table's order within one op)."""
    table = _concat_or([p for p in parts if p.num_rows], schema)
    if table.num_rows == 0:
        return schema.empty_table()
    values = number(table.column(column))
    table = _set(table, column, values)
    return table.take(pa.array(np.argsort(values, kind="stable"), pa.int64()))


# ------------------------------------------------------------------------------------------ small trace


class _SmallTrace:
    """What the data analyses and the rank rules read from the trace itself, gathered from the
    chunks: data-loader rows, and host slices of :data:`SMALL_TRACE_KINDS` (by row in the whole trace)."""

    def __init__(self) -> None:
        self.slices: list[pa.Table] = []
        self.keys: list[np.ndarray] = []
        self.dataloader: list[pa.Table] = []
        self.loader_keys: list[np.ndarray] = []

    def add(self, chunk: TraceChunk) -> None:
        ix = index.index_of(chunk.trace)
        rows = np.flatnonzero(ix.kind_mask(SMALL_TRACE_KINDS, is_device=False))
        self.slices.append(chunk.trace.slices.take(pa.array(rows, pa.int64())))
        self.keys.append(chunk.slice_rows[rows])
        self.dataloader.append(chunk.trace.dataloader)
        self.loader_keys.append(np.asarray(chunk.table_rows.get("dataloader", []), np.int64))

    def trace(self, first: Trace, steps: pa.Table) -> Trace:
        keys = np.concatenate(self.keys) if self.keys else np.zeros(0, np.int64)
        slices = _concat(self.slices) if self.slices else first.slices.slice(0, 0)
        slices = slices.take(pa.array(np.argsort(keys, kind="stable"), pa.int64()))
        return dataclasses.replace(
            first,
            slices=slices,
            flows=first.flows.slice(0, 0),
            comm=first.comm.slice(0, 0),
            memory=first.memory.slice(0, 0),
            comm_tasks=first.comm_tasks.slice(0, 0),
            dataloader=_in_key_order(self.dataloader, self.loader_keys, first.dataloader),
            steps=steps,
        )


def _in_key_order(parts: list[pa.Table], keys: list[np.ndarray], empty: pa.Table) -> pa.Table:
    """The chunks' rows in the whole table's order (a capture's rows need not be in time order)."""
    if not parts:
        return empty
    table = pa.concat_tables(parts)
    return table.take(pa.array(np.argsort(np.concatenate(keys), kind="stable"), pa.int64()))


__all__ = ["ChunkedTables", "analyse_chunks"]

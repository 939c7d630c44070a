"""Every single-rank analysis of a trace read as chunks of whole steps, in bounded memory (issue 21).

:func:`analyse_chunks` takes the chunks of one rank (:class:`~perfsight.model_chunks.TraceChunk`,
from the spilled reader or :func:`~perfsight.model_chunks.split_by_steps`), runs the analyses of
:data:`perfsight.pipeline.ANALYSES` chunk by chunk and merges what they give, so that every table
equals the one :func:`perfsight.pipeline.analyse_trace` gives on the whole trace (same rows, order,
values, schema).  Tables whose rows grow with the events (:data:`ROW_TABLES`) are never held
whole: each chunk's rows go to a :class:`~perfsight.sorted_runs.RunSpill` keyed by their place in
the whole table and come back merged, a batch at a time.  Every number is computed by the analysis
modules' own functions; this module only cuts, carries, keys and merges.
What is carried from chunk to chunk lives beside it: the clocked tables and the rank rules'
extracts in ``chunked_timeline.py``, the allocations and communication tables in
``chunked_rows.py``, the spills and exact merges they share in ``chunked_spills.py``.

How each table is made (chunk-local: the analysis on the chunk, the chunks' results concatenated;
partials: per-chunk aggregates merged exactly; re-run: the same function on the merged small input):

=============================  ==============================================================
table                          how
=============================  ==============================================================
step_trace, overlap_breakdown, chunk-local (one row per step, steps in window order), each chunk
device_idle                    judged on the whole trace's clock, its first window starting
                               where the earlier chunks' end, the work they left running counted
                               as its own (``clock.CLOCK_KEY``/``REACH_KEY``/``CARRIED_KEY``);
                               device_idle attributes a free interval to the chunk's own work
                               (a launch flow never crosses chunks), so one ended by carried work
                               -- launched outside every host step and queued past its chunk --
                               is unattributed here (no shared trace has one)
flops_by_step                  chunk-local (FLOPs of a step's own ops)
vendor_step_differences        re-run on the merged step_trace
time_shares                    re-run on the merged overlap_breakdown and device_idle
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
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfsight import advisor, columns, heap, pipeline
from perfsight.advisor.rank_rules.allocation_steps import ALLOCATION_STEPS
from perfsight.advisor.rank_rules.view import OP_STEPS
from perfsight.analysis import clock, grouping, index, kernels, memory, operators, overlap
from perfsight.analysis.op_statistic import op_statistic_groups, op_statistic_of_groups
from perfsight.chunked_rows import Allocations, Communication
from perfsight.chunked_spills import (
    GroupedSpill,
    concat,
    merge_in_bounded_batches,
    merged_partials,
    set_column,
)
from perfsight.chunked_timeline import Advice, Timeline
from perfsight.model import SliceKind, Trace
from perfsight.model_chunks import TraceChunk, in_whole_order
from perfsight.sorted_runs import RunSpill

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


# ---------------------------------------------------------------------------------------------- merge


class _Merge:
    """What is carried from chunk to chunk, and the partial results so far."""

    def __init__(self, folder: Path, options: pipeline.Options) -> None:
        self.folder, self.options = folder, options
        self.first: Trace | None = None
        self.timelines = {name: Timeline(folder, name) for name in ("host", "device")}
        self.on_device = False  # a chunk had device work: the whole trace is judged on the device clock
        self.flops_by_step: list[pa.Table] = []
        self.steps: list[pa.Table] = []
        self.instances = RunSpill(folder, "operator_instances")
        self.operator_groups: pa.Table | None = None
        self.details = RunSpill(folder, "kernel_details")
        self.stream_reach: dict[int, int] = {}
        self.kernel_groups: pa.Table | None = None
        self.statistic_groups: pa.Table | None = None
        self.curve = GroupedSpill(folder, "memory_curve")
        self.peaks: list[pa.Table] = []
        self.allocations = Allocations(folder)
        self.comm = {bucket: Communication(folder, bucket) for bucket in ("device", "host")}
        self.comm_keys: list[np.ndarray] = []
        self.small = _SmallTrace()
        self.advice = Advice()

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
        instances = set_column(instances, "slice", np.asarray(key, np.int64))
        self.instances.add(instances, np.asarray(key, np.int64))
        if instances.num_rows == 0:
            return instances
        part = operators.operator_groups(instances)
        self.operator_groups = merged_partials(
            self.operator_groups, part, operators.OPERATOR_KEYS, operators.OPERATOR_AGGREGATES
        )
        return instances

    def _kernels(self, trace: Trace) -> None:
        details = kernels.kernel_details(trace, self.stream_reach)
        self.details.add(details, columns.int64(details.column("start_ns")) if details.num_rows else [])
        if details.num_rows == 0:
            return
        first = (("start_ns", "min"),)
        self.kernel_groups = merged_partials(
            self.kernel_groups,
            kernels.kernel_groups(details, first_start=True),
            kernels.KERNEL_KEYS,
            kernels.KERNEL_AGGREGATES + first,
        )
        from perfsight.analysis.op_statistic import OP_STATISTIC_AGGREGATES, OP_STATISTIC_KEYS

        self.statistic_groups = merged_partials(
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
        tables["flops_by_step"] = concat(self.flops_by_step)
        steps = concat(self.steps)
        small = self.small.trace(trace, steps)
        done = dict(tables)
        for name in ("vendor_step_differences",):
            tables[name] = pipeline.ANALYSES[name](small, options, done)
        tables["time_shares"] = overlap.time_shares(tables["overlap_breakdown"], tables["device_idle"])
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
            merge_in_bounded_batches(spill)
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
        groups = set_column(self.operator_groups, "flops_sum", self._flops_in_row_order(self.operator_groups))
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
        slices = concat(self.slices) if self.slices else first.slices.slice(0, 0)
        slices = slices.take(pa.array(np.argsort(keys, kind="stable"), pa.int64()))
        return dataclasses.replace(
            first,
            slices=slices,
            flows=first.flows.slice(0, 0),
            comm=first.comm.slice(0, 0),
            memory=first.memory.slice(0, 0),
            comm_tasks=first.comm_tasks.slice(0, 0),
            dataloader=(
                in_whole_order(self.dataloader, self.loader_keys) if self.dataloader else first.dataloader
            ),
            steps=steps,
        )


__all__ = ["ChunkedTables", "analyse_chunks"]

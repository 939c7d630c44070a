"""Device work per call and per kernel name: the numbers behind ``kernel_details.csv``.

Every slice that occupies an accelerator stream (kernels, copies, fills,
communication kernels; not device-side annotations) becomes one row with the host
operator that launched it, that operator's input shapes, the launch geometry and
how long the stream sat idle before it.

Definitions (integer ns):

* ``wait_ns`` = ``start_ns`` minus the latest end among the earlier device slices
  of the same stream, floored at 0 (0 for the stream's first slice and for slices
  that start while earlier work is still running on the stream).
* ``op`` = the host operator that directly issued the launch
  (:func:`perfsight.analysis.hierarchy.launching_op`), null if unknown.
* ``op_type`` = the vendor's operator type of the work when the trace records it (Ascend:
  ``Conv2D``, ``TransData``, ``hcom_allReduce_``), else ``op``, else null.
* ``core_type`` = the vendor's core type when recorded (Ascend: ``AI_CORE``, ``AI_VECTOR_CORE``,
  ``MIX_AIV``, ``HCCL``; the task type where the export did not describe its kernels), else from
  the kind (:func:`core_of_kind`: ``GPU`` for a kernel, ``MEMCPY``, ``MEMSET``, ``COMMUNICATION``).
* Each piece of work is one row: a communication op's own slice stands for all of its work, so
  the tasks that carry it out -- HCCL's plane tasks (``Trace.comm_tasks``) and their copies on the
  hardware stream (a communication slice that starts inside a device communication op of the rank
  and is not an op itself) -- are not rows of their own; ``communication.json`` breaks them down.

``wait_ns`` is measured per stream.  Ascend's ``kernel_details.csv`` measures its ``Wait Time``
from the end of the previous row in start order on any stream (compute and hcom rows together), so
the two differ where streams interleave (around collectives); every other column means the same.
* ``ratio`` in :func:`kernel_stats` = the name's total device time / all device time
  of the rank, 0..1.

This module must not read files or convert units; it returns Arrow tables.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfsight import columns
from perfsight.analysis import grouping
from perfsight.analysis.hierarchy import launching_op
from perfsight.analysis.index import TraceIndex, index_of
from perfsight.jsontext import json_text
from perfsight.model import SliceKind, Trace

KERNEL_DETAILS_SCHEMA = pa.schema(
    [
        ("rank", pa.int32()),
        ("step", pa.int32()),
        ("name", pa.string()),
        ("kind", pa.string()),
        ("op", pa.string()),
        ("stream", pa.int64()),
        ("start_ns", pa.int64()),
        ("dur_ns", pa.int64()),
        ("wait_ns", pa.int64()),
        ("grid", pa.string()),
        ("block", pa.string()),
        ("occupancy_pct", pa.float32()),
        ("input_dims", pa.string()),
        ("input_types", pa.string()),
        ("op_type", pa.string()),
        ("core_type", pa.string()),
    ]
)

KERNEL_STATS_SCHEMA = pa.schema(
    [
        ("rank", pa.int32()),
        ("name", pa.string()),
        ("kind", pa.string()),
        ("count", pa.int64()),
        ("total_ns", pa.int64()),
        ("avg_ns", pa.int64()),
        ("min_ns", pa.int64()),
        ("max_ns", pa.int64()),
        ("ratio", pa.float64()),
    ]
)


def stream_wait_ns(
    track: np.ndarray, start: np.ndarray, end: np.ndarray, reach_before: dict[int, int] | None = None
) -> np.ndarray:
    """Idle gap before each interval on its track: start minus the latest earlier end, floored at 0.

    ``reach_before``: the latest end on each track of the work before these intervals (the
    earlier chunks of a trace analysed chunk by chunk, issue 21); the first interval of a track
    waits from it, and it is updated in place to these intervals' latest ends.
    Loops over tracks (streams), not over slices.
    """
    n = len(track)
    wait = np.zeros(n, np.int64)
    if n == 0:
        return wait
    order = columns.lexsort((start, track))  # stable: ties keep row order
    t, s, e = track[order], start[order], end[order]
    bounds = np.flatnonzero(np.diff(t)) + 1
    gap = np.zeros(n, np.int64)
    for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, n], strict=True):
        reach = np.maximum.accumulate(e[lo:hi])
        before = None if reach_before is None else reach_before.get(int(t[lo]))
        if before is not None:
            gap[lo] = max(int(s[lo]) - before, 0)
            reach = np.maximum(reach, before)
        gap[lo + 1 : hi] = np.maximum(s[lo + 1 : hi] - reach[:-1], 0)
        if reach_before is not None:
            reach_before[int(t[lo])] = int(reach[-1])
    wait[order] = gap
    return wait


def core_of_kind(kind: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Core type of device work whose trace does not name one: ``"GPU"`` for a compute kernel, the
    kind upper-cased otherwise (``"MEMCPY"``, ``"MEMSET"``, ``"COMMUNICATION"``)."""

    def core(kinds: pa.Array) -> pa.Array:
        kinds = kinds.cast(pa.string())
        return pc.if_else(pc.equal(kinds, "kernel"), "GPU", pc.utf8_upper(kinds))

    return columns.per_distinct(columns.combined(kind), core)


def _task_of_a_communication_op(trace: Trace, ix: TraceIndex, rows: np.ndarray) -> np.ndarray:
    """Which of ``rows`` (device work) are tasks of a communication op rather than work of their own:
    rows of ``comm_tasks``, and communication slices that start inside a device op's interval
    without being an op (HCCL's hardware-stream copies of the plane tasks)."""
    comm = trace.comm.filter(trace.comm.column("is_device"))
    ops = columns.int64(comm.column("slice"))
    ops = ops[(ops >= 0) & (ops < ix.n)]
    if not len(ops) or not len(rows):
        return np.zeros(len(rows), bool)
    tasks = columns.int64(trace.comm_tasks.column("slice"))
    is_comm = ix.of_kind((SliceKind.COMMUNICATION.value,))
    candidate = is_comm[rows] & ~np.isin(rows, ops)
    op_start = np.sort(ix.start[ops])
    order = np.argsort(ix.start[ops], kind="stable")
    reach = np.maximum.accumulate(ix.end[ops][order])  # latest end among the ops started so far
    at = np.searchsorted(op_start, ix.start[rows], side="right") - 1
    inside = (at >= 0) & (ix.start[rows] < reach[np.maximum(at, 0)])
    return candidate & (np.isin(rows, tasks) | inside)


def kernel_details(trace: Trace, stream_reach: dict[int, int] | None = None) -> pa.Table:
    """One row per device work slice, in start-time order (see the module docstring).

    ``stream_reach``: see :func:`stream_wait_ns` (the chunked path carries it from chunk to chunk).
    """
    slices = trace.slices
    ix = index_of(trace)
    rows = np.flatnonzero(ix.device_work)
    rows = rows[~_task_of_a_communication_op(trace, ix, rows)]
    if not len(rows):
        return KERNEL_DETAILS_SCHEMA.empty_table()
    wait = stream_wait_ns(ix.track[rows], ix.start[rows], ix.end[rows], stream_reach)
    order = columns.lexsort((ix.tid[rows], ix.start[rows], ix.rank[rows]))  # by rank, start, stream (stable)
    rows, wait = rows[order], wait[order]
    launcher = launching_op(ix)[rows]
    wanted = ["rank", "step", "name", "kind", "tid", "start_ns", "dur_ns", "grid", "block", "occupancy_pct",
              "op_type", "core_type"]  # fmt: skip
    sub = slices.select([c for c in wanted if c in slices.column_names]).take(pa.array(rows))
    for column in ("op_type", "core_type"):  # slices saved before these columns existed
        if column not in sub.column_names:
            sub = sub.append_column(column, pa.nulls(sub.num_rows, pa.string()))

    has_op = launcher >= 0
    op_name = columns.decoded(
        slices.column("name").take(pa.array(np.where(has_op, launcher, 0), mask=~has_op))
    )
    # the launching op's shapes, else (a graph-mode op) the row's own: one take from either row
    shaped = slices.select(["input_dims", "input_types"]).take(pa.array(np.where(has_op, launcher, rows)))

    return pa.table(
        {
            "rank": sub.column("rank"),
            "step": sub.column("step"),
            "name": columns.decoded(sub.column("name")),
            "kind": sub.column("kind").cast(pa.string()),
            "op": op_name,
            "stream": sub.column("tid"),
            "start_ns": sub.column("start_ns"),
            "dur_ns": sub.column("dur_ns"),
            "wait_ns": wait,
            "grid": json_text(sub.column("grid")),
            "block": json_text(sub.column("block")),
            "occupancy_pct": sub.column("occupancy_pct"),
            "input_dims": json_text(shaped.column("input_dims")),
            "input_types": json_text(shaped.column("input_types")),
            "op_type": pc.coalesce(sub.column("op_type").cast(pa.string()), op_name),
            "core_type": pc.coalesce(
                sub.column("core_type").cast(pa.string()), core_of_kind(sub.column("kind"))
            ),
        },
        schema=KERNEL_DETAILS_SCHEMA,
    )


KERNEL_AGGREGATES = (("dur_ns", "count"), ("dur_ns", "sum"), ("dur_ns", "min"), ("dur_ns", "max"))
"""What :func:`kernel_stats` aggregates per (rank, name, kind) of ``kernel_details`` (merge from
per-chunk partials with :func:`perfsight.analysis.grouping.merge_partials`)."""

KERNEL_KEYS = ("rank", "name", "kind")


def kernel_groups(details: pa.Table, first_start: bool = False) -> pa.Table:
    """:data:`KERNEL_AGGREGATES` per (rank, name, kind) of ``details`` (one chunk's or the whole
    trace's); ``first_start`` adds ``start_ns_min``, by which merged chunk partials are put back in
    the whole table's order of first appearance (``details`` are in start order)."""
    extra = (("start_ns", "min"),) if first_start else ()
    return grouping.aggregate(details, KERNEL_KEYS, KERNEL_AGGREGATES + extra)


def kernel_stats(trace: Trace, details: pa.Table | None = None) -> pa.Table:
    """Per (rank, kernel name, kind) aggregates, largest total first.

    Pass ``details`` (from :func:`kernel_details`) to avoid computing them twice.
    """
    det = kernel_details(trace) if details is None else details
    if det.num_rows == 0:
        return KERNEL_STATS_SCHEMA.empty_table()
    return kernel_stats_of_groups(kernel_groups(det))


def kernel_stats_of_groups(grouped: pa.Table) -> pa.Table:
    """:func:`kernel_stats` from the :func:`kernel_groups` of all device work (whole or merged)."""
    if grouped.num_rows == 0:
        return KERNEL_STATS_SCHEMA.empty_table()
    count = columns.int64(grouped.column("dur_ns_count"))
    total = columns.int64(grouped.column("dur_ns_sum"))
    rank = columns.numpy(grouped.column("rank"))
    rank_keys, rank_idx = np.unique(rank, return_inverse=True)
    rank_total = np.zeros(len(rank_keys), np.int64)
    np.add.at(rank_total, rank_idx, total)
    denom = rank_total[rank_idx]
    table = pa.table(
        {
            "rank": grouped.column("rank"),
            "name": grouped.column("name"),
            "kind": grouped.column("kind"),
            "count": count,
            "total_ns": total,
            "avg_ns": np.rint(total / count).astype(np.int64),
            "min_ns": grouped.column("dur_ns_min"),
            "max_ns": grouped.column("dur_ns_max"),
            "ratio": np.divide(total, denom, out=np.zeros(len(total)), where=denom > 0),
        },
        schema=KERNEL_STATS_SCHEMA,
    )
    return table.sort_by([("rank", "ascending"), ("total_ns", "descending"), ("name", "ascending")])

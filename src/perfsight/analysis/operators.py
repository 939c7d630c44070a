"""Host operator statistics: the numbers behind the operator page and ``op_statistic``-style tables.

For every host operator call (``cpu_op`` rows and host-side communication ops) this
module gives its wall time, its *self* time (wall time minus the time of its direct
children on the same thread, so nested calls are not counted twice), the device time
of the work it launched itself, and its own FLOPs; then aggregates per operator name.

Definitions (units: integer ns, FLOPs as float):

* ``self_ns = dur_ns - sum(dur_ns of direct children on the same track)``, floored
  at 0.  Children of every kind count (a ``cudaLaunchKernel`` inside ``aten::mm``
  is not ``aten::mm``'s own time), as torch.profiler's "Self CPU" does.
* ``device_ns`` = summed duration of the device slices launched by runtime calls
  whose ``external_id`` equals the op's: only the op that directly issued a launch
  gets it (``aten::linear`` gets nothing, its ``aten::addmm`` gets the GEMM).
* ``flops`` = the op's own FLOPs (:func:`perfsight.analysis.flops.row_flops`),
  null if not a recognised op.  Nested recognised ops each carry theirs: for
  totals without double counting use :func:`perfsight.analysis.flops.op_flops`.
* ``host_ratio`` = the name's self time / all operators' self time, 0..1.

This module must not read files or format for display beyond JSON text of shapes;
it consumes a :class:`~perfsight.model.Trace` and returns Arrow tables.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfsight import columns
from perfsight.analysis import grouping
from perfsight.analysis.flops import row_flops
from perfsight.analysis.hierarchy import launching_op, parents
from perfsight.analysis.index import index_of
from perfsight.jsontext import json_text
from perfsight.model import Trace

OPERATOR_INSTANCES_SCHEMA = pa.schema(
    [
        ("rank", pa.int32()),
        ("slice", pa.int64()),
        ("step", pa.int32()),
        ("name", pa.string()),
        ("thread", pa.int64()),
        ("start_ns", pa.int64()),
        ("dur_ns", pa.int64()),
        ("self_ns", pa.int64()),
        ("device_ns", pa.int64()),
        ("input_dims", pa.string()),
        ("input_types", pa.string()),
        ("flops", pa.float64()),
    ]
)

OPERATOR_STATS_SCHEMA = pa.schema(
    [
        ("rank", pa.int32()),
        ("name", pa.string()),
        ("count", pa.int64()),
        ("host_total_ns", pa.int64()),
        ("host_self_ns", pa.int64()),
        ("host_avg_ns", pa.int64()),
        ("host_min_ns", pa.int64()),
        ("host_max_ns", pa.int64()),
        ("device_total_ns", pa.int64()),
        ("host_ratio", pa.float64()),
        ("flops", pa.float64()),
    ]
)


def self_times(trace: Trace) -> np.ndarray:
    """Self time (ns) of every slice: its duration minus its direct children's, floored at 0."""
    ix = index_of(trace)
    parent = parents(ix)
    has = parent >= 0
    children = np.zeros(ix.n, np.int64)
    np.add.at(children, parent[has], ix.dur[has])
    return np.maximum(ix.dur - children, 0)


def launched_device_ns(trace: Trace) -> np.ndarray:
    """Device time (ns) each slice launched directly (0 for slices that launched nothing)."""
    ix = index_of(trace)
    launcher = launching_op(ix)
    linked = ix.device_work & (launcher >= 0)
    device = np.zeros(ix.n, np.int64)
    np.add.at(device, launcher[linked], ix.dur[linked])
    return device


def operator_instances(trace: Trace) -> pa.Table:
    """One row per host operator call, in trace row order (see the module docstring)."""
    slices = trace.slices
    rows = np.flatnonzero(index_of(trace).host_op)
    if not len(rows):
        return OPERATOR_INSTANCES_SCHEMA.empty_table()
    self_ns = self_times(trace)[rows]
    device_ns = launched_device_ns(trace)[rows]
    flops = row_flops(trace)[rows]
    wanted = ["rank", "step", "name", "tid", "start_ns", "dur_ns", "input_dims", "input_types"]
    sub = slices.select(wanted).take(pa.array(rows))
    return pa.table(
        {
            "rank": sub.column("rank"),
            "slice": pa.array(rows, pa.int64()),
            "step": sub.column("step"),
            "name": columns.decoded(sub.column("name")),
            "thread": sub.column("tid"),
            "start_ns": sub.column("start_ns"),
            "dur_ns": sub.column("dur_ns"),
            "self_ns": self_ns,
            "device_ns": device_ns,
            "input_dims": json_text(sub.column("input_dims")),
            "input_types": json_text(sub.column("input_types")),
            "flops": pa.array(flops, pa.float64(), from_pandas=True),
        },
        schema=OPERATOR_INSTANCES_SCHEMA,
    )


OPERATOR_AGGREGATES = (
    ("dur_ns", "count"),
    ("dur_ns", "sum"),
    ("self_ns", "sum"),
    ("dur_ns", "min"),
    ("dur_ns", "max"),
    ("device_ns", "sum"),
    ("flops", "sum"),
)
"""What :func:`operator_stats` aggregates per (rank, name) of ``operator_instances``; each merges
from per-chunk partials (:func:`perfsight.analysis.grouping.merge_partials`)."""

OPERATOR_KEYS = ("rank", "name")


def operator_groups(instances: pa.Table) -> pa.Table:
    """:data:`OPERATOR_AGGREGATES` per (rank, name) of ``instances`` (one chunk's or the whole trace's)."""
    return grouping.aggregate(instances, OPERATOR_KEYS, OPERATOR_AGGREGATES)


def operator_stats(trace: Trace, instances: pa.Table | None = None) -> pa.Table:
    """Per (rank, operator name) aggregates, largest self time first.

    Pass ``instances`` (from :func:`operator_instances`) to avoid computing them twice.
    """
    inst = operator_instances(trace) if instances is None else instances
    if inst.num_rows == 0:
        return OPERATOR_STATS_SCHEMA.empty_table()
    return operator_stats_of_groups(operator_groups(inst))


def operator_stats_of_groups(grouped: pa.Table) -> pa.Table:
    """:func:`operator_stats` from the :func:`operator_groups` of all instances (whole or merged)."""
    if grouped.num_rows == 0:
        return OPERATOR_STATS_SCHEMA.empty_table()
    count = columns.int64(grouped.column("dur_ns_count"))
    total = columns.int64(grouped.column("dur_ns_sum"))
    self_total = columns.int64(grouped.column("self_ns_sum"))
    rank = columns.numpy(grouped.column("rank"))
    # share of each rank's total self time
    rank_keys, rank_idx = np.unique(rank, return_inverse=True)
    rank_self = np.zeros(len(rank_keys), np.int64)
    np.add.at(rank_self, rank_idx, self_total)
    denom = rank_self[rank_idx]
    ratio = np.divide(self_total, denom, out=np.zeros(len(self_total)), where=denom > 0)
    table = pa.table(
        {
            "rank": grouped.column("rank"),
            "name": grouped.column("name"),
            "count": count,
            "host_total_ns": total,
            "host_self_ns": self_total,
            "host_avg_ns": np.rint(total / count).astype(np.int64),
            "host_min_ns": grouped.column("dur_ns_min"),
            "host_max_ns": grouped.column("dur_ns_max"),
            "device_total_ns": grouped.column("device_ns_sum").cast(pa.int64()),
            "host_ratio": ratio,
            "flops": grouped.column("flops_sum"),
        },
        schema=OPERATOR_STATS_SCHEMA,
    )
    return table.sort_by([("rank", "ascending"), ("host_self_ns", "descending"), ("name", "ascending")])


OPERATOR_RANKING_SCHEMA = pa.schema(
    [
        ("rank", pa.int32()),
        ("position", pa.int32()),  # 1 = the largest
        ("name", pa.string()),
        ("count", pa.int64()),
        ("host_self_ns", pa.int64()),
        ("device_total_ns", pa.int64()),
        ("flops", pa.float64()),
        ("ranked_by", pa.string()),  # "device_total_ns" or "host_self_ns", the same on every row
        ("ranked_ns", pa.int64()),  # this row's value of ranked_by
        ("share", pa.float64()),  # ranked_ns / the sum of ranked_ns over every operator name, 0..1
    ]
)
"""Columns of :func:`operator_ranking`."""

RANKING_MEASURES = ("device_total_ns", "host_self_ns")
"""What operators are ranked by, in order of preference."""


def operator_ranking(stats: pa.Table) -> pa.Table:
    """Every operator name of one rank's ``operator_stats``, largest first: the one ranking the CLI
    summary, the overview page and the operator page show (they only take its first rows).

    Ranked by device time when the rank launched any (``device_total_ns`` sums above 0), else by
    host self time; ties by host self time, then by name, so the order is total.  Missing times
    count as 0.  ``share`` is the row's part of the ranked measure over all names.
    """
    if stats.num_rows == 0:
        return OPERATOR_RANKING_SCHEMA.empty_table()
    times = {m: pc.fill_null(stats.column(m), 0).cast(pa.int64()) for m in RANKING_MEASURES}
    by = next((m for m in RANKING_MEASURES if (pc.sum(times[m]).as_py() or 0) > 0), RANKING_MEASURES[-1])
    table = pa.table(
        {
            "rank": stats.column("rank").cast(pa.int32()),
            "name": stats.column("name"),
            "count": stats.column("count"),
            "host_self_ns": times["host_self_ns"],
            "device_total_ns": times["device_total_ns"],
            "flops": stats.column("flops"),
        }
    ).sort_by([(by, "descending"), ("host_self_ns", "descending"), ("name", "ascending")])
    ranked = table.column(by)
    total = pc.sum(ranked).as_py() or 0
    values = columns.int64(ranked, 0)
    share = values / total if total > 0 else np.zeros(len(values))
    n = table.num_rows
    return pa.table(
        {
            "rank": table.column("rank"),
            "position": pa.array(np.arange(1, n + 1, dtype=np.int32)),
            "name": table.column("name"),
            "count": table.column("count"),
            "host_self_ns": table.column("host_self_ns"),
            "device_total_ns": table.column("device_total_ns"),
            "flops": table.column("flops"),
            "ranked_by": pa.array([by] * n, pa.string()),
            "ranked_ns": ranked,
            "share": pa.array(share, pa.float64()),
        },
        schema=OPERATOR_RANKING_SCHEMA,
    )

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
* ``ratio`` in :func:`kernel_stats` = the name's total device time / all device time
  of the rank, 0..1.

This module must not read files or convert units; it returns Arrow tables.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from perfsight import columns
from perfsight.analysis import grouping
from perfsight.analysis.hierarchy import launching_op
from perfsight.analysis.index import index_of
from perfsight.jsontext import json_text
from perfsight.model import Trace

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


def stream_wait_ns(track: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Idle gap before each interval on its track: start minus the latest earlier end, floored at 0.

    Loops over tracks (streams), not over slices.
    """
    n = len(track)
    wait = np.zeros(n, np.int64)
    if n == 0:
        return wait
    order = np.lexsort((np.arange(n), start, track))
    t, s, e = track[order], start[order], end[order]
    bounds = np.flatnonzero(np.diff(t)) + 1
    gap = np.zeros(n, np.int64)
    for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, n], strict=True):
        reach = np.maximum.accumulate(e[lo:hi])
        gap[lo + 1 : hi] = np.maximum(s[lo + 1 : hi] - reach[:-1], 0)
    wait[order] = gap
    return wait


def kernel_details(trace: Trace) -> pa.Table:
    """One row per device work slice, in start-time order (see the module docstring)."""
    slices = trace.slices
    ix = index_of(trace)
    rows = np.flatnonzero(ix.device_work)
    if not len(rows):
        return KERNEL_DETAILS_SCHEMA.empty_table()
    wait = stream_wait_ns(ix.track[rows], ix.start[rows], ix.end[rows])
    order = np.lexsort((ix.tid[rows], ix.start[rows], ix.rank[rows]))  # by rank, start, stream (stable)
    rows, wait = rows[order], wait[order]
    launcher = launching_op(ix)[rows]
    wanted = ["rank", "step", "name", "kind", "tid", "start_ns", "dur_ns", "grid", "block", "occupancy_pct"]
    sub = slices.select(wanted).take(pa.array(rows))

    has_op = launcher >= 0
    op_take = pa.array(np.where(has_op, launcher, 0), mask=~has_op)
    ops = slices.select(["name", "input_dims", "input_types"]).take(op_take)
    return pa.table(
        {
            "rank": sub.column("rank"),
            "step": sub.column("step"),
            "name": sub.column("name").cast(pa.string()),
            "kind": sub.column("kind").cast(pa.string()),
            "op": ops.column("name").cast(pa.string()),
            "stream": sub.column("tid"),
            "start_ns": sub.column("start_ns"),
            "dur_ns": sub.column("dur_ns"),
            "wait_ns": wait,
            "grid": json_text(sub.column("grid")),
            "block": json_text(sub.column("block")),
            "occupancy_pct": sub.column("occupancy_pct"),
            "input_dims": json_text(ops.column("input_dims")),
            "input_types": json_text(ops.column("input_types")),
        },
        schema=KERNEL_DETAILS_SCHEMA,
    )


def kernel_stats(trace: Trace, details: pa.Table | None = None) -> pa.Table:
    """Per (rank, kernel name, kind) aggregates, largest total first.

    Pass ``details`` (from :func:`kernel_details`) to avoid computing them twice.
    """
    det = kernel_details(trace) if details is None else details
    if det.num_rows == 0:
        return KERNEL_STATS_SCHEMA.empty_table()
    grouped = grouping.aggregate(
        det,
        ["rank", "name", "kind"],
        [("dur_ns", "count"), ("dur_ns", "sum"), ("dur_ns", "min"), ("dur_ns", "max")],
    )
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

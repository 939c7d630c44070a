"""Time the training loop waited for data, per step: the number behind the overview's data-wait chart.

Two sources, the better first: perfsight's data-loader capture (``Trace.dataloader`` rows of kind
``wait``, each one ``next()`` on the loader, with the step it started in), else the trace's
``data_loading`` slices (torch.profiler's ``enumerate(DataLoader)...`` ranges) summed per host step
(a slice counts in the step whose host window ``[start_ns, end_ns)`` holds its start).  A rank with
neither has no rows.  Units: ns.

This module must not read files or format for display.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfsight import columns
from perfsight.analysis.index import index_of
from perfsight.model import SliceKind, Trace

CAPTURE = "dataloader capture"
RANGES = "data_loading ranges"

DATA_WAIT_SCHEMA = pa.schema(
    [
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("step", pa.int32(), nullable=False),
        pa.field("data_wait_ns", pa.int64(), nullable=False),
        pa.field("source", pa.string(), nullable=False),  # CAPTURE or RANGES, the same on every row
    ]
)
"""Columns of :func:`data_wait`, one row per step that waited, by step."""


def data_wait(trace: Trace) -> pa.Table:
    """Data wait per step of ``trace`` (see the module docstring for the two sources)."""
    captured = _from_capture(trace)
    return captured if captured.num_rows else _from_ranges(trace)


def _table(rank: int, steps: np.ndarray, ns: np.ndarray, source: str) -> pa.Table:
    return pa.table(
        {
            "rank": pa.array(np.full(len(steps), rank, np.int32)),
            "step": pa.array(steps.astype(np.int32)),
            "data_wait_ns": pa.array(ns.astype(np.int64)),
            "source": pa.array([source] * len(steps), pa.string()),
        },
        schema=DATA_WAIT_SCHEMA,
    )


def _from_capture(trace: Trace) -> pa.Table:
    rows = trace.dataloader
    if rows.num_rows == 0:
        return DATA_WAIT_SCHEMA.empty_table()
    waits = rows.filter(
        pc.and_(pc.equal(rows.column("kind"), "wait"), pc.greater_equal(rows.column("step"), 0))
    )
    if waits.num_rows == 0:
        return DATA_WAIT_SCHEMA.empty_table()
    summed = waits.group_by("step").aggregate([("dur_ns", "sum")]).sort_by("step")
    steps = columns.int64(summed.column("step"))
    return _table(trace.rank, steps, columns.int64(summed.column("dur_ns_sum")), CAPTURE)


def _from_ranges(trace: Trace) -> pa.Table:
    ix = index_of(trace)
    rows = np.flatnonzero(ix.kind_mask([SliceKind.DATA_LOADING.value], is_device=False))
    steps = trace.steps
    if len(rows) == 0 or steps.num_rows == 0:
        return DATA_WAIT_SCHEMA.empty_table()
    order = np.argsort(columns.int64(steps.column("start_ns")), kind="stable")
    numbers = columns.int64(steps.column("step"))[order]
    lo, hi = columns.int64(steps.column("start_ns"))[order], columns.int64(steps.column("end_ns"))[order]
    starts, durs = ix.start[rows], ix.dur[rows]
    which = np.searchsorted(lo, starts, side="right") - 1
    inside = (which >= 0) & (starts < hi[np.maximum(which, 0)])
    sums = np.bincount(which[inside], weights=durs[inside], minlength=len(lo))
    seen = np.flatnonzero(np.bincount(which[inside], minlength=len(lo)) > 0)
    by_step = np.argsort(numbers[seen], kind="stable")
    seen = seen[by_step]
    return _table(trace.rank, numbers[seen], np.round(sums[seen]).astype(np.int64), RANGES)

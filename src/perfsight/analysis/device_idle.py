"""Device idle time inside the step, split by what the device was waiting for.

``overlap_breakdown``'s ``free_ns`` says how long the device did nothing inside a step's stage; it
does not say why, so a rank with 40 % free time had no finding to act on.  Every free interval
ends when work starts again, and on a device trace that work was issued by a runtime launch call
on the host (``hierarchy.launcher``).  Each interval is cut at that call's start:

* ``host_wait_ns``: the part before the launch call began.  The device had finished all it had
  been given and the host had not yet issued more: the step is host-bound there (Python overhead,
  many small kernels launched one at a time, host work or a synchronisation inside the step).
* ``after_launch_ns``: the part after the launch call began: launch latency, or a dependency the
  work waited on once issued (an event from another stream, a peer's collective).
* ``unattributed_ns``: free time not ended by launched work: the window's idle end, or work whose
  launch call the trace lacks (no launch flows or correlation ids; every gap on the host clock).
* ``before_forward_ns``: free time before the step's first forward op (``step_trace``'s
  ``fp_start_ns``), not split: it belongs to the iteration gap, whose cause (data loading, host
  code before the forward pass) the data_wait rule judges; counted there and here, it would be
  reported twice.

Per step, exactly: ``before_forward + host_wait + after_launch + unattributed == free_ns`` of
``overlap_breakdown`` (:func:`perfsight.analysis.overlap.free_intervals` cuts the same intervals).

Why the device as a whole and split in time: Holistic Trace Analysis's idle time breakdown
classifies whole gaps per stream ("host wait" when the next kernel's launch began after the
previous kernel ended, "kernel wait" under a 30 ns threshold, else "other").  A stream idles while
another computes; the time a step loses is the union's, and a gap whose launch came midway was
partly host wait and partly not.

Also per step, from the forward start on: how many free intervals (``gaps``), their median and
longest; how many device work items started in the window and their median duration (many short
kernels with short gaps between them is the launch-bound signature); and the host operator whose
device work waited longest for its launch, summed over the step (``top_wait_op``): what to fuse,
capture in a CUDA graph or move out of the step.

This module must not choose the clock, the windows or what counts as busy (``overlap`` and
``clock`` do), and must not loop over events in Python.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from perfsight import columns
from perfsight.analysis.clock import device_activity_mask
from perfsight.analysis.hierarchy import launcher, launching_op
from perfsight.analysis.index import index_of
from perfsight.analysis.overlap import free_intervals
from perfsight.model import NO_ID, Trace

DEVICE_IDLE_SCHEMA = pa.schema(
    [
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("step", pa.int32(), nullable=False),
        pa.field("free_ns", pa.int64(), nullable=False),
        pa.field("before_forward_ns", pa.int64(), nullable=False),
        pa.field("host_wait_ns", pa.int64(), nullable=False),
        pa.field("after_launch_ns", pa.int64(), nullable=False),
        pa.field("unattributed_ns", pa.int64(), nullable=False),
        pa.field("gaps", pa.int64(), nullable=False),
        pa.field("median_gap_ns", pa.int64(), nullable=False),
        pa.field("longest_gap_ns", pa.int64(), nullable=False),
        pa.field("device_work", pa.int64(), nullable=False),
        pa.field("median_work_ns", pa.int64(), nullable=False),
        pa.field("top_wait_op", pa.string()),
        pa.field("top_wait_op_ns", pa.int64(), nullable=False),
    ]
)
"""Columns of :func:`device_idle`: one row per step, in ``overlap_breakdown``'s order."""

_NEVER = np.iinfo(np.int64).max
"""The launch start of work whose launch call is unknown."""


def device_idle(trace: Trace, steps: pa.Table | None = None, stage_end: str | None = None) -> pa.Table:
    """Per step: the free time of ``overlap_breakdown`` split into before the forward start, host
    wait, after launch and unattributed, with the gap and device-work statistics (see the module
    docstring).  ``steps``: the ``step_trace`` table (``step``, ``fp_start_ns``); without it, or
    where a step's forward start is unknown, the forward starts with the window."""
    windows, (g0, g1) = free_intervals(trace, stage_end)
    n = windows.num_rows
    if n == 0:
        return DEVICE_IDLE_SCHEMA.empty_table()
    lo, hi = columns.int64(windows.column("start_ns")), columns.int64(windows.column("end_ns"))
    window = np.searchsorted(lo, g0, side="right") - 1  # windows are disjoint and in time order
    before = np.clip(_forward_starts(windows, steps)[window] - g0, 0, g1 - g0)
    free_ns = _sum(window, g1 - g0, n)
    before_ns = _sum(window, before, n)
    rest = np.flatnonzero(g0 + before < g1)  # what is left of each interval after the forward start
    g0, g1, window = g0[rest] + before[rest], g1[rest], window[rest]
    length = g1 - g0
    call_start, op = _next_launch(trace, g1)
    known = call_start != _NEVER
    host = np.where(known, np.clip(call_start - g0, 0, length), 0)
    after = np.where(known, length - host, 0)
    work_window, work_ns = _work_in_windows(trace, lo, hi)
    top_op, top_ns = _top_wait_op(trace, window, op, host, n)
    by_name = {
        "rank": windows.column("rank"),
        "step": windows.column("step"),
        "free_ns": free_ns,
        "before_forward_ns": before_ns,
        "host_wait_ns": _sum(window, host, n),
        "after_launch_ns": _sum(window, after, n),
        "unattributed_ns": _sum(window, length - host - after, n),
        "gaps": np.bincount(window, minlength=n).astype(np.int64),
        "median_gap_ns": _median(window, length, n),
        "longest_gap_ns": _max(window, length, n),
        "device_work": np.bincount(work_window, minlength=n).astype(np.int64),
        "median_work_ns": _median(work_window, work_ns, n),
        "top_wait_op": top_op,
        "top_wait_op_ns": top_ns,
    }
    return pa.Table.from_arrays(
        [
            pa.array(v, f.type) if isinstance(v, np.ndarray | list) else v
            for f, v in zip(DEVICE_IDLE_SCHEMA, by_name.values(), strict=True)
        ],
        schema=DEVICE_IDLE_SCHEMA,
    )


def _forward_starts(windows: pa.Table, steps: pa.Table | None) -> NDArray[np.int64]:
    """Per window, where its step's forward pass starts (``steps.fp_start_ns``; the window's start
    where unknown)."""
    starts = columns.int64(windows.column("start_ns")).copy()
    if steps is None or steps.num_rows == 0:
        return starts
    numbers = columns.int64(steps.column("step"))
    fp = columns.int64(steps.column("fp_start_ns"), null=NO_ID)
    order = np.argsort(numbers, kind="stable")
    numbers, fp = numbers[order], fp[order]
    wanted = columns.int64(windows.column("step"))
    at = np.minimum(np.searchsorted(numbers, wanted), max(numbers.size - 1, 0))
    known = (numbers[at] == wanted) & (fp[at] != NO_ID)
    starts[known] = np.maximum(starts[known], fp[at][known])
    return starts


def _device_rows(trace: Trace) -> NDArray[np.int64]:
    """Device work rows that occupy time (what the busy set is made of), by start."""
    ix = index_of(trace)

    def compute() -> NDArray[np.int64]:
        rows = np.flatnonzero(device_activity_mask(trace) & (ix.dur > 0))
        return rows[np.argsort(ix.start[rows], kind="stable")]

    return ix.derived("device_idle.device_rows", compute)


def _next_launch(trace: Trace, at: NDArray[np.int64]) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """For each instant of ``at`` (where a free interval ends): the start of the launch call of the
    device work that starts there (the earliest issued, when several do; :data:`_NEVER` when none
    or unknown) and that work's launching host operator row (-1 when unknown)."""
    ix = index_of(trace)
    rows = _device_rows(trace)
    call = launcher(ix)[rows]
    call_start = np.where(call >= 0, ix.start[np.maximum(call, 0)], _NEVER)
    order = np.lexsort((call_start, ix.start[rows]))
    rows, call_start = rows[order], call_start[order]
    start = ix.start[rows]
    j = np.searchsorted(start, at, side="left")
    hit = j < start.size
    hit[hit] = start[j[hit]] == at[hit]
    launch = np.full(at.size, _NEVER, np.int64)
    launch[hit] = call_start[j[hit]]
    op = np.full(at.size, -1, np.int64)
    issued = launch != _NEVER
    if issued.any():
        op[issued] = launching_op(ix)[rows[j[issued]]]
    return launch, op


def _work_in_windows(
    trace: Trace, lo: NDArray[np.int64], hi: NDArray[np.int64]
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """The window of each device work item that starts inside one, and its duration."""
    ix = index_of(trace)
    rows = _device_rows(trace)
    start = ix.start[rows]
    window = np.searchsorted(lo, start, side="right") - 1
    inside = window >= 0
    inside[inside] = start[inside] < hi[window[inside]]
    return window[inside], ix.dur[rows[inside]]


def _sum(window: NDArray[np.int64], values: NDArray[np.int64], n: int) -> NDArray[np.int64]:
    out = np.zeros(n, np.int64)
    np.add.at(out, window, values)
    return out


def _max(window: NDArray[np.int64], values: NDArray[np.int64], n: int) -> NDArray[np.int64]:
    out = np.zeros(n, np.int64)
    np.maximum.at(out, window, values)
    return out


def _median(window: NDArray[np.int64], values: NDArray[np.int64], n: int) -> NDArray[np.int64]:
    """Per window, the median of its ``values`` (the mean of the middle two, floored; 0 when none)."""
    order = np.lexsort((values, window))
    ordered = values[order]
    count = np.bincount(window, minlength=n)
    first = np.cumsum(count) - count
    out = np.zeros(n, np.int64)
    has = count > 0
    low = ordered[(first + (count - 1) // 2)[has]]
    high = ordered[(first + count // 2)[has]]
    out[has] = (low + high) // 2
    return out


def _top_wait_op(
    trace: Trace, window: NDArray[np.int64], op: NDArray[np.int64], host: NDArray[np.int64], n: int
) -> tuple[list[str | None], NDArray[np.int64]]:
    """Per window, the host operator (by name) whose device work waited longest for its launch,
    summed over the window's gaps, and that time; ``None`` and 0 when no gap waited for a known one.
    Ties go to the name first in sort order (the same whichever rows the trace was cut into)."""
    names: list[str | None] = [None] * n
    total = np.zeros(n, np.int64)
    waited = np.flatnonzero((op >= 0) & (host > 0))
    if waited.size == 0:
        return names, total
    encoded = pc.dictionary_encode(trace.slices.column("name").take(pa.array(op[waited])).cast(pa.string()))
    encoded = encoded.combine_chunks() if isinstance(encoded, pa.ChunkedArray) else encoded
    dictionary = encoded.dictionary
    by_name = pc.array_sort_indices(dictionary)
    rank_of = np.empty(len(dictionary), np.int64)
    rank_of[columns.numpy(by_name, 0)] = np.arange(len(dictionary))
    code = rank_of[columns.numpy(encoded.indices, 0)]
    key = window[waited] * len(dictionary) + code
    keys, inverse = np.unique(key, return_inverse=True)
    sums = np.zeros(keys.size, np.int64)
    np.add.at(sums, inverse, host[waited])
    group_window, group_code = keys // len(dictionary), keys % len(dictionary)
    best = np.lexsort((group_code, -sums, group_window))
    first = best[np.r_[True, group_window[best][1:] != group_window[best][:-1]]]
    sorted_names = dictionary.take(by_name).to_pylist()
    for w, c, s in zip(group_window[first], group_code[first], sums[first], strict=True):  # one per step
        names[int(w)] = sorted_names[int(c)]
        total[int(w)] = int(s)
    return names, total

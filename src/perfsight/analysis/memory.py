"""Allocator memory over time, its peaks, and the lifetime of every allocation.

Reads ``Trace.memory`` (Kineto ``[memory]`` events: one row per allocation or
release with the allocator's totals after it) and answers the memory page's
questions: how the allocated and reserved totals move (``memory_curve``, the data of
``memory_record.csv``), how high they went (``memory_peaks``), and which operator
allocated each block and how long it lived (``operator_memory``, the data of
``operator_memory.csv``).

Definitions (ns, bytes):

* An allocation (``bytes > 0``) is released by the next event for the same address
  on the same device if that event is a release (``bytes < 0``); events are ordered
  by (address, time, trace order).  An allocation followed by another allocation at
  the same address, or by nothing, has no release in the trace (null release).
* The allocating operator is the innermost host operator on the allocating thread
  (``tid``) whose ``[start, end]`` contains the allocation time; null if none does.
* ``peak_ts_ns`` is the first time the allocated total reached its peak.

This module must not read files or convert units, and must not invent totals that
the source did not record (a null total stays null).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfsight import columns
from perfsight.analysis import grouping
from perfsight.analysis.hierarchy import enclosing_op
from perfsight.analysis.index import index_of
from perfsight.model import Trace

MEMORY_CURVE_SCHEMA = pa.schema(
    [
        ("rank", pa.int32()),
        ("device_type", pa.string()),
        ("device_index", pa.int32()),
        ("ts_ns", pa.int64()),
        ("allocated_bytes", pa.int64()),
        ("reserved_bytes", pa.int64()),
        ("active_bytes", pa.int64()),
    ]
)

MEMORY_PEAKS_SCHEMA = pa.schema(
    [
        ("rank", pa.int32()),
        ("device_type", pa.string()),
        ("device_index", pa.int32()),
        ("peak_allocated_bytes", pa.int64()),
        ("peak_reserved_bytes", pa.int64()),
        ("peak_ts_ns", pa.int64()),
    ]
)

OPERATOR_MEMORY_SCHEMA = pa.schema(
    [
        ("rank", pa.int32()),
        ("name", pa.string()),
        ("size_bytes", pa.int64()),
        ("alloc_ns", pa.int64()),
        ("release_ns", pa.int64()),
        ("duration_ns", pa.int64()),
        ("allocated_at_alloc_bytes", pa.int64()),
        ("reserved_at_alloc_bytes", pa.int64()),
        ("allocated_at_release_bytes", pa.int64()),
        ("reserved_at_release_bytes", pa.int64()),
        ("device_type", pa.string()),
        ("device_index", pa.int32()),
    ]
)


def _device_groups(memory: pa.Table) -> np.ndarray:
    """A small integer per (rank, device_type, device_index), ordered like those keys."""
    dtype = pc.dictionary_encode(memory.column("device_type").cast(pa.string())).combine_chunks()
    # codes ordered by the type's text so that groups sort by name
    by_name = columns.int64(pc.sort_indices(dtype.dictionary))
    rank_of_code = np.empty(len(by_name), np.int64)
    rank_of_code[by_name] = np.arange(len(by_name))
    keys = (
        columns.int64(memory.column("device_index")),
        rank_of_code[columns.int64(dtype.indices)],
        columns.int64(memory.column("rank")),
    )
    order = np.lexsort(keys)
    new_group = np.zeros(len(order), bool)
    new_group[1:] = np.any([np.diff(key[order]) != 0 for key in keys], axis=0)
    group = np.empty(len(order), np.int64)
    group[order] = np.cumsum(new_group)
    return group


def memory_curve(trace: Trace) -> pa.Table:
    """Allocator totals after every event, per device, in time order."""
    memory = trace.memory
    if memory.num_rows == 0:
        return MEMORY_CURVE_SCHEMA.empty_table()
    group = _device_groups(memory)
    order = columns.lexsort((columns.int64(memory.column("ts_ns")), group))  # stable: ties keep row order
    sub = memory.take(pa.array(order))
    return pa.table(
        {
            "rank": sub.column("rank"),
            "device_type": sub.column("device_type").cast(pa.string()),
            "device_index": sub.column("device_index"),
            "ts_ns": sub.column("ts_ns"),
            "allocated_bytes": sub.column("allocated_bytes"),
            "reserved_bytes": sub.column("reserved_bytes"),
            "active_bytes": sub.column("active_bytes"),
        },
        schema=MEMORY_CURVE_SCHEMA,
    )


def memory_peaks(trace: Trace, curve: pa.Table | None = None) -> pa.Table:
    """Highest allocated and reserved totals per (rank, device), and when allocated peaked.

    Pass ``curve`` (from :func:`memory_curve`) to avoid computing it twice.
    """
    curve = memory_curve(trace) if curve is None else curve
    if curve.num_rows == 0:
        return MEMORY_PEAKS_SCHEMA.empty_table()
    keys = ["rank", "device_type", "device_index"]
    codes = grouping.group_codes(curve, keys)
    grouped = grouping.aggregate(curve, keys, [("allocated_bytes", "max"), ("reserved_bytes", "max")], codes)
    # first instant each group reaches its allocated maximum (NumPy: Arrow's join needs Acero)
    code = codes[0]
    allocated, peak, ts = (
        curve.column("allocated_bytes"),
        grouped.column("allocated_bytes_max"),
        curve.column("ts_ns"),
    )
    reached = np.flatnonzero(
        columns.valid(allocated)
        & columns.valid(peak)[code]
        & columns.valid(ts)
        & (columns.numpy(allocated, null=0) == columns.numpy(peak, null=0)[code])
    )
    peak_ts = np.full(grouped.num_rows, np.iinfo(np.int64).max, np.int64)
    np.minimum.at(peak_ts, code[reached], columns.int64(ts, null=0)[reached])
    has_ts = np.bincount(code[reached], minlength=grouped.num_rows) > 0
    table = pa.table(
        {
            "rank": grouped.column("rank"),
            "device_type": grouped.column("device_type"),
            "device_index": grouped.column("device_index"),
            "peak_allocated_bytes": grouped.column("allocated_bytes_max"),
            "peak_reserved_bytes": grouped.column("reserved_bytes_max"),
            "peak_ts_ns": pa.array(np.where(has_ts, peak_ts, 0), pa.int64(), mask=~has_ts),
        },
        schema=MEMORY_PEAKS_SCHEMA,
    )
    return table.sort_by([("rank", "ascending"), ("device_type", "ascending"), ("device_index", "ascending")])


def operator_memory(trace: Trace) -> pa.Table:
    """One row per allocation: its operator, size, lifetime and the totals around it."""
    memory = trace.memory
    if memory.num_rows == 0:
        return OPERATOR_MEMORY_SCHEMA.empty_table()
    alloc, following = allocations(memory)
    return allocation_rows(memory, alloc, following, allocating_ops(trace, memory, alloc))


def allocations(memory: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """(the allocation rows of ``memory`` by time, the next event's row at each one's address or -1).

    The next event is the allocation's release when it is a release (see the module docstring);
    -1 means none follows in ``memory`` (the chunked path carries such an allocation on to the
    next chunk, whose events may release it).
    """
    n = memory.num_rows
    group = _device_groups(memory)
    addr = columns.int64(memory.column("addr"))
    ts = columns.int64(memory.column("ts_ns"))
    size = columns.int64(memory.column("bytes"))
    order = np.lexsort((np.arange(n), ts, addr, group))
    # the event after each one in (device, address, time) order
    nxt = np.full(n, -1, np.int64)
    same = (group[order][1:] == group[order][:-1]) & (addr[order][1:] == addr[order][:-1])
    nxt[order[:-1][same]] = order[1:][same]
    alloc = np.flatnonzero(size > 0)
    alloc = alloc[np.argsort(ts[alloc], kind="stable")]
    return alloc, nxt[alloc]


def allocating_ops(trace: Trace, memory: pa.Table, alloc: np.ndarray) -> pa.Array | pa.ChunkedArray:
    """Name of the operator that made each allocation ``alloc`` (rows of ``memory``), null if none."""
    op = enclosing_op(
        index_of(trace),
        columns.int64(memory.column("rank"))[alloc],
        columns.int64(memory.column("tid"))[alloc],
        columns.int64(memory.column("ts_ns"))[alloc],
    )
    has_op = op >= 0
    if not trace.slices.num_rows:
        return pa.nulls(len(alloc), pa.string())
    return columns.decoded(trace.slices.column("name").take(pa.array(np.where(has_op, op, 0), mask=~has_op)))


def allocation_rows(
    memory: pa.Table, alloc: np.ndarray, following: np.ndarray, names: pa.Array | pa.ChunkedArray
) -> pa.Table:
    """The :func:`operator_memory` rows of allocations ``alloc`` (rows of ``memory``), given the
    next event at each one's address (``following``, -1 for none) and their operators' ``names``."""
    size = columns.int64(memory.column("bytes"))
    released = following >= 0
    released[released] = size[following[released]] < 0
    release = np.where(released, following, -1)
    at_alloc = memory.take(pa.array(alloc))
    at_release = memory.select(["ts_ns", "allocated_bytes", "reserved_bytes"]).take(
        pa.array(np.where(released, release, 0), mask=~released)
    )
    release_ns = at_release.column("ts_ns")
    duration = pc.subtract(release_ns, at_alloc.column("ts_ns"))
    return pa.table(
        {
            "rank": at_alloc.column("rank"),
            "name": names,
            "size_bytes": at_alloc.column("bytes"),
            "alloc_ns": at_alloc.column("ts_ns"),
            "release_ns": release_ns,
            "duration_ns": duration,
            "allocated_at_alloc_bytes": at_alloc.column("allocated_bytes"),
            "reserved_at_alloc_bytes": at_alloc.column("reserved_bytes"),
            "allocated_at_release_bytes": at_release.column("allocated_bytes"),
            "reserved_at_release_bytes": at_release.column("reserved_bytes"),
            "device_type": at_alloc.column("device_type").cast(pa.string()),
            "device_index": at_alloc.column("device_index"),
        },
        schema=OPERATOR_MEMORY_SCHEMA,
    )

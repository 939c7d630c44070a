"""Who contains whom and who launched what: the relations between slices of one trace.

Operator self time, kernel attribution, outermost-only FLOPs and the operator
behind an allocation all need the same three questions answered about
``Trace.slices``: which slice is a slice's direct parent on its track, which host
operator launched a device slice, and which host operator was running on a thread
at a given instant.  They are answered here once, with NumPy, looping only over
nesting levels and tracks, never over events.

This module must not compute metrics or build output tables; it returns row
indices into ``Trace.slices`` (``-1`` where there is none).  It trusts the
reader's ``depth`` column (proper Chrome ``X`` nesting on a track).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from perfsight.model import NO_ID, SliceKind

HOST_OP_KINDS = (SliceKind.CPU_OP.value, SliceKind.COMMUNICATION.value)
"""Kinds that are host operators when ``is_device`` is false (a collective's host op is one)."""

DEVICE_WORK_KINDS = (
    SliceKind.KERNEL.value,
    SliceKind.MEMCPY.value,
    SliceKind.MEMSET.value,
    SliceKind.COMMUNICATION.value,
)
"""Kinds that occupy a stream when ``is_device`` is true (device annotations are not work)."""

Rows = NDArray[np.int64]


def kind_mask(slices: pa.Table, kinds: tuple[str, ...], is_device: bool) -> NDArray[np.bool_]:
    """Rows whose kind is one of ``kinds`` and whose ``is_device`` equals ``is_device``."""
    if slices.num_rows == 0:
        return np.zeros(0, bool)
    of_kind = pc.is_in(slices.column("kind"), value_set=pa.array(kinds, pa.string()))
    on_device = slices.column("is_device").to_numpy()
    return np.asarray(of_kind.to_numpy(zero_copy_only=False), bool) & (on_device == is_device)


def host_op_mask(slices: pa.Table) -> NDArray[np.bool_]:
    """Host operator rows: ``cpu_op`` and host-side ``communication`` slices."""
    return kind_mask(slices, HOST_OP_KINDS, is_device=False)


def device_work_mask(slices: pa.Table) -> NDArray[np.bool_]:
    """Device rows that occupy a stream: kernels, copies, fills and communication kernels."""
    return kind_mask(slices, DEVICE_WORK_KINDS, is_device=True)


def _np(slices: pa.Table, name: str) -> NDArray[np.int64]:
    return np.asarray(slices.column(name).to_numpy(), dtype=np.int64)


def parent_rows(slices: pa.Table) -> Rows:
    """Row of each slice's direct parent on its track (``-1`` for depth 0 or no parent found).

    A child at depth ``d`` has as parent the last depth ``d - 1`` slice of the same
    track that starts at or before it.  One sort by (track, start, depth) puts a
    parent before a child that starts at the same instant; each depth level is then
    a running maximum over the positions of its candidate parents.
    """
    n = slices.num_rows
    parent = np.full(n, -1, dtype=np.int64)
    if n == 0:
        return parent
    track, start, depth = _np(slices, "track"), _np(slices, "start_ns"), _np(slices, "depth")
    order = np.lexsort((depth, start, track))
    s_track, s_depth = track[order], depth[order]
    positions = np.arange(n)
    for d in range(1, int(depth.max()) + 1):
        last = np.maximum.accumulate(np.where(s_depth == d - 1, positions, -1))
        child = np.flatnonzero(s_depth == d)
        cand = last[child]
        ok = cand >= 0
        ok[ok] = s_track[cand[ok]] == s_track[child[ok]]
        parent[order[child[ok]]] = order[cand[ok]]
    return parent


def outermost(slices: pa.Table, mask: NDArray[np.bool_]) -> NDArray[np.bool_]:
    """True for masked rows that no other masked row of the same track encloses.

    Sorted by (track, start, longest first), a row is nested when it starts before
    the running maximum of the ends of the masked rows before it on its track.
    """
    result = np.zeros(slices.num_rows, bool)
    rows = np.flatnonzero(mask)
    if not len(rows):
        return result
    track = _np(slices, "track")[rows]
    start = _np(slices, "start_ns")[rows]
    end = start + np.maximum(_np(slices, "dur_ns")[rows], 0)
    depth = _np(slices, "depth")[rows]
    order = np.lexsort((depth, -end, start, track))
    track, start, end = track[order], start[order], end[order]
    bounds = np.flatnonzero(np.diff(track)) + 1
    outer = np.ones(len(rows), bool)
    for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, len(rows)], strict=True):
        reach = np.maximum.accumulate(end[lo:hi])
        outer[lo + 1 : hi] = start[lo + 1 : hi] >= reach[:-1]
    result[rows[order[outer]]] = True
    return result


def _lookup(keys: list[NDArray[np.int64]], table_keys: list[NDArray[np.int64]], values: Rows) -> Rows:
    """For each query key tuple, the value of the matching table key tuple (-1 if none).

    ``table_keys`` must be unique.  Implemented as an Arrow hash join.
    """
    if not len(keys[0]) or not len(table_keys[0]):
        return np.full(len(keys[0]), -1, dtype=np.int64)
    names = [f"k{i}" for i in range(len(keys))]
    left = pa.table({**dict(zip(names, keys, strict=True)), "q": np.arange(len(keys[0]))})
    right = pa.table({**dict(zip(names, table_keys, strict=True)), "v": values})
    joined = left.join(right, keys=names, join_type="inner")
    out = np.full(len(keys[0]), -1, dtype=np.int64)
    out[joined.column("q").to_numpy()] = joined.column("v").to_numpy()
    return out


def launch_pairs(slices: pa.Table, flows: pa.Table) -> tuple[Rows, Rows]:
    """(runtime row, device row) for every device work slice whose launch call is known.

    Uses ``launch`` flows, then equal ``correlation`` ids for device rows no flow names.
    """
    rank, corr = _np(slices, "rank"), _np(slices, "correlation")
    device = device_work_mask(slices)
    runtime = kind_mask(slices, (SliceKind.RUNTIME.value,), is_device=False)
    src = np.zeros(0, np.int64)
    dst = np.zeros(0, np.int64)
    if flows.num_rows:
        is_launch = np.asarray(pc.equal(flows.column("kind"), "launch").to_numpy(zero_copy_only=False), bool)
        src = _np(flows, "src")[is_launch]
        dst = _np(flows, "dst")[is_launch]
        ok = (src >= 0) & (src < len(device)) & (dst >= 0) & (dst < len(device))
        src, dst = src[ok], dst[ok]
        ok = device[dst] & runtime[src]
        src, dst = src[ok], dst[ok]
    unlinked = device.copy()
    unlinked[dst] = False
    dev_rows = np.flatnonzero(unlinked & (corr != NO_ID))
    rt_rows = np.flatnonzero(runtime & (corr != NO_ID))
    if len(dev_rows) and len(rt_rows):
        # one runtime row per (rank, correlation): the first
        key_order = np.lexsort((rt_rows, corr[rt_rows], rank[rt_rows]))
        rt_sorted = rt_rows[key_order]
        first = np.ones(len(rt_sorted), bool)
        first[1:] = (np.diff(corr[rt_sorted]) != 0) | (np.diff(rank[rt_sorted]) != 0)
        rt_unique = rt_sorted[first]
        found = _lookup([rank[dev_rows], corr[dev_rows]], [rank[rt_unique], corr[rt_unique]], rt_unique)
        hit = found >= 0
        src = np.r_[src, found[hit]]
        dst = np.r_[dst, dev_rows[hit]]
    return src.astype(np.int64), dst.astype(np.int64)


def launching_op(slices: pa.Table, flows: pa.Table, parents: Rows | None = None) -> Rows:
    """For every row, the host operator row that directly issued it (-1 if unknown).

    Filled for device work slices only.  The launcher is the host operator whose
    ``external_id`` equals the launching runtime call's (the innermost op on the
    issuing thread), provided that op is on the call's track and spans its start;
    otherwise (older Kineto numbers runtime calls' external ids like their
    correlation ids, so the ids can collide) the runtime call's nearest host-op
    ancestor on its track.
    """
    n = slices.num_rows
    result = np.full(n, -1, dtype=np.int64)
    if n == 0:
        return result
    ops = host_op_mask(slices)
    rank, ext, depth = _np(slices, "rank"), _np(slices, "external_id"), _np(slices, "depth")
    track, start = _np(slices, "track"), _np(slices, "start_ns")
    end = start + np.maximum(_np(slices, "dur_ns"), 0)
    op_rows = np.flatnonzero(ops & (ext != NO_ID))
    # one op per (rank, external id): the deepest, should a source repeat an id on nested rows
    order = np.lexsort((-depth[op_rows], ext[op_rows], rank[op_rows]))
    op_sorted = op_rows[order]
    first = np.ones(len(op_sorted), bool)
    first[1:] = (np.diff(ext[op_sorted]) != 0) | (np.diff(rank[op_sorted]) != 0)
    op_unique = op_sorted[first]

    runtime_rows, device_rows = launch_pairs(slices, flows)
    by_ext = _lookup([rank[runtime_rows], ext[runtime_rows]], [rank[op_unique], ext[op_unique]], op_unique)
    found = by_ext >= 0
    rt, op = runtime_rows[found], by_ext[found]
    found[found] = (track[op] == track[rt]) & (start[op] <= start[rt]) & (start[rt] <= end[op])
    by_ext[~found] = -1
    missing = ~found
    if missing.any():
        parents = parent_rows(slices) if parents is None else parents
        by_ext[missing] = nearest_ancestor(runtime_rows[missing], parents, ops)
    result[device_rows] = by_ext
    return result


def nearest_ancestor(rows: Rows, parents: Rows, target: NDArray[np.bool_]) -> Rows:
    """For each row, its nearest proper ancestor that is ``target`` (-1 if none).

    Climbs one nesting level per iteration for all rows at once.
    """
    current = parents[rows] if len(rows) else np.zeros(0, np.int64)
    active = np.flatnonzero(current >= 0)
    while len(active):
        hit = target[current[active]]
        active = active[~hit]
        current[active] = parents[current[active]]
        active = active[current[active] >= 0]
    return current


def enclosing_op(slices: pa.Table, rank: NDArray[np.int64], tid: NDArray[np.int64],
                 ts: NDArray[np.int64], parents: Rows | None = None) -> Rows:
    """For each instant ``ts`` on host thread (``rank``, ``tid``), the innermost host
    operator running then (``start <= ts <= end``); -1 if none.

    The last host slice of that thread starting at or before ``ts`` is found by one
    merged sort; from it, ancestors are climbed a level at a time until one is a
    host operator that still covers ``ts``.
    """
    q = len(ts)
    if q == 0 or slices.num_rows == 0:
        return np.full(q, -1, dtype=np.int64)
    parents = parent_rows(slices) if parents is None else parents
    host = ~slices.column("is_device").to_numpy()
    rows = np.flatnonzero(host)
    s_rank, s_tid = _np(slices, "rank"), _np(slices, "tid")
    start = _np(slices, "start_ns")
    end = start + np.maximum(_np(slices, "dur_ns"), 0)
    ops = host_op_mask(slices)

    # thread key shared by slices and queries
    pairs = np.concatenate([np.c_[s_rank[rows], s_tid[rows]], np.c_[rank, tid]]).astype(np.int64)
    _, thread = np.unique(pairs, axis=0, return_inverse=True)
    thread = thread.ravel()
    m = len(rows)
    all_thread = thread
    all_time = np.r_[start[rows], ts]
    is_query = np.r_[np.zeros(m, np.int8), np.ones(q, np.int8)]
    order = np.lexsort((is_query, all_time, all_thread))
    positions = np.arange(m + q)
    last = np.maximum.accumulate(np.where(is_query[order] == 0, positions, -1))
    result = np.full(q, -1, dtype=np.int64)
    query_pos = np.flatnonzero(is_query[order] == 1)
    query_idx = order[query_pos] - m
    cand = last[query_pos]
    ok = cand >= 0
    ok[ok] = all_thread[order[cand[ok]]] == thread[m + query_idx[ok]]
    current = np.full(q, -1, dtype=np.int64)
    current[query_idx[ok]] = rows[order[cand[ok]]]

    active = np.flatnonzero(current >= 0)
    while len(active):
        c = current[active]
        done = ops[c] & (end[c] >= ts[active])
        result[active[done]] = c[done]
        active = active[~done]
        current[active] = parents[current[active]]
        active = active[current[active] >= 0]
    return result

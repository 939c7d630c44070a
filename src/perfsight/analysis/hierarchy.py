"""Who contains whom and who launched what: the relations between slices of one trace.

Operator self time, kernel attribution, outermost-only FLOPs and the operator
behind an allocation all need the same questions answered about
``Trace.slices``: which slice is a slice's direct parent on its track, which
runtime call and which host operator launched a device slice, and which host
operator was running on a thread at a given instant.  They are answered here,
with NumPy, looping only over nesting levels, ranks and threads, never over
events; each answer is computed once per trace and kept in its
:class:`~perfsight.analysis.index.TraceIndex`.

This module must not compute metrics or build output tables; it returns row
indices into ``Trace.slices`` (``-1`` where there is none).  It trusts the
reader's ``depth`` column (proper Chrome ``X`` nesting on a track).  The
matching and nesting primitives it shares with the reader (first row with a
key, outermost of nested slices) live in the leaf modules :mod:`perfsight.columns` and
:mod:`perfsight.intervals`.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from perfsight import columns
from perfsight.analysis.index import TraceIndex
from perfsight.columns import first_match
from perfsight.intervals import outermost as _outermost
from perfsight.model import NO_ID

Rows = NDArray[np.int64]


def parents(ix: TraceIndex) -> Rows:
    """Row of each slice's direct parent on its track (``-1`` for depth 0 or no parent found).

    A child at depth ``d`` has as parent the last depth ``d - 1`` slice of the same
    track that starts at or before it.  One sort by (track, start, depth) puts a
    parent before a child that starts at the same instant; the sorted positions are then
    grouped by depth (a stable radix sort of the depths), and each level's children look
    their candidate parent up among the level above's positions (a binary search), so each
    level costs its own rows, not the whole trace's.
    """
    return ix.derived("parents", lambda: _parents(ix))


def _parents(ix: TraceIndex) -> Rows:
    parent = np.full(ix.n, -1, dtype=np.int64)
    if ix.n == 0:
        return parent
    track, depth = ix.track, ix.depth
    order = columns.lexsort((depth, ix.start, track))
    s_track, s_depth = track[order], depth[order]
    deepest = int(depth.max())
    by_depth = np.argsort(s_depth, kind="stable")  # sorted positions of depth 0, then 1, ... ascending
    level = np.searchsorted(s_depth[by_depth], np.arange(deepest + 2))  # where each depth's positions begin
    for d in range(1, deepest + 1):
        above, child = by_depth[level[d - 1] : level[d]], by_depth[level[d] : level[d + 1]]
        if not len(above):
            continue
        at = np.searchsorted(above, child) - 1  # the last depth d - 1 position before each child
        ok = at >= 0
        cand = above[np.maximum(at, 0)]
        ok &= s_track[cand] == s_track[child]
        parent[order[child[ok]]] = order[cand[ok]]
    return parent


def parent_rows(slices: pa.Table) -> Rows:
    """:func:`parents` of a bare slices table (nothing is kept between calls)."""
    return parents(TraceIndex(slices))


def outermost(ix: TraceIndex, mask: NDArray[np.bool_]) -> NDArray[np.bool_]:
    """True for masked rows that no other masked row of the same track encloses (of identical
    intervals, the shallowest)."""
    return _outermost(ix.track, ix.start, ix.end, mask, ix.depth)


def _first_per_rank(ix: TraceIndex, table_rows: Rows, query_rows: Rows, key: NDArray[np.int64]) -> Rows:
    """For each query row, the first of ``table_rows`` of the same rank with an equal ``key`` (-1 if none)."""
    rank = ix.rank
    found = np.full(len(query_rows), -1, dtype=np.int64)
    for r in np.unique(rank[query_rows]):  # a loop over ranks (one, in a single-rank trace)
        table = table_rows[rank[table_rows] == r]
        mine = np.flatnonzero(rank[query_rows] == r)
        match = first_match(key[table], key[query_rows[mine]])
        hit = match >= 0
        found[mine[hit]] = table[match[hit]]
    return found


def launch_pairs(ix: TraceIndex) -> tuple[Rows, Rows]:
    """(runtime row, device row) for every device work slice whose launch call is known.

    Uses ``launch`` flows, then equal ``correlation`` ids (the first runtime call of
    the rank with that id) for device rows no flow names.
    """
    return ix.derived("launch_pairs", lambda: _launch_pairs(ix))


def _launch_pairs(ix: TraceIndex) -> tuple[Rows, Rows]:
    corr = ix.correlation
    device, runtime = ix.device_work, ix.runtime
    src = np.zeros(0, np.int64)
    dst = np.zeros(0, np.int64)
    flows = ix.flows
    if flows is not None and flows.num_rows:
        is_launch = columns.numpy(pc.equal(flows.column("kind"), "launch"), null=False)
        src = columns.int64(flows.column("src"))[is_launch]
        dst = columns.int64(flows.column("dst"))[is_launch]
        ok = (src >= 0) & (src < ix.n) & (dst >= 0) & (dst < ix.n)
        src, dst = src[ok], dst[ok]
        ok = device[dst] & runtime[src]
        src, dst = src[ok], dst[ok]
    unlinked = device.copy()
    unlinked[dst] = False
    dev_rows = np.flatnonzero(unlinked & (corr != NO_ID))
    rt_rows = np.flatnonzero(runtime & (corr != NO_ID))
    found = _first_per_rank(ix, rt_rows, dev_rows, corr)
    hit = found >= 0
    return np.r_[src, found[hit]].astype(np.int64), np.r_[dst, dev_rows[hit]].astype(np.int64)


def launcher(ix: TraceIndex) -> Rows:
    """For every slice row, the row of the runtime call that launched it, or ``-1``."""

    def compute() -> Rows:
        out = np.full(ix.n, -1, dtype=np.int64)
        src, dst = launch_pairs(ix)
        out[dst] = src
        return out

    return ix.derived("launcher", compute)


def launching_op(ix: TraceIndex) -> Rows:
    """For every row, the host operator row that directly issued it (-1 if unknown).

    Filled for device work slices only.  The launcher is the host operator whose
    ``external_id`` equals the launching runtime call's (the innermost op on the
    issuing thread), provided that op is on the call's track and spans its start;
    otherwise (older Kineto numbers runtime calls' external ids like their
    correlation ids, so the ids can collide) the runtime call's nearest host-op
    ancestor on its track.
    """
    return ix.derived("launching_op", lambda: _launching_op(ix))


def _launching_op(ix: TraceIndex) -> Rows:
    result = np.full(ix.n, -1, dtype=np.int64)
    if ix.n == 0:
        return result
    ops, ext = ix.host_op, ix.external_id
    track, start, end = ix.track, ix.start, ix.end
    op_rows = np.flatnonzero(ops & (ext != NO_ID))
    # one op per (rank, external id): the deepest, should a source repeat an id on nested rows
    op_rows = op_rows[np.argsort(-ix.depth[op_rows], kind="stable")]
    runtime_rows, device_rows = launch_pairs(ix)
    by_ext = _first_per_rank(ix, op_rows, runtime_rows, ext)
    found = by_ext >= 0
    rt, op = runtime_rows[found], by_ext[found]
    found[found] = (track[op] == track[rt]) & (start[op] <= start[rt]) & (start[rt] <= end[op])
    by_ext[~found] = -1
    missing = ~found
    if missing.any():
        by_ext[missing] = nearest_ancestor(runtime_rows[missing], parents(ix), ops)
    result[device_rows] = by_ext
    return result


def nearest_ancestor(rows: Rows, parent: Rows, target: NDArray[np.bool_]) -> Rows:
    """For each row, its nearest proper ancestor that is ``target`` (-1 if none).

    Climbs one nesting level per iteration for all rows at once.
    """
    current = parent[rows] if len(rows) else np.zeros(0, np.int64)
    active = np.flatnonzero(current >= 0)
    while len(active):
        hit = target[current[active]]
        active = active[~hit]
        current[active] = parent[current[active]]
        active = active[current[active] >= 0]
    return current


def _host_threads(ix: TraceIndex) -> tuple[dict[tuple[int, int], tuple[int, int]], Rows, NDArray[np.int64]]:
    """Host rows sorted by (rank, tid, start, row); each thread's (lo, hi) range in that order;
    the sorted starts."""

    def compute() -> tuple[dict[tuple[int, int], tuple[int, int]], Rows, NDArray[np.int64]]:
        rows = np.flatnonzero(~ix.is_device)
        rank, tid, start = ix.rank[rows], ix.tid[rows], ix.start[rows]
        order = columns.lexsort((start, tid, rank))
        rows, rank, tid = rows[order], rank[order], tid[order]
        bounds = np.flatnonzero((np.diff(rank) != 0) | (np.diff(tid) != 0)) + 1
        lo, hi = np.r_[0, bounds], np.r_[bounds, len(rows)]
        ranges = {(int(rank[a]), int(tid[a])): (int(a), int(b)) for a, b in zip(lo, hi, strict=True) if b > a}
        return ranges, rows, ix.start[rows]

    return ix.derived("host_threads", compute)


def enclosing_op(
    ix: TraceIndex, rank: NDArray[np.int64], tid: NDArray[np.int64], ts: NDArray[np.int64]
) -> Rows:
    """For each instant ``ts`` on host thread (``rank``, ``tid``), the innermost host
    operator running then (``start <= ts <= end``); -1 if none.

    The last host slice of that thread starting at or before ``ts`` (of equal starts,
    the last row) is found by a binary search per thread; from it, ancestors are
    climbed a level at a time until one is a host operator that still covers ``ts``.
    """
    q = len(ts)
    result = np.full(q, -1, dtype=np.int64)
    if q == 0 or ix.n == 0:
        return result
    ranges, rows, starts = _host_threads(ix)
    current = np.full(q, -1, dtype=np.int64)
    by_thread = np.lexsort((tid, rank))
    bounds = np.flatnonzero((np.diff(rank[by_thread]) != 0) | (np.diff(tid[by_thread]) != 0)) + 1
    for a, b in zip(np.r_[0, bounds], np.r_[bounds, q], strict=True):  # a loop over threads
        first = by_thread[a]
        span = ranges.get((int(rank[first]), int(tid[first])))
        if span is None:
            continue
        lo, hi = span
        mine = by_thread[a:b]
        pos = np.searchsorted(starts[lo:hi], ts[mine], side="right") - 1
        ok = pos >= 0
        current[mine[ok]] = rows[lo + pos[ok]]

    ops, end, parent = ix.host_op, ix.end, parents(ix)
    active = np.flatnonzero(current >= 0)
    while len(active):
        c = current[active]
        done = ops[c] & (end[c] >= ts[active])
        result[active[done]] = c[done]
        active = active[~done]
        current[active] = parent[current[active]]
        active = active[current[active] >= 0]
    return result

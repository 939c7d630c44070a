"""HCCL's per-plane tasks of one rank's communication ops: which task moves data, which plane
is an op's main plane, and where an RDMA transfer starts and ends.

Ascend records each HCCL op as tasks on planes (``Trace.comm_tasks``): SDMA copies and reductions
over a link, RDMA sends, and notifications.  ``perfsight.analysis.communication`` turns them into
the times and bandwidths of ``communication.json``; this module only orders the tasks and finds
their structure (vectorised over tasks; the one loop is the greedy pairing of RDMA transfer
candidates).  It must not decide a reported number.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from perfsight import columns
from perfsight.model import NO_ID

SDMA_TRANSIT_TASKS = ("Memcpy", "Reduce_Inline")
"""SDMA tasks that move data (others only notify)."""

UNKNOWN_TASK_TYPES = ("", "N/A")
"""Task types that say nothing: a level0 db export lists every HCCL task with type, transport and
link ``N/A``.  Such tasks are ignored, so their op is split as an op without tasks is (its basis is
not ``tasks``) rather than read as all idle."""

NOTIFY_WAIT = "Notify_Wait"
"""A task that waits for a peer's notification (waiting, unless part of an RDMA transfer)."""

RDMA_SEND = "RDMASend"
"""The RDMA task that posts a send."""


def text(table: pa.Table, name: str) -> pa.Array:
    """Column ``name`` of ``table`` as one plain string array (all nulls when the column is absent:
    readers fill only what their format records)."""
    if name not in table.column_names:
        return pa.nulls(table.num_rows, pa.string())
    return columns.combined(table.column(name)).cast(pa.string())


def is_one_of(values: pa.Array, options: tuple[str, ...]) -> NDArray[np.bool_]:
    """Which ``values`` are among ``options`` (a null is not)."""
    return columns.numpy(pc.is_in(values, value_set=pa.array(options, pa.string())), null=False)


def in_ranges(size: int, first: NDArray[np.int64], last: NDArray[np.int64]) -> NDArray[np.bool_]:
    """Which of ``size`` positions lie in one of the ranges ``first[i]..last[i]`` (inclusive): the
    tasks an RDMA transfer consumed, which count as part of that transfer and not on their own."""
    covered = np.zeros(size + 1, dtype=np.int64)
    np.add.at(covered, first, 1)
    np.add.at(covered, last + 1, -1)
    return np.cumsum(covered[:-1]) > 0


def _rank_column(tasks: pa.Table, name: str) -> NDArray[np.int64]:
    """A rank column of the tasks (``NO_ID`` where not recorded, or for a reader that has none)."""
    if name not in tasks.column_names:
        return np.full(tasks.num_rows, NO_ID, np.int64)
    return columns.int64(pc.cast(tasks.column(name), pa.int64()), NO_ID)


class OpTasks:
    """One rank's tasks that belong to an op of ``comm`` and say what they are (a task type other
    than :data:`UNKNOWN_TASK_TYPES`), ordered by op, plane, start."""

    def __init__(self, comm: pa.Table, tasks: pa.Table | None) -> None:
        n_ops = comm.num_rows
        if tasks is None or tasks.num_rows == 0:
            tasks = pa.table({"op": pa.array([], pa.int64())})
        op = columns.int64(tasks.column("op"), NO_ID) if tasks.num_rows else np.zeros(0, np.int64)
        known = ~is_one_of(pc.fill_null(text(tasks, "task_type"), ""), UNKNOWN_TASK_TYPES)
        keep = np.flatnonzero((op >= 0) & (op < n_ops) & known)
        if tasks.num_rows:
            plane = columns.int64(tasks.column("plane"), NO_ID)
            start = columns.int64(tasks.column("start_ns"), 0)
            order = keep[np.lexsort((start[keep], plane[keep], op[keep]))]
            tasks = tasks.take(pa.array(order, pa.int64()))
        else:
            order = keep
        self.n = order.size
        self.op = op[order] if self.n else np.zeros(0, np.int64)
        if self.n:
            self.plane = columns.int64(tasks.column("plane"), NO_ID)
            self.start = columns.int64(tasks.column("start_ns"), 0)
            self.dur = np.maximum(columns.int64(tasks.column("dur_ns"), 0), 0)
            self.bytes = columns.int64(tasks.column("bytes"), 0)
            self.type = text(tasks, "task_type")
            self.transport = text(tasks, "transport")
            link = pc.replace_substring(pc.fill_null(text(tasks, "link"), ""), "HCCS_SW", "HCCS")
            self.link = columns.combined(link)
            self.dst = _rank_column(tasks, "dst_rank")
        self.has = np.zeros(n_ops, dtype=bool)
        self.has[self.op] = True

    def main_plane_mask(self, n_ops: int) -> NDArray[np.bool_]:
        """Tasks on their op's main plane: the only plane; else 0 if plane 0 has RDMA, else 1."""
        if self.n == 0:
            return np.zeros(0, dtype=bool)
        valid = self.plane != NO_ID
        pair = np.unique(np.stack([self.op[valid], self.plane[valid]], axis=1), axis=0)
        planes = np.bincount(pair[:, 0], minlength=n_ops) if pair.size else np.zeros(n_ops, np.int64)
        only = np.full(n_ops, NO_ID, dtype=np.int64)
        if pair.size:
            only[pair[:, 0]] = pair[:, 1]  # meaningful where planes == 1
        rdma0 = np.zeros(n_ops, dtype=bool)
        is_rdma = columns.numpy(pc.equal(self.transport, "RDMA"), null=False)
        rdma0[self.op[is_rdma & (self.plane == 0)]] = True
        main = np.where(planes == 1, only, np.where(rdma0, 0, 1))
        return self.plane == main[self.op]

    def rdma_transfers(
        self, rows: NDArray[np.int64], p2p: NDArray[np.bool_]
    ) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """Among ``rows`` (ordered, one op's lane after another): (first task, last task) of each
        RDMA transfer -- an RDMA task followed by ``RDMASend`` then ``Notify_Wait`` on the same op
        and plane, ``n`` tasks long (3 for point-to-point ops, 5 otherwise), greedily from the left."""
        if rows.size < 3:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        ttype = self.type.take(pa.array(rows))
        rdma = columns.numpy(pc.equal(self.transport.take(pa.array(rows)), "RDMA"), null=False)
        send = columns.numpy(pc.equal(ttype, RDMA_SEND), null=False)
        wait = columns.numpy(pc.equal(ttype, NOTIFY_WAIT), null=False)
        lane = self.op[rows] * (1 << 20) + self.plane[rows]
        length = np.where(p2p[self.op[rows]], 3, 5)
        i = np.arange(rows.size - 2)
        last = i + length[i] - 1
        inside = last < rows.size
        same = np.zeros(i.size, dtype=bool)
        same[inside] = lane[last[inside]] == lane[i[inside]]
        candidates = np.flatnonzero(rdma[i] & send[i + 1] & wait[i + 2] & same)
        first: list[int] = []
        blocked_until = -1
        for c in candidates.tolist():  # greedy: a transfer consumes its tasks
            if c > blocked_until:
                first.append(c)
                blocked_until = int(last[c])
        f = np.asarray(first, dtype=np.int64)
        return f, last[f] if f.size else f

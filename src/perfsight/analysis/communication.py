"""Per-op communication analysis: where each collective's time goes, and how fast each link moved data.

The numbers of Ascend's ``communication.json`` ("Communication Time Info" and
"Communication Bandwidth Info"), computed from one rank's ``comm`` table (one row
per op instance) and, when the trace has them, its ``comm_tasks`` (HCCL's
per-plane transfer and notification tasks).  Definitions, learned from Ascend's
golden files and documented for users in docs/OUTPUTS.md:

Time (per op, from the op's **main plane**: its only plane; else plane 0 when plane 0
carries an RDMA task, else plane 1 -- HCCL's main stream):

* ``elapse_ns``: the op's duration.
* ``transit_ns``: time moving data on the main plane: SDMA ``Memcpy``/``Reduce_Inline``
  tasks over a real link (not ``ON_CHIP``), plus each RDMA transfer (an RDMA task
  followed by ``RDMASend`` and ``Notify_Wait``: from its start to the end of its last
  task; 3 tasks for send/receive ops, 5 otherwise).
* ``wait_ns``: ``Notify_Wait`` time on the main plane outside RDMA transfers.
* ``synchronization_ns``: the part of ``wait_ns`` before the first transit task
  (waiting for the peers to be ready at all).
* ``idle_ns`` = ``elapse - transit - wait``.
* ratios: ``wait / (wait + transit)`` and ``synchronization / (synchronization + transit)``.

Without tasks (Kineto/NCCL) a rank cannot split an op by itself.  Given
``arrivals`` -- for each op, when the last participating rank entered the same
collective instance (cross-rank matching is the cluster analysis' job) --
``synchronization_ns = wait_ns = min(last_arrival - start, elapse)`` (time spent
waiting for the slowest peer) and ``transit_ns = elapse - wait``.  With neither,
``transit_ns = elapse`` and the waits are 0; ``basis`` says which applied.

Bandwidth (per op and link type, over **all** planes): SDMA transit tasks grouped
by their link (``HCCS_SW`` counts as HCCS; ``ON_CHIP`` local copies are not
traffic), RDMA transfers as RDMA; ``SDMA`` is HCCS + PCIE + SIO.
``bandwidth = bytes / transit time`` in GB/s (10^9 bytes per second);
``large_packet_ratio`` is the share of packets larger than 32 MB (HCCS, PCIE,
SIO) or 0.5 MB (RDMA), MB = 10^6 bytes.

Point-to-point ops (``perfsight.model.is_p2p``) are summed apart from collectives in the step
totals, as Ascend's "Total Op Info" is written per kind.  The task structure (main plane, RDMA
transfers) comes from :mod:`perfsight.analysis.hccl_tasks`.  The ``communication_*`` functions at
the end are the rank's registered tables (``perfsight.pipeline.ANALYSES``): cached, returned by
``perfsight.load``, formatted by ``perfsight.export.communication_json``.

Everything is vectorised (NumPy over tasks, grouped by op).  This module must not read files,
match ranks, or convert to ms/MB (export does).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from perfsight import columns
from perfsight.analysis import grouping, hccl_tasks
from perfsight.model import NO_ID, Trace, is_p2p

LINK_TYPES = ("RDMA", "HCCS", "PCIE", "SDMA", "SIO")
"""Link types of "Communication Bandwidth Info", in Ascend's order (SDMA = HCCS + PCIE + SIO)."""

SDMA_LINKS = ("HCCS", "PCIE", "SIO")
"""Links whose traffic SDMA sums."""

LARGE_PACKET_BYTES = {"RDMA": 500_000, "HCCS": 32_000_000, "PCIE": 32_000_000, "SIO": 32_000_000}
"""A packet larger than this is "large" (Ascend's message-size thresholds: 0.5 MB RDMA, 32 MB others)."""

OP_TIME_SCHEMA = pa.schema(
    [
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("op", pa.int64(), nullable=False),  # row index into the comm table given
        pa.field("comm_row", pa.int64(), nullable=False),  # row in Trace.comm (op_times alone: = op)
        pa.field("step", pa.int32(), nullable=False),
        pa.field("is_p2p", pa.bool_(), nullable=False),  # model.is_p2p of the collective
        pa.field("name", pa.string()),
        pa.field("group", pa.string()),
        pa.field("collective", pa.string()),
        pa.field("start_ns", pa.int64(), nullable=False),  # first task's start (the op's without tasks)
        pa.field("elapse_ns", pa.int64(), nullable=False),
        pa.field("transit_ns", pa.int64(), nullable=False),
        pa.field("wait_ns", pa.int64(), nullable=False),
        pa.field("synchronization_ns", pa.int64(), nullable=False),
        pa.field("idle_ns", pa.int64(), nullable=False),
        pa.field("wait_ratio", pa.float64(), nullable=False),  # wait / (wait + transit), 0 if both 0
        pa.field("synchronization_ratio", pa.float64(), nullable=False),
        pa.field("basis", pa.string(), nullable=False),  # "tasks", "arrivals" or "elapse"
    ]
)
"""Columns of :func:`op_times`."""

LINK_SCHEMA = pa.schema(
    [
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("op", pa.int64(), nullable=False),
        pa.field("step", pa.int32(), nullable=False),
        pa.field("is_p2p", pa.bool_(), nullable=False),
        pa.field("link", pa.string(), nullable=False),  # one of LINK_TYPES
        pa.field("bytes", pa.int64(), nullable=False),
        pa.field("transit_ns", pa.int64(), nullable=False),
        pa.field("packets", pa.int64(), nullable=False),
        pa.field("large_packets", pa.int64(), nullable=False),
        pa.field("bandwidth_gb_s", pa.float64(), nullable=False),  # 0 when no transit time
        pa.field("large_packet_ratio", pa.float64(), nullable=False),  # 0 for SDMA, as Ascend writes
    ]
)
"""Columns of :func:`link_bandwidth`: one row per op and link type (all five, zeros included)."""

SIZE_SCHEMA = pa.schema(
    [
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("op", pa.int64(), nullable=False),  # NO_ID in step totals
        pa.field("step", pa.int32(), nullable=False),
        pa.field("is_p2p", pa.bool_(), nullable=False),
        pa.field("link", pa.string(), nullable=False),  # RDMA, HCCS, PCIE or SIO (SDMA has none)
        pa.field("packet_bytes", pa.int64(), nullable=False),
        pa.field("count", pa.int64(), nullable=False),
        pa.field("transit_ns", pa.int64(), nullable=False),
    ]
)
"""Columns of :func:`size_distribution`: packets of one size on one link of one op."""

STEP_TIME_SCHEMA = pa.schema(
    [
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("step", pa.int32(), nullable=False),
        pa.field("is_p2p", pa.bool_(), nullable=False),
        pa.field("elapse_ns", pa.int64(), nullable=False),
        pa.field("transit_ns", pa.int64(), nullable=False),
        pa.field("wait_ns", pa.int64(), nullable=False),
        pa.field("synchronization_ns", pa.int64(), nullable=False),
        pa.field("idle_ns", pa.int64(), nullable=False),
        pa.field("wait_ratio", pa.float64(), nullable=False),
        pa.field("synchronization_ratio", pa.float64(), nullable=False),
    ]
)
"""Columns of :func:`step_times`: Ascend's "Total Op Info" time part, per step and kind (p2p or not)."""


# ---------------------------------------------------------------------------------------------
# helpers


def _ratio(part: NDArray[np.int64], other: NDArray[np.int64]) -> NDArray[np.float64]:
    denominator = (part + other).astype(np.float64)
    return np.divide(part, denominator, out=np.zeros(part.size), where=denominator > 0)


def _sum_by(keys: NDArray[np.int64], values: NDArray[np.int64], n: int) -> NDArray[np.int64]:
    out = np.zeros(n, dtype=np.int64)
    np.add.at(out, keys, values)
    return out


def _link_rates(
    nbytes: NDArray[np.int64],
    ns: NDArray[np.int64],
    packets: NDArray[np.int64],
    large: NDArray[np.int64],
    is_sdma: NDArray[np.bool_],
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """(bandwidth in GB/s, large-packet ratio) of link sums, for one op or a step's total: bytes
    per ns is GB/s; SDMA's ratio is 0, as Ascend writes it (it is a sum of other links)."""
    bandwidth = np.divide(nbytes, ns, out=np.zeros(nbytes.shape), where=ns > 0)
    ratio = np.divide(large, packets, out=np.zeros(nbytes.shape), where=(packets > 0) & ~is_sdma)
    return bandwidth, ratio


def _p2p(comm: pa.Table) -> NDArray[np.bool_]:
    """Point-to-point ops of ``comm`` (the model's one definition, :func:`perfsight.model.is_p2p`)."""
    return columns.numpy(is_p2p(comm.column("collective")), null=False)


def _op_columns(comm: pa.Table) -> dict[str, pa.Array]:
    n = comm.num_rows
    return {
        "rank": pa.array(columns.int64(comm.column("rank")).astype(np.int32) if n else [], pa.int32()),
        "op": pa.array(np.arange(n, dtype=np.int64), pa.int64()),
        "step": pa.array(columns.int64(comm.column("step"), NO_ID).astype(np.int32) if n else [], pa.int32()),
        "is_p2p": pa.array(_p2p(comm) if n else np.zeros(0, bool), pa.bool_()),
    }


# ---------------------------------------------------------------------------------------------
# public functions


def op_times(comm: pa.Table, tasks: pa.Table | None = None, arrivals: pa.Table | None = None) -> pa.Table:
    """Elapse, transit, wait, synchronization and idle time of every row of ``comm`` (one rank).

    ``comm``: rows of ``COMM_SCHEMA`` (pass the device rows when the rank has them, so one op is
    not counted twice as host call and kernel); the output's ``op`` is the row index in it.
    ``tasks``: rows of ``COMM_TASK_SCHEMA`` whose ``op`` indexes ``comm`` (``Trace.comm_tasks``).
    ``arrivals``: optional table with ``op`` (row in ``comm``) and ``last_arrival_ns`` (when the
    last rank of the same collective instance started it), used for ops without tasks.
    Returns :data:`OP_TIME_SCHEMA` rows, one per ``comm`` row, in order.
    """
    n = comm.num_rows
    if n == 0:
        return OP_TIME_SCHEMA.empty_table()
    t = hccl_tasks.OpTasks(comm, tasks)
    start = columns.int64(comm.column("start_ns"), 0)
    elapse = np.maximum(columns.int64(comm.column("dur_ns"), 0), 0)
    transit = np.zeros(n, dtype=np.int64)
    wait = np.zeros(n, dtype=np.int64)
    sync = np.zeros(n, dtype=np.int64)
    first_start = start.copy()
    if t.n:
        np.minimum.at(first_start, t.op, t.start)
        main = np.flatnonzero(t.main_plane_mask(n))
        f, last = t.rdma_transfers(main, _p2p(comm))
        in_rdma = hccl_tasks.in_ranges(main.size, f, last)
        rows = main
        sdma_transit = (
            columns.numpy(pc.equal(t.transport.take(pa.array(rows)), "SDMA"), null=False)
            & hccl_tasks.is_one_of(t.type.take(pa.array(rows)), hccl_tasks.SDMA_TRANSIT_TASKS)
            & ~columns.numpy(pc.equal(t.link.take(pa.array(rows)), "ON_CHIP"), null=False)
            & ~in_rdma
        )
        row_types = t.type.take(pa.array(rows))
        is_wait = columns.numpy(pc.equal(row_types, hccl_tasks.NOTIFY_WAIT), null=False) & ~in_rdma
        op_of = t.op[rows]
        rdma_ns = t.start[rows[last]] + t.dur[rows[last]] - t.start[rows[f]] if f.size else f
        transit += _sum_by(op_of[sdma_transit], t.dur[rows][sdma_transit], n)
        transit += _sum_by(op_of[f], rdma_ns, n) if f.size else 0
        wait += _sum_by(op_of[is_wait], t.dur[rows][is_wait], n)
        # synchronization: waits before the op's first transit task on the main plane
        position = np.arange(rows.size)
        first_transit = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(first_transit, op_of[sdma_transit], position[sdma_transit])
        if f.size:
            np.minimum.at(first_transit, op_of[f], f)
        early = is_wait & (position < first_transit[op_of])
        sync += _sum_by(op_of[early], t.dur[rows][early], n)
    basis = np.where(t.has, "tasks", "elapse").astype(object)
    if arrivals is not None and arrivals.num_rows:
        a_op = columns.int64(arrivals.column("op"), NO_ID)
        a_ns = columns.int64(arrivals.column("last_arrival_ns"), NO_ID)
        ok = (a_op >= 0) & (a_op < n) & (a_ns != NO_ID)
        target = a_op[ok][~t.has[a_op[ok]]]
        late = np.clip(a_ns[ok][~t.has[a_op[ok]]] - start[target], 0, elapse[target])
        wait[target] = sync[target] = late
        basis[target] = "arrivals"
    no_tasks = ~t.has
    transit[no_tasks] = elapse[no_tasks] - wait[no_tasks]
    by_name = _op_columns(comm)
    return pa.Table.from_arrays(
        [
            by_name["rank"],
            by_name["op"],
            by_name["op"],
            by_name["step"],
            by_name["is_p2p"],
            hccl_tasks.text(comm, "name"),
            hccl_tasks.text(comm, "group"),
            hccl_tasks.text(comm, "collective"),
            pa.array(first_start, pa.int64()),
            pa.array(elapse, pa.int64()),
            pa.array(transit, pa.int64()),
            pa.array(wait, pa.int64()),
            pa.array(sync, pa.int64()),
            pa.array(elapse - transit - wait, pa.int64()),
            pa.array(_ratio(wait, transit), pa.float64()),
            pa.array(_ratio(sync, transit), pa.float64()),
            pa.array(basis.astype(str), pa.string()),
        ],
        schema=OP_TIME_SCHEMA,
    )


def _packets(comm: pa.Table, tasks: pa.Table | None) -> tuple[NDArray[np.int64], ...]:
    """Every packet of every op, over all planes: (op, link code, bytes, transit ns).

    Link codes index :data:`LINK_TYPES`.  SDMA transit tasks take their link; RDMA transfers
    count as one RDMA packet of their first task's size.
    """
    n = comm.num_rows
    t = hccl_tasks.OpTasks(comm, tasks)
    empty = np.zeros(0, dtype=np.int64)
    if t.n == 0:
        return empty, empty, empty, empty
    rows = np.arange(t.n)
    f, last = t.rdma_transfers(rows, _p2p(comm))
    in_rdma = hccl_tasks.in_ranges(t.n, f, last)
    sdma = (
        columns.numpy(pc.equal(t.transport, "SDMA"), null=False)
        & hccl_tasks.is_one_of(t.type, hccl_tasks.SDMA_TRANSIT_TASKS)
        & hccl_tasks.is_one_of(t.link, SDMA_LINKS)
        & ~in_rdma
    )
    link_code = np.full(t.n, -1, dtype=np.int64)
    for code, link in enumerate(LINK_TYPES):
        if link in SDMA_LINKS:
            link_code[sdma & columns.numpy(pc.equal(t.link, link), null=False)] = code
    sdma_rows = np.flatnonzero(link_code >= 0)
    op = np.concatenate([t.op[sdma_rows], t.op[f]])
    code = np.concatenate([link_code[sdma_rows], np.full(f.size, LINK_TYPES.index("RDMA"), np.int64)])
    size = np.concatenate([t.bytes[sdma_rows], t.bytes[f]])
    dur = np.concatenate([t.dur[sdma_rows], t.start[last] + t.dur[last] - t.start[f] if f.size else empty])
    keep = op < n
    return op[keep], code[keep], size[keep], dur[keep]


def link_bandwidth(comm: pa.Table, tasks: pa.Table | None = None) -> pa.Table:
    """Bytes, transit time, bandwidth and large-packet ratio of every op of ``comm`` on each of the
    five link types (:data:`LINK_TYPES`; zero rows included, as Ascend writes them).

    Arguments as in :func:`op_times`.  Ops without tasks get zero rows (a trace without
    per-link tasks says nothing about links).  Returns :data:`LINK_SCHEMA` rows ordered by op, link.
    """
    n, k = comm.num_rows, len(LINK_TYPES)
    if n == 0:
        return LINK_SCHEMA.empty_table()
    op, code, size, dur = _packets(comm, tasks)
    cell = op * k + code
    nbytes = _sum_by(cell, size, n * k).reshape(n, k)
    ns = _sum_by(cell, dur, n * k).reshape(n, k)
    packets = _sum_by(cell, np.ones(cell.size, np.int64), n * k).reshape(n, k)
    threshold = np.array([LARGE_PACKET_BYTES.get(link, np.iinfo(np.int64).max) for link in LINK_TYPES])
    large = _sum_by(cell, (size > threshold[code]).astype(np.int64), n * k).reshape(n, k)
    sdma = LINK_TYPES.index("SDMA")
    parts = [LINK_TYPES.index(link) for link in SDMA_LINKS]
    nbytes[:, sdma] = nbytes[:, parts].sum(axis=1)
    ns[:, sdma] = ns[:, parts].sum(axis=1)
    packets[:, sdma] = packets[:, parts].sum(axis=1)
    large[:, sdma] = 0
    bandwidth, ratio = _link_rates(nbytes, ns, packets, large, np.arange(k) == sdma)
    base = _op_columns(comm)
    return pa.Table.from_arrays(
        [
            pa.array(np.repeat(columns.int64(base["rank"]), k).astype(np.int32), pa.int32()),
            pa.array(np.repeat(np.arange(n, dtype=np.int64), k), pa.int64()),
            pa.array(np.repeat(columns.int64(base["step"]), k).astype(np.int32), pa.int32()),
            pa.array(np.repeat(columns.numpy(base["is_p2p"]), k), pa.bool_()),
            pa.array(np.tile(np.array(LINK_TYPES, dtype=object), n).astype(str), pa.string()),
            pa.array(nbytes.reshape(-1), pa.int64()),
            pa.array(ns.reshape(-1), pa.int64()),
            pa.array(packets.reshape(-1), pa.int64()),
            pa.array(large.reshape(-1), pa.int64()),
            pa.array(bandwidth.reshape(-1), pa.float64()),
            pa.array(ratio.reshape(-1), pa.float64()),
        ],
        schema=LINK_SCHEMA,
    )


PEER_SCHEMA = pa.schema(
    [
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("comm_row", pa.int64(), nullable=False),  # row in Trace.comm
        pa.field("step", pa.int32(), nullable=False),
        pa.field("src", pa.int64(), nullable=False),
        pa.field("dst", pa.int64(), nullable=False),
        pa.field("transport", pa.string(), nullable=False),  # a LINK_TYPES entry but SDMA, or LOCAL
        pa.field("bytes", pa.int64(), nullable=False),
        pa.field("transit_ns", pa.int64(), nullable=False),
    ]
)

LOCAL = "LOCAL"
"""Transport of a copy within the rank's own device (HCCL's ``ON_CHIP`` link), as Ascend's matrix
names it."""


def peer_links(comm: pa.Table, tasks: pa.Table | None = None) -> pa.Table:
    """Bytes and transit time of every op of ``comm`` from its rank to each peer, by transport: the
    rows of Ascend's ``communication_matrix.json``, from tasks that name their destination rank.

    The packets are :func:`link_bandwidth`'s (SDMA copies and reductions over HCCS / PCIE / SIO,
    RDMA transfers) plus the copies within the device (``ON_CHIP``: ``LOCAL``, to the rank
    itself when no destination is recorded).  ``comm_row`` indexes ``comm`` as given (pass
    ``Trace.comm`` and ``Trace.comm_tasks``).  A trace whose tasks name no peer (Kineto, a level0
    export) gives no rows: its links are the cluster analysis' logical estimate.
    """
    t = hccl_tasks.OpTasks(comm, tasks)
    if t.n == 0 or not (t.dst >= 0).any():
        return PEER_SCHEMA.empty_table()
    rows = np.arange(t.n)
    f, last = t.rdma_transfers(rows, _p2p(comm))
    in_rdma = hccl_tasks.in_ranges(t.n, f, last)
    moving = (
        columns.numpy(pc.equal(t.transport, "SDMA"), null=False)
        & hccl_tasks.is_one_of(t.type, hccl_tasks.SDMA_TRANSIT_TASKS)
        & ~in_rdma
    )
    names = np.array([*LINK_TYPES, LOCAL], dtype=object)
    code = np.full(t.n, -1, np.int64)
    for link in SDMA_LINKS:
        code[moving & columns.numpy(pc.equal(t.link, link), null=False)] = LINK_TYPES.index(link)
    code[moving & columns.numpy(pc.equal(t.link, "ON_CHIP"), null=False)] = len(LINK_TYPES)
    sdma = np.flatnonzero(code >= 0)
    ranks = columns.int64(comm.column("rank"))
    op = np.concatenate([t.op[sdma], t.op[f]])
    link = np.concatenate([code[sdma], np.full(f.size, LINK_TYPES.index("RDMA"), np.int64)])
    dst = np.concatenate([t.dst[sdma], t.dst[f]])
    size = np.concatenate([t.bytes[sdma], t.bytes[f]])
    dur = np.concatenate([t.dur[sdma], t.start[last] + t.dur[last] - t.start[f] if f.size else f])
    dst = np.where((dst < 0) & (link == len(LINK_TYPES)), ranks[op], dst)  # a local copy: to itself
    keep = dst >= 0
    keys = np.stack([op[keep], dst[keep], link[keep]], axis=1)
    if not keys.size:
        return PEER_SCHEMA.empty_table()
    unique, inverse = np.unique(keys, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    steps = columns.int64(comm.column("step"), NO_ID)
    return pa.Table.from_arrays(
        [
            pa.array(ranks[unique[:, 0]].astype(np.int32), pa.int32()),
            pa.array(unique[:, 0], pa.int64()),
            pa.array(steps[unique[:, 0]].astype(np.int32), pa.int32()),
            pa.array(ranks[unique[:, 0]], pa.int64()),
            pa.array(unique[:, 1], pa.int64()),
            pa.array(names[unique[:, 2]].astype(str), pa.string()),
            pa.array(_sum_by(inverse, size[keep], len(unique)), pa.int64()),
            pa.array(_sum_by(inverse, dur[keep], len(unique)), pa.int64()),
        ],
        schema=PEER_SCHEMA,
    )


def size_distribution(comm: pa.Table, tasks: pa.Table | None = None) -> pa.Table:
    """Packets of every op grouped by link and exact size: count and total transit time.

    Arguments as in :func:`op_times`; returns :data:`SIZE_SCHEMA` rows ordered by op, link, size.
    """
    if comm.num_rows == 0:
        return SIZE_SCHEMA.empty_table()
    op, code, size, dur = _packets(comm, tasks)
    if op.size == 0:
        return SIZE_SCHEMA.empty_table()
    keys = np.stack([op, code, size], axis=1)
    unique, inverse = np.unique(keys, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    count = np.bincount(inverse, minlength=len(unique)).astype(np.int64)
    ns = _sum_by(inverse, dur, len(unique))
    ranks = columns.int64(comm.column("rank"))
    steps = columns.int64(comm.column("step"), NO_ID)
    return pa.Table.from_arrays(
        [
            pa.array(ranks[unique[:, 0]].astype(np.int32), pa.int32()),
            pa.array(unique[:, 0], pa.int64()),
            pa.array(steps[unique[:, 0]].astype(np.int32), pa.int32()),
            pa.array(_p2p(comm)[unique[:, 0]], pa.bool_()),
            pa.array(np.array(LINK_TYPES, dtype=object)[unique[:, 1]].astype(str), pa.string()),
            pa.array(unique[:, 2], pa.int64()),
            pa.array(count, pa.int64()),
            pa.array(ns, pa.int64()),
        ],
        schema=SIZE_SCHEMA,
    )


def step_times(times: pa.Table) -> pa.Table:
    """Sum of :func:`op_times` per rank, step and kind (``is_p2p``), ratios recomputed from the
    sums: the time part of Ascend's "Total Op Info", which sums a step's collectives and its
    point-to-point ops apart.  Rows ordered by rank, step, collectives before p2p."""
    if times.num_rows == 0:
        return STEP_TIME_SCHEMA.empty_table()
    keys = ["rank", "step", "is_p2p"]
    sums = ["elapse_ns", "transit_ns", "wait_ns", "synchronization_ns", "idle_ns"]
    grouped = grouping.aggregate(times, keys, [(c, "sum") for c in sums])
    grouped = grouped.sort_by([(k, "ascending") for k in keys])
    total = {c: columns.int64(grouped.column(f"{c}_sum")) for c in sums}
    return pa.Table.from_arrays(
        [
            grouped.column("rank").cast(pa.int32()),
            grouped.column("step").cast(pa.int32()),
            grouped.column("is_p2p").cast(pa.bool_()),
            *[pa.array(total[c], pa.int64()) for c in sums],
            pa.array(_ratio(total["wait_ns"], total["transit_ns"]), pa.float64()),
            pa.array(_ratio(total["synchronization_ns"], total["transit_ns"]), pa.float64()),
        ],
        schema=STEP_TIME_SCHEMA,
    )


def _step_total_keys(grouped: pa.Table) -> list[pa.Array]:
    """The key columns of a per-step total (rank, op = ``NO_ID``, step, is_p2p, link), typed as
    :data:`LINK_SCHEMA` and :data:`SIZE_SCHEMA` begin."""
    return [
        grouped.column("rank").cast(pa.int32()),
        pa.array(np.full(grouped.num_rows, NO_ID), pa.int64()),
        grouped.column("step").cast(pa.int32()),
        grouped.column("is_p2p").cast(pa.bool_()),
        grouped.column("link").cast(pa.string()),
    ]


def step_links(links: pa.Table) -> pa.Table:
    """Sum of :func:`link_bandwidth` per rank, step, kind (``is_p2p``) and link; bandwidth and
    ratio from the sums (the link part of "Total Op Info").

    ``op`` is ``NO_ID`` in the result; rows ordered by rank, step, collectives before p2p, then
    links in the order of ``links``.  SDMA sums HCCS + PCIE + SIO, as for one op.
    """
    if links.num_rows == 0:
        return LINK_SCHEMA.empty_table()
    keys = ["rank", "step", "is_p2p", "link"]
    sums = ["bytes", "transit_ns", "packets", "large_packets"]
    grouped = grouping.aggregate(links, keys, [(c, "sum") for c in sums])
    grouped = grouped.sort_by([("rank", "ascending"), ("step", "ascending"), ("is_p2p", "ascending")])
    nbytes, ns, packets, large = (columns.int64(grouped.column(f"{c}_sum")) for c in sums)
    is_sdma = columns.numpy(pc.equal(grouped.column("link"), "SDMA"), null=False)
    bandwidth, ratio = _link_rates(nbytes, ns, packets, large, is_sdma)
    return pa.Table.from_arrays(
        [
            *_step_total_keys(grouped),
            pa.array(nbytes, pa.int64()),
            pa.array(ns, pa.int64()),
            pa.array(packets, pa.int64()),
            pa.array(large, pa.int64()),
            pa.array(bandwidth, pa.float64()),
            pa.array(ratio, pa.float64()),
        ],
        schema=LINK_SCHEMA,
    )


def primary_rows(comm: pa.Table) -> NDArray[np.int64]:
    """Row indices of the ``comm`` rows that stand for the rank's op instances (see
    :func:`primary_ops`), ascending."""
    if comm.num_rows == 0:
        return np.zeros(0, np.int64)
    device = columns.numpy(comm.column("is_device"), null=False)
    return np.flatnonzero(device) if device.any() else np.arange(comm.num_rows, dtype=np.int64)


def primary_ops(comm: pa.Table, tasks: pa.Table | None = None) -> tuple[pa.Table, pa.Table | None]:
    """The rows of ``comm`` that stand for the rank's op instances, with ``tasks`` re-indexed to them.

    A Kineto rank records each collective twice (host call and NCCL kernel): the device rows are
    the op instances when there are any, else the host rows.  Ascend's HCCL ops are device rows.
    Pass the result to :func:`op_times`, :func:`link_bandwidth` and :func:`size_distribution`.
    """
    if comm.num_rows == 0:
        return comm, tasks
    keep = primary_rows(comm)
    if keep.size == comm.num_rows:
        return comm, tasks
    new_index = np.full(comm.num_rows, NO_ID, dtype=np.int64)
    new_index[keep] = np.arange(keep.size)
    if tasks is not None and tasks.num_rows:
        op = columns.int64(tasks.column("op"), NO_ID)
        mapped = np.where((op >= 0) & (op < comm.num_rows), new_index[np.clip(op, 0, None)], NO_ID)
        tasks = tasks.set_column(tasks.schema.get_field_index("op"), "op", pa.array(mapped, pa.int64()))
    return comm.take(pa.array(keep, pa.int64())), tasks


def step_sizes(sizes: pa.Table) -> pa.Table:
    """Packets of :func:`size_distribution` summed per rank, step, kind (``is_p2p``), link and
    exact size: the "Size Distribution" of "Total Op Info".

    ``op`` is ``NO_ID``.  Rows ordered by rank, step, collectives before p2p, link (in
    :data:`LINK_TYPES` order), then by where the size first appears in ``sizes`` (op by op, each
    op's sizes ascending) -- the order Ascend lists them in.
    """
    if sizes.num_rows == 0:
        return SIZE_SCHEMA.empty_table()
    keys = ["rank", "step", "is_p2p", "link", "packet_bytes"]
    grouped = grouping.aggregate(sizes, keys, [("count", "sum"), ("transit_ns", "sum")])
    link = columns.int64(pc.index_in(grouped.column("link"), pa.array(LINK_TYPES)), len(LINK_TYPES))
    order = np.lexsort(
        (
            np.arange(grouped.num_rows),  # first appearance: aggregate keeps it
            link,
            columns.numpy(grouped.column("is_p2p"), null=False),
            columns.int64(grouped.column("step")),
            columns.int64(grouped.column("rank")),
        )
    )
    grouped = grouped.take(pa.array(order, pa.int64()))
    return pa.Table.from_arrays(
        [
            *_step_total_keys(grouped),
            grouped.column("packet_bytes").cast(pa.int64()),
            grouped.column("count_sum").cast(pa.int64()),
            grouped.column("transit_ns_sum").cast(pa.int64()),
        ],
        schema=SIZE_SCHEMA,
    )


# ---------------------------------------------------------------------------------------------
# the rank's tables (registered in perfsight.pipeline.ANALYSES, cached, returned by perfsight.load)


def communication_ops(trace: Trace) -> pa.Table:
    """:func:`op_times` of the rank's op instances (:func:`primary_ops`), one row per op.

    ``comm_row`` is the op's row in ``trace.comm``; ``name`` is the op's recorded name, else its
    slice's name (a Kineto NCCL kernel), null without either.  ``op`` (0, 1, ...) is what
    :func:`communication_links` and :func:`communication_sizes` refer to.
    """
    rows = primary_rows(trace.comm)
    comm, tasks = primary_ops(trace.comm, trace.comm_tasks)
    times = op_times(comm, tasks)
    if times.num_rows == 0:
        return times
    names = times.column("name")
    missing = columns.numpy(pc.equal(pc.fill_null(names, ""), ""), null=True)
    slice_rows = columns.int64(comm.column("slice"), NO_ID)
    usable = missing & (slice_rows >= 0) & (slice_rows < trace.slices.num_rows)
    if usable.any():
        taken = trace.slices.column("name").take(pa.array(np.where(usable, slice_rows, 0), pa.int64()))
        names = pc.if_else(pa.array(usable), columns.combined(taken).cast(pa.string()), names)
    times = times.set_column(times.schema.get_field_index("name"), "name", names)
    row = times.schema.get_field_index("comm_row")
    return times.set_column(row, "comm_row", pa.array(rows, pa.int64()))


def communication_links(trace: Trace) -> pa.Table:
    """:func:`link_bandwidth` of the rank's op instances (``op`` as in :func:`communication_ops`)."""
    return link_bandwidth(*primary_ops(trace.comm, trace.comm_tasks))


def communication_peers(trace: Trace) -> pa.Table:
    """:func:`peer_links` of the rank's ops (``comm_row`` as in :func:`communication_ops`)."""
    return peer_links(trace.comm, trace.comm_tasks)


def communication_sizes(trace: Trace) -> pa.Table:
    """:func:`size_distribution` of the rank's op instances (``op`` as in :func:`communication_ops`)."""
    return size_distribution(*primary_ops(trace.comm, trace.comm_tasks))

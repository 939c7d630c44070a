"""Which clock a rank is judged on, what counts as its work, and where each step lies on it.

Step trace and overlap breakdown must agree on three things, so they are
decided here once:

* **The clock.**  A rank that has device slices (``is_device`` and kind
  kernel/memcpy/memset/communication) is judged on its device clock; a rank
  without any (a CPU-only gloo job) on its host clock.
* **Its work.**  Device clock: *compute* is every device kernel, memcpy and
  memset (``kind`` in :data:`perfsight.model.DEVICE_COMPUTE_KINDS`; communication kernels
  have kind ``communication`` and are not compute); *communication* is every
  device slice of kind ``communication``.  Host clock: *communication* is every
  host slice of kind ``communication`` (``gloo:all_reduce`` on gloo's threads,
  ``c10d::allreduce_`` on the caller's); *compute* is, per host thread, the union
  of its ``cpu_op`` slices minus the time that thread spends inside its own
  communication slices (a thread blocked in a collective is not computing, and a
  pure communication thread contributes nothing), then minus the time inside
  ``data_loading`` slices (collating a batch is data preparation, not training
  compute).  Nesting needs no ``depth`` filter: everything is a union of
  intervals.  *Receive* is the part of communication done by point-to-point
  receive ops (pipeline parallelism): a communication slice whose name, whose
  ``comm`` row's ``collective``, or whose host op (same ``external_id``, directly
  or through the runtime call that launched it) says ``recv``/``irecv``.
* **Step windows.**  Host clock: the host step marker ``[start_ns, end_ns)``.
  Device clock: a step's device work runs after the host issued it, so the
  window of step *i* is ``[max(host_start_i, end_(i-1)), max(host_end_i,
  device_end_i, last end of device work launched during host step i, end_(i-1)))``.
  The start of the later step is clipped, never the end of the earlier one:
  all device work a step launched stays in that step, windows never overlap,
  and every nanosecond of the clock belongs to at most one step.  When the
  device runs behind the host (GPU-bound), steps are therefore back to back on
  the device clock.

A chunk of a trace (a few whole steps, issue 21) is judged as part of its whole trace: the
chunked path records in the chunk's ``meta.extra`` the whole trace's clock (:data:`CLOCK_KEY`,
which :func:`choose_clock` follows) and where the earlier chunks' windows end
(:data:`REACH_KEY`: the chunk's first window starts no earlier, as in the whole trace), and the
earlier chunks' work that runs on past their last window (:data:`CARRIED_KEY`: an asynchronous
all-reduce of one step still running in the next), which counts as the chunk's own.

This module must not compute metrics (that is ``step_trace`` and ``overlap``)
and must not loop over events in Python; loops are over tracks at most.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from perfsight import columns
from perfsight import intervals as iv
from perfsight.analysis.hierarchy import launcher
from perfsight.analysis.index import dictionary_mask, index_of
from perfsight.model import DEVICE_ACTIVITY_KINDS, DEVICE_COMPUTE_KINDS, NO_ID, SliceKind, Trace

Clock = Literal["device", "host"]

COMMUNICATION = SliceKind.COMMUNICATION.value

RECEIVE_PATTERN = r"(?i)(^|[^a-z_])i?recv([^a-z]|$)"
"""A point-to-point receive by name or collective: ``nccl:recv``, ``c10d::irecv_``, ``recv``
(not ``SendRecv`` nor ``send_recv``, which also send)."""

WINDOW_SCHEMA = pa.schema(
    [
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("step", pa.int32(), nullable=False),
        pa.field("start_ns", pa.int64(), nullable=False),  # window on the chosen clock
        pa.field("end_ns", pa.int64(), nullable=False),
        pa.field("host_start_ns", pa.int64(), nullable=False),  # the host step marker
        pa.field("host_end_ns", pa.int64(), nullable=False),
    ]
)
"""One row per step, sorted by host start: the window used by step trace and overlap."""


# ---------------------------------------------------------------------------------------------
# Column helpers


def names_of(table: pa.Table, rows: NDArray[np.int64]) -> list[str]:
    """The ``name`` of each row (``""`` for ``-1``); for a handful of rows (one per step)."""
    valid = rows >= 0
    out = [""] * rows.size
    if valid.any():
        taken = table.column("name").take(pa.array(rows[valid])).cast(pa.string()).to_pylist()
        for i, name in zip(np.flatnonzero(valid), taken, strict=True):
            out[i] = name or ""
    return out


def _matches(pattern: str) -> Callable[[pa.Array], pa.Array]:
    return lambda values: pc.match_substring_regex(values, pattern)


# ---------------------------------------------------------------------------------------------
# The clock and its work


@dataclasses.dataclass(frozen=True)
class Activity:
    """Merged interval sets of one rank's work on its chosen clock."""

    clock: Clock
    compute: iv.Intervals
    communication: iv.Intervals
    receive: iv.Intervals  # a subset of communication


def device_activity_mask(trace: Trace) -> NDArray[np.bool_]:
    """Rows that occupy the device clock."""
    return index_of(trace).kind_mask(DEVICE_ACTIVITY_KINDS, is_device=True)


CLOCK_KEY = "clock"
"""``meta.extra`` key: the clock of the whole trace a chunk belongs to (see the module docstring)."""

REACH_KEY = "window_reach_ns"
"""``meta.extra`` key: the end of the windows of the steps before a chunk (see the module docstring)."""

CARRIED_KEY = "carried_activity"
"""``meta.extra`` key: the earlier chunks' :class:`Activity` after their last window (see the module
docstring); :func:`activity` adds it to the chunk's own."""


def choose_clock(trace: Trace) -> Clock:
    """``"device"`` when the rank has any device work, else ``"host"`` (a chunk: its whole trace's)."""
    chosen = trace.meta.extra.get(CLOCK_KEY)
    if chosen in ("device", "host"):
        return chosen
    return "device" if bool(device_activity_mask(trace).any()) else "host"


def _receive_mask(trace: Trace, comm_rows: NDArray[np.int64]) -> NDArray[np.bool_]:
    """Which of ``comm_rows`` are point-to-point receives (see the module docstring)."""
    ix = index_of(trace)
    if comm_rows.size == 0:
        return np.zeros(0, dtype=bool)
    recv_row = ix.name_mask(_matches(RECEIVE_PATTERN), "receive").copy()
    comm = trace.comm
    if comm.num_rows:
        recv_coll = dictionary_mask(comm.column("collective"), _matches(RECEIVE_PATTERN))
        rows = columns.int64(comm.column("slice"), NO_ID)[recv_coll]
        recv_row[rows[(rows >= 0) & (rows < ix.n)]] = True
    launched_by = launcher(ix)
    ext = ix.external_id
    recv_ext = np.unique(ext[recv_row & ~ix.is_device & (ext != NO_ID)])
    own = ext[comm_rows]
    via_launch = np.where(launched_by[comm_rows] >= 0, ext[np.maximum(launched_by[comm_rows], 0)], NO_ID)
    linked = (np.isin(own, recv_ext) & (own != NO_ID)) | (
        np.isin(via_launch, recv_ext) & (via_launch != NO_ID)
    )
    return recv_row[comm_rows] | linked


def _host_compute(trace: Trace, comm_rows: NDArray[np.int64]) -> iv.Intervals:
    """Host compute: per thread, ``cpu_op`` time not spent inside that thread's communication
    slices; then, across threads, minus data loading.  Loops over threads only."""
    ix = index_of(trace)
    start, end, track = ix.start, ix.end, ix.track
    op = np.flatnonzero(ix.kind_mask([SliceKind.CPU_OP.value], is_device=False))
    comm_track = track[comm_rows]
    parts_s: list[NDArray[np.int64]] = []
    parts_e: list[NDArray[np.int64]] = []
    for t in np.unique(track[op]):
        on_t = op[track[op] == t]
        blocked = comm_rows[comm_track == t]
        s_t, e_t = iv.subtract((start[on_t], end[on_t]), (start[blocked], end[blocked]))
        parts_s.append(s_t)
        parts_e.append(e_t)
    if not parts_s:
        return iv.empty()
    loading = ix.kind_mask([SliceKind.DATA_LOADING.value], is_device=False)
    return iv.subtract((np.concatenate(parts_s), np.concatenate(parts_e)), (start[loading], end[loading]))


def activity(trace: Trace, clock: Clock | None = None) -> Activity:
    """Compute, communication and receive intervals of ``trace`` on its clock."""
    clock = clock or choose_clock(trace)
    return index_of(trace).derived(("activity", clock), lambda: _activity(trace, clock))


def _activity(trace: Trace, clock: Clock) -> Activity:
    own = _own_activity(trace, clock)
    carried = trace.meta.extra.get(CARRIED_KEY)
    if not isinstance(carried, Activity) or carried.clock != clock:
        return own
    return Activity(
        clock,
        *(
            iv.union(np.concatenate((a[0], b[0])), np.concatenate((a[1], b[1])))
            for a, b in (
                (own.compute, carried.compute),
                (own.communication, carried.communication),
                (own.receive, carried.receive),
            )
        ),
    )


def after(work: Activity, at_ns: int) -> Activity:
    """The part of ``work`` from ``at_ns`` on (what a chunk carries to the next: :data:`CARRIED_KEY`)."""

    def cut(merged: iv.Intervals) -> iv.Intervals:
        s, e = merged
        keep = e > at_ns
        return np.maximum(s[keep], at_ns), e[keep]

    return Activity(work.clock, cut(work.compute), cut(work.communication), cut(work.receive))


def _own_activity(trace: Trace, clock: Clock) -> Activity:
    ix = index_of(trace)
    if ix.n == 0:
        return Activity(clock, iv.empty(), iv.empty(), iv.empty())
    start, end = ix.start, ix.end
    on_device = clock == "device"
    comm_rows = np.flatnonzero(ix.kind_mask([COMMUNICATION], is_device=on_device))
    if on_device:
        compute_rows = ix.kind_mask(DEVICE_COMPUTE_KINDS, is_device=True)
        compute = iv.union(start[compute_rows], end[compute_rows])
    else:
        compute = _host_compute(trace, comm_rows)
    recv = _receive_mask(trace, comm_rows)
    return Activity(
        clock=clock,
        compute=compute,
        communication=iv.union(start[comm_rows], end[comm_rows]),
        receive=iv.union(start[comm_rows[recv]], end[comm_rows[recv]]),
    )


# ---------------------------------------------------------------------------------------------
# Step windows


def _last_launched_end(trace: Trace, lo: NDArray[np.int64], hi: NDArray[np.int64]) -> NDArray[np.int64]:
    """Per host window ``[lo, hi)``, the last end of device work whose launch call started in it (else lo)."""
    ix = index_of(trace)
    out = lo.copy()
    dev = np.flatnonzero(device_activity_mask(trace))
    call = launcher(ix)[dev]
    linked = call >= 0
    if not linked.any():
        return out
    dev_end = ix.end[dev][linked]
    launch_ns = ix.start[call[linked]]
    order = np.argsort(launch_ns, kind="stable")
    launch_ns, dev_end = launch_ns[order], dev_end[order]
    a = np.searchsorted(launch_ns, lo, side="left")
    b = np.searchsorted(launch_ns, hi, side="left")
    for i in np.flatnonzero(b > a):  # a loop over steps
        out[i] = max(int(out[i]), int(dev_end[a[i] : b[i]].max()))
    return out


def step_windows(trace: Trace, clock: Clock | None = None) -> pa.Table:
    """The window of every step of ``trace`` on ``clock`` (see the module docstring)."""
    if trace.steps.num_rows == 0:
        return WINDOW_SCHEMA.empty_table()
    clock = clock or choose_clock(trace)
    return index_of(trace).derived(("step_windows", clock), lambda: _step_windows(trace, clock))


def _step_windows(trace: Trace, clock: Clock) -> pa.Table:
    steps = trace.steps
    order = np.lexsort((columns.int64(steps.column("step")), columns.int64(steps.column("start_ns"))))
    steps = steps.take(pa.array(order))
    host_start = columns.int64(steps.column("start_ns"))
    host_end = np.maximum(columns.int64(steps.column("end_ns")), host_start)
    raw_end = host_end.copy()
    if clock == "device":
        dev_end = columns.int64(steps.column("device_end_ns"), NO_ID)
        raw_end = np.maximum(raw_end, np.where(dev_end == NO_ID, raw_end, dev_end))
        raw_end = np.maximum(raw_end, _last_launched_end(trace, host_start, host_end))
    reach = np.maximum.accumulate(raw_end)  # the end of every earlier window
    start = host_start.copy()
    before = trace.meta.extra.get(REACH_KEY)
    if before is not None:  # a chunk: the earlier chunks' windows end here
        reach = np.maximum(reach, int(before))
        start[0] = max(int(start[0]), int(before))
    start[1:] = np.maximum(host_start[1:], reach[:-1])
    end = np.maximum(reach, start)
    return pa.Table.from_arrays(
        [
            steps.column("rank").cast(pa.int32()),
            steps.column("step").cast(pa.int32()),
            pa.array(start, pa.int64()),
            pa.array(end, pa.int64()),
            pa.array(host_start, pa.int64()),
            pa.array(host_end, pa.int64()),
        ],
        schema=WINDOW_SCHEMA,
    )

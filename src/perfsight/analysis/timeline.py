"""Which timeline a rank is judged on, what counts as its work, and where each step lies on it.

Step trace and overlap breakdown must agree on three things, so they are
decided here once:

* **The timeline.**  A rank that has device slices (``is_device`` and kind
  kernel/memcpy/memset/communication) is judged on its device timeline; a rank
  without any (a CPU-only gloo job) on its host timeline.
* **Its work.**  Device timeline: *compute* is every device kernel, memcpy and
  memset (``kind`` in :data:`perfsight.model.DEVICE_KINDS`; communication kernels
  have kind ``communication`` and are not compute); *communication* is every
  device slice of kind ``communication``.  Host timeline: *communication* is every
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
* **Step windows.**  Host timeline: the host step marker ``[start_ns, end_ns)``.
  Device timeline: a step's device work runs after the host issued it, so the
  window of step *i* is ``[max(host_start_i, end_(i-1)), max(host_end_i,
  device_end_i, last end of device work launched during host step i, end_(i-1)))``.
  The start of the later step is clipped, never the end of the earlier one:
  all device work a step launched stays in that step, windows never overlap,
  and every nanosecond of the timeline belongs to at most one step.  When the
  device runs behind the host (GPU-bound), steps are therefore back to back on
  the device clock.

This module must not compute metrics (that is ``step_trace`` and ``overlap``)
and must not loop over events in Python; loops are over tracks at most.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from perfsight.analysis import intervals as iv
from perfsight.analysis.hierarchy import launch_pairs
from perfsight.model import DEVICE_KINDS, NO_ID, SliceKind, Trace

Timeline = Literal["device", "host"]

COMMUNICATION = SliceKind.COMMUNICATION.value
DEVICE_ACTIVITY_KINDS: tuple[str, ...] = (*DEVICE_KINDS, COMMUNICATION)
"""Kinds of device slices that occupy the device timeline."""

RECEIVE_PATTERN = r"(?i)(^|[^a-z_])i?recv([^a-z]|$)"
"""A point-to-point receive by name or collective: ``nccl:recv``, ``c10d::irecv_``, ``recv``
(not ``SendRecv`` nor ``send_recv``, which also send)."""

WINDOW_SCHEMA = pa.schema(
    [
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("step", pa.int32(), nullable=False),
        pa.field("start_ns", pa.int64(), nullable=False),  # window on the chosen timeline
        pa.field("end_ns", pa.int64(), nullable=False),
        pa.field("host_start_ns", pa.int64(), nullable=False),  # the host step marker
        pa.field("host_end_ns", pa.int64(), nullable=False),
    ]
)
"""One row per step, sorted by host start: the window used by step trace and overlap."""


# ---------------------------------------------------------------------------------------------
# Column helpers (vectorised over dictionary columns: the predicate runs once per distinct value)


def string_mask(column: pa.ChunkedArray, predicate: Callable[[pa.Array], pa.Array]) -> NDArray[np.bool_]:
    """``predicate`` (an Arrow string array -> boolean array) applied to every row of ``column``."""
    parts: list[NDArray[np.bool_]] = []
    for chunk in column.chunks:
        if pa.types.is_dictionary(chunk.type):
            values = chunk.dictionary
            per_value = np.asarray(predicate(values).fill_null(False).to_numpy(zero_copy_only=False), bool)
            if per_value.size == 0:
                parts.append(np.zeros(len(chunk), dtype=bool))
                continue
            idx = chunk.indices.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
            valid = chunk.is_valid().to_numpy(zero_copy_only=False)
            parts.append(per_value[idx] & valid)
        else:
            parts.append(np.asarray(predicate(chunk).fill_null(False).to_numpy(zero_copy_only=False), bool))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=bool)


def is_in(column: pa.ChunkedArray, values: Sequence[str]) -> NDArray[np.bool_]:
    """Rows whose value is one of ``values``."""
    value_set = pa.array(list(values), pa.string())
    return string_mask(column, lambda arr: pc.is_in(arr.cast(pa.string()), value_set=value_set))


def int_column(table: pa.Table, name: str) -> NDArray[np.int64]:
    """An integer column as int64 NumPy (nulls become ``NO_ID``)."""
    return table.column(name).fill_null(NO_ID).to_numpy().astype(np.int64, copy=False)


def bool_column(table: pa.Table, name: str) -> NDArray[np.bool_]:
    return np.asarray(table.column(name).fill_null(False).to_numpy(), dtype=bool)


def names_of(table: pa.Table, rows: NDArray[np.int64]) -> list[str]:
    """The ``name`` of each row (``""`` for ``-1``)."""
    valid = rows >= 0
    out = [""] * rows.size
    if valid.any():
        taken = table.column("name").take(pa.array(rows[valid])).cast(pa.string()).to_pylist()
        for i, name in zip(np.flatnonzero(valid), taken, strict=True):
            out[i] = name or ""
    return out


# ---------------------------------------------------------------------------------------------
# Links between host and device


def launcher_rows(trace: Trace) -> NDArray[np.int64]:
    """For every slice row, the row of the runtime call that launched it, or ``-1``.

    The links are :func:`perfsight.analysis.hierarchy.launch_pairs`' (``launch``
    flows, then equal ``correlation``); this only spreads them over all rows.
    """
    out = np.full(trace.slices.num_rows, -1, dtype=np.int64)
    if trace.slices.num_rows:
        src, dst = launch_pairs(trace.slices, trace.flows)
        out[dst] = src
    return out


# ---------------------------------------------------------------------------------------------
# The timeline and its work


@dataclasses.dataclass(frozen=True)
class Activity:
    """Merged interval sets of one rank's work on its chosen timeline."""

    timeline: Timeline
    compute: iv.Intervals
    communication: iv.Intervals
    receive: iv.Intervals  # a subset of communication


def device_activity_mask(trace: Trace) -> NDArray[np.bool_]:
    """Rows that occupy the device timeline."""
    sl = trace.slices
    return bool_column(sl, "is_device") & is_in(sl.column("kind"), DEVICE_ACTIVITY_KINDS)


def choose_timeline(trace: Trace) -> Timeline:
    """``"device"`` when the rank has any device work, else ``"host"``."""
    return "device" if bool(device_activity_mask(trace).any()) else "host"


def _receive_mask(trace: Trace, comm_rows: NDArray[np.int64]) -> NDArray[np.bool_]:
    """Which of ``comm_rows`` are point-to-point receives (see the module docstring)."""
    sl = trace.slices
    if comm_rows.size == 0:
        return np.zeros(0, dtype=bool)
    by_name = string_mask(
        sl.column("name"), lambda a: pc.match_substring_regex(a.cast(pa.string()), RECEIVE_PATTERN)
    )
    recv_row = by_name.copy()
    comm = trace.comm
    if comm.num_rows:
        recv_coll = string_mask(
            comm.column("collective"),
            lambda a: pc.match_substring_regex(a.cast(pa.string()), RECEIVE_PATTERN),
        )
        rows = int_column(comm, "slice")[recv_coll]
        recv_row[rows[(rows >= 0) & (rows < sl.num_rows)]] = True
    launcher = launcher_rows(trace)
    ext = int_column(sl, "external_id")
    recv_ext = np.unique(ext[recv_row & ~bool_column(sl, "is_device") & (ext != NO_ID)])
    own = ext[comm_rows]
    via_launch = np.where(launcher[comm_rows] >= 0, ext[np.maximum(launcher[comm_rows], 0)], NO_ID)
    linked = (np.isin(own, recv_ext) & (own != NO_ID)) | (
        np.isin(via_launch, recv_ext) & (via_launch != NO_ID)
    )
    return recv_row[comm_rows] | linked


def _host_compute(
    trace: Trace, start: NDArray[np.int64], end: NDArray[np.int64], comm_rows: NDArray[np.int64]
) -> iv.Intervals:
    """Host compute: per thread, ``cpu_op`` time not spent inside that thread's communication
    slices; then, across threads, minus data loading.  Loops over threads only."""
    sl = trace.slices
    host = ~bool_column(sl, "is_device")
    track = int_column(sl, "track")
    op = np.flatnonzero(host & is_in(sl.column("kind"), [SliceKind.CPU_OP.value]))
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
    loading = host & is_in(sl.column("kind"), [SliceKind.DATA_LOADING.value])
    return iv.subtract((np.concatenate(parts_s), np.concatenate(parts_e)), (start[loading], end[loading]))


def activity(trace: Trace, timeline: Timeline | None = None) -> Activity:
    """Compute, communication and receive intervals of ``trace`` on its timeline."""
    sl = trace.slices
    timeline = timeline or choose_timeline(trace)
    if sl.num_rows == 0:
        return Activity(timeline, iv.empty(), iv.empty(), iv.empty())
    start = int_column(sl, "start_ns")
    end = start + np.maximum(int_column(sl, "dur_ns"), 0)
    is_device = bool_column(sl, "is_device")
    kind = sl.column("kind")
    is_comm = is_in(kind, [COMMUNICATION])
    if timeline == "device":
        comm_rows = np.flatnonzero(is_device & is_comm)
        compute = iv.union(
            start[is_device & is_in(kind, DEVICE_KINDS)], end[is_device & is_in(kind, DEVICE_KINDS)]
        )
    else:
        comm_rows = np.flatnonzero(~is_device & is_comm)
        compute = _host_compute(trace, start, end, comm_rows)
    recv = _receive_mask(trace, comm_rows)
    return Activity(
        timeline=timeline,
        compute=compute,
        communication=iv.union(start[comm_rows], end[comm_rows]),
        receive=iv.union(start[comm_rows[recv]], end[comm_rows[recv]]),
    )


# ---------------------------------------------------------------------------------------------
# Step windows


def _last_launched_end(trace: Trace, lo: NDArray[np.int64], hi: NDArray[np.int64]) -> NDArray[np.int64]:
    """Per host window ``[lo, hi)``, the last end of device work whose launch call started in it (else lo)."""
    sl = trace.slices
    out = lo.copy()
    dev = np.flatnonzero(device_activity_mask(trace))
    launcher = launcher_rows(trace)[dev]
    linked = launcher >= 0
    if not linked.any():
        return out
    start = int_column(sl, "start_ns")
    dev_end = (start + np.maximum(int_column(sl, "dur_ns"), 0))[dev][linked]
    launch_ns = start[launcher[linked]]
    order = np.argsort(launch_ns, kind="stable")
    launch_ns, dev_end = launch_ns[order], dev_end[order]
    a = np.searchsorted(launch_ns, lo, side="left")
    b = np.searchsorted(launch_ns, hi, side="left")
    for i in np.flatnonzero(b > a):  # a loop over steps
        out[i] = max(int(out[i]), int(dev_end[a[i] : b[i]].max()))
    return out


def step_windows(trace: Trace, timeline: Timeline | None = None) -> pa.Table:
    """The window of every step of ``trace`` on ``timeline`` (see the module docstring)."""
    steps = trace.steps
    if steps.num_rows == 0:
        return WINDOW_SCHEMA.empty_table()
    timeline = timeline or choose_timeline(trace)
    order = np.lexsort((int_column(steps, "step"), int_column(steps, "start_ns")))
    steps = steps.take(pa.array(order))
    host_start = int_column(steps, "start_ns")
    host_end = np.maximum(int_column(steps, "end_ns"), host_start)
    raw_end = host_end.copy()
    if timeline == "device":
        dev_end = steps.column("device_end_ns").fill_null(NO_ID).to_numpy().astype(np.int64)
        raw_end = np.maximum(raw_end, np.where(dev_end == NO_ID, raw_end, dev_end))
        raw_end = np.maximum(raw_end, _last_launched_end(trace, host_start, host_end))
    reach = np.maximum.accumulate(raw_end)  # the end of every earlier window
    start = host_start.copy()
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

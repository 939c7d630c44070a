"""Merge perfsight's own capture tables (the run folder's sidecars) into a Kineto :class:`Trace`.

Why: the comm capture knows what Kineto does not (group, per-group sequence number, peer, bytes,
time blocked in ``wait()``), Kineto knows what the capture does not (the slice on the timeline,
device kernels, the ops DDP issues from C++).  The model has one ``comm`` table, so the two are
joined here, once, and every analysis reads the result.  The data-loader capture becomes the
model's ``dataloader`` table.

Matching (vectorised; loops only over threads and collective names, never over rows):

* a capture row issued from Python is the trace's host comm row on the **same OS thread** whose
  start lies inside the capture's call (``c10d::allreduce_`` for gloo, ``record_param_comms``
  for NCCL run inside the Python call that issued them);
* a flight-recorder row (an op DDP issued from C++) is the trace's host comm row of the **same
  collective** whose interval contains the entry's creation time;
* the trace's values win where it has them (NCCL's ``record_param_comms`` metadata); the
  capture fills what is null;
* a point-to-point op (``perfsight.model.is_p2p``) lasts until the transfer was seen to end
  (:func:`p2p_end_ns`): gloo's ``c10d::send``/``c10d::recv_`` slices only enqueue the transfer and
  last microseconds, so without the capture's ``wait()`` a rate-limited link looks as fast as any.

Capture rows without a trace row are appended (``slice = -1``, ``source = "capture"`` /
``"flight_recorder"``); trace rows nobody matched keep ``source = "trace"``.

Clock: capture times are Unix nanoseconds; the trace's are Unix minus ``meta.base_time_ns``
(torch 2.13 Kineto), so the merge needs ``base_time_ns`` and says so when a trace lacks it.

Entry point for ``perfsight.ingest.run_folder``: :func:`merge_sidecars`.  This module must not
import torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from perfsight import columns
from perfsight.ingest.assemble import step_of
from perfsight.ingest.kineto import _canonical_collective
from perfsight.model import COMM_SCHEMA, DATALOADER_SCHEMA, NO_ID, Trace, conform, is_p2p

COMM_SIDECAR = "comm"
DATALOADER_SIDECAR = "dataloader"
_FILLED = ("in_bytes", "out_bytes", "dtype", "group", "group_ranks", "seq", "peer")


def merge_sidecars(trace: Trace, files: Mapping[str, str | Path]) -> Trace:
    """``trace`` with the capture tables in ``files`` merged in.

    ``files`` maps a capture name to its Parquet file, as the run folder lists them:
    ``{"comm": .../perfsight_comm_0.parquet, "dataloader": .../perfsight_dataloader_0.parquet}``.
    Unknown names are ignored; an unreadable file or a trace without ``base_time_ns`` leaves the
    trace's own tables as they are and adds a warning naming the file to ``trace.meta.warnings``.
    """
    tables: dict[str, pa.Table] = {}
    for name, path in files.items():
        if name not in (COMM_SIDECAR, DATALOADER_SIDECAR):
            continue
        try:
            tables[name] = pq.read_table(path)
        except (OSError, pa.ArrowException) as exc:
            trace.meta.warnings.append(f"{path}: unreadable {name} capture ({exc}); not merged")
    if not tables:
        return trace
    base = trace.meta.base_time_ns
    if base is None:
        names = ", ".join(str(files[n]) for n in tables)
        trace.meta.warnings.append(
            f"{names}: the trace records no baseTimeNanoseconds, so perfsight's capture times "
            "cannot be placed on its clock; not merged"
        )
        return trace
    changes: dict[str, pa.Table] = {}
    try:
        if COMM_SIDECAR in tables:
            changes["comm"] = merge_comm(trace, tables[COMM_SIDECAR], base)
        if DATALOADER_SIDECAR in tables:
            changes["dataloader"] = dataloader_table(trace, tables[DATALOADER_SIDECAR], base)
    except (KeyError, pa.ArrowException, ValueError) as exc:
        trace.meta.warnings.append(f"{trace.meta.sources or files}: capture tables not merged ({exc})")
        return trace
    return dataclasses.replace(trace, **changes)


def merge_comm(trace: Trace, capture: pa.Table, base_time_ns: int) -> pa.Table:
    """The trace's ``comm`` rows joined with the comm capture's rows (see the module docstring)."""
    comm = trace.comm
    n = comm.num_rows
    is_python = columns.numpy(pc.equal(capture.column("source"), "python"), False).astype(bool)
    start = columns.int64(capture.column("start_ns"), 0) - base_time_ns
    issue_end = columns.int64(capture.column("issue_end_ns"), -1)
    issue_end = np.where(issue_end >= 0, issue_end - base_time_ns, start)
    end = columns.int64(capture.column("end_ns"), 0) - base_time_ns
    wait_start = columns.int64(capture.column("wait_start_ns"), -1)
    wait_end = columns.int64(capture.column("wait_end_ns"), -1)
    wait_ns = np.where((wait_start >= 0) & (wait_end >= wait_start), wait_end - wait_start, -1)
    collective = (
        _canonical_collective(capture.column("collective")) if capture.num_rows else pa.array([], pa.string())
    )
    transfer_end = p2p_end_ns(
        collective, issue_end, wait_start - base_time_ns, wait_end - base_time_ns, wait_ns
    )

    host = ~columns.numpy(comm.column("is_device"), False).astype(bool)
    k_start = columns.int64(comm.column("start_ns"), 0)
    k_end = k_start + columns.int64(comm.column("dur_ns"), 0)
    slice_rows = columns.int64(comm.column("slice"), NO_ID)
    k_tid = (
        columns.int64(pc.take(trace.slices.column("tid"), pa.array(np.maximum(slice_rows, 0))))
        if n
        else slice_rows
    )
    taken = np.zeros(n, dtype=bool)
    match = np.full(capture.num_rows, -1, dtype=np.int64)

    tid = columns.int64(capture.column("tid"), -1)
    for thread in np.unique(tid[is_python]):
        rows = np.flatnonzero(is_python & (tid == thread))
        candidates = np.flatnonzero(host & (k_tid == thread))
        _claim_first_start_inside(candidates, k_start, start[rows], issue_end[rows], rows, match, taken)

    other = ~is_python
    for name in pc.unique(pc.filter(collective, pa.array(other))).to_pylist() if other.any() else ():
        rows = np.flatnonzero(other & _equals(collective, name))
        candidates = np.flatnonzero(host & _equals(comm.column("collective"), name) & ~taken)
        _claim_containing(candidates, k_start, k_end, start[rows], rows, match, taken)

    matched = match >= 0
    merged = comm
    k_rows, c_rows = match[matched], np.flatnonzero(matched)
    if len(k_rows):  # a p2p op's slice is its enqueueing; it lasts until its transfer ended
        dur = columns.int64(comm.column("dur_ns"), 0)
        dur[k_rows] = np.maximum(dur[k_rows], transfer_end[c_rows] - k_start[k_rows])
        merged = merged.set_column(
            merged.schema.get_field_index("dur_ns"), "dur_ns", pa.array(dur, pa.int64())
        )
    for field in _FILLED:
        merged = _fill(merged, field, capture.column(field), k_rows, c_rows)
    wait_column = np.full(n, -1, dtype=np.int64)
    wait_column[k_rows] = wait_ns[c_rows]
    merged = merged.set_column(
        merged.schema.get_field_index("host_wait_ns"),
        "host_wait_ns",
        pa.array(wait_column, pa.int64(), mask=wait_column < 0),
    )
    row_source = np.full(n, "trace", dtype=object)
    row_source[k_rows] = np.where(is_python[c_rows], "trace+capture", "trace+flight_recorder")
    merged = merged.set_column(
        merged.schema.get_field_index("source"), "source", pa.array(row_source, pa.string())
    )

    # a Python op whose trace slice the reader did not make a comm row (it nests in another comm
    # range on its thread: gloo's batched recv inside the send's range) gets a row for that slice
    slice_of = np.full(capture.num_rows, NO_ID, dtype=np.int64)
    nested = is_python & ~matched
    if nested.any():
        slices = trace.slices
        s_start = columns.int64(slices.column("start_ns"), 0)
        s_tid = columns.int64(slices.column("tid"), -1)
        spare = _equals(pc.cast(slices.column("kind"), pa.string()), "communication")
        spare &= ~columns.numpy(slices.column("is_device"), False).astype(bool)
        spare[slice_rows[slice_rows >= 0]] = False
        used = np.zeros(slices.num_rows, dtype=bool)
        for thread in np.unique(tid[nested]):
            rows = np.flatnonzero(nested & (tid == thread))
            candidates = np.flatnonzero(spare & (s_tid == thread))
            _claim_first_start_inside(candidates, s_start, start[rows], issue_end[rows], rows, slice_of, used)

    extra = np.flatnonzero(~matched)
    if not len(extra):
        return conform(merged, COMM_SCHEMA)
    take = pa.array(extra)
    on_slice = slice_of[extra] >= 0
    picked = np.maximum(slice_of[extra], 0)
    s_start = (
        columns.int64(trace.slices.column("start_ns"), 0)[picked] if trace.slices.num_rows else start[extra]
    )
    s_dur = columns.int64(trace.slices.column("dur_ns"), 0)[picked] if trace.slices.num_rows else end[extra]
    s_dur = np.maximum(s_dur, transfer_end[extra] - s_start)
    s_step = (
        columns.int64(trace.slices.column("step"), NO_ID)[picked] if trace.slices.num_rows else start[extra]
    )
    appended = pa.table(
        {
            "rank": np.full(len(extra), trace.meta.rank, np.int32),
            "slice": slice_of[extra],
            "is_device": np.zeros(len(extra), dtype=bool),
            "collective": pc.take(collective, take),
            "start_ns": np.where(on_slice, s_start, start[extra]),
            "dur_ns": np.where(on_slice, s_dur, np.maximum(end[extra] - start[extra], 0)),
            "step": np.where(on_slice, s_step, step_of(start[extra], trace.steps)).astype(np.int32),
            **{field: pc.take(capture.column(field), take) for field in _FILLED},
            "name": pc.take(capture.column("api"), take),
            "host_wait_ns": pa.array(wait_ns[extra], pa.int64(), mask=wait_ns[extra] < 0),
            "source": np.where(
                on_slice, "trace+capture", np.where(is_python[extra], "capture", "flight_recorder")
            ).astype(object),
        }
    )
    return pa.concat_tables([conform(merged, COMM_SCHEMA), conform(appended, COMM_SCHEMA)])


def p2p_end_ns(
    collective: pa.Array | pa.ChunkedArray,
    issue_end: np.ndarray,
    wait_start: np.ndarray,
    wait_end: np.ndarray,
    wait_ns: np.ndarray,
) -> np.ndarray:
    """When each captured point-to-point op's transfer was seen to end (``-1`` for other rows).

    The transfer ends by the end of the caller's ``wait()`` on it.  That end is the op's end when
    the caller waited at least as long as it did other work between issuing the op and waiting
    (``dist.send``/``dist.recv`` wait at once; an ``irecv`` waited right after is the same): the
    range [call, wait end] is then mostly this op.  A wait that came after longer other work and
    returned sooner says only that the transfer ended somewhere before: the op keeps the end of its
    call, so compute done meanwhile is never counted as transfer time.
    """
    p2p = columns.numpy(is_p2p(collective), null=False).astype(bool) if len(issue_end) else np.zeros(0, bool)
    gap = wait_start - issue_end
    blocked = p2p & (wait_ns >= 0) & (wait_ns >= gap)
    return np.where(blocked, wait_end, -1)


def _equals(values: pa.Array | pa.ChunkedArray, text: str) -> np.ndarray:
    return columns.numpy(pc.equal(values, text), False).astype(bool)


def _claim_first_start_inside(
    candidates: np.ndarray,
    k_start: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    rows: np.ndarray,
    match: np.ndarray,
    taken: np.ndarray,
) -> None:
    """Match each capture call [lo, hi] to the first trace row of ``candidates`` starting in it."""
    if not len(candidates) or not len(rows):
        return
    order = candidates[np.argsort(k_start[candidates], kind="stable")]
    starts = k_start[order]
    pos = np.searchsorted(starts, lo, side="left")
    ok = pos < len(order)
    ok[ok] = starts[pos[ok]] <= hi[ok]
    _assign(order, pos, ok, rows, match, taken)


def _claim_containing(
    candidates: np.ndarray,
    k_start: np.ndarray,
    k_end: np.ndarray,
    times: np.ndarray,
    rows: np.ndarray,
    match: np.ndarray,
    taken: np.ndarray,
) -> None:
    """Match each time to the last-starting trace row of ``candidates`` whose interval contains it."""
    if not len(candidates) or not len(rows):
        return
    order = candidates[np.argsort(k_start[candidates], kind="stable")]
    pos = np.searchsorted(k_start[order], times, side="right") - 1
    ok = pos >= 0
    ok[ok] = k_end[order[pos[ok]]] >= times[ok]
    _assign(order, pos, ok, rows, match, taken)


def _assign(
    order: np.ndarray, pos: np.ndarray, ok: np.ndarray, rows: np.ndarray, match: np.ndarray, taken: np.ndarray
) -> None:
    """One trace row per capture row: the first capture row to claim it wins."""
    target = order[pos[ok]]
    claimants = rows[ok]
    _, first = np.unique(target, return_index=True)
    target, claimants = target[first], claimants[first]
    free = ~taken[target]
    match[claimants[free]] = target[free]
    taken[target[free]] = True


def _fill(
    table: pa.Table, field: str, values: pa.ChunkedArray, k_rows: np.ndarray, c_rows: np.ndarray
) -> pa.Table:
    """``table[field]`` with nulls at ``k_rows`` filled from ``values[c_rows]``."""
    if not len(k_rows):
        return table
    index = table.schema.get_field_index(field)
    target_type = table.schema.field(index).type
    spread = np.full(table.num_rows, -1, dtype=np.int64)
    spread[k_rows] = c_rows
    has = spread >= 0
    picked = pc.take(pc.cast(values, target_type), pa.array(np.where(has, spread, 0), mask=~has))
    return table.set_column(index, field, pc.coalesce(table.column(field), picked))


def dataloader_table(trace: Trace, capture: pa.Table, base_time_ns: int) -> pa.Table:
    """The data-loader capture as the model's ``dataloader`` table, on the trace's clock."""
    start = columns.int64(capture.column("start_ns"), 0) - base_time_ns
    end = columns.int64(capture.column("end_ns"), 0) - base_time_ns
    table = capture.drop_columns(
        [c for c in ("start_ns", "end_ns", "tid", "rank") if c in capture.column_names]
    )
    table = table.append_column("rank", pa.array(np.full(capture.num_rows, trace.meta.rank, np.int32)))
    table = table.append_column("start_ns", pa.array(start, pa.int64()))
    table = table.append_column("dur_ns", pa.array(np.maximum(end - start, 0), pa.int64()))
    table = table.append_column("step", pa.array(step_of(start, trace.steps), pa.int32()))
    return conform(table, DATALOADER_SCHEMA)

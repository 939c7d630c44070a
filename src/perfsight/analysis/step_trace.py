"""Step trace: split every training step into iteration interval, forward+backward and tail.

This is MindSpore's 迭代轨迹 (iteration trace) for PyTorch traces.  A step is cut
at two points, the start of the forward pass (FP) and the end of the backward
pass (BP)::

    |<- iteration_interval ->|<------- fp_bp ------->|<- tail ->|
    step start              FP start                BP end     step end

* ``iteration_interval_ns`` (迭代间隙) = FP start - step start: waiting for data
  and anything else before the first forward op.
* ``fp_bp_ns`` (前反向) = BP end - FP start.
* ``tail_ns`` (迭代拖尾) = step end - BP end: gradient all-reduce, the optimizer
  update, and whatever else follows the backward pass.
  The three always add up to ``duration_ns`` exactly.

The step window (``start_ns``/``end_ns``/``duration_ns``) and the clock
(``"device"`` or ``"host"``, the table's ``timeline`` column) are those of
:mod:`perfsight.analysis.clock`, so
step trace and overlap breakdown describe the same interval of time.

Automatic FP/BP detection (PyTorch)
-----------------------------------
* *Main thread*: the host track carrying the ``step`` slices (``ProfilerStep#N``);
  without step slices, the host track with the most ``cpu_op`` slices.
* *FP start (host)*: the first ``cpu_op`` on the main thread that starts inside
  the host step and at or after the end of the step's last ``data_loading`` slice
  on that thread (``enumerate(DataLoader)#...__next__``); with no data loading,
  the first ``cpu_op`` of the step.  The first op by start time is an outermost one.
* *BP end (host)*: the latest end among the step's backward slices: host slices
  whose name starts with ``autograd::engine::evaluate_function`` (one per
  autograd node).  A step without any uses the ``cpu_op`` slices of autograd
  threads instead (a track whose name contains ``autograd``, or a non-main track
  carrying ``evaluate_function`` slices).  Node slices come first because the
  autograd thread also runs DDP's ``finalize_backward`` (``copy_bucket_to_grad``),
  which waits for the last gradient all-reduce: counting it would put that
  all-reduce inside forward+backward instead of the tail.  A slice belongs to
  the step when its start lies in the host step.
* *Device clock*: FP start becomes the start of the first device activity
  (compute or communication) in the step window whose launching runtime call
  started at or after the FP op's start -- the first device work launched by the
  forward op or after it (device work with no launch link counts when it
  itself starts at or after that instant).  BP end becomes the end of the last
  device *compute* activity (kernel/memcpy/memset) in the window launched by a
  backward op: its runtime call lies on a backward slice's thread inside that
  slice, or carries a backward slice's ``external_id``.  Communication kernels
  launched from backward hooks (DDP gradient all-reduce) are left to the tail,
  as in MindSpore, where BP ends at the op before the last all-reduce.  When
  no device compute is linked to a backward op, the last device compute
  launched no later than the host BP end is used.

User-chosen points
------------------
``fp_point``/``bp_point`` name an op (exact ``name`` match, any host thread): FP
start is the start of the step's first slice with that name, BP end the end of
its last one (latest end); on the device clock they are mapped to device
work as above, with "launched by a backward op" meaning "launched by that
slice".  A step where the named slice is absent falls back to automatic
detection for that point; :func:`named_point_warnings` says in how many steps
(the pipeline adds it to the run's warnings, which the summary prints).

Failed detection
----------------
When FP or BP cannot be found in a step, or BP would end before FP starts, the
step is reported whole: ``fp_start_ns = start_ns``, ``bp_end_ns = end_ns``,
``fp_bp_ns = duration_ns``, ``iteration_interval_ns = tail_ns = 0`` and empty
``fp_op``/``bp_op``.  Found points are clamped into the window.

This module must not read environment variables (``PERFSIGHT_FP_POINT`` /
``PERFSIGHT_BP_POINT`` are the CLI/API layer's job), must not mutate the trace,
and must not loop over events in Python: loops are over steps and tracks.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from perfsight import columns
from perfsight import intervals as iv
from perfsight.analysis.clock import (
    Clock,
    choose_clock,
    device_activity_mask,
    names_of,
    step_windows,
)
from perfsight.analysis.hierarchy import launcher
from perfsight.analysis.index import TraceIndex, dictionary_mask, index_of
from perfsight.model import DEVICE_COMPUTE_KINDS, NO_ID, STEP_PHASES_SCHEMA, SliceKind, Trace
from perfsight.units import ms_text

BACKWARD_PREFIX = "autograd::engine::evaluate_function"
"""Name prefix of the autograd engine's per-node backward slices."""

STEP_TRACE_SCHEMA = pa.schema(
    [
        *STEP_PHASES_SCHEMA,
        pa.field("fp_op", pa.string(), nullable=False),
        pa.field("bp_op", pa.string(), nullable=False),
        pa.field("timeline", pa.string(), nullable=False),
    ]
)
"""Columns of :func:`step_trace` (contract: docs/ANALYSIS_CONTRACT.md)."""


MIN_STEPS_TO_DROP_WARMUP = 3
"""The warm-up policy of every average over steps (the cluster step trace, the advisor): the first
complete profiled step is left out when at least this many complete steps remain -- it pays for
lazy initialisation, allocator growth and cold caches."""


def _sorted_rows(
    rows: NDArray[np.int64], key: NDArray[np.int64], tie: NDArray[np.int64]
) -> NDArray[np.int64]:
    return rows[np.lexsort((tie[rows], key[rows]))]


def main_track(trace: Trace) -> int:
    """The host track of the training loop: the one carrying step markers (``-1`` if none)."""
    ix = index_of(trace)
    for kind in (SliceKind.STEP.value, SliceKind.CPU_OP.value):
        tracks = ix.track[ix.kind_mask([kind], is_device=False)]
        if tracks.size:
            values, counts = np.unique(tracks, return_counts=True)
            return int(values[np.argmax(counts)])
    return -1


def _autograd_tracks(trace: Trace, backward_named: NDArray[np.bool_], main: int) -> NDArray[np.int64]:
    tracks = trace.tracks
    named = np.zeros(0, dtype=np.int64)
    if tracks.num_rows:
        by_name = dictionary_mask(
            tracks.column("name"), lambda a: pc.match_substring(a, "autograd", ignore_case=True)
        )
        on_host = ~columns.numpy(tracks.column("is_device"), null=False)
        named = columns.int64(tracks.column("track"))[by_name & on_host]
    carrying = np.unique(index_of(trace).track[backward_named])
    return np.setdiff1d(np.union1d(named, carrying), [main])


def _launched_by(
    trace: Trace,
    host_rows: NDArray[np.int64],
    launched: NDArray[np.int64],
    start: NDArray[np.int64],
    end: NDArray[np.int64],
) -> NDArray[np.bool_]:
    """For each slice row: was its launching runtime call made inside one of ``host_rows``?

    Inside means on the same track within the slice's time, or carrying the
    slice's ``external_id``.  Loops over tracks only.
    """
    ix = index_of(trace)
    out = np.zeros(ix.n, dtype=bool)
    has = launched >= 0
    if host_rows.size == 0 or not has.any():
        return out
    track, ext = ix.track, ix.external_id
    rows = np.flatnonzero(has)
    calls = launched[rows]
    call_track, call_start, call_ext = track[calls], start[calls], ext[calls]
    hit = np.zeros(rows.size, dtype=bool)
    for t in np.unique(track[host_rows]):
        on_t = host_rows[track[host_rows] == t]
        merged = iv.union(start[on_t], end[on_t])
        same = call_track == t
        hit[same] |= iv.contains(merged, call_start[same])
    host_ext = ext[host_rows]  # not made unique first: np.isin does not need it (2.6 ms saved)
    host_ext = host_ext[host_ext != NO_ID]
    hit |= (call_ext != NO_ID) & np.isin(call_ext, host_ext)
    out[rows[hit]] = True
    return out


def _named(ix: TraceIndex, name: str | None) -> NDArray[np.bool_]:
    """Rows named exactly ``name`` (none when ``name`` is None)."""
    if not name:
        return np.zeros(ix.n, dtype=bool)
    value_set = pa.array([name], pa.string())
    return ix.name_mask(lambda a: pc.is_in(a, value_set=value_set), ("exactly", name))


class _Rows:
    """Host rows of one role, sorted by start, with per-step range lookups."""

    def __init__(self, rows: NDArray[np.int64], start: NDArray[np.int64], depth: NDArray[np.int64]) -> None:
        self.rows = _sorted_rows(rows, start, depth)
        self.starts = start[self.rows]

    def in_window(self, lo: int, hi: int) -> NDArray[np.int64]:
        a, b = np.searchsorted(self.starts, [lo, hi], side="left")
        return self.rows[a:b]


def _first_at_or_after(rows: _Rows, at: int, hi: int) -> int:
    j = int(np.searchsorted(rows.starts, at, side="left"))
    return int(rows.rows[j]) if j < rows.rows.size and rows.starts[j] < hi else -1


def _last_ending(rows: NDArray[np.int64], end: NDArray[np.int64], depth: NDArray[np.int64]) -> int:
    if rows.size == 0:
        return -1
    best = np.lexsort((depth[rows], -end[rows]))[0]  # latest end, then the outermost
    return int(rows[best])


class _DeviceWork:
    """Device activity sorted by start, with the host time of each one's launch call."""

    def __init__(self, trace: Trace, start: NDArray[np.int64], end: NDArray[np.int64]) -> None:
        self.trace, self.start_all, self.end_all = trace, start, end
        ix = index_of(trace)
        self.launcher = launcher(ix)
        rows = np.flatnonzero(device_activity_mask(trace))
        self.rows = rows[np.argsort(start[rows], kind="stable")]
        self.start, self.end = start[self.rows], end[self.rows]
        calls = self.launcher[self.rows]
        self.launch = np.where(calls >= 0, start[np.maximum(calls, 0)], NO_ID)
        self.compute = ix.of_kind(DEVICE_COMPUTE_KINDS)[self.rows]

    def launched_by(self, host_rows: NDArray[np.int64]) -> NDArray[np.bool_]:
        """Per device activity: launched from inside one of ``host_rows``."""
        return _launched_by(self.trace, host_rows, self.launcher, self.start_all, self.end_all)[self.rows]

    def first_launched_from(self, lo: int, hi: int, host_ns: int) -> int:
        """Start of the first activity in ``[lo, hi)`` launched at or after ``host_ns`` (-1 if none).

        Activity without a launch link counts when it itself starts at or after ``host_ns``.
        """
        a, z = np.searchsorted(self.start, [lo, hi], side="left")
        launch = self.launch[a:z]
        after = np.where(launch != NO_ID, launch >= host_ns, self.start[a:z] >= host_ns)
        return int(self.start[a:z][np.argmax(after)]) if after.any() else -1

    def last_compute_end(self, lo: int, hi: int, launched_by: NDArray[np.bool_], host_end_ns: int) -> int:
        """End of the last compute in ``[lo, hi)`` flagged in ``launched_by``; failing that, of the
        last compute launched no later than ``host_end_ns`` (-1 if none)."""
        a, z = np.searchsorted(self.start, [lo, hi], side="left")
        mine = self.compute[a:z] & launched_by[a:z]
        if not mine.any():
            launch = self.launch[a:z]
            mine = self.compute[a:z] & (launch != NO_ID) & (launch <= host_end_ns)
        return int(self.end[a:z][mine].max()) if mine.any() else -1


def step_trace(trace: Trace, fp_point: str | None = None, bp_point: str | None = None) -> pa.Table:
    """Iteration interval, forward+backward and tail of every step of ``trace`` (see module docstring)."""
    clock: Clock = choose_clock(trace)
    windows = step_windows(trace, clock)
    if windows.num_rows == 0:
        return STEP_TRACE_SCHEMA.empty_table()
    sl = trace.slices
    ix = index_of(trace)
    start, end, depth, track = ix.start, ix.end, ix.depth, ix.track
    host = ~ix.is_device
    main = main_track(trace)

    cpu_op = ix.kind_mask([SliceKind.CPU_OP.value], is_device=False)
    first_ops = _Rows(np.flatnonzero(cpu_op & (track == main)), start, depth)
    loading = _Rows(
        np.flatnonzero(ix.kind_mask([SliceKind.DATA_LOADING.value], is_device=False) & (track == main)),
        start,
        depth,
    )
    backward_named = host & ix.name_mask(lambda a: pc.starts_with(a, BACKWARD_PREFIX), "backward")
    on_autograd = cpu_op & np.isin(track, _autograd_tracks(trace, backward_named, main))
    backward = _Rows(np.flatnonzero(backward_named), start, depth)
    autograd = _Rows(np.flatnonzero(on_autograd & ~backward_named), start, depth)
    fp_named = _Rows(np.flatnonzero(host & _named(ix, fp_point)), start, depth)
    bp_named = _Rows(np.flatnonzero(host & _named(ix, bp_point)), start, depth)

    # BP candidates, in order of preference: the named op, autograd node slices, autograd-thread ops
    bp_sources = ([bp_named] if bp_point else []) + [backward, autograd]
    device = _DeviceWork(trace, start, end) if clock == "device" else None
    launched = [device.launched_by(rows.rows) if device else None for rows in bp_sources]

    w_start = columns.int64(windows.column("start_ns"))
    w_end = columns.int64(windows.column("end_ns"))
    h_start = columns.int64(windows.column("host_start_ns"))
    h_end = columns.int64(windows.column("host_end_ns"))
    n = windows.num_rows
    fp_ns = w_start.copy()
    bp_ns = w_end.copy()
    fp_row = np.full(n, -1, dtype=np.int64)
    bp_row = np.full(n, -1, dtype=np.int64)
    for i in range(n):  # a loop over steps; each step looks at its own slice ranges only
        hs, he, ws, we = int(h_start[i]), int(h_end[i]), int(w_start[i]), int(w_end[i])
        f = _first_at_or_after(fp_named, hs, he) if fp_point else -1
        if f < 0:
            dl = loading.in_window(hs, he)
            f = _first_at_or_after(first_ops, max(hs, int(end[dl].max())) if dl.size else hs, he)
        b, launched_by = -1, None
        for rows, flags in zip(bp_sources, launched, strict=True):
            b_rows = rows.in_window(hs, he)
            if b_rows.size:
                b, launched_by = _last_ending(b_rows, end, depth), flags
                break
        if f < 0 or b < 0:
            continue
        fp_i, bp_i = int(start[f]), int(end[b])
        if device is not None and launched_by is not None:
            fp_i = device.first_launched_from(ws, we, fp_i)
            bp_i = device.last_compute_end(ws, we, launched_by, bp_i)
            if fp_i < 0 or bp_i < 0:
                continue
        fp_i = min(max(fp_i, ws), we)
        bp_i = min(bp_i, we)
        if bp_i < fp_i:
            continue
        fp_ns[i], bp_ns[i], fp_row[i], bp_row[i] = fp_i, bp_i, f, b

    return pa.Table.from_arrays(
        [
            windows.column("rank"),
            windows.column("step"),
            pa.array(w_start, pa.int64()),
            pa.array(w_end, pa.int64()),
            pa.array(w_end - w_start, pa.int64()),
            pa.array(fp_ns, pa.int64()),
            pa.array(bp_ns, pa.int64()),
            pa.array(fp_ns - w_start, pa.int64()),
            pa.array(bp_ns - fp_ns, pa.int64()),
            pa.array(w_end - bp_ns, pa.int64()),
            pa.array(names_of(sl, fp_row), pa.string()),
            pa.array(names_of(sl, bp_row), pa.string()),
            pa.array([clock] * n, pa.string()),
        ],
        schema=STEP_TRACE_SCHEMA,
    )


def named_point_warnings(table: pa.Table, fp_point: str | None, bp_point: str | None) -> list[str]:
    """One line per user-named point that some steps of ``table`` (a :func:`step_trace` result)
    could not use: there the step's ``fp_op``/``bp_op`` is another op (automatic detection) or
    empty (not found).  Why: a misspelt ``--fp-point`` must not pass unnoticed as a silent fallback.
    """
    lines = []
    for point, column, label in ((fp_point, "fp_op", "FP point"), (bp_point, "bp_op", "BP point")):
        if not point or not table.num_rows:
            continue
        missed = int(pc.sum(pc.not_equal(table.column(column), point)).as_py() or 0)
        if missed:
            rank = table.column("rank")[0].as_py()
            lines.append(
                f"rank {rank}: {label} {point!r} not found in {missed} of {table.num_rows} steps; "
                "automatic detection used there"
            )
    return lines


VENDOR_PHASES = (
    ("duration_ns", "step"),
    ("iteration_interval_ns", "iteration interval"),
    ("fp_bp_ns", "forward+backward"),
    ("tail_ns", "tail"),
)
"""The phases compared with a vendor's recorded step trace, and their names in a warning."""

VENDOR_DIFFERENCE_SCHEMA = pa.schema(
    [
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("step", pa.int32(), nullable=False),
        pa.field("phase", pa.string(), nullable=False),  # a column of STEP_PHASES_SCHEMA
        pa.field("perfsight_ns", pa.int64()),  # null: perfsight has no such step
        pa.field("vendor_ns", pa.int64()),  # null: the vendor recorded no such step
    ]
)
"""Columns of :func:`vendor_step_differences`."""


def vendor_step_differences(ours: pa.Table, vendor: pa.Table) -> pa.Table:
    """Where perfsight's step trace (:func:`step_trace`) and the one the source's tool recorded
    (``Trace.vendor.step_trace``) disagree: one row per (step, phase) whose ns differ, or per phase
    of a step only one of them has.  Empty when they agree or when there is no vendor step trace.

    Why: the vendor's numbers may rest on facts the events lack (MindInsight's FP/BP points follow
    the graph's op order), so they are a cross-check to show, never a substitute for ours.
    """
    if vendor.num_rows == 0:
        return VENDOR_DIFFERENCE_SCHEMA.empty_table()
    keys = ["rank", "step"]
    phases = [name for name, _ in VENDOR_PHASES]
    mine = ours.select(keys + phases).rename_columns(keys + [f"{p}.perfsight" for p in phases])
    theirs = vendor.select(keys + phases).rename_columns(keys + [f"{p}.vendor" for p in phases])
    joined = mine.join(theirs, keys, join_type="full outer").sort_by([("step", "ascending")])
    parts = []
    for phase in phases:
        a, b = joined.column(f"{phase}.perfsight"), joined.column(f"{phase}.vendor")
        differs = pc.fill_null(pc.not_equal(a, b), True)  # a step only one side has differs too
        rows = joined.filter(differs)
        parts.append(
            pa.table(
                [
                    rows.column("rank").cast(pa.int32()),
                    rows.column("step").cast(pa.int32()),
                    pa.array([phase] * rows.num_rows, pa.string()),
                    rows.column(f"{phase}.perfsight"),
                    rows.column(f"{phase}.vendor"),
                ],
                schema=VENDOR_DIFFERENCE_SCHEMA,
            )
        )
    return pa.concat_tables(parts).sort_by([("step", "ascending")])


def vendor_difference_warnings(differences: pa.Table, table_name: str) -> list[str]:
    """One line per rank whose step trace differs from the vendor's (a :func:`vendor_step_differences`
    result): how many steps, and each differing phase of the first one, in ms."""
    if differences.num_rows == 0:
        return []
    label = dict(VENDOR_PHASES)
    rows = differences.to_pylist()
    steps = sorted({row["step"] for row in rows})
    first = [row for row in rows if row["step"] == steps[0]]
    detail = ", ".join(
        f"{label[row['phase']]} {ms_text(row['perfsight_ns'])} vs {ms_text(row['vendor_ns'])} ms"
        for row in first
    )
    return [
        f"rank {rows[0]['rank']}: perfsight's step trace differs from the one the source's tool recorded "
        f"(table {table_name}) in {len(steps)} step(s); step {steps[0]}: {detail}"
    ]


def duration_spread(durations_ns: NDArray[np.int64]) -> dict[str, int]:
    """The median, 90th percentile (nearest rank) and largest of the steps' ``duration_ns``: how
    a long run's steps are spread, for a reader who is shown only its slowest ones."""
    ordered = np.sort(durations_ns)
    rank = {q: -(-len(ordered) * q // 100) - 1 for q in (50, 90)}
    return {"median_ns": int(ordered[rank[50]]), "p90_ns": int(ordered[rank[90]]), "max_ns": int(ordered[-1])}

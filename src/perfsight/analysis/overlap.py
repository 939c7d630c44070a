"""Overlap breakdown: how each step's time splits into computing, communication and idle.

The columns of MindSpore's ``step_trace_time.csv``, computed per step by
interval union and intersection on the rank's clock (device when it has
device work, host otherwise; see :mod:`perfsight.analysis.clock` for what
counts as compute, communication and receive there, and for the step windows).
With ``C`` the compute set, ``M`` the communication set and ``R`` the receive
part of ``M``, all cut to the step window ``[start, end)``:

* ``step_ns`` = ``end - start`` (the window).
* ``preparing_ns`` = time from the window start to the first instant covered
  by ``C ∪ M`` (the whole window when nothing runs in it).
* ``stage_ns`` = ``step_ns - preparing_ns``.
* ``computing_ns`` = ``|C|``; ``communication_ns`` = ``|M|``;
  ``overlapped_ns`` = ``|C ∩ M|``;
  ``communication_not_overlapped_ns`` = ``|M| - |C ∩ M|`` = ``|M \\ C|``.
* ``free_ns`` = ``stage - computing - communication_not_overlapped`` (time in
  the stage when neither computes nor communicates; never negative).
* ``bubble_ns`` = ``|R \\ C|``: time spent only in point-to-point receives
  (pipeline-parallel waiting); 0 when there are none.
* ``communication_not_overlapped_exclude_receive_ns`` =
  ``communication_not_overlapped - bubble`` = ``|M \\ C \\ R|``.

Invariants, exact in integer nanoseconds: ``computing + communication_not_overlapped
+ free == stage`` and ``stage + preparing == step_ns``.

Where the stage ends (``stage_end``): ``"window"`` (perfsight's default) ends it
with the window, so device idle time after the step's last work is ``free``.
``"last_work"`` is Ascend's convention (learned from its ``step_trace_time.csv``,
see docs/OUTPUTS.md): the stage runs from the first to the last instant covered by
``C ∪ M`` in the window, and idle time after the last work belongs to no column,
so then ``stage + preparing <= step_ns``.  ``None`` takes the convention the trace's
reader recorded in ``meta.extra["stage_end"]`` (the Ascend reader sets
``"last_work"``), else ``"window"``.

:func:`overlap_intervals` returns the merged intervals behind those numbers
(the "Overlap Analysis" lanes of ``trace_view.json``), restricted to the step
windows; per window, each lane's length equals the matching column.

This module must not convert units (export does) and must not loop over
events in Python: every window is measured at once with prefix sums.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfsight import columns
from perfsight import intervals as iv
from perfsight.analysis.clock import Activity, activity, choose_clock, step_windows
from perfsight.model import Trace

OVERLAP_SCHEMA = pa.schema(
    [
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("step", pa.int32(), nullable=False),
        pa.field("step_ns", pa.int64(), nullable=False),
        pa.field("computing_ns", pa.int64(), nullable=False),
        pa.field("communication_not_overlapped_ns", pa.int64(), nullable=False),
        pa.field("overlapped_ns", pa.int64(), nullable=False),
        pa.field("communication_ns", pa.int64(), nullable=False),
        pa.field("free_ns", pa.int64(), nullable=False),
        pa.field("stage_ns", pa.int64(), nullable=False),
        pa.field("bubble_ns", pa.int64(), nullable=False),
        pa.field("communication_not_overlapped_exclude_receive_ns", pa.int64(), nullable=False),
        pa.field("preparing_ns", pa.int64(), nullable=False),
    ]
)
"""Columns of :func:`overlap_breakdown`, in ``step_trace_time.csv`` order."""

LANES = ("Computing", "Communication", "Communication(Not Overlapped)", "Free")
"""Lane names of :func:`overlap_intervals`, as MindSpore's trace view shows them."""

OVERLAP_INTERVAL_SCHEMA = pa.schema(
    [
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("lane", pa.string(), nullable=False),
        pa.field("start_ns", pa.int64(), nullable=False),
        pa.field("end_ns", pa.int64(), nullable=False),
    ]
)


def _steps_and_work(trace: Trace) -> tuple[pa.Table, Activity, iv.Intervals]:
    """The step windows, the work on the rank's clock, and its busy set (compute ∪ communication).

    No windows when the input recorded no compute work (``meta.compute_recorded``): every share
    would then be a made-up "100 % free", so the breakdown is empty instead."""
    clock = choose_clock(trace)
    windows = step_windows(trace, clock)
    if windows.num_rows and not trace.meta.compute_recorded:
        windows = windows.slice(0, 0)
    if windows.num_rows == 0:
        return windows, Activity(clock, iv.empty(), iv.empty(), iv.empty()), iv.empty()
    work = activity(trace, clock)
    busy = iv.union(
        np.concatenate((work.compute[0], work.communication[0])),
        np.concatenate((work.compute[1], work.communication[1])),
    )
    return windows, work, busy


STAGE_ENDS = ("window", "last_work")
"""Conventions for where a step's stage ends (see the module docstring)."""


def _stage_end(trace: Trace, stage_end: str | None) -> str:
    chosen = stage_end or str(trace.meta.extra.get("stage_end", "window"))
    if chosen not in STAGE_ENDS:
        raise ValueError(f"stage_end must be one of {STAGE_ENDS}, not {chosen!r}")
    return chosen


def _last_covered(merged: iv.Intervals, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """For each window ``[lo, hi)``, the end of the last covered stretch in it (``lo`` when none)."""
    s, e = merged
    if s.size == 0:
        return lo.copy()
    j = np.searchsorted(s, hi, side="left") - 1  # last interval starting before hi
    end = np.where(j >= 0, np.minimum(e[np.maximum(j, 0)], hi), lo)
    return np.maximum(end, lo)


def _stage_bounds(
    busy: iv.Intervals, lo: np.ndarray, hi: np.ndarray, stage_end: str
) -> tuple[np.ndarray, np.ndarray]:
    first = iv.first_covered(busy, lo, hi)
    last = np.maximum(_last_covered(busy, lo, hi), first) if stage_end == "last_work" else hi
    return first, last


def overlap_breakdown(trace: Trace, stage_end: str | None = None) -> pa.Table:
    """Per step: computing, communication (overlapped or not), free, bubble and preparing time in ns.

    ``stage_end``: ``"window"`` or ``"last_work"`` (Ascend's convention); ``None`` follows the trace.
    """
    windows, work, busy = _steps_and_work(trace)
    if windows.num_rows == 0:
        return OVERLAP_SCHEMA.empty_table()
    lo, hi = columns.int64(windows.column("start_ns")), columns.int64(windows.column("end_ns"))
    step_ns = hi - lo
    first, last = _stage_bounds(busy, lo, hi, _stage_end(trace, stage_end))
    preparing = first - lo
    stage = last - first
    computing = iv.measure(work.compute, lo, hi)
    communication = iv.measure(work.communication, lo, hi)
    overlapped = iv.measure(iv.intersect(work.compute, work.communication), lo, hi)
    not_overlapped = communication - overlapped
    bubble = iv.measure(iv.subtract(work.receive, work.compute), lo, hi)
    by_name = {
        "rank": windows.column("rank"),
        "step": windows.column("step"),
        "step_ns": step_ns,
        "computing_ns": computing,
        "communication_not_overlapped_ns": not_overlapped,
        "overlapped_ns": overlapped,
        "communication_ns": communication,
        "free_ns": stage - computing - not_overlapped,
        "stage_ns": stage,
        "bubble_ns": bubble,
        "communication_not_overlapped_exclude_receive_ns": not_overlapped - bubble,
        "preparing_ns": preparing,
    }
    return pa.Table.from_arrays(
        [
            pa.array(v, f.type) if isinstance(v, np.ndarray) else v
            for f, v in zip(OVERLAP_SCHEMA, by_name.values(), strict=True)
        ],
        schema=OVERLAP_SCHEMA,
    )


def _free(busy: iv.Intervals, lo: np.ndarray, hi: np.ndarray, stage_end: str) -> iv.Intervals:
    """The free set: every stage minus the busy set (``free_ns`` per window, as intervals)."""
    return iv.subtract(iv.union(*_stage_bounds(busy, lo, hi, stage_end)), busy)


def free_intervals(trace: Trace, stage_end: str | None = None) -> tuple[pa.Table, iv.Intervals]:
    """The step windows (``clock.WINDOW_SCHEMA``) and the free intervals inside their stages: the
    "Free" lane of :func:`overlap_intervals`, whose lengths per window sum to ``free_ns``.

    Why public: ``analysis.device_idle`` attributes each of these intervals to what ended it; it
    must cut exactly the time this module calls free."""
    windows, _, busy = _steps_and_work(trace)
    if windows.num_rows == 0:
        return windows, iv.empty()
    lo, hi = columns.int64(windows.column("start_ns")), columns.int64(windows.column("end_ns"))
    return windows, _free(busy, lo, hi, _stage_end(trace, stage_end))


def overlap_intervals(trace: Trace, stage_end: str | None = None) -> pa.Table:
    """Merged Computing / Communication / Communication(Not Overlapped) / Free intervals inside the steps."""
    windows, work, busy = _steps_and_work(trace)
    if windows.num_rows == 0:
        return OVERLAP_INTERVAL_SCHEMA.empty_table()
    lo, hi = columns.int64(windows.column("start_ns")), columns.int64(windows.column("end_ns"))
    steps = iv.union(lo, hi)
    lanes = {
        "Computing": iv.intersect(work.compute, steps),
        "Communication": iv.intersect(work.communication, steps),
        "Communication(Not Overlapped)": iv.intersect(iv.subtract(work.communication, work.compute), steps),
        "Free": _free(busy, lo, hi, _stage_end(trace, stage_end)),
    }
    lane_of = np.repeat(np.arange(len(lanes), dtype=np.int32), [s.size for s, _ in lanes.values()])
    starts = np.concatenate([s for s, _ in lanes.values()])
    ends = np.concatenate([e for _, e in lanes.values()])
    return pa.Table.from_arrays(
        [
            pa.array(np.full(starts.size, trace.rank, dtype=np.int32), pa.int32()),
            pa.array(list(lanes), pa.string()).take(pa.array(lane_of)),
            pa.array(starts, pa.int64()),
            pa.array(ends, pa.int64()),
        ],
        schema=OVERLAP_INTERVAL_SCHEMA,
    )


SHARES = (
    ("computing", "computing_ns"),
    ("communication_overlapped", "overlapped_ns"),
    ("communication_not_overlapped", "communication_not_overlapped_ns"),
    ("free", "free_ns"),
    ("preparing", "preparing_ns"),
)
"""Where the time goes, by share name and the :data:`OVERLAP_SCHEMA` column summed for it."""

PART_SHARES = (("free_host_wait", "host_wait_ns"),)
"""Parts of a share, by name and the ``device_idle`` column summed for it: the free time the device
spent waiting for the host to issue its next work (inside ``free``, so not added to the whole)."""

TIME_SHARES_SCHEMA = pa.schema(
    [
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("share", pa.string(), nullable=False),  # a name of SHARES or PART_SHARES
        pa.field("ns", pa.int64(), nullable=False),  # summed over the steps
        pa.field("total_ns", pa.int64(), nullable=False),  # every step's step_ns, summed
        pa.field("fraction", pa.float64(), nullable=False),  # ns / total_ns, 0..1
    ]
)
"""Columns of :func:`time_shares`: one row per name of :data:`SHARES`, in that order, then those of
:data:`PART_SHARES` when ``device_idle`` is given."""


def time_shares(breakdown: pa.Table, device_idle: pa.Table | None = None) -> pa.Table:
    """Where one rank's time goes over all its steps: each column of ``breakdown`` (an
    :func:`overlap_breakdown` result) summed, as ns and as a fraction of all steps' time, and with
    ``device_idle`` (``analysis.device_idle``, the same steps) the parts of :data:`PART_SHARES`.

    Empty when no step could be broken down (no steps, or no compute recorded): a share of nothing
    is unknown, never 0 %.  Computing, overlapped and not-overlapped communication, free and
    preparing add up to the whole time (with ``stage_end="window"``).
    """
    total = int(pc.sum(breakdown.column("step_ns")).as_py() or 0) if breakdown.num_rows else 0
    if total <= 0:
        return TIME_SHARES_SCHEMA.empty_table()
    rank = breakdown.column("rank")[0].as_py()
    summed = [(name, breakdown, column) for name, column in SHARES]
    if device_idle is not None and device_idle.num_rows:
        summed += [(name, device_idle, column) for name, column in PART_SHARES]
    sums = [int(pc.sum(table.column(column)).as_py() or 0) for _, table, column in summed]
    return pa.table(
        {
            "rank": pa.array([rank] * len(summed), pa.int32()),
            "share": pa.array([name for name, _, _ in summed], pa.string()),
            "ns": pa.array(sums, pa.int64()),
            "total_ns": pa.array([total] * len(summed), pa.int64()),
            "fraction": pa.array([part / total for part in sums], pa.float64()),
        },
        schema=TIME_SHARES_SCHEMA,
    )

"""Derive the structural columns every reader needs: tracks, nesting depth, steps, flows.

A reader fills the raw slice columns (kind, name, times, ids); this module adds
what follows from them alone, the same way for every input format, so that no
reader re-implements nesting or step assignment.  All functions are
vectorised: loops run over tracks or steps, never over events.
"""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfsight.columns import first_match, sorted_codes
from perfsight.model import (
    FLOW_SCHEMA,
    KIND_NAMES,
    NO_ID,
    SLICE_SCHEMA,
    STEP_SCHEMA,
    TRACK_SCHEMA,
    SliceKind,
    conform,
    kind_code,
)

STEP_NAME = re.compile(r"^ProfilerStep#(\d+)$")

MAX_RANK = np.iinfo(np.int32).max
"""Ranks are int32 in every table (model.py): a rank past this cannot be stored."""


def is_rank(value: object) -> bool:
    """True for a whole number a rank can be: 0 to :data:`MAX_RANK` (bools are not ranks)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_RANK


def assign_tracks(
    rank: int,
    pid: np.ndarray,
    tid: np.ndarray,
    is_device: np.ndarray,
    names: dict[tuple[int, int, bool], str],
) -> tuple[np.ndarray, pa.Table]:
    """Number each (pid, tid, is_device) lane; return per-slice track ids and the track table.

    ``rank`` must pass :func:`is_rank` (readers check what a file says before calling): a
    ValueError saying so, not numpy's OverflowError, is what a caller that did not check gets."""
    if not is_rank(rank):
        raise ValueError(f"rank {rank!r} is outside 0..{MAX_RANK}")
    ordered, track = lanes(pid, tid, is_device)
    return track, track_table(rank, ordered, names)


def lanes(pid: np.ndarray, tid: np.ndarray, is_device: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (pid, tid, is_device) lanes in track order (host threads first, then device
    streams, each by pid/tid) as a k x 3 int64 array, and each row's lane number.  A reader that
    sees its rows in parts numbers the union of the parts' lanes with :func:`track_table`."""
    # factorise each column first: np.unique over rows (axis=0) is ten times slower
    pid_values, pid_code = sorted_codes(pid)
    tid_values, tid_code = sorted_codes(tid)
    combined = (pid_code * len(tid_values) + tid_code) * 2 + is_device.astype(np.int64)
    codes, inverse = sorted_codes(combined)
    unique = (
        np.stack(
            [
                pid_values[codes // 2 // max(len(tid_values), 1)],
                tid_values[codes // 2 % max(len(tid_values), 1)],
                codes % 2,
            ],
            axis=1,
        )
        if len(codes)
        else np.zeros((0, 3), np.int64)
    )
    order = np.lexsort((unique[:, 1], unique[:, 0], unique[:, 2]))
    renumber = np.empty(len(order), dtype=np.int32)
    renumber[order] = np.arange(len(order), dtype=np.int32)
    return unique[order], renumber[inverse] if len(inverse) else np.zeros(0, np.int32)


def track_table(rank: int, ordered: np.ndarray, names: dict[tuple[int, int, bool], str]) -> pa.Table:
    """The track table of lanes already in track order (``lanes``' first result), named from
    ``names`` (thread names by (pid, tid, is_device)) or ``thread N`` / ``stream N``."""
    labels = []
    for p, t, dev in ordered.tolist():
        default = f"stream {t}" if dev else f"thread {t}"
        labels.append(names.get((p, t, bool(dev)), default))
    return conform(
        pa.table(
            {
                "track": np.arange(len(ordered), dtype=np.int32),
                "rank": np.full(len(ordered), rank, dtype=np.int32),
                "pid": ordered[:, 0],
                "tid": ordered[:, 1],
                "is_device": ordered[:, 2].astype(bool),
                "device_index": np.where(ordered[:, 2] == 1, ordered[:, 0], NO_ID).astype(np.int32),
                "stream": np.where(ordered[:, 2] == 1, ordered[:, 1], NO_ID),
                "name": labels,
            }
        ),
        TRACK_SCHEMA,
    )


def nesting_depth(track: np.ndarray, start: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """Depth of each slice within its track, assuming proper nesting (Chrome 'X' semantics).

    Depth = slices of the same track that started before this one (parents sort
    first on equal starts because they are longer) minus those that ended by
    its start.  A zero-length slice at exactly a slice's start ends "by" that start
    without having started before it (it sorts after, being shorter): it is not
    subtracted, or a parent holding a zero-length first child would lose a level.
    """
    n = len(track)
    depth = np.zeros(n, dtype=np.int16)
    if n == 0:
        return depth
    end = start + np.maximum(dur, 0)
    order = track_time_order(track, start, dur)
    sorted_track = track[order]
    bounds = np.flatnonzero(np.diff(sorted_track)) + 1
    for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, n], strict=True):
        idx = order[lo:hi]
        s = start[idx]
        ends_sorted = np.sort(end[idx], kind="stable")  # timsort: a track's ends come nearly in order
        started_before = np.arange(hi - lo)
        closed = np.searchsorted(ends_sorted, s, side="right")
        later_zero = _zero_length_from_here(s, end[idx] <= s)
        depth[idx] = np.clip(started_before - closed + later_zero, 0, np.iinfo(np.int16).max)
    return depth


def _zero_length_from_here(start: np.ndarray, zero: np.ndarray) -> np.ndarray:
    """For each position of a track's time order, the zero-length slices at the same start from
    that position on (itself included): the ends ``nesting_depth`` counted as closed although
    they did not start before it."""
    n = len(start)
    seen = np.concatenate([[0], np.cumsum(zero, dtype=np.int64)])  # zero-length before a position
    new_start = np.r_[True, start[1:] != start[:-1]]
    group_end = np.r_[np.flatnonzero(new_start)[1:], n]  # one past each run of equal starts
    run_end = group_end[np.cumsum(new_start) - 1]
    return seen[run_end] - seen[:n]


def track_time_order(track: np.ndarray, start: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """``np.lexsort((-dur, start, track))``, the same permutation, at a fraction of its cost.

    Why: a trace's slices come nearly in time order, which a stable sort (timsort) of ``start``
    exploits and lexsort's does not; the track key then sorts by radix (few tracks fit 16 bits),
    and only the runs of equal (track, start) -- a parent and its first child -- are ordered by
    duration, longest first.  Ties of all three keep row order, as lexsort's do."""
    order = np.argsort(start, kind="stable")
    small = track.astype(np.uint16) if len(track) and track.min() >= 0 and track.max() <= 0xFFFF else track
    order = order[np.argsort(small[order], kind="stable")]
    t, s = track[order], start[order]
    tie = (t[1:] == t[:-1]) & (s[1:] == s[:-1])
    if tie.any():
        in_run = np.zeros(len(order), bool)
        in_run[1:] |= tie
        in_run[:-1] |= tie
        pos = np.flatnonzero(in_run)
        run = np.cumsum(np.r_[True, ~tie])[pos]
        rows = order[pos]
        order[pos] = rows[np.lexsort((-dur[rows], run))]
    return order


def steps_from_markers(
    rank: int,
    names: pa.ChunkedArray | pa.Array,
    kind: np.ndarray,
    is_device: np.ndarray,
    start: np.ndarray,
    dur: np.ndarray,
) -> tuple[pa.Table, bool]:
    """Host step markers (ProfilerStep#N) as a steps table; (table, inferred).

    Without markers the whole trace is one inferred step 0.
    """
    idx = step_markers(kind, is_device)
    span = (int(start.min()), int((start + dur).max())) if len(start) else None
    return marker_steps(rank, pc.take(names, pa.array(idx, pa.int64())), start[idx], dur[idx], span)


def step_markers(kind: np.ndarray, is_device: np.ndarray) -> np.ndarray:
    """The rows that mark a step: host slices of kind STEP."""
    return np.flatnonzero((kind == kind_code(SliceKind.STEP)) & ~is_device)


def marker_steps(
    rank: int,
    marker_names: pa.ChunkedArray | pa.Array,
    marker_start: np.ndarray,
    marker_dur: np.ndarray,
    span: tuple[int, int] | None,
) -> tuple[pa.Table, bool]:
    """The steps table of the marker rows (in row order); without any, one inferred step 0 over
    ``span`` (the first start and last end of every slice, None without slices)."""
    if len(marker_start):
        numbers = np.array(
            [int(STEP_NAME.match(n).group(1)) for n in pc.cast(marker_names, pa.string()).to_pylist()],
            dtype=np.int32,
        )
        order = np.argsort(marker_start, kind="stable")
        numbers = numbers[order]
        starts, ends = marker_start[order], marker_start[order] + marker_dur[order]
        inferred = False
    else:
        numbers = np.array([0], dtype=np.int32)
        if span is not None:
            starts, ends = np.array([span[0]]), np.array([span[1]])
        else:
            starts = ends = np.array([0])
        inferred = True
    table = conform(
        pa.table(
            {
                "rank": np.full(len(numbers), rank, np.int32),
                "step": numbers,
                "start_ns": starts.astype(np.int64),
                "end_ns": ends.astype(np.int64),
                "complete": np.ones(len(numbers), bool),
                "inferred": np.full(len(numbers), inferred),
            }
        ),
        STEP_SCHEMA,
    )
    return table, inferred


def step_of(times: np.ndarray, steps: pa.Table) -> np.ndarray:
    """Step number whose host window contains each time, NO_ID outside every window."""
    result = np.full(len(times), NO_ID, dtype=np.int32)
    if steps.num_rows == 0 or len(times) == 0:
        return result
    s = steps.column("start_ns").to_numpy()
    e = steps.column("end_ns").to_numpy()
    n = steps.column("step").to_numpy()
    order = np.argsort(s)
    s, e, n = s[order], e[order], n[order]
    pos = np.searchsorted(s, times, side="right") - 1
    valid = pos >= 0
    inside = valid.copy()
    inside[valid] = times[valid] < e[pos[valid]]
    result[inside] = n[pos[inside]]
    return result


def launch_links(
    correlation: np.ndarray, is_device: np.ndarray, kind: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(runtime row, device row) pairs sharing a correlation id: the launch flows.

    A device row whose id several runtime calls carry is linked to the first of them.
    """
    runtime, device = launch_sides(correlation, is_device, kind)
    match = first_match(correlation[runtime], correlation[device])
    found = match >= 0
    return runtime[match[found]], device[found]


def launch_sides(
    correlation: np.ndarray, is_device: np.ndarray, kind: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The rows that may launch (host runtime calls with a correlation id) and the rows that may be
    launched (device rows with one), each in row order."""
    has = correlation != NO_ID
    runtime = np.flatnonzero(has & ~is_device & (kind == kind_code(SliceKind.RUNTIME)))
    return runtime, np.flatnonzero(has & is_device)


def device_step(
    step: np.ndarray,
    is_device: np.ndarray,
    src: np.ndarray,
    dst: np.ndarray,
    start: np.ndarray,
    steps: pa.Table,
) -> np.ndarray:
    """Give device slices the step of the host call that launched them (time as a fallback)."""
    result = step.copy()
    dev = np.flatnonzero(is_device)
    result[dev] = step_of(start[dev], steps)  # fallback: device time inside the host window
    result[dst] = step[src]  # launched work belongs to its launcher's step
    return result


def device_windows(
    steps: pa.Table, step: np.ndarray, on_device: np.ndarray, start: np.ndarray, end: np.ndarray
) -> pa.Table:
    """Fill device_start_ns/device_end_ns: the first and last device work of each step."""
    first, last = device_window_bounds(steps, step, on_device, start, end)
    return with_device_windows(steps, first, last)


def device_window_bounds(
    steps: pa.Table, step: np.ndarray, on_device: np.ndarray, start: np.ndarray, end: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per step row, the first device start and last device end of these slices (int64 max / min
    where none): bounds of parts combine with ``np.minimum`` / ``np.maximum``."""
    numbers = steps.column("step").to_numpy()
    first = np.full(len(numbers), np.iinfo(np.int64).max, dtype=np.int64)
    last = np.full(len(numbers), np.iinfo(np.int64).min, dtype=np.int64)
    rows = np.flatnonzero(on_device & (step != NO_ID))
    if len(rows) and len(numbers):
        order = np.argsort(numbers)
        slot = np.searchsorted(numbers[order], step[rows])
        slot = np.minimum(slot, len(numbers) - 1)
        ok = numbers[order][slot] == step[rows]
        target = order[slot[ok]]
        np.minimum.at(first, target, start[rows[ok]])
        np.maximum.at(last, target, end[rows[ok]])
    return first, last


def with_device_windows(steps: pa.Table, first: np.ndarray, last: np.ndarray) -> pa.Table:
    """``steps`` with the device window columns of :func:`device_window_bounds`' bounds."""
    has = first <= last
    steps = steps.set_column(
        steps.schema.get_field_index("device_start_ns"),
        "device_start_ns",
        pa.array(np.where(has, first, 0), pa.int64(), mask=~has),
    )
    return steps.set_column(
        steps.schema.get_field_index("device_end_ns"),
        "device_end_ns",
        pa.array(np.where(has, last, 0), pa.int64(), mask=~has),
    )


def flows_table(rank: int, src: np.ndarray, dst: np.ndarray, kind: str) -> pa.Table:
    return conform(
        pa.table(
            {
                "rank": np.full(len(src), rank, np.int32),
                "kind": pa.repeat(pa.scalar(kind, pa.string()), len(src)),
                "src": src.astype(np.int64),
                "dst": dst.astype(np.int64),
            }
        ),
        FLOW_SCHEMA,
    )


def slice_table(
    rank: int,
    kind: np.ndarray,
    category: pa.Array | pa.ChunkedArray,
    names: pa.Array | pa.ChunkedArray,
    is_device: np.ndarray,
    pid: np.ndarray,
    tid: np.ndarray,
    track: np.ndarray,
    start: np.ndarray,
    dur: np.ndarray,
    step: np.ndarray,
    correlation: np.ndarray | None = None,
    *,
    external_id: np.ndarray | None = None,
    depth: np.ndarray | None = None,
    args: dict[str, pa.ChunkedArray] | None = None,
) -> pa.Table:
    """The slice table every reader builds: ``kind`` as ``kind_code`` values; ids default to
    NO_ID (inputs without Kineto's ids), ``depth`` to the nesting of the tracks and times; ``args``
    fills the optional argument columns (shapes, grid, bytes, ...)."""
    n = len(start)
    return conform(
        pa.table(
            {
                "rank": np.full(n, rank, np.int32),
                "kind": pa.DictionaryArray.from_arrays(pa.array(kind, pa.int32()), pa.array(KIND_NAMES)),
                "category": pc.dictionary_encode(category),
                "name": pc.dictionary_encode(names),
                "is_device": is_device,
                "pid": pid,
                "tid": tid,
                "track": track,
                "start_ns": start,
                "dur_ns": dur,
                "depth": nesting_depth(track, start, dur) if depth is None else depth,
                "correlation": np.full(n, NO_ID, np.int64) if correlation is None else correlation,
                "external_id": np.full(n, NO_ID, np.int64) if external_id is None else external_id,
                "step": np.asarray(step, np.int32),
                **(args or {}),
            }
        ),
        SLICE_SCHEMA,
    )

"""``trace_view.json``: the whole trace as a Chrome trace-event file for Perfetto and chrome://tracing.

The file is one JSON object ``{"displayTimeUnit": "ns", "otherData": {...}, "traceEvents": [...]}``
holding, per rank:

* ``M`` metadata events naming and ordering every process and thread (one thread per
  ``Trace.tracks`` row: host threads under their process, device streams under their device).
  pids/tids are the trace's own where a viewer accepts them; Perfetto reads them as uint32 and
  would fold a negative tid into its process's main thread, so an id outside ``0..2**32-1`` (or
  clashing with another lane's) is replaced by a fresh one — the thread name keeps the original;
* one ``X`` event per slice, ``ts``/``dur`` in microseconds with three decimals, ``args`` carrying
  the kind, step, correlation, external id, input shapes/types and kernel launch geometry;
* ``s``/``f`` flow arrows for ``Trace.flows`` (``s`` at the source slice's start on its thread,
  ``f`` with ``"bp": "e"`` at the destination slice's start, so both ends bind to the slices
  themselves, as Kineto writes them);
* ``C`` counter events for the allocator's allocated/reserved/active megabytes, one counter
  process per device;
* an "Overlap Analysis" process with the threads "Computing", "Communication",
  "Communication(Not Overlapped)" and "Free" holding the merged intervals of
  :func:`perfsight.analysis.overlap.overlap_intervals`, as MindSpore's trace view has.

Time base: timestamps stay absolute (the trace's own clock) when a double-precision microsecond
value — what chrome://tracing computes with; Perfetto parses the decimal text exactly — still
resolves every nanosecond — the largest timestamp is below 2**43 µs
(~102 days of a monotonic clock), or every timestamp is a whole microsecond below 2**53 µs.
Otherwise (nanosecond-resolution wall-clock times) the start of the trace's first second is
subtracted from every timestamp and recorded as ``otherData.perfsight_time_offset_ns``; add it
back to recover the trace's clock.

The file is written in chunks of rows, each chunk's JSON text built with Arrow string kernels
over whole columns (names escaped by orjson once per distinct value), so memory stays bounded by
the chunk size and no Python object is made per event.  This module must not compute analyses
(it draws what ``overlap_intervals`` returns) and must not convert units except via ``units.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from perfsight.export import text
from perfsight.export.units import bytes_to_mb, us_text
from perfsight.model import NO_ID, Trace

CHUNK_ROWS = 65_536
"""Events built and written per chunk: bounds the writer's memory whatever the trace size."""

OVERLAP_PROCESS = "Overlap Analysis"
OVERLAP_LANES = ("Computing", "Communication", "Communication(Not Overlapped)", "Free")

EXACT_US_LIMIT = 2**43
"""Below this many µs a double's spacing is under 1 ns, so absolute timestamps lose nothing."""
WHOLE_US_LIMIT = 2**53
"""Below this many µs a double holds every whole microsecond exactly."""

NS_PER_S = 1_000_000_000
UINT32_MAX = 2**32 - 1


@dataclasses.dataclass(frozen=True)
class _Lanes:
    """Output pid/tid per track, and the extra processes this writer adds."""

    track_pid: np.ndarray  # by track index
    track_tid: np.ndarray
    metadata: list[dict]  # M events (a handful: per process and per track)
    memory_pid: dict[str, int]  # by device text ("CUDA:0")
    overlap_pid: int
    overlap_tids: list[int]  # one per OVERLAP_LANES entry


def _timestamps(trace: Trace, overlap: pa.Table | None) -> Iterator[np.ndarray]:
    """Every timestamp (ns) the file will hold, one array at a time."""
    slices = trace.slices
    if slices.num_rows:
        start = text.combined(slices.column("start_ns")).to_numpy()
        yield start
        yield start + text.combined(slices.column("dur_ns")).to_numpy()
    if trace.memory.num_rows:
        yield text.combined(trace.memory.column("ts_ns")).to_numpy()
    if overlap is not None and overlap.num_rows:
        yield text.combined(overlap.column("start_ns")).to_numpy()
        yield text.combined(overlap.column("end_ns")).to_numpy()


def time_offset_ns(trace: Trace, overlap: pa.Table | None = None) -> int:
    """The nanoseconds subtracted from every timestamp: 0 unless doubles would lose precision."""
    low, high, whole_us = None, 0, True
    for values in _timestamps(trace, overlap):
        low = int(values.min()) if low is None else min(low, int(values.min()))
        high = max(high, int(np.abs(values).max()))
        whole_us = whole_us and bool((values % 1000 == 0).all())
    if low is None:
        return 0
    if high < EXACT_US_LIMIT * 1000 or (whole_us and high < WHOLE_US_LIMIT * 1000):
        return 0
    return (low // NS_PER_S) * NS_PER_S


class _Ids:
    """Hands out pids/tids that viewers accept: Perfetto reads both as uint32 and turns a negative
    pid into 0 and a negative tid into the pid, which would merge unrelated lanes; so a source id
    outside ``0..2**32-1``, or one already taken, is replaced by a fresh unused one."""

    def __init__(self, seen: list[int]) -> None:
        valid = [v for v in seen if 0 <= v <= UINT32_MAX]
        self._next = max([0, *valid]) + 1
        self._taken_pids: set[int] = set()
        self._taken_tids: dict[int, set[int]] = {}

    def _fresh(self, taken: set[int]) -> int:
        while self._next in taken or self._next > UINT32_MAX:
            self._next = 1 if self._next > UINT32_MAX else self._next + 1
        value = self._next
        self._next += 1
        return value

    def pid(self, wanted: int | None) -> int:
        usable = wanted is not None and 0 <= wanted <= UINT32_MAX and wanted not in self._taken_pids
        pid = wanted if usable else self._fresh(self._taken_pids)
        self._taken_pids.add(pid)
        self._taken_tids[pid] = set()
        return pid

    def tid(self, pid: int, wanted: int) -> int:
        taken = self._taken_tids[pid]
        tid = wanted if 0 <= wanted <= UINT32_MAX and wanted not in taken else self._fresh(taken | {pid})
        taken.add(tid)
        return tid


def _lanes(trace: Trace, memory_keys: list[str]) -> _Lanes:
    """Output pids/tids for every track plus the memory and overlap processes (a loop over tracks)."""
    tracks = trace.tracks.sort_by("track")
    n_tracks = int(pc.max(tracks.column("track")).as_py()) + 1 if tracks.num_rows else 0
    track_pid = np.zeros(n_tracks, dtype=np.int64)
    track_tid = np.zeros(n_tracks, dtype=np.int64)
    device_names = {d.index: d.name for d in trace.meta.devices}
    rows = tracks.to_pylist()
    ids = _Ids([int(r["pid"]) for r in rows] + [int(r["tid"]) for r in rows])
    assigned: dict[tuple[bool, int], int] = {}
    metadata: list[dict] = []
    rank = trace.rank

    def process(pid: int, name: str, sort_index: int) -> None:
        metadata.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}})
        metadata.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                         "args": {"sort_index": sort_index}})
        metadata.append({"ph": "M", "name": "process_labels", "pid": pid, "tid": 0,
                         "args": {"labels": f"rank {rank}"}})

    def thread(pid: int, tid: int, name: str, sort_index: int) -> None:
        metadata.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
        metadata.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                         "args": {"sort_index": sort_index}})

    for row in rows:
        key = (bool(row["is_device"]), int(row["pid"]))
        if key not in assigned:
            pid = assigned[key] = ids.pid(key[1])
            if key[0]:
                index = int(row["device_index"])
                label = f"GPU {index}" + (f" ({device_names[index]})" if index in device_names else "")
                process(pid, f"Rank {rank} {label}", 1000 + max(index, 0))
            else:
                process(pid, f"Rank {rank} CPU process {key[1]}", len(assigned))
        pid = assigned[key]
        tid = ids.tid(pid, int(row["tid"]))
        track_pid[row["track"]] = pid
        track_tid[row["track"]] = tid
        thread(pid, tid, str(row["name"]), int(row["track"]))

    memory_pid = {}
    for i, key in enumerate(memory_keys):
        memory_pid[key] = ids.pid(None)
        process(memory_pid[key], f"Rank {rank} Memory {key}", 2000 + i)
    overlap_pid = ids.pid(None)
    process(overlap_pid, OVERLAP_PROCESS, 3000)
    overlap_tids = [ids.tid(overlap_pid, i + 1) for i in range(len(OVERLAP_LANES))]
    for i, (lane, tid) in enumerate(zip(OVERLAP_LANES, overlap_tids, strict=True)):
        thread(overlap_pid, tid, lane, i)
    return _Lanes(track_pid, track_tid, metadata, memory_pid, overlap_pid, overlap_tids)


def _escaped_dictionary(column: pa.ChunkedArray | pa.Array) -> tuple[pa.Array, pa.Array]:
    """(indices, JSON-escaped dictionary values) of a string column, escaped once per value."""
    arr = text.combined(column)
    if not pa.types.is_dictionary(arr.type):
        arr = pc.dictionary_encode(arr.cast(pa.string()))
    escaped = text.json_strings(arr.dictionary.cast(pa.string()))
    return arr.indices, escaped


def _num(values: pa.Array) -> pa.Array:
    """Numbers as JSON number text; null, NaN and infinities become null (then omitted)."""
    if pa.types.is_floating(values.type):
        values = pc.if_else(pc.is_finite(values), values, pa.nulls(len(values), values.type))
    return values.cast(pa.string())


def _id(values: pa.Array) -> pa.Array:
    """Integer ids as text, with ``NO_ID`` as null (then omitted)."""
    return pc.if_else(pc.equal(values, NO_ID), pa.nulls(len(values), pa.string()), values.cast(pa.string()))


def _object(pairs: list[tuple[str, pa.Array]]) -> pa.Array:
    """A JSON object per row from ``(key, value JSON text)`` pairs; null values are left out."""
    pieces = [text.concat(orjson.dumps(key).decode() + ":", value) for key, value in pairs]
    joined = pc.binary_join_element_wise(*pieces, ",", null_handling="skip")
    return text.concat("{", joined, "}")


def _slice_chunks(trace: Trace, lanes: _Lanes, offset: int, chunk_rows: int) -> Iterator[str]:
    slices = trace.slices
    name_idx, name_esc = _escaped_dictionary(slices.column("name"))
    kind_idx, kind_esc = _escaped_dictionary(slices.column("kind"))
    cat_idx, cat_esc = _escaped_dictionary(slices.column("category"))
    track_pid = pa.array(lanes.track_pid).cast(pa.string())
    track_tid = pa.array(lanes.track_tid).cast(pa.string())
    for lo in range(0, slices.num_rows, chunk_rows):
        n = min(chunk_rows, slices.num_rows - lo)
        part = slices.slice(lo, n)

        def col(name: str, part: pa.Table = part) -> pa.Array:
            return text.combined(part.column(name))

        track = col("track")
        kind = kind_esc.take(kind_idx.slice(lo, n))
        category = pc.fill_null(cat_esc.take(cat_idx.slice(lo, n)), kind)
        args = _object([
            ("kind", kind),
            ("step", _id(col("step"))),
            ("correlation", _id(col("correlation"))),
            ("External id", _id(col("external_id"))),
            ("Input Dims", text.json_shapes(col("input_dims"))),
            ("Input type", text.json_string_lists(col("input_types"))),
            ("grid", text.json_int_lists(col("grid"))),
            ("block", text.json_int_lists(col("block"))),
            ("est. achieved occupancy %", _num(col("occupancy_pct"))),
            ("bytes", _num(col("bytes"))),
        ])
        events = text.concat(
            '{"ph":"X","name":', name_esc.take(name_idx.slice(lo, n)),
            ',"cat":', category,
            ',"pid":', track_pid.take(track), ',"tid":', track_tid.take(track),
            ',"ts":', us_text(pc.subtract(col("start_ns"), offset)),
            ',"dur":', us_text(col("dur_ns")),
            ',"args":', args, "}",
        )
        yield text.join_rows(events, ",\n")


def _flow_chunks(trace: Trace, lanes: _Lanes, offset: int, chunk_rows: int) -> Iterator[str]:
    flows = trace.flows
    if flows.num_rows == 0:
        return
    start = text.combined(trace.slices.column("start_ns"))
    track = text.combined(trace.slices.column("track"))
    track_pid = pa.array(lanes.track_pid).cast(pa.string())
    track_tid = pa.array(lanes.track_tid).cast(pa.string())
    kind_idx, kind_esc = _escaped_dictionary(flows.column("kind"))
    for lo in range(0, flows.num_rows, chunk_rows):
        n = min(chunk_rows, flows.num_rows - lo)
        part = flows.slice(lo, n)
        kind = kind_esc.take(kind_idx.slice(lo, n))
        flow_id = pa.array(np.arange(lo, lo + n, dtype=np.int64)).cast(pa.string())
        for phase, end in (('"s"', "src"), ('"f","bp":"e"', "dst")):
            rows = text.combined(part.column(end))
            at = track.take(rows)
            events = text.concat(
                '{"ph":', phase, ',"id":', flow_id, ',"cat":', kind, ',"name":', kind,
                ',"pid":', track_pid.take(at), ',"tid":', track_tid.take(at),
                ',"ts":', us_text(pc.subtract(start.take(rows), offset)), "}",
            )
            yield text.join_rows(events, ",\n")


def _memory_keys(trace: Trace) -> pa.Array:
    from perfsight.export.mindspore_csv import device_type_text

    memory = trace.memory
    return device_type_text(memory.column("device_type"), memory.column("device_index"))


def _memory_chunks(trace: Trace, lanes: _Lanes, keys: pa.Array, offset: int, chunk_rows: int
                   ) -> Iterator[str]:
    memory = trace.memory
    if memory.num_rows == 0:
        return
    names = list(lanes.memory_pid)
    pids = pa.array([lanes.memory_pid[k] for k in names], pa.int64()).cast(pa.string())
    pid = pids.take(pc.index_in(keys, value_set=pa.array(names, pa.string())))
    for lo in range(0, memory.num_rows, chunk_rows):
        n = min(chunk_rows, memory.num_rows - lo)
        part = memory.slice(lo, n)
        args = _object([
            ("Allocated", _num(bytes_to_mb(part.column("allocated_bytes")))),
            ("Reserved", _num(bytes_to_mb(part.column("reserved_bytes")))),
            ("Active", _num(bytes_to_mb(part.column("active_bytes")))),
        ])
        events = text.concat(
            '{"ph":"C","name":"Memory (MB)","pid":', pid.slice(lo, n), ',"tid":', pid.slice(lo, n),
            ',"ts":', us_text(pc.subtract(text.combined(part.column("ts_ns")), offset)),
            ',"args":', args, "}",
        )
        yield text.join_rows(events, ",\n")


def _overlap_chunks(overlap: pa.Table, lanes: _Lanes, offset: int, chunk_rows: int) -> Iterator[str]:
    if overlap.num_rows == 0:
        return
    lane_names = pa.array(OVERLAP_LANES, pa.string())
    lane_tid = pa.array([str(t) for t in lanes.overlap_tids], pa.string())
    lane_esc = text.json_strings(lane_names)
    for lo in range(0, overlap.num_rows, chunk_rows):
        part = overlap.slice(lo, min(chunk_rows, overlap.num_rows - lo))
        index = pc.index_in(text.combined(part.column("lane")), value_set=lane_names)
        start = text.combined(part.column("start_ns"))
        events = text.concat(
            '{"ph":"X","name":', lane_esc.take(index), ',"cat":"overlap"',
            f',"pid":{lanes.overlap_pid},"tid":', lane_tid.take(index),
            ',"ts":', us_text(pc.subtract(start, offset)),
            ',"dur":', us_text(pc.subtract(text.combined(part.column("end_ns")), start)),
            ',"args":{}}',
        )
        yield text.join_rows(events, ",\n")


def _write_blocks(handle: IO[str], blocks: Iterator[str], first: bool) -> bool:
    for block in blocks:
        if not block:
            continue
        if not first:
            handle.write(",\n")
        handle.write(block)
        first = False
    return first


def write_trace_view(path: str | Path, trace: Trace, overlap: pa.Table | None = None,
                     chunk_rows: int = CHUNK_ROWS) -> Path:
    """Write ``trace_view.json`` for ``trace`` at ``path`` and return the path.

    ``overlap`` is ``overlap_intervals(trace)``; it is computed here when not given.
    """
    if overlap is None:
        from perfsight.analysis.overlap import overlap_intervals

        overlap = overlap_intervals(trace)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    offset = time_offset_ns(trace, overlap)
    keys = _memory_keys(trace)
    lanes = _lanes(trace, sorted(pc.unique(keys).to_pylist()) if len(keys) else [])
    other = {"producer": "perfsight", "rank": trace.rank, "world_size": trace.meta.world_size,
             "perfsight_time_offset_ns": offset, "time_unit_of_ts": "us"}
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as handle:
        handle.write('{"displayTimeUnit":"ns","otherData":')
        handle.write(orjson.dumps(other).decode())
        handle.write(',"traceEvents":[\n')
        first = _write_blocks(handle, iter([",\n".join(orjson.dumps(m).decode() for m in lanes.metadata)]),
                              True)
        first = _write_blocks(handle, _slice_chunks(trace, lanes, offset, chunk_rows), first)
        first = _write_blocks(handle, _flow_chunks(trace, lanes, offset, chunk_rows), first)
        first = _write_blocks(handle, _memory_chunks(trace, lanes, keys, offset, chunk_rows), first)
        _write_blocks(handle, _overlap_chunks(overlap, lanes, offset, chunk_rows), first)
        handle.write("\n]}\n")
    tmp.replace(path)
    return path

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

The file is written in chunks of rows, each laid out by :class:`perfsight.export.text.TextRows`:
every distinct piece of text (a name escaped by orjson, a duration, a launch geometry, an event's
fixed keys) is made once, and the native library formats each row from those pieces and the
number columns straight into the chunk (without it, one Arrow ``take`` copies the pieces of all
rows into place: the same bytes), so memory stays bounded by :data:`PIECE_ROWS` rows and no
Python object is made per event.  This module must not compute analyses (it draws what
``overlap_intervals`` returns) and must not convert units except via ``units.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from perfsight import columns
from perfsight.export import text
from perfsight.heap import return_freed_memory
from perfsight.jsontext import json_strings, json_text
from perfsight.model import NO_ID, Trace
from perfsight.units import (
    NS_PER_S,
    NS_PER_US,
    bytes_to_mb,
    is_whole_us,
)
from perfsight.write_behind import open_written_behind

PIECE_ROWS = 65_536
"""Rows whose pieces (codes, numbers, distinct texts) are made at once, then written chunk by chunk:
large enough that making them costs little per row, small enough to bound the writer's memory."""

CHUNK_ROWS = 8_192
"""Events written per chunk (at most; a chunk is also at most 4 MiB): with :data:`PIECE_ROWS`,
bounds the writer's memory whatever the trace size.  8K rows rather than 16K: the trace view runs
beside the CSV writers and the timeline index, where the run's peak is reached; 3 MB lower peak
on both shared Kineto traces at the same CPU (docs/BENCHMARKS.md)."""

OVERLAP_PROCESS = "Overlap Analysis"
OVERLAP_LANES = ("Computing", "Communication", "Communication(Not Overlapped)", "Free")

EXACT_US_LIMIT = 2**43
"""Below this many µs a double's spacing is under 1 ns, so absolute timestamps lose nothing."""
WHOLE_US_LIMIT = 2**53
"""Below this many µs a double holds every whole microsecond exactly."""

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
        start = columns.int64(slices.column("start_ns"))
        yield start
        yield start + columns.int64(slices.column("dur_ns"))
    if trace.memory.num_rows:
        yield columns.int64(trace.memory.column("ts_ns"))
    if overlap is not None and overlap.num_rows:
        yield columns.int64(overlap.column("start_ns"))
        yield columns.int64(overlap.column("end_ns"))


def time_offset_ns(trace: Trace, overlap: pa.Table | None = None) -> int:
    """The nanoseconds subtracted from every timestamp: 0 unless doubles would lose precision."""
    return offset_of(_timestamps(trace, overlap))


def offset_of(timestamps: Iterable[np.ndarray]) -> int:
    """:func:`time_offset_ns` of every timestamp (ns) the file will hold, given an array at a time."""
    span = TimeSpan()
    for values in timestamps:
        span.add(values)
    return span.offset_ns()


class TimeSpan:
    """What the time offset depends on, gathered an array of timestamps at a time (the chunked
    writer adds each chunk's): the lowest, the largest magnitude, and whether all are whole µs."""

    def __init__(self) -> None:
        self.low: int | None = None
        self.high = 0
        self.whole_us = True

    def add(self, values: np.ndarray) -> None:
        if not len(values):
            return
        self.low = int(values.min()) if self.low is None else min(self.low, int(values.min()))
        self.high = max(self.high, int(np.abs(values).max()))
        self.whole_us = self.whole_us and is_whole_us(values)

    def offset_ns(self) -> int:
        """The nanoseconds subtracted from every timestamp (see the module docstring)."""
        if self.low is None:
            return 0
        exact = self.high < EXACT_US_LIMIT * NS_PER_US
        if exact or (self.whole_us and self.high < WHOLE_US_LIMIT * NS_PER_US):
            return 0
        return (self.low // NS_PER_S) * NS_PER_S


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
        metadata.append(
            {
                "ph": "M",
                "name": "process_sort_index",
                "pid": pid,
                "tid": 0,
                "args": {"sort_index": sort_index},
            }
        )
        metadata.append(
            {"ph": "M", "name": "process_labels", "pid": pid, "tid": 0, "args": {"labels": f"rank {rank}"}}
        )

    def thread(pid: int, tid: int, name: str, sort_index: int) -> None:
        metadata.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
        metadata.append(
            {
                "ph": "M",
                "name": "thread_sort_index",
                "pid": pid,
                "tid": tid,
                "args": {"sort_index": sort_index},
            }
        )

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


# ---------------------------------------------------------------------------------------------
# Events as text, one chunk of rows at a time (see ``text.TextRows``).  Every event starts with its
# separator (",\n"): the metadata events always come first, so chunks are written as they are.
# A chunk is valid until the next is drawn (``TextRows.chunks``): write it before drawing the next.


def _escaped_dictionary(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, list[str]]:
    """(per-row codes, JSON-escaped text per code) of a string column, escaped once per value;
    a null row gets code ``-1``."""
    arr = text.combined(column)
    if not pa.types.is_dictionary(arr.type):
        arr = pc.dictionary_encode(arr.cast(pa.string()))
    escaped = json_strings(arr.dictionary.cast(pa.string())).to_pylist()
    return columns.numpy(arr.indices, -1), escaped


def _num(values: pa.Array) -> pa.Array:
    """Numbers as JSON number text; null, NaN and infinities become null (then omitted)."""
    if pa.types.is_floating(values.type):
        values = pc.if_else(pc.is_finite(values), values, pa.nulls(len(values), values.type))
    return values.cast(pa.string())


def _ids(values: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Integer ids and where they are set (``NO_ID`` is no id: its key is then left out)."""
    ids = columns.int64(values, NO_ID)
    return ids, ids != NO_ID


def _json_list(values: pa.Array) -> pa.Array:
    return json_text(values, sep=",")


def _mb(values: pa.Array) -> pa.Array:
    return _num(bytes_to_mb(values))


def _spans(n: int) -> Iterator[tuple[int, int]]:
    """``(lo, hi)`` row ranges of at most :data:`PIECE_ROWS` rows covering ``0..n``."""
    return ((lo, min(lo + PIECE_ROWS, n)) for lo in range(0, n, PIECE_ROWS))


def slice_events(
    slices: pa.Table, lanes: _Lanes, offset: int, chunk_rows: int = CHUNK_ROWS
) -> Iterator[memoryview]:
    """The ``X`` events of ``slices`` (any run of the trace's slices, in their order)."""
    name_code, name_esc = _escaped_dictionary(slices.column("name"))
    kind_code, kind_esc = _escaped_dictionary(slices.column("kind"))
    cat_code, cat_esc = _escaped_dictionary(slices.column("category"))
    heads = pa.array([',\n{"ph":"X","name":' + name for name in name_esc], pa.string())
    cats = [',"cat":' + c for c in cat_esc + kind_esc]  # no category: the kind
    lane_text = _lane_texts(lanes)
    for lo, hi in _spans(slices.num_rows):
        part = slices.slice(lo, hi - lo)
        kind = kind_code[lo:hi]
        rows = text.TextRows(hi - lo)
        rows.add_choice(name_code[lo:hi], heads)
        rows.add_choice(np.where(cat_code[lo:hi] >= 0, cat_code[lo:hi], len(cat_esc) + kind), cats)
        rows.add_choice(columns.numpy(part.column("track")), lane_text)
        rows.add_micros(columns.int64(part.column("start_ns")) - offset)
        rows.add(',"dur":')
        rows.add_micros(columns.int64(part.column("dur_ns")), few=True)  # durations repeat
        rows.add(',"args":')
        rows.open_object()
        rows.add_member("kind", (kind, kind_esc))
        rows.add_int_member("step", *_ids(part.column("step")), few=True)
        rows.add_int_member("correlation", *_ids(part.column("correlation")))
        rows.add_int_member("External id", *_ids(part.column("external_id")))
        for key, column in SLICE_LIST_ARGS:  # few distinct values: each text is made once
            rows.add_member(key, text.distinct_texts(part.column(column), _json_list))
        rows.add_member("est. achieved occupancy %", text.distinct_texts(part.column("occupancy_pct"), _num))
        nbytes = part.column("bytes")
        rows.add_int_member("bytes", columns.int64(nbytes, 0), columns.valid(nbytes), few=True)
        rows.close_object()
        rows.add("}")
        yield from rows.chunks(chunk_rows)


SLICE_LIST_ARGS = (
    ("Input Dims", "input_dims"),
    ("Input type", "input_types"),
    ("Concrete Inputs", "concrete_inputs"),
    ("grid", "grid"),
    ("block", "block"),
)
"""The ``args`` keys of a slice's list columns, in the order they are written."""


def _lane_texts(lanes: _Lanes) -> list[str]:
    """Per track: its output pid and tid, up to the timestamp's key."""
    return [f',"pid":{p},"tid":{t},"ts":' for p, t in zip(lanes.track_pid, lanes.track_tid, strict=True)]


def _flow_chunks(trace: Trace, lanes: _Lanes, offset: int, chunk_rows: int) -> Iterator[memoryview]:
    flows = trace.flows
    start = columns.numpy(trace.slices.column("start_ns"))
    track = columns.numpy(trace.slices.column("track"))
    for phase, end in FLOW_PHASES:  # every start, then every finish
        at = columns.int64(flows.column(end))
        for lo, hi in _spans(flows.num_rows):
            ids = np.arange(lo, hi, dtype=np.int64)
            kind = flows.column("kind").slice(lo, hi - lo)
            rows = _flow_rows(phase, ids, kind, track[at[lo:hi]], start[at[lo:hi]], lanes, offset)
            yield from rows.chunks(chunk_rows)


FLOW_PHASES = (('"s"', "src"), ('"f","bp":"e"', "dst"))
"""Each flow's two events, the phase text and the end it binds to: all starts are written first."""


def flow_events(
    phase: str,
    ids: np.ndarray,
    kind: pa.ChunkedArray | pa.Array,
    track: np.ndarray,
    start_ns: np.ndarray,
    lanes: _Lanes,
    offset: int,
) -> memoryview:
    """One ``phase`` event per flow: its row in the trace's flows (``ids``), its kind, and the
    track and start of the slice it binds to."""
    return _flow_rows(phase, ids, kind, track, start_ns, lanes, offset).to_bytes()


def _flow_rows(
    phase: str,
    ids: np.ndarray,
    kind: pa.ChunkedArray | pa.Array,
    track: np.ndarray,
    start_ns: np.ndarray,
    lanes: _Lanes,
    offset: int,
) -> text.TextRows:
    kind_code, kind_esc = _escaped_dictionary(kind)
    kinds = [f',"cat":{k},"name":{k}' for k in kind_esc]
    rows = text.TextRows(len(ids))
    rows.add(',\n{"ph":' + phase + ',"id":')
    rows.add_ints(ids)
    rows.add_choice(kind_code, kinds)
    rows.add_choice(track, _lane_texts(lanes))
    rows.add_micros(start_ns - offset)
    rows.add("}")
    return rows


def memory_keys(memory: pa.Table) -> pa.Array:
    """Each allocator row's device text ("CUDA:0"): one counter process per distinct text."""
    from perfsight.export.mindspore_csv import device_type_text

    return device_type_text(memory.column("device_type"), memory.column("device_index"))


def memory_events(
    memory: pa.Table, lanes: _Lanes, keys: pa.Array, offset: int, chunk_rows: int = CHUNK_ROWS
) -> Iterator[memoryview]:
    """The ``C`` events of ``memory`` (any run of the trace's allocator rows; ``keys``: theirs)."""
    heads = [
        f',\n{{"ph":"C","name":"Memory (MB)","pid":{pid},"tid":{pid},"ts":'
        for pid in lanes.memory_pid.values()
    ]
    head_code = columns.int64(pc.index_in(keys, value_set=pa.array(list(lanes.memory_pid), pa.string())))
    ts = columns.int64(memory.column("ts_ns"))
    for lo, hi in _spans(memory.num_rows):
        part = memory.slice(lo, hi - lo)
        rows = text.TextRows(hi - lo)
        rows.add_choice(head_code[lo:hi], heads)
        rows.add_micros(ts[lo:hi] - offset)
        rows.add(',"args":')
        rows.open_object()
        for key, column in (
            ("Allocated", "allocated_bytes"),
            ("Reserved", "reserved_bytes"),
            ("Active", "active_bytes"),
        ):
            rows.add_member(key, text.distinct_texts(part.column(column), _mb))
        rows.close_object()
        rows.add("}")
        yield from rows.chunks(chunk_rows)


def overlap_events(
    overlap: pa.Table, lanes: _Lanes, offset: int, chunk_rows: int = CHUNK_ROWS
) -> Iterator[memoryview]:
    """The ``X`` events of the overlap lanes for ``overlap`` (any run of ``overlap_intervals``)."""
    lane_names = pa.array(OVERLAP_LANES, pa.string())
    heads = [
        f',\n{{"ph":"X","name":{orjson.dumps(lane).decode()},"cat":"overlap"'
        f',"pid":{lanes.overlap_pid},"tid":{tid},"ts":'
        for lane, tid in zip(OVERLAP_LANES, lanes.overlap_tids, strict=True)
    ]
    lane_code = columns.int64(pc.index_in(text.combined(overlap.column("lane")), value_set=lane_names))
    start = columns.int64(overlap.column("start_ns"))
    end = columns.int64(overlap.column("end_ns"))
    for lo, hi in _spans(overlap.num_rows):
        rows = text.TextRows(hi - lo)
        rows.add_choice(lane_code[lo:hi], heads)
        rows.add_micros(start[lo:hi] - offset)
        rows.add(',"dur":')
        rows.add_micros(end[lo:hi] - start[lo:hi])
        rows.add(',"args":{}}')
        yield from rows.chunks(chunk_rows)


def write_trace_view(
    path: str | Path, trace: Trace, overlap: pa.Table | None = None, chunk_rows: int = CHUNK_ROWS
) -> Path:
    """Write ``trace_view.json`` for ``trace`` at ``path`` and return the path.

    ``overlap`` is ``overlap_intervals(trace)``; it is computed here when not given.
    """
    if overlap is None:
        from perfsight.analysis.overlap import overlap_intervals

        overlap = overlap_intervals(trace)
    offset = time_offset_ns(trace, overlap)
    keys = memory_keys(trace.memory)
    lanes = view_lanes(trace, sorted(pc.unique(keys).to_pylist()) if len(keys) else [])
    return write_events(
        path,
        trace,
        lanes,
        offset,
        (
            slice_events(trace.slices, lanes, offset, chunk_rows),
            _flow_chunks(trace, lanes, offset, chunk_rows),
            memory_events(trace.memory, lanes, keys, offset, chunk_rows),
            overlap_events(overlap, lanes, offset, chunk_rows),
        ),
    )


def view_lanes(trace: Trace, memory_devices: list[str]) -> _Lanes:
    """The output pids/tids of ``trace``'s tracks (a chunk has them all) and of the counter
    processes of ``memory_devices`` (every distinct :func:`memory_keys` text, sorted)."""
    return _lanes(trace, memory_devices)


def write_events(
    path: str | Path, trace: Trace, lanes: _Lanes, offset: int, parts: Iterable[Iterable[memoryview]]
) -> Path:
    """The file: its header from ``trace``'s metadata, the lanes' ``M`` events, then every
    event text of ``parts`` in order (slices, flow starts and finishes, memory, overlap)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    other = {
        "producer": "perfsight",
        "rank": trace.rank,
        "world_size": trace.meta.world_size,
        "perfsight_time_offset_ns": offset,
        "time_unit_of_ts": "us",
    }
    tmp = path.with_name(path.name + ".tmp")
    with open_written_behind(tmp) as handle:
        handle.write(b'{"displayTimeUnit":"ns","otherData":' + orjson.dumps(other) + b',"traceEvents":[\n')
        handle.write(b",\n".join(orjson.dumps(m) for m in lanes.metadata))  # never empty: see _lanes
        for chunks in parts:
            for chunk in chunks:
                handle.write(chunk)
        handle.write(b"\n]}\n")
    tmp.replace(path)
    return_freed_memory()  # the chunks' texts: gone before the next writer grows the heap
    return path

"""The timeline index: a rank's slices laid out so a window at screen resolution is read in O(W log n).

Why it exists: the web UI shows traces of any size, and a 10-million-event trace cannot be scanned
per request.  Within one *lane* (a track at one nesting depth) events do not overlap, so sorted by
start their ends are sorted too; a window query is then a binary search per pixel boundary rather
than a scan (see ``perfsight.server.timeline``).  The arrays are plain ``.npy`` files, opened
memory-mapped: the first view of a huge trace reads only the pages it touches.

Layout of ``{cache folder}/timeline/`` (all arrays in lane order: track, depth, start)::

    start.npy, dur.npy      int64   absolute ns
    end_max.npy             int64   running maximum of the end within the lane (equals the end
                                    where the lane has no overlap; a safe search key where it has)
    row.npy                 int32   row of the event in ``slices`` (the event id of the API;
                                    int64 only past 2**31 rows, as pos and flow_* below)
    name.npy                int32   index into names.idx
    kind.npy                int8    index into perfsight.model.KIND_NAMES
    pos.npy                 int32   inverse of row.npy: the position of slice row r
    flow_src.npy, flow_dst.npy  int32  positions of each flow's ends, ordered by source start
    flow_kind.npy           int8    index into meta.idx's flow_kinds
    names.idx               the distinct event names (JSON text)
    meta.idx                JSON text: lanes [{track, depth, offset, count, ordered, levels}],
                            extent, per-kind totals, and ``stamp``: the digest of the cache's
                            source.json it was built from

Level-of-detail pyramid (``lod_*.npy``, all levels of all lanes concatenated; a lane's
``levels`` are ``[k, offset, count]`` rows, finest first).  Level ``k`` is the lane as a window at
``2**k`` ns per pixel would show it, pixels aligned to multiples of ``2**k``: each event at least
``2**k`` long alone, each run of shorter ones starting in the same pixel merged into one entry.
Why: without it, a zoomed-out window of a 10-million-event trace costs a binary search per pixel
per lane plus scattered reads of every array (about 17 ms of CPU); with it, a window at ``px`` ns per
pixel reads the contiguous entries of the level just finer than ``px`` (at most about 4 per pixel)
and merges them once more to its own pixels.  Levels are built one from the previous one (merging
merged runs gives the same runs as merging the events), start at the first level that merges at
least a quarter of the lane's events, and stop when one pixel spans the lane; lanes of fewer than
``LEVEL_MIN_EVENTS`` events get none (a scan of them is as cheap).

    lod_start.npy, lod_end.npy  int64  absolute ns: first start, last end of the entry
    lod_end_max.npy         int64   running maximum of lod_end within the level (search key)
    lod_count.npy           int64   events merged (1: the event itself)
    lod_name.npy, lod_kind.npy, lod_row.npy   as name/kind/row, of the entry's first event

This module lays out data and holds the one merging rule (:func:`merge_runs`); choosing a level and
answering a window lives in the server.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from perfsight import columns, layout
from perfsight.model import KIND_NAMES, Trace
from perfsight.parquet_files import spill_options

FOLDER = "timeline"
FORMAT = 3
META = "meta.idx"  # JSON text; not named *.json, which trace discovery would take for a trace
NAMES = "names.idx"  # JSON list of the distinct event names
LOD_ARRAYS = ("lod_start", "lod_end", "lod_end_max", "lod_count", "lod_name", "lod_kind", "lod_row")
ARRAYS = (
    "start", "dur", "end_max", "row", "name", "kind", "pos", "flow_src", "flow_dst", "flow_kind", *LOD_ARRAYS
)  # fmt: skip
LEVEL_MIN_EVENTS = 4096
"""Lanes with fewer events get no pyramid: scanning a few thousand events is as fast as a level."""
LEVEL_MAX_RATIO = 0.75
"""The finest level kept is the first with at most this share of the lane's events."""


def stamp_of(cache_folder: Path) -> str:
    """A digest of the cache's ``source.json`` (empty when the cache has none)."""
    try:
        data = (Path(cache_folder) / layout.CACHE_SOURCE_FILE).read_bytes()
    except OSError:
        return ""
    return hashlib.sha256(data + f"/timeline{FORMAT}".encode()).hexdigest()[:16]


def is_current(cache_folder: Path) -> bool:
    """True when the index under ``cache_folder`` was built from the cache as it is now."""
    try:
        meta = json.loads((Path(cache_folder) / FOLDER / META).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return meta.get("stamp") == stamp_of(cache_folder) and all(
        (Path(cache_folder) / FOLDER / f"{name}.npy").is_file() for name in ARRAYS
    )


def _codes_and_values(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, list[Any]]:
    codes = columns.distinct_codes(column)
    values = columns.combined(column).take(pa.array(columns.first_rows(codes))).to_pylist()
    if pa.types.is_dictionary(columns.combined(column).type):
        values = [str(v) for v in values]
    return codes, values


def _save(folder: Path, name: str, array: np.ndarray) -> None:
    tmp = folder / f"{name}.tmp.npy"
    np.save(tmp, np.ascontiguousarray(array))
    tmp.replace(folder / f"{name}.npy")


def merge_runs(
    start: np.ndarray,
    end: np.ndarray,
    count: np.ndarray | None,
    bucket: np.ndarray,
    px: float,
    ordered: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The level-of-detail rule, for entries in start order: ``(heads, counts, ends)``.

    A single event (``count`` 1; ``None`` means all are single) at least ``px`` long stays alone;
    each run of other entries in the same ``bucket`` (pixel) becomes one entry: ``heads`` indexes its
    first entry, ``counts`` sums the events merged, ``ends`` is the latest end.  Both the pyramid
    (aligned buckets) and the server (the request's own pixels) use it, so they cannot disagree.
    In an ``ordered`` lane (no overlaps) ends rise with starts, so a run's end is its last one's:
    ``np.maximum.reduceat`` costs ~0.1 us per run, more than all the rest on a dense window.
    """
    n = len(start)
    if n == 0:
        empty = np.zeros(0, np.int64)
        return empty, empty, empty
    long = end - start >= px
    if count is not None:
        long &= count == 1
    brk = np.empty(n, bool)
    brk[0] = True
    brk[1:] = long[1:] | long[:-1] | (bucket[1:] != bucket[:-1])
    heads = np.flatnonzero(brk)
    tails = np.empty_like(heads)
    tails[:-1] = heads[1:] - 1
    tails[-1] = n - 1
    if count is None:
        counts = tails - heads + 1
    else:
        total = np.cumsum(count)
        counts = total[tails] - total[heads] + count[heads]
    ends = end[tails] if ordered else np.maximum.reduceat(end, heads)
    return heads, counts.astype(np.int64, copy=False), ends


def _lane_levels(
    start: np.ndarray, end: np.ndarray, ordered: bool, min_events: int
) -> list[tuple[int, dict[str, np.ndarray]]]:
    """The pyramid of one lane: ``[(k, {start, end, count, first})]`` (``first``: lane position of
    each entry's first event), finest first.  See the module docstring."""
    n = len(start)
    if n < max(2, min_events):
        return []
    extent = int(end.max() - start.min())
    # below about the mean spacing nearly nothing merges: start a little under it
    k = max(0, int(np.log2(max(1, extent // n))) - 2)
    cur_start, cur_end, cur_count = start, end, np.ones(n, np.int64)
    cur_first = np.arange(n, dtype=np.int64)
    levels: list[tuple[int, dict[str, np.ndarray]]] = []
    while True:
        size = 1 << k
        heads, counts, ends = merge_runs(cur_start, cur_end, cur_count, cur_start >> k, size, ordered)
        cur_start, cur_end, cur_count, cur_first = cur_start[heads], ends, counts, cur_first[heads]
        if levels or len(heads) <= LEVEL_MAX_RATIO * n:
            levels.append((k, {"start": cur_start, "end": cur_end, "count": cur_count, "first": cur_first}))
        if size > extent or len(heads) <= 1:
            return levels
        k += 1


def write_timeline_index(
    trace: Trace, cache_folder: str | Path, *, level_min_events: int = LEVEL_MIN_EVENTS
) -> Path:
    """Build and save the index of ``trace`` under ``cache_folder/timeline``; return that folder.

    Call it after the cache is saved (the stamp ties the index to that cache's sources).
    ``level_min_events``: lanes with fewer events get no level-of-detail pyramid.  Each array is
    saved as soon as it is final and then dropped: the pipeline writes this beside other writers,
    and holding every array to the end would add a dozen row-sized arrays to their peak.
    """
    cache_folder = Path(cache_folder)
    folder = cache_folder / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    (folder / META).unlink(missing_ok=True)  # not current while being rewritten
    slices = trace.slices
    n = slices.num_rows
    ids = np.int32 if n < 2**31 else np.int64  # row numbers: half the bytes on any real trace
    track = columns.numpy(slices.column("track"))
    depth = columns.numpy(slices.column("depth"))
    start = columns.int64(slices.column("start_ns"))
    order = np.lexsort((start, depth, track)) if n else np.zeros(0, np.int64)
    s_start = start[order]
    del start
    s_dur = np.maximum(columns.int64(slices.column("dur_ns")), 0)[order]
    s_end = s_start + s_dur
    kinds_sorted = _kinds_sorted(slices.column("kind"), order)
    counts = np.bincount(kinds_sorted, minlength=len(KIND_NAMES))
    totals = np.bincount(kinds_sorted, weights=s_dur, minlength=len(KIND_NAMES))
    _save(folder, "start", s_start)
    _save(folder, "dur", s_dur)
    del s_dur
    _save(folder, "kind", kinds_sorted)
    name_codes, names = _codes_and_values(slices.column("name")) if n else (np.zeros(0, np.int64), [])
    name_sorted = name_codes[order].astype(np.int32)
    del name_codes
    _save(folder, "name", name_sorted)
    row = order.astype(ids)
    _save(folder, "row", row)
    lane_key = track[order].astype(np.int64) * 65536 + depth[order]
    bounds = np.flatnonzero(np.diff(lane_key)) + 1 if n else np.zeros(0, np.int64)
    del lane_key
    offsets = np.concatenate([[0], bounds, [n]]).astype(np.int64) if n else np.zeros(1, np.int64)
    end_max = np.empty_like(s_end)
    lanes = []
    lod_parts: list[dict[str, np.ndarray]] = []
    lod_total = 0
    for a, b in zip(offsets[:-1], offsets[1:], strict=True):
        np.maximum.accumulate(s_end[a:b], out=end_max[a:b])
        lane, parts = _lane(
            int(track[order[a]]),
            int(depth[order[a]]),
            int(a),
            s_start[a:b],
            s_end[a:b],
            lod_total,
            level_min_events,
        )
        lanes.append(lane)
        lod_parts += parts
        lod_total += sum(len(level["start"]) for level in parts)
    _save(folder, "end_max", end_max)
    del end_max
    first = _save_levels(folder, lod_parts)
    del lod_parts
    _save(folder, "lod_name", name_sorted[first])
    _save(folder, "lod_kind", kinds_sorted[first])
    _save(folder, "lod_row", row[first])
    del name_sorted, kinds_sorted, row, first
    pos = np.empty(n, ids)
    pos[order] = np.arange(n, dtype=ids)
    del order
    _save(folder, "pos", pos)
    flow_kinds = _save_flows(folder, trace.flows, pos, s_start)
    first_ns, last_ns = (int(s_start.min()), int(s_end.max())) if n else (0, 0)
    _finish(cache_folder, trace.rank, names, n, first_ns, last_ns, lanes, flow_kinds, counts, totals)
    return folder


def _lane(
    track: int, depth: int, offset: int, start: np.ndarray, end: np.ndarray, lod_total: int, min_events: int
) -> tuple[dict[str, Any], list[dict[str, np.ndarray]]]:
    """One lane's entry of meta.idx and its pyramid levels (``first`` as index positions), given the
    lane's starts and ends in lane order; ``lod_total``: the pyramid entries of the lanes before it."""
    ordered = bool(len(start) < 2 or np.all(start[1:] >= end[:-1]))
    levels, parts = [], []
    for k, level in _lane_levels(start, end, ordered, min_events):
        level["first"] += offset
        parts.append(level)
        levels.append([k, lod_total, len(level["start"])])
        lod_total += len(level["start"])
    lane = {"track": track, "depth": depth, "offset": offset, "count": len(start), "ordered": ordered}
    return {**lane, "levels": levels}, parts


def _finish(
    cache_folder: Path,
    rank: int,
    names: list[Any],
    n: int,
    first_ns: int,
    last_ns: int,
    lanes: list[dict[str, Any]],
    flow_kinds: list[Any],
    counts: np.ndarray,
    totals: np.ndarray,
) -> None:
    """names.idx, then meta.idx (written last: a half-written index is never current)."""
    folder = cache_folder / FOLDER
    tmp = folder / (NAMES + ".tmp")
    tmp.write_text(json.dumps(names, ensure_ascii=False), encoding="utf-8")
    tmp.replace(folder / NAMES)
    meta = {
        "format": FORMAT,
        "rank": rank,
        "events": int(n),
        "first_ns": first_ns,
        "last_ns": last_ns,
        "lanes": lanes,
        "flow_kinds": [str(k) for k in flow_kinds],
        "by_kind": [
            {"kind": KIND_NAMES[i], "count": int(counts[i]), "total_ns": int(totals[i])}
            for i in range(len(KIND_NAMES))
            if counts[i]
        ],
        "stamp": stamp_of(cache_folder),
    }
    tmp = folder / (META + ".tmp")
    tmp.write_text(json.dumps(meta), encoding="utf-8")
    tmp.replace(folder / META)


def _kinds_sorted(kind: pa.ChunkedArray, order: np.ndarray) -> np.ndarray:
    """Each slice's index into ``KIND_NAMES``, in lane order (int8)."""
    if not len(order):
        return np.zeros(0, np.int8)
    return kind_index(kind)[order]


def kind_index(kind: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Each slice's index into ``KIND_NAMES`` (int8; an unknown kind: the last one)."""
    kind_codes, kind_values = _codes_and_values(kind)
    kind_map = np.array(
        [KIND_NAMES.index(k) if k in KIND_NAMES else len(KIND_NAMES) - 1 for k in kind_values], np.int8
    )
    return kind_map[kind_codes]


def _save_flows(folder: Path, flows: pa.Table, pos: np.ndarray, s_start: np.ndarray) -> list[Any]:
    """flow_src/flow_dst (positions of each flow's ends, by source start) and flow_kind; returns
    the distinct flow kinds ``flow_kind`` indexes."""
    if flows.num_rows:
        f_src = pos[columns.int64(flows.column("src"))]
        f_dst = pos[columns.int64(flows.column("dst"))]
        f_kind, flow_kinds = _codes_and_values(flows.column("kind"))
        by_start = np.argsort(s_start[f_src], kind="stable")
        f_src, f_dst, f_kind = f_src[by_start], f_dst[by_start], f_kind[by_start]
    else:
        f_src = f_dst = f_kind = np.zeros(0, np.int64)
        flow_kinds = []
    _save(folder, "flow_src", f_src.astype(pos.dtype))
    _save(folder, "flow_dst", f_dst.astype(pos.dtype))
    _save(folder, "flow_kind", f_kind.astype(np.int8))
    return flow_kinds


def _save_levels(folder: Path, parts: list[dict[str, np.ndarray]]) -> np.ndarray:
    """Save all levels of all lanes as flat ``lod_*`` arrays, one at a time, with each level's
    running maximum of ends; return each entry's first event (lane position) for the rest."""
    if not parts:
        empty = np.zeros(0, np.int64)
        for key in ("start", "end", "end_max", "count"):
            _save(folder, f"lod_{key}", empty)
        return empty
    for key in ("start", "end", "count"):
        _save(folder, f"lod_{key}", np.concatenate([p[key] for p in parts]))
    _save(folder, "lod_end_max", np.concatenate([np.maximum.accumulate(p["end"]) for p in parts]))
    return np.concatenate([p["first"] for p in parts])


CHUNK_ROWS = 1 << 18
"""Entries per piece of a whole-array scan (:meth:`TimelineArrays.chunks`): 1-2 MB an array, about
10 MB with the temporaries of a flow or search scan."""


class TimelineArrays:
    """The saved index of one rank, memory-mapped (opening it reads only meta.idx and names.idx).

    Lookups (binary searches, a window's entries) use the mapped arrays and touch only the pages
    they read; a scan of a whole array (search over every event's name, the flows of a window)
    reads it in pieces with :meth:`chunks` instead, so that no scan leaves the whole array
    resident in the server: its memory stays the same for a trace of any size."""

    def __init__(self, cache_folder: str | Path) -> None:
        folder = Path(cache_folder) / FOLDER
        self.folder = folder
        self.meta: dict[str, Any] = json.loads((folder / META).read_text(encoding="utf-8"))
        self.names: list[str] = json.loads((folder / NAMES).read_text(encoding="utf-8"))
        for name in ARRAYS:
            # a plain ndarray over the mapped file: slicing a np.memmap costs more than the search
            setattr(self, name, np.asarray(np.load(folder / f"{name}.npy", mmap_mode="r")))

    def chunks(self, *names: str, rows: int | None = None) -> Iterator[tuple[int, list[np.ndarray]]]:
        """``(first position, [piece of each array])`` over the arrays ``names`` (of one length),
        ``rows`` (default :data:`CHUNK_ROWS`) entries at a time, read from their files into memory
        of their own (the mapping's pages are not touched, so a scan leaves nothing resident)."""
        rows = rows or CHUNK_ROWS
        with contextlib.ExitStack() as stack:
            files = []
            for name in names:
                handle = stack.enter_context(open(self.folder / f"{name}.npy", "rb"))
                major, _ = np.lib.format.read_magic(handle)
                if major == 1:
                    shape, fortran, dtype = np.lib.format.read_array_header_1_0(handle)
                else:
                    shape, fortran, dtype = np.lib.format.read_array_header_2_0(handle)
                if fortran or len(shape) != 1:
                    raise ValueError(f"{self.folder / name}.npy: not a flat array")
                files.append((handle, dtype, shape[0]))
            total = min((n for _, _, n in files), default=0)
            for first in range(0, total, rows):
                count = min(rows, total - first)
                yield first, [np.fromfile(handle, dtype, count) for handle, dtype, _ in files]

    start: np.ndarray
    dur: np.ndarray
    end_max: np.ndarray
    row: np.ndarray
    name: np.ndarray
    kind: np.ndarray
    pos: np.ndarray
    flow_src: np.ndarray
    flow_dst: np.ndarray
    flow_kind: np.ndarray
    lod_start: np.ndarray
    lod_end: np.ndarray
    lod_end_max: np.ndarray
    lod_count: np.ndarray
    lod_name: np.ndarray
    lod_kind: np.ndarray
    lod_row: np.ndarray


# ---------------------------------------------------------------------------------------------
# The same index from slices spilled to disk (the chunked writers: a trace larger than memory)

SPILLED_SLICE_COLUMNS = ("row", "track", "depth", "start_ns", "dur_ns", "kind", "name")
"""What :func:`write_timeline_index_spilled` reads per slice: its row in ``slices``, its lane and
times, its :func:`kind_index` and its code into the names list."""
SPILLED_FLOW_COLUMNS = ("row", "src", "dst", "kind", "src_start_ns")
"""Per flow: its row in ``flows``, its ends' slice rows, its code into the flow kinds, its source's start."""


class _NpyStream:
    """A 1-D ``.npy`` file written a piece at a time, byte-identical to ``np.save`` of the whole.

    Why the header is written first and rewritten at the end: NumPy pads a header so that its
    shape may grow to 21 digits in place, so the header of the final count fits where the
    header of count 0 was.  The values then go straight into the file, once: the index of a
    10 GB trace is about 3.5 GB, and writing it to a body file and copying that after the header
    wrote and read it all a second time."""

    def __init__(self, folder: Path, name: str, dtype: np.dtype | type) -> None:
        self.path = folder / f"{name}.npy"
        self.tmp = self.path.with_name(self.path.stem + ".tmp.npy")
        self.dtype = np.dtype(dtype)
        self.handle = self.tmp.open("wb")
        self.header_bytes = self._write_header(0)
        self.count = 0

    def add(self, values: np.ndarray) -> None:
        self.handle.write(np.ascontiguousarray(values, dtype=self.dtype))
        self.count += len(values)

    def close(self) -> None:
        self.handle.seek(0)
        length = self._write_header(self.count)
        self.handle.close()
        if length != self.header_bytes:  # a 1-D header stays 128 bytes up to 60 digits
            raise RuntimeError(f"{self.path}: the .npy header of {self.count} values changed length")
        self.tmp.replace(self.path)

    def _write_header(self, count: int) -> int:
        """Write the header of ``count`` values at the file's position; return its length."""
        header = {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False}
        start = self.handle.tell()
        np.lib.format.write_array_header_1_0(self.handle, {**header, "shape": (count,)})
        return self.handle.tell() - start


def write_timeline_index_spilled(
    cache_folder: str | Path,
    rank: int,
    slice_files: list[Path],
    flow_files: list[Path],
    names: list[Any],
    flow_kinds: list[Any],
    spill: Path,
    *,
    level_min_events: int = LEVEL_MIN_EVENTS,
    memory_limit: str | None = None,
) -> Path:
    """:func:`write_timeline_index` of a trace whose slices (``SPILLED_SLICE_COLUMNS``) and flows
    (``SPILLED_FLOW_COLUMNS``) are Parquet files: the same files, byte for byte.

    DuckDB sorts the slices into lane order within ``memory_limit`` (default
    ``external_sort.MEMORY_LIMIT``), spilling under ``spill``; they are then read a batch at a
    time, one lane held at once (its pyramid needs all of it: the memory of the largest lane).
    The inverse permutation and the flows' ends are two more DuckDB sorts.
    """
    import pyarrow.parquet as pq

    from perfsight.store.external_sort import MEMORY_LIMIT, connect, files, quoted

    cache_folder = Path(cache_folder)
    folder = cache_folder / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    (folder / META).unlink(missing_ok=True)
    spill.mkdir(parents=True, exist_ok=True)
    con = connect(spill, memory_limit or MEMORY_LIMIT)
    n = sum(pq.ParquetFile(f).metadata.num_rows for f in slice_files)
    ids = np.int32 if n < 2**31 else np.int64
    out = {
        name: _NpyStream(folder, name, dtype)
        for name, dtype in (
            ("start", np.int64), ("dur", np.int64), ("end_max", np.int64), ("kind", np.int8),
            ("name", np.int32), ("row", ids), ("lod_start", np.int64), ("lod_end", np.int64),
            ("lod_end_max", np.int64), ("lod_count", np.int64), ("lod_name", np.int32),
            ("lod_kind", np.int8), ("lod_row", ids),
        )
    }  # fmt: skip
    counts = np.zeros(len(KIND_NAMES), np.int64)
    totals = np.zeros(len(KIND_NAMES), np.float64)
    lanes: list[dict[str, Any]] = []
    lod_total = 0
    first_ns = last_ns = None
    posmap = spill / "timeline_pos.parquet"

    def lane_done(parts: list[pa.RecordBatch], offset: int) -> int:
        """Write one lane (its batches in ``parts``, emptied here); return its event count."""
        nonlocal lod_total, first_ns, last_ns
        lane = pa.Table.from_batches(parts)
        track, depth = int(lane.column("track")[0].as_py()), int(lane.column("depth")[0].as_py())
        start = columns.int64(lane.column("start_ns"))
        dur = columns.int64(lane.column("dur_ns"))
        kind = columns.numpy(lane.column("kind")).astype(np.int8)
        name = columns.numpy(lane.column("name")).astype(np.int32)
        row = columns.int64(lane.column("row")).astype(ids)
        del lane
        parts.clear()  # the batches: only the arrays are held while the pyramid is built
        end = start + dur
        for key, values in (("start", start), ("dur", dur), ("kind", kind), ("name", name), ("row", row)):
            out[key].add(values)
        out["end_max"].add(np.maximum.accumulate(end))
        counts[:] += np.bincount(kind, minlength=len(KIND_NAMES))
        totals[:] += np.bincount(kind, weights=dur, minlength=len(KIND_NAMES))
        del dur
        first_ns = int(start.min()) if first_ns is None else min(first_ns, int(start.min()))
        last_ns = int(end.max()) if last_ns is None else max(last_ns, int(end.max()))
        entry, levels = _lane(track, depth, offset, start, end, lod_total, level_min_events)
        lanes.append(entry)
        for level in levels:
            local = level["first"] - offset
            for key in ("start", "end", "count"):
                out[f"lod_{key}"].add(level[key])
            out["lod_end_max"].add(np.maximum.accumulate(level["end"]))
            out["lod_name"].add(name[local])
            out["lod_kind"].add(kind[local])
            out["lod_row"].add(row[local])
            lod_total += len(level["start"])
        return len(start)

    query = (
        "SELECT row, track, depth, start_ns, greatest(dur_ns, 0) AS dur_ns, kind, name "
        f"FROM read_parquet({files(slice_files)}) ORDER BY track, depth, start_ns, row"
    )
    rows_and_positions = pa.schema([("row", pa.int64()), ("pos", pa.int64())])
    with pq.ParquetWriter(posmap, rows_and_positions, **spill_options(rows_and_positions)) as positions:
        done = flushed = 0
        lane_parts: list[pa.RecordBatch] = []
        lane_key = None
        reader = con.sql(query).to_arrow_reader(65_536) if n else iter(())
        for batch in reader:
            key = columns.int64(batch.column("track")) * 65536 + columns.int64(batch.column("depth"))
            bounds = np.flatnonzero(np.diff(key)) + 1
            cuts = [0, *bounds.tolist(), len(key)]
            for a, b in zip(cuts[:-1], cuts[1:], strict=True):
                if lane_key is not None and key[a] != lane_key:
                    flushed += lane_done(lane_parts, flushed)
                    lane_parts = []
                lane_key = key[a]
                lane_parts.append(batch.slice(a, b - a))
            rows = batch.column("row")
            positions.write_table(
                pa.table({"row": rows, "pos": pa.array(np.arange(done, done + len(key), dtype=np.int64))})
            )
            done += len(key)
        if lane_parts:
            lane_done(lane_parts, flushed)
    for stream in out.values():
        stream.close()
    pos = _NpyStream(folder, "pos", ids)
    if n:
        for batch in con.sql(f"SELECT pos FROM read_parquet({quoted(posmap)}) ORDER BY row").to_arrow_reader(
            65_536
        ):
            pos.add(columns.int64(batch.column("pos")))
    pos.close()
    flow = {name: _NpyStream(folder, name, dtype) for name, dtype in (
        ("flow_src", ids), ("flow_dst", ids), ("flow_kind", np.int8))}  # fmt: skip
    if flow_files:
        query = (
            "SELECT a.pos AS src, b.pos AS dst, f.kind AS kind "
            f"FROM read_parquet({files(flow_files)}) f "
            f"JOIN read_parquet({quoted(posmap)}) a ON f.src = a.row "
            f"JOIN read_parquet({quoted(posmap)}) b ON f.dst = b.row "
            "ORDER BY f.src_start_ns, f.row"
        )
        for batch in con.sql(query).to_arrow_reader(65_536):
            for key in ("src", "dst", "kind"):
                flow[f"flow_{key}"].add(columns.int64(batch.column(key)))
    for stream in flow.values():
        stream.close()
    con.close()
    posmap.unlink(missing_ok=True)
    _finish(
        cache_folder, rank, names, n, first_ns or 0, last_ns or 0, lanes, flow_kinds if flow_files else [],
        counts, totals,
    )  # fmt: skip
    return folder


class FirstSeenCodes:
    """Codes of a column given a batch at a time, numbered in order of first appearance over all
    batches: what the whole-trace index gives the whole column (``values`` is names.idx)."""

    def __init__(self) -> None:
        self.values: list[Any] = []
        self._code: dict[Any, int] = {}

    def add(self, column: pa.ChunkedArray | pa.Array) -> np.ndarray:
        """The codes of one batch's rows (-1 for null)."""
        if not len(column):
            return np.zeros(0, np.int64)
        codes, values = _codes_and_values(column)
        mapping = np.empty(len(values), np.int64)
        for i, value in enumerate(values):  # the batch's distinct values, not its rows
            if value not in self._code:
                self._code[value] = len(self.values)
                self.values.append(value)
            mapping[i] = self._code[value]
        return np.where(codes >= 0, mapping[np.maximum(codes, 0)], -1)

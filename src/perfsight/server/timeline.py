"""Timeline queries at screen resolution: level of detail, whole-trace search, details and flows.

Why level of detail: a window of a 10-million-event trace holds far more events than a 2,000-pixel
canvas can show, and sending them all would take seconds.  Within a *lane* (one track at one
nesting depth, see ``perfsight.store.timeline_index``) events do not overlap, so:

* a lane's visible range is two binary searches (on the running maximum of ends and on starts);
* zoomed out (``ns_per_px`` at least the lane's finest pyramid level), the entries of the pyramid
  level just finer than a pixel -- at most about four per pixel, contiguous in memory -- are merged
  once more to the window's own pixels with the index's one rule (``merge_runs``): long events
  alone, runs of shorter ones one block per pixel;
* zoomed in, a visible range of at most ``DIRECT_FACTOR`` events per pixel is merged the same way,
  scanning it; a longer one (no pyramid level that fine) is split by a binary search per pixel
  boundary, keeping each pixel's last event alone when it is a pixel or longer (in a
  non-overlapping lane only it can be);
* a lane with overlapping events (a trace whose nesting is inconsistent) is merged by scanning.

So every event at least a pixel long is always returned as itself, whatever the zoom, and a
response holds at most about two entries per pixel per lane; the work per lane is bounded by the
pixels, not by the trace.  Search scans the name dictionary, then one integer column of the whole
trace: it finds an event anywhere, not only in loaded windows.  Whole-column scans (search, a
window's flows, an event's flows) read the index in pieces (``TimelineArrays.chunks``), so the
server's memory does not grow with the trace.

The track list also says what a user needs to find their way: each track's label (rank, pipeline
stage, device, thread or stream) and every rank's profiled steps, which the viewer opens on and
marks; the window, flow and search queries can be limited to the ranks the viewer shows.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np

from perfsight.model import KIND_NAMES
from perfsight.server import queries
from perfsight.server.registry import LazyRanks, OpenedRun, RankData
from perfsight.server.runs import CLUSTER_OUTPUT_DIR
from perfsight.store.timeline_index import TimelineArrays, merge_runs

DIRECT_FACTOR = 4
"""A visible range of at most this many events per pixel is grouped by a scan, not by pixel search."""


TRACK_COLUMNS = ("track", "name", "is_device", "device_index", "stream", "pid", "tid")
"""The columns of a rank's ``tracks.parquet`` the track list shows."""


def track_list(opened: OpenedRun, rank: int | None) -> list[dict[str, Any]]:
    """Every track of the rank (all ranks when None), with its label, nesting depth and event count.

    Every rank of a job is listed without opening any (:func:`job_tracks`): the timeline page of
    one rank of a thousand-rank job asks for the job's tracks, and opening each rank's index for
    them took seconds."""
    if rank is None and isinstance(opened.ranks, LazyRanks):
        ranks = opened.ranks
        listed = ranks.once("job_tracks", lambda: job_tracks(opened, ranks))
        if listed is not None:
            return [dict(t) for t in listed]  # copies: a caller may change its rows
    out = []
    stages = rank_stages(opened.root)
    for data in _ranks(opened, rank):
        lanes = [(x["track"], x["depth"], x["count"]) for x in data.timeline.meta["lanes"]]
        out.extend(_rank_tracks(data.rank, stages.get(data.rank), lanes, data.tracks.to_pylist()))
    return out


def job_tracks(opened: OpenedRun, ranks: LazyRanks) -> list[dict[str, Any]] | None:
    """Every rank's tracks from one query over the ranks' ``tracks.parquet`` and the lanes their
    indexes listed when the run was opened; None when a rank's lanes are not known."""
    lanes = {r: ranks.lanes(r) for r in ranks}
    if any(v is None for v in lanes.values()):
        return None
    files = {str(ranks.cache_folder(r) / "tracks.parquet"): r for r in ranks}
    if not files:
        return []
    found = queries.arrow(
        f"SELECT filename, {', '.join(TRACK_COLUMNS)} FROM read_parquet(?, filename = true, "
        "file_row_number = true) ORDER BY filename, file_row_number",
        [list(files)],
    ).to_pylist()
    by_rank: dict[int, list[dict[str, Any]]] = {r: [] for r in ranks}
    for row in found:  # a row per track (tens per rank), not per event
        by_rank[files[row.pop("filename")]].append(row)
    stages = rank_stages(opened.root)
    out = []
    for r, rows in by_rank.items():  # rank order, each rank's tracks in its file's order
        out.extend(_rank_tracks(r, stages.get(r), lanes[r] or (), rows))
    return out


def _rank_tracks(
    rank: int, stage: int | None, lanes: Any, tracks: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """One rank's tracks with label, deepest lane and events (``lanes``: (track, depth, events))."""
    depth: dict[int, int] = {}
    count: dict[int, int] = {}
    for track, lane_depth, events in lanes:
        depth[track] = max(depth.get(track, 0), lane_depth)
        count[track] = count.get(track, 0) + events
    return [
        {
            "rank": rank,
            "track": row["track"],
            "name": row["name"],
            "label": track_label(rank, stage, row),
            "is_device": row["is_device"],
            "device_index": row["device_index"],
            "stream": row["stream"],
            "pid": row["pid"],
            "tid": row["tid"],
            "max_depth": depth.get(row["track"], 0),
            "events": count.get(row["track"], 0),
        }
        for row in tracks
    ]


def track_label(rank: int, stage: int | None, track: dict[str, Any]) -> str:
    """What a track is called on screen: where it runs, then the reader's name of the thread or stream
    ("rank 0 · stage 1 · thread 4242 (MainThread)", "rank 0 · device 0 · stream 7").  Why not the
    bare name: a job's tracks are all called "thread N" or "stream N"; only rank and stage tell
    them apart, and they come first so that a label cut short still says which rank it is."""
    parts = [f"rank {rank}"]
    if stage is not None:
        parts.append(f"stage {stage}")
    if track["is_device"] and track["device_index"] >= 0:
        parts.append(f"device {track['device_index']}")
    parts.append(str(track["name"]))
    return " · ".join(parts)


def rank_stages(root: Path | None) -> dict[int, int]:
    """Pipeline stage of each rank, from the job's cluster summary (its ``stages`` member, which the
    cluster analysis decides); empty for a run of one stage, or without a cross-rank analysis."""
    if root is None:
        return {}
    try:
        summary = json.loads((root / CLUSTER_OUTPUT_DIR / "cluster_summary.json").read_text(encoding="utf-8"))
        members = summary.get("stages") or {}
    except (OSError, ValueError, AttributeError):
        return {}
    if not isinstance(members, dict) or len(members) < 2:
        return {}
    try:
        return {int(r): int(stage) for stage, ranks in members.items() for r in ranks}
    except (TypeError, ValueError):
        return {}


def step_marks(opened: OpenedRun, ranks: set[int] | None) -> list[dict[str, Any]]:
    """Every profiled step of the chosen ranks (all when None), from the ``step_trace`` analysis table:
    its window on the step trace's own clock, relative to the run's origin.  One query over every
    rank's table, so a job of a thousand ranks costs one scan, not a thousand (and that scan once
    per opened analysis: the timeline page of each of its ranks asks for all)."""
    if ranks is None and isinstance(opened.ranks, LazyRanks):
        every = opened.ranks.once("step_marks", lambda: _step_marks(opened, None))
        return [dict(m) for m in every]
    return _step_marks(opened, ranks)


def _step_marks(opened: OpenedRun, ranks: set[int] | None) -> list[dict[str, Any]]:
    chosen = [r for r in sorted(opened.ranks) if ranks is None or r in ranks]
    paths = {r: opened.table_path(r, "step_trace") for r in chosen}  # no rank is opened for this
    files = {str(path): r for r, path in paths.items() if path.is_file()}
    if not files:
        return []
    origin = int(opened.origin_ns)
    found = queries.arrow(
        f"SELECT filename, step, start_ns - {origin} AS start_ns, end_ns - {origin} AS end_ns "
        "FROM read_parquet(?, filename = true)",
        [list(files)],
    )
    out = [
        {"rank": files[f], "step": step, "start_ns": start, "end_ns": end}
        for f, step, start, end in zip(*found.to_pydict().values(), strict=True)
    ]
    return sorted(out, key=lambda m: (m["rank"], m["step"]))


def steps_span(marks: list[dict[str, Any]]) -> dict[str, int] | None:
    """From the first step's start to the last step's end (None without steps): where the timeline
    opens, since the whole trace may hold a profiler-wide event many times longer than the steps."""
    if not marks:
        return None
    return {"start_ns": min(m["start_ns"] for m in marks), "end_ns": max(m["end_ns"] for m in marks)}


def _ranks(opened: OpenedRun, rank: int | None, ranks: set[int] | None = None) -> list[RankData]:
    if rank is not None:
        return [opened.rank(rank)]
    return [opened.ranks[r] for r in sorted(opened.ranks) if ranks is None or r in ranks]


@dataclasses.dataclass
class LaneWindow:
    """One lane's entries in a window: where they come from (raw arrays or a pyramid level) and
    ``pos`` (positions in those arrays of each entry's first event), ``count`` and ``end``."""

    from_level: bool
    pos: np.ndarray
    count: np.ndarray
    end: np.ndarray


def _level_for(lane: dict[str, Any], px: float) -> list[int] | None:
    """The coarsest pyramid level of ``lane`` at most ``px`` ns per pixel (``[k, offset, count]``):
    every event a pixel or longer is still alone there, and it has at most ~4 entries per pixel."""
    best = None
    for level in lane.get("levels", ()):
        if (1 << level[0]) > px:
            break
        best = level
    return best


def _lane_lod(ix: TimelineArrays, lane: dict[str, Any], ws: int, we: int, width: int) -> LaneWindow | None:
    """The level of detail of one lane in the window ``[ws, we)`` at ``width`` pixels."""
    px = (we - ws) / width
    level = _level_for(lane, px)
    if level is not None:
        a, b = level[1], level[1] + level[2]
        first = a + int(ix.lod_end_max[a:b].searchsorted(ws, side="right"))
        last = a + int(ix.lod_start[a:b].searchsorted(we, side="left"))
        if last <= first:
            return None
        return _merged(
            ix.lod_start[first:last],
            ix.lod_end[first:last],
            ix.lod_count[first:last],
            first,
            ws,
            px,
            lane["ordered"],
        )
    a, b = lane["offset"], lane["offset"] + lane["count"]
    first = a + int(ix.end_max[a:b].searchsorted(ws, side="right"))
    last = a + int(ix.start[a:b].searchsorted(we, side="left"))
    if last <= first:
        return None
    if last - first <= DIRECT_FACTOR * width or not lane["ordered"]:
        start = ix.start[first:last]
        return _merged(start, start + ix.dur[first:last], None, first, ws, px, lane["ordered"])
    return _per_pixel(ix, first, last, ws, px, width)


def _merged(
    start: np.ndarray,
    end: np.ndarray,
    count: np.ndarray | None,
    first: int,
    ws: int,
    px: float,
    ordered: bool,
) -> LaneWindow | None:
    """Merge a contiguous run of entries to the window's pixels (entries ending before ``ws`` --
    possible where a lane overlaps itself -- are left out)."""
    # in an ordered lane the search on ends already left out what ends before the window
    visible = None if ordered else end > ws
    if visible is not None and not visible.all():
        keep = np.flatnonzero(visible)
        if len(keep) == 0:
            return None
        start, end = start[keep], end[keep]
        count = None if count is None else count[keep]
    else:
        keep = None
    # multiply, not divide: float floor division is ~30x slower in NumPy
    bucket = np.maximum(np.floor((start - ws) * (1.0 / px)), -1)
    heads, counts, ends = merge_runs(start, end, count, bucket, px, ordered)
    pos = (heads if keep is None else keep[heads]) + first
    return LaneWindow(from_level=count is not None, pos=pos, count=counts, end=ends)


def _per_pixel(ix: TimelineArrays, first: int, last: int, ws: int, px: float, width: int) -> LaneWindow:
    """A long run of raw events (a lane without a pyramid level this fine): a binary search per pixel
    boundary splits it; in a non-overlapping lane only the last event of a pixel can be a pixel or
    longer (any later one of that pixel starts after it ends), so it stays alone and the rest of the
    pixel is merged."""
    starts = ix.start[first:last]
    # integer keys: float keys would make NumPy convert the whole int64 column on every search;
    # the first key, ``ws`` itself, gives the event that began before the window a group of its own
    bounds = ws + np.ceil(px * np.arange(0, width)).astype(np.int64)
    cut = np.concatenate([[0], starts.searchsorted(bounds, side="left"), [last - first]]) + first
    g_start, g_end = cut[:-1], cut[1:]
    nonempty = g_end > g_start
    g_start, g_end = g_start[nonempty], g_end[nonempty]
    tail = g_end - 1
    tail_long = ix.dur[tail] >= px
    cluster_last = np.where(tail_long, tail - 1, tail)
    has_cluster = cluster_last >= g_start
    single_pos = tail[tail_long]
    c_first = g_start[has_cluster]
    c_count = (cluster_last - g_start + 1)[has_cluster]
    pos = np.concatenate([c_first, single_pos])
    count = np.concatenate([c_count, np.ones(len(single_pos), np.int64)])
    end = np.concatenate([ix.end_max[cluster_last[has_cluster]], ix.start[single_pos] + ix.dur[single_pos]])
    order = np.argsort(pos, kind="stable")
    return LaneWindow(from_level=False, pos=pos[order], count=count[order], end=end[order])


def window(
    opened: OpenedRun,
    start_ns: int,
    end_ns: int,
    width: int,
    rank: int | None,
    tracks: set[tuple[int, int]] | None,
    ranks: set[int] | None = None,
) -> dict[str, Any]:
    """The ``/timeline/window`` response (column-wise lanes, names as a shared dictionary)."""
    origin = opened.origin_ns
    ws, we = origin + start_ns, origin + end_ns
    out_tracks: list[dict[str, Any]] = []
    names: list[str] = []
    events = 0
    for data in _ranks(opened, rank, ranks):
        ix = data.timeline
        by_track: dict[int, list[dict[str, Any]]] = {}
        rank_lanes: list[tuple[dict[str, Any], np.ndarray]] = []
        for lane in ix.meta["lanes"]:
            if tracks is not None and (data.rank, lane["track"]) not in tracks:
                continue
            got = _lane_lod(ix, lane, ws, we, width)
            if got is None:
                continue
            pos = got.pos
            if got.from_level:
                starts, kind, row, codes = (
                    ix.lod_start[pos],
                    ix.lod_kind[pos],
                    ix.lod_row[pos],
                    ix.lod_name[pos],
                )
            else:
                starts, kind, row, codes = ix.start[pos], ix.kind[pos], ix.row[pos], ix.name[pos]
            entry = {
                "depth": lane["depth"],
                "start_ns": starts - origin,
                "dur_ns": got.end - starts,
                "kind": kind,
                "id": row,
                "count": got.count,
            }
            rank_lanes.append((entry, codes))
            by_track.setdefault(lane["track"], []).append(entry)
        if rank_lanes:
            # one dictionary of the names used: a mark per distinct name, not a sort of every entry
            used = np.zeros(len(ix.names), bool)
            for _, codes in rank_lanes:
                used[codes] = True
            unique = np.flatnonzero(used)
            table = np.cumsum(used, dtype=np.int64) - 1 + len(names)
            names.extend([ix.names[c] for c in unique.tolist()])
            for entry, codes in rank_lanes:
                entry["name"] = table[codes]
                events += len(codes)
        for track_id in sorted(by_track):
            out_tracks.append({"rank": data.rank, "track": track_id, "lanes": by_track[track_id]})
    return {
        "start_ns": start_ns,
        "end_ns": end_ns,
        "width_px": width,
        "ns_per_px": (end_ns - start_ns) / width,
        "names": names,
        "events": events,
        "tracks": out_tracks,
    }


def _lane_of(ix: TimelineArrays, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(track, depth) of each index position."""
    lanes = ix.meta["lanes"]
    offsets = np.array([lane["offset"] for lane in lanes], np.int64)
    which = np.searchsorted(offsets, positions, side="right") - 1
    tracks = np.array([lane["track"] for lane in lanes], np.int64)
    depths = np.array([lane["depth"] for lane in lanes], np.int64)
    return tracks[which], depths[which]


def search(
    opened: OpenedRun, query: str, rank: int | None, offset: int, limit: int, ranks: set[int] | None = None
) -> tuple[int, list[dict[str, Any]]]:
    """Events whose name contains ``query`` (case-insensitive), over every event of the trace:
    ``(how many, the hits from offset to offset + limit by start)``; ties by start go to the lower
    rank, then to the event earlier in the index."""
    needle = query.lower()
    want = offset + limit
    total = 0
    candidates: list[tuple[int, int, int]] = []  # (start, rank, position)
    for data in _ranks(opened, rank, ranks):
        ix = data.timeline
        matching = np.array([needle in name.lower() for name in ix.names], bool)
        if not matching.any():
            continue
        count, positions, starts = _earliest_matches(ix, matching, want)
        total += count
        candidates.extend(zip(starts.tolist(), [data.rank] * len(starts), positions.tolist(), strict=True))
    candidates.sort()
    hits = []
    for start, r, pos in candidates[offset:want]:
        ix = opened.ranks[r].timeline
        track, depth = _lane_of(ix, np.array([pos]))
        hits.append(
            {
                "rank": r,
                "id": int(ix.row[pos]),
                "track": int(track[0]),
                "depth": int(depth[0]),
                "name": ix.names[int(ix.name[pos])],
                "start_ns": int(start) - opened.origin_ns,
                "dur_ns": int(ix.dur[pos]),
            }
        )
    return total, hits


def _earliest_matches(
    ix: TimelineArrays, matching: np.ndarray, want: int
) -> tuple[int, np.ndarray, np.ndarray]:
    """How many events have a name code ``matching`` marks, and the positions and starts of the
    ``want`` earliest (by start, then position), scanning the index in pieces: memory for one
    piece and ``want`` candidates, whatever the trace's size and however many events match."""
    count = 0
    best_pos, best_start = np.zeros(0, np.int64), np.zeros(0, np.int64)
    for first, (names, starts) in ix.chunks("name", "start"):
        hit = np.flatnonzero(matching[names])
        count += len(hit)
        if len(hit) == 0 or want == 0:
            continue
        pos = np.concatenate([best_pos, hit + first])  # ascending: earlier pieces come first
        start = np.concatenate([best_start, starts[hit]])
        if len(pos) > want:
            kth = np.partition(start, want - 1)[want - 1]
            below = np.flatnonzero(start < kth)
            ties = np.flatnonzero(start == kth)[: want - len(below)]  # the lowest positions
            keep = np.sort(np.concatenate([below, ties]))
            pos, start = pos[keep], start[keep]
        best_pos, best_start = pos, start
    return count, best_pos, best_start


def _slice_row(data: RankData, row: int) -> dict[str, Any]:
    """One row of the rank's cached ``slices`` table.  Read by DuckDB with a row-number filter it
    pushes into the scan: reading the row group that holds it (a million rows of every column)
    took 240 MB and 0.6 s on a 2 GB trace, the filtered scan 22 MB and 36 ms."""
    found = queries.arrow(
        "SELECT * EXCLUDE (file_row_number) FROM read_parquet(?, file_row_number = true) "
        "WHERE file_row_number = ?",
        [str(data.cache_folder / "slices.parquet"), int(row)],
        queries.pages_database(),
    ).to_pylist()
    if not found:
        raise KeyError(row)
    return found[0]


EVENT_FLOWS = 100
"""Flows listed per direction in an event's details."""


def _event_flows(opened: OpenedRun, ix: TimelineArrays, pos: int) -> list[dict[str, Any]]:
    """The flows leaving (``out``) and reaching (``in``) the event at index position ``pos``, at most
    :data:`EVENT_FLOWS` each, scanning the flows in pieces."""
    partners: dict[str, list[tuple[int, int]]] = {"out": [], "in": []}  # (flow, other end's position)
    for first, (src, dst) in ix.chunks("flow_src", "flow_dst"):
        for direction, mine, other in (("out", src, dst), ("in", dst, src)):
            room = EVENT_FLOWS - len(partners[direction])
            hits = np.flatnonzero(mine == pos)[:room]
            partners[direction].extend(zip((hits + first).tolist(), other[hits].tolist(), strict=True))
    kinds = ix.meta["flow_kinds"]
    flows = []
    for direction in ("out", "in"):
        for m, o in partners[direction]:
            track, _ = _lane_of(ix, np.array([o]))
            flows.append(
                {
                    "kind": kinds[int(ix.flow_kind[m])] if kinds else "flow",
                    "direction": direction,
                    "id": int(ix.row[o]),
                    "track": int(track[0]),
                    "name": ix.names[int(ix.name[o])],
                    "start_ns": int(ix.start[o]) - opened.origin_ns,
                }
            )
    return flows


def event(opened: OpenedRun, rank: int | None, event_id: int) -> dict[str, Any]:
    """Everything the trace records about one event, plus its flow partners; KeyError if none."""
    data = opened.rank(rank)
    ix = data.timeline
    if not 0 <= event_id < len(ix.pos):
        raise KeyError(event_id)
    row = _slice_row(data, event_id)
    pos = int(ix.pos[event_id])
    track_names = dict(
        zip(data.tracks.column("track").to_pylist(), data.tracks.column("name").to_pylist(), strict=True)
    )
    flows = _event_flows(opened, ix, pos)
    return {
        "rank": data.rank,
        "id": event_id,
        "name": str(row["name"]),
        "kind": str(row["kind"]),
        "category": None if row["category"] is None else str(row["category"]),
        "track": row["track"],
        "track_name": track_names.get(row["track"], ""),
        "pid": row["pid"],
        "tid": row["tid"],
        "start_ns": row["start_ns"] - opened.origin_ns,
        "dur_ns": row["dur_ns"],
        "depth": row["depth"],
        "step": row["step"],
        "correlation": row["correlation"],
        "external_id": row["external_id"],
        "input_dims": row["input_dims"],
        "input_types": row["input_types"],
        "concrete_inputs": row.get("concrete_inputs"),  # absent from a cache written before it
        "grid": row["grid"],
        "block": row["block"],
        "occupancy_pct": row["occupancy_pct"],
        "bytes": row["bytes"],
        "flows": flows,
    }


def _starting_in(ix: TimelineArrays, ws: int, we: int) -> tuple[np.ndarray, np.ndarray]:
    """The index positions of the events starting in ``[ws, we]``, as sorted, disjoint ranges
    ``[lo, hi)``: one binary search pair per lane (within a lane, starts are sorted)."""
    lo, hi = [], []
    for lane in ix.meta["lanes"]:
        a, b = lane["offset"], lane["offset"] + lane["count"]
        starts = ix.start[a:b]
        first, last = a + int(starts.searchsorted(ws, "left")), a + int(starts.searchsorted(we, "right"))
        if last > first:
            lo.append(first)
            hi.append(last)
    return np.array(lo, np.int64), np.array(hi, np.int64)


def _inside(positions: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Whether each position lies in one of the sorted, disjoint ranges ``[lo, hi)``."""
    if len(lo) == 0:
        return np.zeros(len(positions), bool)
    which = np.searchsorted(lo, positions, side="right") - 1
    return (which >= 0) & (positions < hi[np.maximum(which, 0)])


def flows(
    opened: OpenedRun, start_ns: int, end_ns: int, rank: int | None, limit: int, ranks: set[int] | None = None
) -> tuple[int, list[dict[str, Any]]]:
    """Flow arrows with either end starting inside the window (at most ``limit``, by source start).

    Whether an end starts in the window is read from its index position alone (the window is a
    range of positions per lane), and the flows are scanned in pieces: no request reads every
    flow's start times, so the memory of a window's flows does not grow with the trace."""
    ws, we = opened.origin_ns + start_ns, opened.origin_ns + end_ns
    total = 0
    out: list[dict[str, Any]] = []
    for data in _ranks(opened, rank, ranks):
        ix = data.timeline
        if len(ix.flow_src) == 0:
            continue
        lo, hi = _starting_in(ix, ws, we)
        kinds = ix.meta["flow_kinds"]
        for first, (src_all, dst_all) in ix.chunks("flow_src", "flow_dst"):
            chosen = np.flatnonzero(_inside(src_all, lo, hi) | _inside(dst_all, lo, hi))
            total += len(chosen)
            chosen = chosen[: max(0, limit - len(out))]
            if len(chosen) == 0:
                continue
            src, dst = src_all[chosen].astype(np.int64), dst_all[chosen].astype(np.int64)
            src_start, dst_start = np.asarray(ix.start[src]), np.asarray(ix.start[dst])
            flow_kind = np.asarray(ix.flow_kind[first + chosen])
            s_track, s_depth = _lane_of(ix, src)
            d_track, d_depth = _lane_of(ix, dst)
            for i in range(len(chosen)):  # at most ``limit`` flows
                out.append(
                    {
                        "rank": data.rank,
                        "kind": kinds[int(flow_kind[i])] if kinds else "flow",
                        "src_id": int(ix.row[src[i]]),
                        "src_track": int(s_track[i]),
                        "src_depth": int(s_depth[i]),
                        "src_ts_ns": int(src_start[i]) - opened.origin_ns,
                        "dst_id": int(ix.row[dst[i]]),
                        "dst_track": int(d_track[i]),
                        "dst_depth": int(d_depth[i]),
                        "dst_ts_ns": int(dst_start[i]) - opened.origin_ns,
                    }
                )
    return total, out


def kind_names() -> list[str]:
    return list(KIND_NAMES)


def parse_tracks(text: str | None) -> set[tuple[int, int]] | None:
    """``"0:3,1:5"`` -> {(0, 3), (1, 5)}; ValueError with a reason on bad input."""
    if text is None or not text.strip():
        return None
    out = set()
    for part in text.split(","):
        rank_text, sep, track_text = part.strip().partition(":")
        if not sep:
            raise ValueError(f"track {part!r} is not RANK:TRACK")
        out.add((int(rank_text), int(track_text)))
    return out


def parse_ranks(text: str | None) -> set[int] | None:
    """``"0,2,5"`` -> {0, 2, 5} (None: every rank); ValueError with a reason on bad input."""
    if text is None or not text.strip():
        return None
    try:
        return {int(part) for part in text.split(",") if part.strip()}
    except ValueError:
        raise ValueError(f"ranks {text!r} is not a comma-separated list of rank numbers") from None

"""The timeline's level-of-detail pyramid against the events it summarises, on a real trace.

The pyramid (``lod_*`` arrays of the timeline index) answers zoomed-out windows; the raw arrays
answer the rest.  Each is built here on its own for the same trace (``level_min_events``: every lane
gets a pyramid, or none), and both must keep the contract of docs/API.md, checked against the
trace's own events: every event at least a pixel long that overlaps the window is returned as
itself, every pixel an event paints is painted, merging conserves events, at most about two
entries per pixel per lane.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import kineto_file
from perfsight import columns
from perfsight.ingest import read_trace
from perfsight.model import Trace
from perfsight.server import timeline
from perfsight.server.registry import OpenedRun, RankData
from perfsight.store.timeline_index import TimelineArrays, write_timeline_index

TRACE = "ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"
WIDTH = 600


@pytest.fixture(scope="module")
def trace() -> Trace:
    return read_trace(kineto_file(TRACE))


def _opened(trace: Trace, folder: Path, level_min_events: int) -> OpenedRun:
    write_timeline_index(trace, folder, level_min_events=level_min_events)
    arrays = TimelineArrays(folder)
    data = RankData(0, folder, folder, trace.meta, arrays, trace.tracks)
    origin = arrays.meta["first_ns"]
    return OpenedRun(run=None, ranks={0: data}, origin_ns=origin, end_ns=arrays.meta["last_ns"] - origin)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def both(trace: Trace, tmp_path_factory: pytest.TempPathFactory) -> dict[str, OpenedRun]:
    return {
        "pyramid": _opened(trace, tmp_path_factory.mktemp("pyramid"), level_min_events=2),
        "raw": _opened(trace, tmp_path_factory.mktemp("raw"), level_min_events=2**62),
    }


def _events(trace: Trace) -> dict[str, np.ndarray]:
    s = trace.slices
    start = columns.int64(s.column("start_ns"))
    return {
        "track": columns.int64(s.column("track")),
        "depth": columns.int64(s.column("depth")),
        "start": start,
        "end": start + np.maximum(columns.int64(s.column("dur_ns")), 0),
        "name": np.array(s.column("name").to_pylist(), dtype=object),
    }


def _painted(starts: np.ndarray, ends: np.ndarray, lo: int, px: float, width: int) -> set[int]:
    """Pixels (0..width-1) that intervals [start, end] relative to the window touch."""
    first = np.clip(np.floor((starts - lo) / px), 0, width - 1).astype(np.int64)
    last = np.clip(np.floor((np.maximum(ends, starts) - lo) / px), 0, width - 1).astype(np.int64)
    out: set[int] = set()
    for a, b in zip(first.tolist(), last.tolist(), strict=True):
        out.update(range(a, b + 1))
    return out


def _check(body: dict[str, Any], events: dict[str, np.ndarray], origin: int, lo: int, hi: int) -> None:
    px = body["ns_per_px"]
    ws, we = origin + lo, origin + hi
    returned = 0
    for track in body["tracks"]:
        for lane in track["lanes"]:
            n = len(lane["id"])
            returned += n
            assert n <= 2 * WIDTH + 2
            mine = (events["track"] == track["track"]) & (events["depth"] == lane["depth"])
            mine &= (events["end"] > ws) & (events["start"] < we)
            start = np.array(lane["start_ns"], np.int64) + origin
            end = start + np.array(lane["dur_ns"], np.int64)
            count = np.array(lane["count"])
            singles = {
                (body["names"][nm], s, e)
                for nm, s, e, c in zip(
                    lane["name"], start.tolist(), end.tolist(), count.tolist(), strict=True
                )
                if c == 1
            }
            long = mine & (events["end"] - events["start"] >= px)
            wanted = set(
                zip(
                    events["name"][long].tolist(),
                    events["start"][long].tolist(),
                    events["end"][long].tolist(),
                    strict=True,
                )
            )
            assert wanted <= singles, f"events a pixel or longer missing on track {track['track']}"
            oracle = _painted(events["start"][mine], events["end"][mine], ws, px, WIDTH)
            assert oracle <= _painted(start, end, ws, px, WIDTH), "a visible event's pixel is blank"
    assert returned == body["events"]


@pytest.mark.parametrize("kind", ["pyramid", "raw"])
def test_whole_trace_window_keeps_every_event_once(
    kind: str, both: dict[str, OpenedRun], trace: Trace
) -> None:
    opened = both[kind]
    body = timeline.window(opened, 0, opened.end_ns, WIDTH, None, None)
    total = sum(sum(lane["count"]) for t in body["tracks"] for lane in t["lanes"])
    assert total == trace.slices.num_rows  # merging conserves events: each counted exactly once
    assert body["events"] < total / 5  # and it does merge
    _check(body, _events(trace), opened.origin_ns, 0, opened.end_ns)


@pytest.mark.parametrize("kind", ["pyramid", "raw"])
def test_windows_at_every_zoom_keep_long_events_and_paint_every_pixel(
    kind: str, both: dict[str, OpenedRun], trace: Trace
) -> None:
    opened = both[kind]
    events = _events(trace)
    end = opened.end_ns
    rng = np.random.default_rng(0)
    for fraction in (0.3, 0.1, 0.01, 1e-3, 1e-4):
        span = max(1000, int(end * fraction))
        for lo in rng.integers(0, end - span, 3).tolist():
            body = timeline.window(opened, lo, lo + span, WIDTH, None, None)
            _check(body, events, opened.origin_ns, lo, lo + span)


def test_pyramid_and_raw_arrays_agree_on_every_event_a_pixel_or_longer(both: dict[str, OpenedRun]) -> None:
    end = both["raw"].end_ns
    for lo, hi in ((0, end), (end // 3, end // 3 + end // 50)):
        found = {}
        for kind, opened in both.items():
            body = timeline.window(opened, lo, hi, WIDTH, None, None)
            px = body["ns_per_px"]
            found[kind] = {
                (t["track"], lane["depth"], body["names"][nm], s, d)
                for t in body["tracks"]
                for lane in t["lanes"]
                for nm, s, d, c in zip(
                    lane["name"], lane["start_ns"], lane["dur_ns"], lane["count"], strict=True
                )
                if c == 1 and d >= px
            }
        assert found["pyramid"] == found["raw"] and found["raw"]

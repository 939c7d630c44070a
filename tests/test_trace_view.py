"""trace_view.json: valid Chrome trace JSON with every slice, flow, counter and the overlap lanes.

The file is parsed back with the standard library's ``json`` and compared with the Trace it came
from (and, for memory, with the raw Kineto JSON), so a viewer reading it sees exactly the trace.
"""

from __future__ import annotations

import gzip
import json
import time
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from _hostile import BASE_NS, HOSTILE_NAMES, hostile_trace
from _trace_builder import make_trace
from perfsight.analysis.overlap import overlap_intervals
from perfsight.export.trace_view import OVERLAP_LANES, OVERLAP_PROCESS, time_offset_ns, write_trace_view
from perfsight.ingest import eventscan, read_trace
from perfsight.model import Trace
from shared_data import KINETO, require

NCCL = KINETO / "nccl_parser_config" / "nccl_data.json.gz"
DF_INDEX = KINETO / "df_index_resolver" / "df_index_resolver.json.gz"
NS_RESOLUTION = KINETO / "ns_resolution_trace" / "rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"


def _load(path: Path) -> dict[str, Any]:
    with path.open(encoding="utf-8") as handle:
        return json.load(handle)


def _ns(value: float, offset: int) -> int:
    """A parsed ``ts`` (µs) back to trace-clock ns, through its exact decimal text."""
    return int(Decimal(repr(value)) * 1000) + offset


def _processes(doc: dict[str, Any]) -> dict[int, str]:
    return {
        e["pid"]: e["args"]["name"]
        for e in doc["traceEvents"]
        if e["ph"] == "M" and e["name"] == "process_name"
    }


def _threads(doc: dict[str, Any]) -> dict[tuple[int, int], str]:
    return {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in doc["traceEvents"]
        if e["ph"] == "M" and e["name"] == "thread_name"
    }


@pytest.fixture(scope="module")
def nccl_view(tmp_path_factory: pytest.TempPathFactory) -> tuple[Trace, dict[str, Any]]:
    trace = read_trace(require(NCCL))
    path = write_trace_view(tmp_path_factory.mktemp("tv") / "trace_view.json", trace)
    return trace, _load(path)


def test_every_slice_is_an_x_event_with_exact_times(nccl_view) -> None:
    trace, doc = nccl_view
    assert doc["displayTimeUnit"] == "ns"
    offset = doc["otherData"]["perfsight_time_offset_ns"]
    assert offset == 0  # monotonic-clock µs values resolve every ns in a double
    overlap = {pid for pid, name in _processes(doc).items() if name == OVERLAP_PROCESS}
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] not in overlap]
    assert len(xs) == trace.slices.num_rows
    assert Counter(e["name"] for e in xs) == Counter(trace.slices.column("name").to_pylist())
    assert sorted(_ns(e["ts"], offset) for e in xs) == sorted(trace.slices.column("start_ns").to_pylist())
    total_ns = sum(trace.slices.column("dur_ns").to_pylist())
    assert sum(int(Decimal(repr(e["dur"])) * 1000) for e in xs) == total_ns
    kernel = next(e for e in xs if e["args"]["kind"] == "kernel")
    assert {"correlation", "External id", "step", "grid", "block"} <= set(kernel["args"])


def test_every_track_is_a_named_thread_in_a_named_process(nccl_view) -> None:
    trace, doc = nccl_view
    threads = _threads(doc)
    processes = _processes(doc)
    assert sorted(trace.tracks.column("name").to_pylist()) == sorted(
        name for name in threads.values() if name not in OVERLAP_LANES
    )
    assert all(pid in processes for pid, _ in threads)
    assert any(name.startswith("Rank 0 GPU 0") for name in processes.values())


def test_ids_are_unsigned_32_bit_and_one_lane_per_track(nccl_view) -> None:
    trace, doc = nccl_view
    assert min(trace.tracks.column("tid").to_pylist()) < 0  # Kineto writes negative tids
    ids = [(e["pid"], e["tid"]) for e in doc["traceEvents"] if "pid" in e]
    assert all(0 <= pid < 2**32 and 0 <= tid < 2**32 for pid, tid in ids)
    lanes = list(_threads(doc))
    assert len(lanes) == len(set(lanes)) == trace.tracks.num_rows + len(OVERLAP_LANES)
    named = set(lanes)
    assert {(e["pid"], e["tid"]) for e in doc["traceEvents"] if e["ph"] in "Xsf"} <= named


def test_overlap_analysis_process_has_the_four_lanes_and_their_intervals(nccl_view) -> None:
    trace, doc = nccl_view
    pid = next(p for p, name in _processes(doc).items() if name == OVERLAP_PROCESS)
    lanes = {tid: name for (p, tid), name in _threads(doc).items() if p == pid}
    assert sorted(lanes.values()) == sorted(OVERLAP_LANES)
    drawn = Counter(lanes[e["tid"]] for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] == pid)
    expected = Counter(overlap_intervals(trace).column("lane").to_pylist())
    assert drawn == expected and drawn["Computing"] > 0


def test_flow_arrows_bind_to_the_launch_and_the_kernel(nccl_view) -> None:
    trace, doc = nccl_view
    starts: dict[str, list[dict[str, Any]]] = {"s": [], "f": []}
    for e in doc["traceEvents"]:
        if e["ph"] in ("s", "f"):
            starts[e["ph"]].append(e)
    assert len(starts["s"]) == len(starts["f"]) == trace.flows.num_rows
    assert all(e["bp"] == "e" for e in starts["f"])
    slices = trace.slices
    lane_of = {name: key for key, name in _threads(doc).items()}
    tracks = {row["track"]: lane_of[row["name"]] for row in trace.tracks.to_pylist()}
    by_id = {e["id"]: e for e in starts["s"]}
    finish = {e["id"]: e for e in starts["f"]}
    for i, flow in enumerate(trace.flows.slice(0, 200).to_pylist()):
        src, dst = slices.slice(flow["src"], 1).to_pylist()[0], slices.slice(flow["dst"], 1).to_pylist()[0]
        assert _ns(by_id[i]["ts"], 0) == src["start_ns"] and _ns(finish[i]["ts"], 0) == dst["start_ns"]
        assert (by_id[i]["pid"], by_id[i]["tid"]) == tracks[src["track"]]
        assert (finish[i]["pid"], finish[i]["tid"]) == tracks[dst["track"]]


def test_hostile_names_come_back_exactly(tmp_path: Path) -> None:
    trace = hostile_trace()
    path = write_trace_view(tmp_path / "trace_view.json", trace)
    doc = _load(path)
    names = {e["name"] for e in doc["traceEvents"] if e["ph"] == "X"}
    assert set(HOSTILE_NAMES) <= names
    assert {f"kernel {n}" for n in HOSTILE_NAMES} <= names
    cats = {e.get("cat") for e in doc["traceEvents"] if e["ph"] == "X"}
    assert {f"cat {n}" for n in HOSTILE_NAMES} <= cats
    assert set(trace.tracks.column("name").to_pylist()) <= set(_threads(doc).values())
    op = next(e for e in doc["traceEvents"] if e["ph"] == "X" and e["name"] == HOSTILE_NAMES[1])
    assert op["args"]["Input Dims"] == [[2, 3], [], [7]]
    assert op["args"]["Input type"] == ["float", HOSTILE_NAMES[1], "int64"]
    raw = path.read_text(encoding="utf-8")
    assert "</script>" in raw and "\n]}" in raw  # escaping is JSON's, not HTML's: the file is data


def test_nanosecond_wall_clock_times_are_rebased_and_the_offset_recorded(tmp_path: Path) -> None:
    trace = hostile_trace()
    offset = time_offset_ns(trace)
    assert offset == (BASE_NS // 10**9) * 10**9
    doc = _load(write_trace_view(tmp_path / "trace_view.json", trace))
    assert doc["otherData"]["perfsight_time_offset_ns"] == offset
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X" and e.get("cat") != "overlap"]
    assert sorted(_ns(e["ts"], offset) for e in xs) == sorted(trace.slices.column("start_ns").to_pylist())
    counters = [e for e in doc["traceEvents"] if e["ph"] == "C"]
    assert [_ns(e["ts"], offset) for e in counters] == trace.memory.column("ts_ns").to_pylist()
    allocated = trace.memory.column("allocated_bytes").to_pylist()
    assert [e["args"]["Allocated"] * 2**20 for e in counters] == allocated


def test_chunked_writing_gives_the_same_events(tmp_path: Path) -> None:
    trace = hostile_trace()
    whole = _load(write_trace_view(tmp_path / "a.json", trace))
    chunked = _load(write_trace_view(tmp_path / "b.json", trace, chunk_rows=3))

    def events(doc: dict[str, Any]) -> list[str]:
        return sorted(json.dumps(e, sort_keys=True) for e in doc["traceEvents"])

    assert events(whole) == events(chunked) and len(whole["traceEvents"]) > 3 * 3


def test_large_trace_streams_quickly_with_memory_counters(tmp_path: Path) -> None:
    trace = read_trace(require(DF_INDEX))
    began = time.perf_counter()
    path = write_trace_view(tmp_path / "trace_view.json", trace)
    elapsed = time.perf_counter() - began
    assert elapsed < 10, f"writing took {elapsed:.1f} s"
    doc = _load(path)
    counters = [e for e in doc["traceEvents"] if e["ph"] == "C"]
    assert len(counters) == trace.memory.num_rows
    with gzip.open(DF_INDEX, "rt") as handle:
        raw = json.load(handle)
    events = raw["traceEvents"] if isinstance(raw, dict) else raw
    raw_peak = max(e["args"]["Total Allocated"] for e in events if e.get("name") == "[memory]")
    assert max(e["args"].get("Allocated", 0) for e in counters) * 2**20 == raw_peak


def test_an_empty_trace_gives_a_valid_file_with_the_overlap_lanes(tmp_path: Path) -> None:
    trace = make_trace([], [])
    doc = _load(write_trace_view(tmp_path / "trace_view.json", trace))
    assert not [e for e in doc["traceEvents"] if e["ph"] != "M"]
    assert sorted(_threads(doc).values()) == sorted(OVERLAP_LANES)


def test_real_nanosecond_trace_is_rebased_without_losing_a_nanosecond(tmp_path: Path) -> None:
    trace = read_trace(require(NS_RESOLUTION))
    doc = _load(write_trace_view(tmp_path / "trace_view.json", trace))
    offset = doc["otherData"]["perfsight_time_offset_ns"]
    assert offset > 0 and offset % 10**9 == 0
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X" and e.get("cat") != "overlap"]
    assert max(e["ts"] for e in xs) < 2**43  # small enough that a double resolves 1 ns
    assert sorted(_ns(e["ts"], offset) for e in xs) == sorted(trace.slices.column("start_ns").to_pylist())


@pytest.mark.skipif(not eventscan.available(), reason="native library not built")
@pytest.mark.parametrize("source", ["hostile", NCCL, DF_INDEX, NS_RESOLUTION], ids=lambda s: Path(s).name)
def test_native_and_portable_layouts_write_the_same_file(tmp_path: Path, source: Path | str) -> None:
    trace = hostile_trace() if source == "hostile" else read_trace(require(source))
    chunk_rows = 3 if source == "hostile" else 5_000  # chunks that end inside a piece of rows
    native = write_trace_view(tmp_path / "native.json", trace, chunk_rows=chunk_rows).read_bytes()
    eventscan.use_library(None)
    try:
        portable = write_trace_view(tmp_path / "portable.json", trace, chunk_rows=chunk_rows).read_bytes()
    finally:
        eventscan.use_library(Path(eventscan.__file__).parent)
    assert native == portable
    assert native.count(b'\n{"ph":"X"') >= trace.slices.num_rows
